"""The checkpoint catalog and spec.resume on the tiny model (the trainer as its own process, as in a
pod, with its termination message in a file). Each "job" is a trainer config with its own uid on the
same output folder, as a new FineTuneJob on a reused claim.

- A run with eval data lists every kept checkpoint with its step, epoch, losses, time and size; the
  best by eval loss is kept although it is older than saveTotalLimit's window; the final model is
  evaluated (its last evaluation was not at the final step).
- resume: best and resume: "<step>" train from that checkpoint (train-result.json's resumed step
  and the steps this attempt logged), what came after is set aside and deleted once the new run
  saved; resume: none starts over; a step the volume does not hold fails with CheckpointNotFound
  naming the steps there are, and nothing is touched.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, run_trainer, trainer_config

from kubetune_api.failures import Failure, parse_failure
from kubetune_api.trainer_config import COMPLETE_MARKER, TRAIN_RESULT_FILE
from kubetune_trainer.settings import FAULT_ENV
from kubetune_trainer.sources.data_check import EXIT_BAD_INPUT
from kubetune_trainer.volume import catalog, checkpoints, resume

pytestmark = [pytest.mark.e2e, pytest.mark.training]

WITH_EVAL = {"path": str(TINY_DATA), "format": "messages", "evalFraction": 0.2}


def _train(config: Path, tmp: Path, name: str, **env: str) -> tuple[int, Any, str]:
    term = tmp / f"{name}.termination-log"
    log = tmp / f"{name}.log"
    code = run_trainer(config, log, extra_env=env, termination_log=term)
    return code, parse_failure(term.read_text() if term.exists() else ""), log.read_text()


def _result(out: Path) -> dict[str, Any]:
    return json.loads((out / TRAIN_RESULT_FILE).read_text())


def _steps(out: Path) -> list[int]:
    return [c.step for c in checkpoints.complete_checkpoints(checkpoints.checkpoints_root(out))]


def _marker(path: Path) -> dict[str, Any]:
    return json.loads((path / COMPLETE_MARKER).read_text())


def _history(checkpoint: Path) -> dict[str, dict[int, float]]:
    """The losses the Trainer logged up to ``checkpoint`` (its trainer_state.json)."""
    history = json.loads((checkpoint / checkpoints.TRAINER_STATE).read_text())["log_history"]
    return {key: {e["step"]: e[key] for e in history if key in e} for key in ("loss", "eval_loss")}


def test_the_catalog_lists_every_checkpoint_keeps_the_best_and_resume_best_trains_from_it(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Job A saves at 2, 4, 6 and evaluates at 4 (evalSteps 4); it dies right after the save of step 6
    (the fault hook: SIGKILL after the marker), so step 4 is the best by eval loss and older than the
    window of saveTotalLimit 1. Job B, on the same volume with resume: best, trains from step 4."""
    out = tmp_path / "run"
    gate = {"registration": {"gate": {"minImprovement": 0.0}}}
    settings: dict[str, Any] = {"dataset": WITH_EVAL, "maxSteps": 8, "saveSteps": 2, "evalSteps": 4}
    job_a = trainer_config(out, tiny_model, name="a", saveTotalLimit=1, extra_spec=gate, **settings)
    code, _, log = _train(job_a, tmp_path, "a", **{FAULT_ENV: "kill-after-mark:6"})
    assert code == -signal.SIGKILL, log[-3000:]
    assert _steps(out) == [4, 6]  # 2 pruned; 4 kept as the best, 6 as the newest
    status = catalog.status_of(out)
    assert status["bestStep"] == 4 and status["latestStep"] == 6 and status["count"] == 2
    four, six = status["items"]
    logged = _history(out / "checkpoints" / "checkpoint-6")
    assert (
        four["step"] == 4 and four["loss"] == logged["loss"][4] and four["evalLoss"] == logged["eval_loss"][4]
    )
    assert six["step"] == 6 and six["loss"] == logged["loss"][6] and "evalLoss" not in six  # not evaluated
    for item in (four, six):
        assert item["epoch"] > 0 and item["sizeBytes"] > 100_000 and item["time"].endswith("Z")
        assert Path(item["path"]).is_dir()
    # the gate's minImprovement: the base model evaluated once, before the first step, and logged
    base = json.loads((out / catalog.BASE_EVAL_FILE).read_text())
    assert catalog.base_eval_loss(out) == base["eval_loss"] > logged["eval_loss"][4]
    run = json.loads((out / "mlflow-run.json").read_text())
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(tracking_uri=run["tracking_uri"]).get_run(run["run_id"]).data.metrics
    assert metrics["kubetune.base_eval_loss"] == pytest.approx(base["eval_loss"])

    job_b = trainer_config(
        out, tiny_model, name="b", saveTotalLimit=2, extra_spec={"resume": "best", **gate}, **settings
    )
    code, failure, log = _train(job_b, tmp_path, "b")
    assert code == 0 and failure is None, log[-3000:]
    result = _result(out)
    assert result["resumed_from_step"] == 4 and result["resumed_from"].endswith("checkpoint-4")
    assert result["steps_this_attempt"] == 4 and result["global_step"] == 8
    assert 'spec.resume "best": training from checkpoint 4' in log
    # the run's history: A's steps up to 4, then B's 5..8 (A's 5 and 6 were set aside)
    assert [s for s, _ in result["losses"]] == list(range(1, 9))
    assert [tuple(x) for x in result["losses"][:4]] == sorted(logged["loss"].items())[:4]
    # B trained steps 5 and 6 again from checkpoint 4's weights, optimizer and data position: as A did
    assert result["losses"][4][1] == pytest.approx(logged["loss"][5], rel=1e-3)
    # what A saved after step 4 was set aside, then deleted once B saved its first checkpoint
    assert not (out / resume.SUPERSEDED_DIR).exists()
    assert json.loads((out / resume.RESUME_FILE).read_text())["from_step"] == 4
    # resumed from trained weights: the base measurement stands, it is not taken again
    assert json.loads((out / catalog.BASE_EVAL_FILE).read_text()) == base
    final = _marker(out / "final")
    assert final["step"] == 8 and final["eval_loss"] == dict(result["eval_losses"])[8]


def test_a_run_stopped_by_its_budget_evaluates_its_final_model(tmp_path: Path, tiny_model: Path) -> None:
    """The Trainer evaluates at its eval steps and at max_steps; a budget stops it in between, so the
    final model is evaluated on the way out and final/COMPLETE carries that eval loss."""
    out = tmp_path / "run"
    config = trainer_config(
        out,
        tiny_model,
        dataset=WITH_EVAL,
        maxSteps=5000,
        saveSteps=1000,
        evalSteps=1000,
        extra_spec={"budget": {"maxDuration": "12s"}},
    )
    code, failure, log = _train(config, tmp_path, "budget")
    assert code == 0 and failure is None, log[-3000:]
    result = _result(out)
    step = result["budget"]["step"]
    assert 0 < step < 1000
    final = _marker(out / "final")
    assert final["step"] == step and result["eval_losses"] == [[step, final["eval_loss"]]]
    (entry,) = catalog.catalog(out)  # the checkpoint of the stop, saved before the evaluation
    assert entry.step == step and entry.eval_loss is None and entry.loss == result["losses"][-1][1]
    assert catalog.select_for_registration(out, "bestEval") == catalog.Selected(
        out / "final", final["eval_loss"], "final"
    )


def test_resume_a_step_none_and_a_step_that_does_not_exist(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "run"

    def job(name: str, max_steps: int, resume_from: str | None) -> Path:
        extra = {"resume": resume_from} if resume_from else None
        return trainer_config(
            out, tiny_model, name=name, maxSteps=max_steps, saveSteps=2, saveTotalLimit=3, extra_spec=extra
        )

    code, failure, log = _train(job("a", 6, None), tmp_path, "a")
    assert code == 0 and failure is None, log[-3000:]
    assert _steps(out) == [2, 4, 6]
    final_a = _marker(out / "final")

    # a step the volume does not hold: refused, naming the steps there are; nothing moved
    code, failure, log = _train(job("missing", 8, "5"), tmp_path, "missing")
    assert code == EXIT_BAD_INPUT, log[-3000:]
    assert failure is not None and failure.reason == Failure.CHECKPOINT_NOT_FOUND, log[-3000:]
    assert not failure.retryable
    assert "no complete checkpoint of step 5; it has steps 2, 4, 6" in failure.message
    assert _steps(out) == [2, 4, 6] and _marker(out / "final") == final_a
    assert not (out / resume.SUPERSEDED_DIR).exists()

    # resume: "2" trains from step 2 (the finished final model set aside, then replaced)
    code, failure, log = _train(job("two", 6, "2"), tmp_path, "two")
    assert code == 0 and failure is None, log[-3000:]
    result = _result(out)
    assert result["resumed_from_step"] == 2 and result["steps_this_attempt"] == 4
    assert _marker(out / "final")["step"] == 6 and _marker(out / "final") != final_a
    assert not (out / resume.SUPERSEDED_DIR).exists()

    # resume: none starts over (nothing resumed; steps from 1), the old checkpoints gone once it saved
    code, failure, log = _train(job("none", 4, "none"), tmp_path, "none")
    assert code == 0 and failure is None, log[-3000:]
    result = _result(out)
    assert result["resumed_from_step"] is None and result["steps_this_attempt"] == 4
    assert [s for s, _ in result["losses"]] == [1, 2, 3, 4]
    assert _steps(out) == [2, 4] and _marker(out / "final")["step"] == 4
    assert not (out / resume.SUPERSEDED_DIR).exists()
