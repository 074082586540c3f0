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
from kubetune_trainer import checkpoints
from kubetune_trainer.callbacks import FAULT_ENV

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

    code = run_trainer(config, log)
    assert code == 0, log.read_text()[-3000:]
    result = _result(out)
    assert result["resumed_from_step"] == 3
    assert result["global_step"] == result["planned_steps"] == 8
    assert result["mlflow_run_id"] == first_run_id
    # The cut-short save was deleted and redone; retention kept the newest two complete ones.
    assert [(c.step, c.complete) for c in checkpoints.list_checkpoints(root)] == [(6, True), (8, True)]
    assert (out / "final" / COMPLETE_MARKER).is_file()
    # The restarted attempt logged only the steps after the checkpoint.
    assert result["losses"][0][0] == 4


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
    from kubetune_trainer import train

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
    from kubetune_trainer import train

    out = tmp_path / "old"
    (out / FINAL_DIR).mkdir(parents=True)
    checkpoints.mark_complete(out / FINAL_DIR, {"step": 2, "config_hash": "0123456789abcdef"})
    outcome = train.run(TrainerConfig.load(trainer_config(out, tiny_model, maxSteps=2)), progress_bar=False)
    assert outcome.status == "already-complete" and outcome.exit_code == 0
