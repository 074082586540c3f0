"""Progress into the FineTuneJob status: the payload, throttling, and never failing training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune_api.status import Progress
from kubetune_trainer.training.progress import ProgressReporter, ProgressState


def test_status_payload_uses_the_api_field_names() -> None:
    state = ProgressState(total_steps=200)
    state.update(step=1, epoch=0.0, now=2.0, start=0.0)
    state.update(step=50, epoch=0.25, now=100.0, start=0.0)
    state.loss, state.eval_loss, state.tokens_per_second = 1.5, 1.7, 12345.678
    state.checkpoint_latest, state.checkpoint_step, state.checkpoint_count = "/ckpt/checkpoint-50", 50, 1
    status = state.as_status()
    progress = status["progress"]
    assert progress["step"] == 50 and progress["totalSteps"] == 200 and progress["percent"] == 25
    assert progress["etaSeconds"] == 300  # 150 steps left at 2 s per step
    assert progress["tokensPerSecond"] == 12345.7 and progress["evalLoss"] == 1.7
    assert progress["updatedAt"].endswith("Z")
    assert status["checkpoints"] == {"latest": "/ckpt/checkpoint-50", "latestStep": 50, "count": 1}
    # Every key is a field of the API's Progress model (strict: unknown fields are refused).
    Progress.model_validate(progress)


def test_eta_after_a_resume_counts_only_this_attempts_steps() -> None:
    state = ProgressState(total_steps=100)
    state.update(step=61, epoch=None, now=0.0, start=0.0)  # resumed from checkpoint 60
    state.update(step=70, epoch=None, now=20.0, start=0.0)  # 10 steps in 20 s
    assert state.eta_seconds == 60


def test_reports_are_throttled_but_checkpoints_always_go_out() -> None:
    sent: list[dict[str, Any]] = []
    reporter = ProgressReporter(sent.append, total_steps=10, min_interval_s=3600)
    for step in range(1, 6):
        reporter.on_step(step, None)
    assert len(sent) == 1  # the first one, then nothing for an hour
    reporter.on_checkpoint(Path("/c/checkpoint-5"), 5, 1)
    assert len(sent) == 2 and sent[-1]["checkpoints"]["latestStep"] == 5


def test_an_api_error_never_reaches_training() -> None:
    calls = []

    def broken(status: dict[str, Any]) -> None:
        calls.append(status)
        raise RuntimeError("403 Forbidden")

    reporter = ProgressReporter(broken, total_steps=10, min_interval_s=0)
    reporter.on_step(1, 0.1)
    reporter.on_step(2, 0.2)
    assert len(calls) == 2 and reporter.sent == 0


def test_without_a_patcher_it_is_a_no_op() -> None:
    reporter = ProgressReporter(None, total_steps=10)
    reporter.on_step(1, None)
    assert not reporter.enabled and reporter.report(force=True) is False


def test_the_mlflow_run_goes_into_the_status_once_it_exists(tmp_path: Path, monkeypatch: Any) -> None:
    from kubetune_api.status import MlflowStatus
    from kubetune_api.trainer_config import load_manifest, resolve
    from kubetune_trainer.mlflow.tracking import MlflowTracker

    repo = Path(__file__).resolve().parents[2]
    cfg = resolve(load_manifest(repo / "examples" / "tiny-local.yaml"), output_dir=str(tmp_path))
    from kubetune_trainer.mlflow import tracking

    for name in tracking._FAST_FAIL_ENV:  # the tracker sets these; put back after the test
        monkeypatch.delenv(name, raising=False)
    # a password with an "@" in it: all of the user information goes
    tracker = MlflowTracker(cfg, tmp_path, tracking_uri="https://bob:hunt@r2@mlflow.example.com")
    sent: list[dict[str, Any]] = []
    reporter = ProgressReporter(sent.append, total_steps=10, min_interval_s=0, mlflow=tracker.status)
    reporter.on_step(1, None)
    assert "mlflow" not in sent[-1]  # MLflow down at the start: no run yet, training goes on
    tracker.run_id, tracker.experiment_id = "abc123", "7"
    reporter.on_step(2, None)
    assert sent[-1]["mlflow"] == {
        "trackingUri": "https://mlflow.example.com",  # the credentials dropped
        "experimentId": "7",
        "runId": "abc123",
        "runUrl": "https://mlflow.example.com/#/experiments/7/runs/abc123",  # the run in the MLflow UI
    }
    MlflowStatus.model_validate(sent[-1]["mlflow"])  # the API's field names
    assert "bob" not in str(sent) and "hunt" not in str(sent)


def test_a_non_finite_loss_clears_the_field_instead_of_losing_the_update() -> None:
    """JSON has no NaN: with one in it the API server refused the whole merge patch (seen: 400
    "invalid JSON patch"), so the step, ETA and checkpoint went stale with the last finite loss."""
    import json

    state = ProgressState(total_steps=10)
    state.update(step=3, epoch=0.3, now=3.0, start=0.0)
    state.loss, state.eval_loss = float("nan"), float("inf")
    status = state.as_status()
    body = json.dumps(status, allow_nan=False)  # raises if a NaN or infinity were left in
    assert json.loads(body)["progress"]["loss"] is None  # a merge patch's null removes the old value
    assert json.loads(body)["progress"]["evalLoss"] is None
    assert status["progress"]["step"] == 3


def test_the_status_shows_losses_to_four_significant_digits() -> None:
    """``kubectl get finetunejobs`` prints status.progress.loss as it is: 7.279966831207275 read as
    noise. The status shows four significant digits, as the trainer's log does; MLflow keeps the
    exact values."""
    state = ProgressState(total_steps=10)
    state.update(step=3, epoch=0.3, now=3.0, start=0.0)
    state.loss, state.eval_loss, state.base_eval_loss = 7.279966831207275, 0.0123456, 1543.21
    progress = state.as_status()["progress"]
    assert (progress["loss"], progress["evalLoss"], progress["baseEvalLoss"]) == (7.28, 0.01235, 1543.0)
