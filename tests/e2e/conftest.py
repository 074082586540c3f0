"""Fixtures for the trainer's end-to-end tests: the tiny model, trainer configs, an MLflow server.

Everything is local: the tiny Qwen2 model is built once per session from the shipped data, and the
MLflow server is a real ``mlflow server`` process on 127.0.0.1 (tests/support/mlflow_server.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.trainer_config import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
TINY_DATA = REPO / "examples" / "data" / "tiny-chat.jsonl"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubetune_trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_DATA)


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from tests.support.mlflow_server import running_mlflow_server

    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


def trainer_config(
    output_dir: Path,
    model: Path,
    *,
    method: str = "full",
    tracking_uri: str | None = None,
    experiment: str | None = None,
    name: str = "tiny-test",
    uid: str | None = None,
    dataset: dict[str, Any] | None = None,
    extra_spec: dict[str, Any] | None = None,
    **training: Any,
) -> Path:
    """Write a small, fast trainer config and return its path (output_dir/config.yaml)."""
    train = {
        "maxSteps": 8,
        "batchSize": 4,
        "gradientAccumulationSteps": 1,
        "learningRate": 3e-3,
        "maxLength": 128,
        "loggingSteps": 1,
        "saveSteps": 4,
        "saveTotalLimit": 2,
        "warmupSteps": 1,
        "weightDecay": 0.0,
    }
    train.update(training)
    spec: dict[str, Any] = {
        "model": {"path": str(model)},
        "dataset": dataset or {"path": str(TINY_DATA), "format": "messages"},
        "method": method,
        "training": train,
    }
    if method == "lora":
        spec["lora"] = {"r": 16, "alpha": 32, "dropout": 0.0}
    spec.update(extra_spec or {})
    cfg = TrainerConfig.model_validate(
        {
            "job": {"name": name, "namespace": "default", "uid": uid or str(uuid.uuid4())},
            "spec": spec,
            "outputDir": str(output_dir),
            "trackingUri": tracking_uri,
            "experiment": experiment or f"test/{uuid.uuid4().hex[:8]}",
            "registeredModelName": name,
        }
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir.parent / f"{output_dir.name}-config.yaml"
    path.write_text(cfg.to_yaml())
    return path


def trainer_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    # Two cores, shared: one thread per process keeps two-process runs from thrashing.
    env.setdefault("OMP_NUM_THREADS", "1")
    for name in ("MLFLOW_TRACKING_URI", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def start_trainer(
    config: Path,
    log: Path,
    *,
    extra_env: dict[str, str] | None = None,
    termination_log: Path | None = None,
) -> subprocess.Popen[bytes]:
    """``python -m kubetune_trainer.train --config ...`` as its own process, output to ``log``;
    ``termination_log``: its ``--termination-log`` (the pod's report, never from the environment)."""
    env = {**trainer_env(), **(extra_env or {})}
    report = ["--termination-log", str(termination_log)] if termination_log is not None else []
    with log.open("ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "kubetune_trainer.train", "--config", str(config), *report],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def run_trainer(
    config: Path,
    log: Path,
    *,
    timeout: float = 300,
    extra_env: dict[str, str] | None = None,
    termination_log: Path | None = None,
) -> int:
    return wait_or_kill(
        start_trainer(config, log, extra_env=extra_env, termination_log=termination_log), timeout
    )


def wait_or_kill(proc: subprocess.Popen[bytes], timeout: float) -> int:
    """The process's exit code; killed (and reaped) if it outlives ``timeout`` or the test fails."""
    try:
        return proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
