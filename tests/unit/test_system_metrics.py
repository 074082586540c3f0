"""MLflow's system metrics of a training run (kubetune_trainer.mlflow.system) against a real MLflow
store (sqlite): a refused write drops one point and the next ones still come; stopping ends the
thread and logs a last point; a restarted attempt's points go on after the last step.

A whole training run with the metrics read back from the MLflow server: tests/e2e/test_train.py.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.slow  # MLflow's store (its migrations) and a sampling thread

CPU = "system/cpu_utilization_percentage"
MEMORY = "system/system_memory_usage_megabytes"


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, str, str]:
    from mlflow.tracking import MlflowClient

    for name in ("MLFLOW_SYSTEM_METRICS_SAMPLES_BEFORE_LOGGING", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "0.05")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment_id = client.create_experiment("system", artifact_location=(tmp_path / "a").as_uri())
    return client, uri, client.create_run(experiment_id).info.run_id


def _steps(client: Any, run_id: str, key: str) -> list[int]:
    return [m.step for m in client.get_metric_history(run_id, key)]


def _wait_for_points(client: Any, run_id: str, count: int) -> None:
    deadline = time.monotonic() + 30
    while len(_steps(client, run_id, MEMORY)) < count:
        assert time.monotonic() < deadline, _steps(client, run_id, MEMORY)
        time.sleep(0.05)


def _threads() -> list[str]:
    from kubetune_trainer.mlflow.system import THREAD_NAME

    return [t.name for t in threading.enumerate() if t.name == THREAD_NAME]


def test_a_refused_write_drops_one_point_and_the_metrics_go_on(
    run: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    from kubetune_trainer.mlflow import system

    client, uri, run_id = run
    monkeypatch.setattr(system, "RETRY_AFTER_S", 0.3)
    log_batch = MlflowClient.log_batch
    refused: list[str] = []

    def refuse_the_first(self: Any, run_id: str, metrics: Any = (), *args: Any, **kwargs: Any) -> Any:
        if not refused:
            refused.append(run_id)
            raise MlflowException("the server said no (injected)")
        return log_batch(self, run_id, metrics, *args, **kwargs)

    monkeypatch.setattr(MlflowClient, "log_batch", refuse_the_first)
    metrics = system.SystemMetrics.start(run_id, uri, resume=False)
    assert metrics is not None and _threads() == [system.THREAD_NAME]
    _wait_for_points(client, run_id, 3)
    metrics.stop()

    assert refused == [run_id] and metrics.failed
    assert _threads() == []  # stopped with the run
    steps = _steps(client, run_id, MEMORY)
    # the refused point took no step; the last one was logged by stop(), after the thread ended
    assert steps == list(range(len(steps))) and len(steps) >= 3
    assert _steps(client, run_id, MEMORY) == steps  # nothing after stop()
    values = client.get_run(run_id).data.metrics
    assert 0 <= values[CPU] <= 100 and values[MEMORY] > 0


def test_a_restarted_attempt_goes_on_after_the_last_step_and_a_short_one_logs_a_point(
    run: tuple[Any, str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetune_trainer.mlflow import system

    client, uri, run_id = run
    first = system.SystemMetrics.start(run_id, uri, resume=False)
    assert first is not None
    _wait_for_points(client, run_id, 2)
    first.stop()
    logged = _steps(client, run_id, MEMORY)

    # an attempt shorter than one sampling interval: stop() still logs its point
    monkeypatch.setenv("MLFLOW_SYSTEM_METRICS_SAMPLING_INTERVAL", "3600")
    second = system.SystemMetrics.start(run_id, uri, resume=True)
    assert second is not None
    second.stop()
    assert _steps(client, run_id, MEMORY) == [*logged, logged[-1] + 1]
    assert _steps(client, run_id, CPU)[-1] == logged[-1] + 1
    assert _threads() == []
