"""Checkpoints that survive anything: kill -9 during a save, and SIGTERM (preemption), then restart.

The trainer runs as its own process, as in a pod. kill -9 in the middle of a save is made exact
with the trainer's fault injection (``KUBETUNE_FAULT_INJECT=kill-before-mark:<step>``: SIGKILL after
the checkpoint's files are written and before its COMPLETE marker), so the test does not depend on
winning a race against a tiny save.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import run_trainer, start_trainer, trainer_config

from kubetune_api.trainer_config import COMPLETE_MARKER, EXIT_PREEMPTED, MLFLOW_RUN_FILE, TRAIN_RESULT_FILE
from kubetune_trainer.settings import FAULT_ENV
from kubetune_trainer.volume import checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _result(out: Path) -> dict[str, Any]:
    return json.loads((out / TRAIN_RESULT_FILE).read_text())


def test_kill_9_during_a_save_resumes_from_the_previous_complete_checkpoint(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    out = tmp_path / "run"
    log = tmp_path / "train.log"
    config = trainer_config(out, tiny_model, tracking_uri=mlflow_server.uri, maxSteps=8, saveSteps=3)
    root = checkpoints.checkpoints_root(out)

    code = run_trainer(config, log, extra_env={FAULT_ENV: "kill-before-mark:6"})
    assert code == -signal.SIGKILL, log.read_text()[-3000:]
    # Step 3 complete; step 6 written but never marked: it must not count.
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(root)] == [(3, True), (6, False)]
    assert (root / "checkpoint-6" / "trainer_state.json").exists()
    first_run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]
    # the killed attempt wrote no train-result.json; its losses live in its checkpoint
    assert not (out / TRAIN_RESULT_FILE).exists()
    killed_attempt = _logged_losses(root / "checkpoint-3")
    assert [s for s, _ in killed_attempt] == [1, 2, 3]

    code = run_trainer(config, log)
    assert code == 0, log.read_text()[-3000:]
    result = _result(out)
    assert result["resumed_from_step"] == 3
    assert result["global_step"] == result["planned_steps"] == 8
    assert result["mlflow_run_id"] == first_run_id
    # The cut-short save was deleted and redone; retention kept the newest two complete ones.
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(root)] == [(6, True), (8, True)]
    assert (out / "final" / COMPLETE_MARKER).is_file()
    # train-result.json covers the whole run: the killed attempt's steps up to its checkpoint, then
    # the second attempt's; the first loss is the first attempt's
    assert [s for s, _ in result["losses"]] == list(range(1, 9))
    assert [tuple(x) for x in result["losses"][:3]] == killed_attempt
    assert result["first_loss"] == killed_attempt[0][1]
    assert result["final_loss"] == result["losses"][-1][1]
    assert result["steps_this_attempt"] == 5
    # the run's mean loss, not this attempt's losses divided by every attempt's steps
    assert result["train_loss"] == pytest.approx(sum(v for _, v in result["losses"]) / 8)


def _logged_losses(checkpoint: Path) -> list[tuple[int, float]]:
    history = json.loads((checkpoint / "trainer_state.json").read_text())["log_history"]
    return [(e["step"], e["loss"]) for e in history if "loss" in e]


def _wait_for(predicate: Any, timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}:\n{log.read_text()[-3000:]}")


def test_sigterm_saves_a_checkpoint_exits_143_and_the_restart_continues_the_same_run(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    out = tmp_path / "run"
    log = tmp_path / "train.log"
    # No periodic save before the end: any checkpoint must come from the SIGTERM.
    config = trainer_config(out, tiny_model, tracking_uri=mlflow_server.uri, maxSteps=24, saveSteps=1000)
    root = checkpoints.checkpoints_root(out)

    proc = start_trainer(config, log)
    try:
        # Training has started once the first step's loss is logged.
        _wait_for(lambda: "'loss'" in log.read_text(), 240, "the first training step", log)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == EXIT_PREEMPTED, log.read_text()[-3000:]
    first = _result(out)
    assert first["status"] == "preempted"
    step = first["preempted_at_step"]
    assert 1 <= step < 24
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(root)] == [(step, True)]
    assert not (out / "final").exists()
    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    assert client.get_run(run_id).info.status == "KILLED"

    code = run_trainer(config, log)
    assert code == 0, log.read_text()[-3000:]
    second = _result(out)
    assert second["resumed_from_step"] == step
    # train-result.json tells the whole run's loss curve: the first attempt's steps, then the second's.
    assert [s for s, _loss in second["losses"]] == list(range(1, 25))
    assert second["global_step"] == 24
    assert second["mlflow_run_id"] == run_id
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    # One run holds both attempts: its loss history spans the steps before and after the SIGTERM.
    history = [m.step for m in client.get_metric_history(run_id, "loss")]
    assert min(history) == 1 and max(history) == 24
    experiment = run.info.experiment_id
    assert len(client.search_runs([experiment])) == 1


def test_a_folder_of_another_training_is_neither_resumed_nor_taken_as_finished(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    """Train, then change a hyperparameter and run into the same folder (an edited local manifest, a
    reused claim): refused with exit 2 naming the folder, and nothing in it is touched. The same
    config again finds its finished model."""
    from kubetune_api.trainer_config import FINAL_DIR, TrainerConfig
    from kubetune_trainer.training import train

    out = tmp_path / "run"
    config = trainer_config(out, tiny_model, tracking_uri=mlflow_server.uri, maxSteps=2, saveSteps=1)
    first = train.run(TrainerConfig.load(config), progress_bar=False)
    assert first.exit_code == 0, first
    marker = json.loads((out / FINAL_DIR / COMPLETE_MARKER).read_text())
    assert marker["training_hash"] == TrainerConfig.load(config).training_hash()
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "config.yaml"}

    changed = trainer_config(
        out, tiny_model, tracking_uri=mlflow_server.uri, maxSteps=2, saveSteps=1, learningRate=1e-4
    )
    refused = train.run(TrainerConfig.load(changed), progress_bar=False)
    assert refused.exit_code == train.EXIT_OTHER_TRAINING and refused.status == "refused"
    assert str(out / FINAL_DIR) in refused.result["error"] and "another training" in refused.result["error"]
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing rewritten, nothing removed

    # only a checkpoint of the other training (its final model gone): refused the same way
    import shutil

    shutil.rmtree(out / FINAL_DIR)
    refused = train.run(TrainerConfig.load(changed), progress_bar=False)
    assert refused.exit_code == train.EXIT_OTHER_TRAINING and "checkpoint-2" in refused.result["error"]

    # the first config again resumes its own checkpoint and finishes
    again = train.run(
        TrainerConfig.load(
            trainer_config(out, tiny_model, tracking_uri=mlflow_server.uri, maxSteps=2, saveSteps=1)
        ),
        progress_bar=False,
    )
    assert again.exit_code == 0, again


def test_markers_without_a_training_hash_are_trusted_as_before(tmp_path: Path, tiny_model: Path) -> None:
    """Folders written before the check (no ``training_hash`` in the marker) keep working."""
    from kubetune_api.trainer_config import FINAL_DIR, TrainerConfig
    from kubetune_trainer.training import train

    out = tmp_path / "old"
    (out / FINAL_DIR).mkdir(parents=True)
    checkpoints.mark_complete(out / FINAL_DIR, {"step": 2, "config_hash": "0123456789abcdef"})
    outcome = train.run(TrainerConfig.load(trainer_config(out, tiny_model, maxSteps=2)), progress_bar=False)
    assert outcome.status == "already-complete" and outcome.exit_code == 0


def test_markers_without_a_data_hash_are_trusted_as_before(tmp_path: Path, tiny_model: Path) -> None:
    """A final model marked by the same training before kubetune recorded the data's hash is taken
    as finished, whatever the data holds now."""
    from kubetune_api.trainer_config import FINAL_DIR, TrainerConfig
    from kubetune_trainer.training import train

    out = tmp_path / "old"
    cfg = TrainerConfig.load(trainer_config(out, tiny_model, maxSteps=2))
    (out / FINAL_DIR).mkdir(parents=True)
    checkpoints.mark_complete(out / FINAL_DIR, {"step": 2, "training_hash": cfg.training_hash()})
    outcome = train.run(cfg, progress_bar=False)
    assert outcome.status == "already-complete" and outcome.exit_code == 0


def _local_manifest(tmp_path: Path, model: Path, data: Path) -> Path:
    import yaml

    doc = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "resumed"},
        "spec": {
            "model": {"path": str(model)},
            "dataset": {"path": str(data), "format": "messages"},
            "method": "full",
            "training": {
                "maxSteps": 4,
                "batchSize": 4,
                "gradientAccumulationSteps": 1,
                "learningRate": 3e-3,
                "maxLength": 128,
                "loggingSteps": 1,
                "saveSteps": 2,
                "saveTotalLimit": 2,
                "warmupSteps": 1,
                "weightDecay": 0.0,
            },
        },
    }
    path = data.parent / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_local_run_across_attempts_and_data_changed_under_the_same_path(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    """The issue's story with ``kubetune run --local``: the first attempt is killed after its last
    checkpoint, before the final model; the next one resumes at the last step and reports the
    whole run (the first attempt's first loss, every step), never "None". Then the data file
    changes under the same name: the folder is refused (exit 2, naming it) and left as it is; with
    the data put back, the run finishes from its checkpoint."""
    import subprocess
    import sys

    from tests.e2e.conftest import REPO, TINY_DATA, trainer_env

    from kubetune_api.trainer_config import FINAL_DIR
    from kubetune_trainer.sources.data_check import content_hash

    rows = TINY_DATA.read_text().splitlines()
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(rows[:64]) + "\n")
    manifest = _local_manifest(tmp_path, tiny_model, data)
    out = tmp_path / "run"
    root = checkpoints.checkpoints_root(out)

    def kubetune_run(fault: str | None = None) -> subprocess.CompletedProcess[str]:
        env = trainer_env()
        if fault:
            env[FAULT_ENV] = fault
        command = [sys.executable, "-m", "kubetune_cli", "run", str(manifest), "--local"]
        command += ["--output-dir", str(out), "--tracking-uri", mlflow_server.uri, "--no-register"]
        command += ["--no-progress-bar"]
        return subprocess.run(
            command, check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=600
        )

    killed = kubetune_run(fault="kill-after-mark:4")
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(root)] == [(2, True), (4, True)]
    assert not (out / FINAL_DIR).exists() and not (out / TRAIN_RESULT_FILE).exists()
    first_attempt = _logged_losses(root / "checkpoint-4")
    assert [s for s, _ in first_attempt] == [1, 2, 3, 4]
    marker = json.loads((root / "checkpoint-4" / COMPLETE_MARKER).read_text())
    old_hash = content_hash(data)
    assert marker["data_hash"] == old_hash

    resumed = kubetune_run()
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    first, last = first_attempt[0][1], first_attempt[-1][1]
    assert f"loss            {first:.3f} -> {last:.3f} in 4 steps (this attempt resumed at step 4)" in (
        resumed.stdout
    )
    assert "None" not in resumed.stdout
    result = _result(out)
    assert [tuple(x) for x in result["losses"]] == first_attempt
    assert result["global_step"] == 4 and result["steps_this_attempt"] == 0
    assert result["train_loss"] == pytest.approx(sum(v for _, v in first_attempt) / 4)
    assert json.loads((out / FINAL_DIR / COMPLETE_MARKER).read_text())["data_hash"] == old_hash

    # other rows, same file name: the training hash is the same, the data hash is not
    data.write_text("\n".join(rows[64:128]) + "\n")
    new_hash = content_hash(data)
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file() and p.name != "config.yaml"}
    refused = kubetune_run()
    assert refused.returncode == 2, refused.stderr[-3000:]
    expected = (
        f"{out / FINAL_DIR} was written by this training on other data: the content of {data} changed "
        f"since (data hash {old_hash}, now {new_hash}); resuming from it, or taking it as this run's "
        "result, would mix the two. Use a new output folder (kubetune run --output-dir, or a new storage "
        f"claim in a cluster), or delete {out} to start over."
    )
    assert f"kubetune: {expected}\n" in refused.stderr
    assert {p: p.stat().st_mtime_ns for p in before} == before  # nothing rewritten, nothing removed

    import shutil

    shutil.rmtree(out / FINAL_DIR)
    refused = kubetune_run()
    assert refused.returncode == 2
    assert f"kubetune: {root / 'checkpoint-4'} was written by this training on other data" in refused.stderr

    # the same data again: the same training, resumed from its own checkpoint
    data.write_text("\n".join(rows[:64]) + "\n")
    again = kubetune_run()
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / FINAL_DIR / COMPLETE_MARKER).is_file()
