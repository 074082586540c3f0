"""Failures that explain themselves, from real causes on the tiny model (the trainer as its own
process, as in a pod, with its termination message in a file).

Real causes: a loss that turns NaN (learning rate 1.0), a budget of a few seconds, a checkpoint
volume that is really full (a 2 MiB tmpfs, root only). Test hooks (``KUBETUNE_FAULT_INJECT``) stand
in only where a CPU cannot produce the cause: CUDA out of memory (``cuda-oom``) and an NCCL timeout
(``nccl-timeout``); they raise the error torch raises.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, run_trainer, trainer_config, trainer_env

from kubetune_api.failures import EXIT_FAILED, EXIT_RETRY, Failure, parse_failure
from kubetune_api.trainer_config import COMPLETE_MARKER, TRAIN_RESULT_FILE
from kubetune_trainer.settings import FAULT_ENV
from kubetune_trainer.training import oom
from kubetune_trainer.volume import checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _run(config: Path, tmp: Path, name: str, **env: str) -> tuple[int, Any, str]:
    term = tmp / f"{name}.termination-log"
    log = tmp / f"{name}.log"
    code = run_trainer(config, log, extra_env=env, termination_log=term)
    text = term.read_text() if term.exists() else ""
    return code, parse_failure(text), log.read_text()


def test_a_nan_loss_stops_the_run_with_loss_diverged_and_keeps_the_last_good_checkpoint(
    tmp_path: Path, tiny_model: Path
) -> None:
    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, maxSteps=40, learningRate=1.0, saveSteps=2, saveTotalLimit=3)
    code, failure, log = _run(config, tmp_path, "nan")
    assert code == EXIT_FAILED, log[-3000:]
    assert failure is not None and failure.reason == Failure.LOSS_DIVERGED, log[-3000:]
    assert not failure.retryable
    assert failure.step is not None and failure.step < 40  # it stopped early, at the step it names
    assert f"at step {failure.step}" in failure.message
    kept = checkpoints.complete_checkpoints(checkpoints.checkpoints_root(out))
    assert kept and all(c.step < failure.step for c in kept)  # nothing saved at or after the bad step
    assert f"the last good checkpoint is {kept[-1].path}" in failure.message
    assert not (out / "final").exists()


def test_the_watchdog_can_be_turned_off(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "run"
    config = trainer_config(
        out, tiny_model, maxSteps=24, learningRate=1.0, saveSteps=24, lossWatchdog={"enabled": False}
    )
    code, failure, log = _run(config, tmp_path, "off")
    assert code == 0, log[-3000:]
    assert failure is None
    assert (out / "final" / COMPLETE_MARKER).is_file()


def test_a_budget_of_a_few_seconds_ends_with_the_model_of_the_step_it_reached_and_registers_it(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    out = tmp_path / "run"
    config = trainer_config(
        out,
        tiny_model,
        tracking_uri=mlflow_server.uri,
        name="budgeted",
        maxSteps=5000,
        saveSteps=1000,
        extra_spec={"budget": {"maxDuration": "12s"}},
    )
    code, failure, log = _run(config, tmp_path, "budget")
    assert code == 0, log[-3000:]
    assert failure is None
    result = json.loads((out / TRAIN_RESULT_FILE).read_text())
    budget = result["budget"]
    assert budget["reached"] is True and budget["limit"] == "maxDuration 12s"
    assert 0 < budget["step"] < budget["totalSteps"] == 5000
    assert result["global_step"] == budget["step"]
    # the final model is that step's, and a checkpoint of that step was saved on the way out
    final = json.loads((out / "final" / COMPLETE_MARKER).read_text())
    assert final["step"] == budget["step"] and final["budget"] == "maxDuration 12s"
    assert checkpoints.latest_complete(checkpoints.checkpoints_root(out)).step == budget["step"]
    goodput = result["goodput"]
    assert goodput["restarts"] == 0
    assert goodput["heldGpuSeconds"] >= 12
    assert 0 < goodput["productiveGpuSeconds"] < goodput["heldGpuSeconds"]
    assert goodput["startupGpuSeconds"] > 0

    # the registration Job's container, against the real MLflow server: one version, and the tags
    # say which step and checkpoint it is and that the budget stopped it
    reg = subprocess.run(
        [sys.executable, "-m", "kubetune_trainer.register", "--config", str(config)],
        cwd=REPO,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert reg.returncode == 0, reg.stderr[-3000:]
    from mlflow.tracking import MlflowClient

    versions = MlflowClient(tracking_uri=mlflow_server.uri).search_model_versions("name = 'budgeted'")
    assert len(versions) == 1
    tags = versions[0].tags
    assert tags["kubetune.budget_reached"] == "maxDuration 12s"
    assert tags["kubetune.final.step"] == str(budget["step"])
    assert tags["kubetune.final.checkpoint"] == str(
        checkpoints.checkpoint_path(checkpoints.checkpoints_root(out), budget["step"])
    )


def test_cuda_out_of_memory_retries_with_smaller_micro_steps_and_the_same_loss_curve(
    tmp_path: Path, tiny_model: Path
) -> None:
    """The CUDA out-of-memory error comes from the test hook (a CPU has no CUDA memory); the retry,
    the leaner layout and the resume are real."""
    common: dict[str, Any] = {"maxSteps": 8, "batchSize": 4, "gradientAccumulationSteps": 2, "saveSteps": 2}
    steady = tmp_path / "steady"
    code, _, log = _run(
        trainer_config(steady, tiny_model, name="oom", uid="u-1", **common), tmp_path, "steady"
    )
    assert code == 0, log[-3000:]

    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, name="oom", uid="u-1", **common)
    hook = {FAULT_ENV: "cuda-oom:5:2"}  # from step 5 on, a micro-step of more than 2 rows runs out
    code, failure, log = _run(config, tmp_path, "oom-1", **hook)
    assert code == EXIT_RETRY, log[-3000:]
    assert failure is not None and failure.reason == Failure.CUDA_OUT_OF_MEMORY and failure.retryable
    assert failure.step == 5
    assert "4 rows x 2 micro-steps" in failure.message and "2 rows x 4 micro-steps" in failure.message
    retries = oom.load(out)
    assert [(r["attempt"], r["step"], r["after"]) for r in retries] == [
        (1, 5, "2 rows x 4 micro-steps, no recomputation")
    ]

    code, failure, log = _run(config, tmp_path, "oom-2", **hook)
    assert code == 0, log[-3000:]
    assert "resuming from" in log and "retry 1 after CUDA out of memory: 2 rows x 4 micro-steps" in log
    got = json.loads((out / TRAIN_RESULT_FILE).read_text())
    want = json.loads((steady / TRAIN_RESULT_FILE).read_text())
    assert got["plan"]["per_device_batch_size"] == 2 and got["plan"]["gradient_accumulation_steps"] == 4
    assert [s for s, _ in got["losses"]] == [s for s, _ in want["losses"]] == list(range(1, 9))
    for (step, a), (_, b) in zip(got["losses"], want["losses"], strict=True):
        assert a == pytest.approx(b, rel=1e-3, abs=1e-4), f"step {step}"
    assert got["goodput"]["restarts"] == 1


def test_out_of_memory_retries_are_bounded(tmp_path: Path, tiny_model: Path) -> None:
    """Hooked CUDA out of memory at every layout: oomRetries 1 allows one retry, then it is final."""
    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, maxSteps=6, batchSize=4, saveSteps=2, oomRetries=1)
    hook = {FAULT_ENV: "cuda-oom:3:0"}
    code, first, _ = _run(config, tmp_path, "a", **hook)
    code2, second, log = _run(config, tmp_path, "b", **hook)
    assert (code, code2) == (EXIT_RETRY, EXIT_FAILED), log[-3000:]
    assert first is not None and second is not None and not second.retryable
    assert "no retry left (spec.training.oomRetries 1)" in second.message


def test_an_nccl_timeout_is_named_and_retryable(tmp_path: Path, tiny_model: Path) -> None:
    """The NCCL watchdog's error comes from the test hook (no NCCL on a CPU)."""
    out = tmp_path / "run"
    code, failure, log = _run(
        trainer_config(out, tiny_model, maxSteps=4), tmp_path, "nccl", **{FAULT_ENV: "nccl-timeout:2"}
    )
    assert code == EXIT_RETRY, log[-3000:]
    assert failure is not None and failure.reason == Failure.NCCL_TIMEOUT and failure.step == 2


def test_bad_data_is_a_dataset_error_naming_the_row(tmp_path: Path, tiny_model: Path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n{"text": 3}\n'
    )
    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, dataset={"path": str(data), "format": "messages"})
    code, failure, log = _run(config, tmp_path, "bad")
    assert code == 2, log[-3000:]
    assert failure is not None and failure.reason == Failure.DATASET_ERROR
    assert "line 2" in failure.message or "row 2" in failure.message, failure.message


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root to mount a tmpfs"
)
def test_a_full_checkpoint_volume_is_disk_full_with_its_free_bytes(tmp_path: Path, tiny_model: Path) -> None:
    """A real full volume: the run folder is a 3 MiB tmpfs (in a private mount namespace); the tiny
    model's first checkpoint does not fit."""
    out = tmp_path / "run"
    out.mkdir()
    config = trainer_config(out, tiny_model, maxSteps=6, saveSteps=2)
    term = tmp_path / "full.termination-log"
    script = (
        f"mount -t tmpfs -o size=3m tmpfs {out} && "
        f"exec {sys.executable} -m kubetune_trainer.train --config {config} --termination-log {term}"
    )
    env = trainer_env()
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    failure = parse_failure(term.read_text() if term.exists() else "")
    assert proc.returncode == EXIT_FAILED, proc.stderr[-3000:]
    assert failure is not None and failure.reason == Failure.DISK_FULL, proc.stderr[-3000:]
    assert "No space left on device" in failure.message and "free of" in failure.message
    assert "spec.storage.size" in failure.hint


def test_a_corrupt_checkpoint_is_named_when_the_resume_cannot_read_it(
    tmp_path: Path, tiny_model: Path
) -> None:
    """A real corrupt checkpoint: the first attempt is killed right after its step-4 checkpoint is
    complete (the kill-after-mark fault), then that checkpoint's weights are cut short on disk."""
    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, maxSteps=8, saveSteps=4)
    code, _, log = _run(config, tmp_path, "first", **{FAULT_ENV: "kill-after-mark:4"})
    assert code == -9, log[-3000:]
    ckpt = checkpoints.checkpoint_path(checkpoints.checkpoints_root(out), 4)
    weights = ckpt / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    code, failure, log = _run(config, tmp_path, "resume")
    assert code == EXIT_FAILED, log[-3000:]
    assert failure is not None and failure.reason == Failure.CHECKPOINT_CORRUPT, log[-3000:]
    assert str(ckpt) in failure.message


def test_sigterm_saves_and_says_preempted(tmp_path: Path, tiny_model: Path) -> None:
    import signal
    import time

    from tests.e2e.conftest import start_trainer, wait_or_kill

    out = tmp_path / "run"
    term = tmp_path / "preempted.termination-log"
    config = trainer_config(out, tiny_model, maxSteps=100000, saveSteps=50)
    proc = start_trainer(config, tmp_path / "preempted.log", termination_log=term)
    root = checkpoints.checkpoints_root(out)
    deadline = time.monotonic() + 240
    while not checkpoints.complete_checkpoints(root) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    assert wait_or_kill(proc, 240) == 143
    failure = parse_failure(term.read_text())
    assert failure is not None and failure.reason == Failure.PREEMPTED and failure.retryable
    newest = checkpoints.latest_complete(root)
    assert newest is not None and failure.step == newest.step


@pytest.mark.parametrize(
    ("model", "reason"),
    [("kubetune/tiny-gated", Failure.MODEL_GATED), ("kubetune/none", Failure.MODEL_NOT_FOUND)],
)
def test_a_hub_model_the_trainer_cannot_have_is_named(
    tmp_path: Path, tiny_model: Path, model: str, reason: Failure
) -> None:
    """Without preparation (which refuses these first), the trainer itself meets the Hub's 401 and 404
    (the Hub stand-in of tests/support/hub.py, over the Hub's protocol)."""
    from tests.support.hub import HubStandIn

    from kubetune_api.trainer_config import TrainerConfig

    hub = HubStandIn(tmp_path / "hub")
    hub.add_model("kubetune/tiny-gated", tiny_model, gated_token="hf_test_token_not_a_secret")
    try:
        out = tmp_path / "run"
        config = trainer_config(out, tiny_model, maxSteps=2)
        cfg = TrainerConfig.load(config)
        named = cfg.spec.model.model_copy(update={"name": model, "path": None})
        config.write_text(
            cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"model": named})}).to_yaml()
        )
        env = {"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hf"), "HF_TOKEN": ""}
        code, failure, log = _run(config, tmp_path, "hub", **env)
    finally:
        hub.stop()
    assert code == EXIT_FAILED, log[-3000:]
    assert failure is not None and failure.reason == reason, log[-3000:]
    assert model in failure.message
