"""``torchrun --nproc_per_node 2`` on the CPU (gloo): one DDP run, one checkpoint set, one MLflow run."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, trainer_config, trainer_env
from tests.support.mlflow_server import free_port

from kubetune_api.trainer_config import COMPLETE_MARKER, MLFLOW_RUN_FILE, TRAIN_RESULT_FILE
from kubetune_trainer import checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def test_torchrun_two_processes_train_with_ddp(tmp_path: Path, tiny_model: Path, mlflow_server: Any) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists() and shutil.which("torchrun") is None:
        pytest.skip("torchrun is not installed")
    out = tmp_path / "run"
    config = trainer_config(
        out, tiny_model, method="lora", tracking_uri=mlflow_server.uri, maxSteps=6, saveSteps=3
    )
    command = [
        str(torchrun if torchrun.exists() else "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "kubetune_trainer.train",
        "--config",
        str(config),
    ]
    proc = subprocess.run(
        command, check=False, cwd=REPO, env=trainer_env(), capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    result = json.loads((out / TRAIN_RESULT_FILE).read_text())
    assert result["world_size"] == 2 and result["global_step"] == 6
    assert result["plan"]["world_size"] == 2
    # One checkpoint set (not one per rank), each checkpoint complete and holding both ranks' RNG state.
    root = checkpoints.checkpoints_root(out)
    listed = checkpoints.list_checkpoints(root)
    assert [(c.step, c.complete) for c in listed] == [(3, True), (6, True)]
    for ckpt in listed:
        assert (ckpt.path / "rng_state_0.pth").is_file() and (ckpt.path / "rng_state_1.pth").is_file()
        assert json.loads((ckpt.path / COMPLETE_MARKER).read_text())["world_size"] == 2
    assert not [p.name for p in out.iterdir() if p.name.startswith("checkpoint-")]
    assert (out / "final" / COMPLETE_MARKER).is_file()

    # One MLflow run: only rank 0 talks to MLflow.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]
    experiment = client.get_run(run_id).info.experiment_id
    runs = client.search_runs([experiment])
    assert [r.info.run_id for r in runs] == [run_id]
    assert runs[0].data.params["kubetune.worldSize"] == "2"
