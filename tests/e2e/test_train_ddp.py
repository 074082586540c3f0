"""torchrun on the CPU (gloo): LoRA on 2 and full fine-tuning on 8 processes (DDP), preempted and resumed.

The trainer pod's command is ``python -m kubetune_trainer.launch <torchrun args>`` (torchrun in
process, with a retryable exit code and a longer shutdown grace on SIGTERM). Here it runs
``--nproc_per_node 2``, gets SIGTERM mid-run like a preempted pod, exits 143 with a complete
checkpoint, and the restart finishes: one checkpoint set, one MLflow run, both ranks' state saved.
"""

from __future__ import annotations

import json
import math
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, trainer_config, trainer_env, wait_or_kill
from tests.support.mlflow_server import free_port

from kubetune_api.trainer_config import COMPLETE_MARKER, EXIT_PREEMPTED, MLFLOW_RUN_FILE, TRAIN_RESULT_FILE
from kubetune_trainer.volume import checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _launch(
    config: Path, log: Path, nproc: int, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable,
        "-m",
        "kubetune_trainer.launch",
        "--nproc_per_node",
        str(nproc),
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        "-m",
        "kubetune_trainer.train",
        "--config",
        str(config),
    ]
    with log.open("ab") as out:
        return subprocess.Popen(
            command, cwd=REPO, env={**trainer_env(), **(env or {})}, stdout=out, stderr=subprocess.STDOUT
        )


@pytest.mark.parametrize(
    ("method", "sharding", "nproc"),
    [
        # with data-loader workers, as on GPUs: torchrun's SIGTERM reaches them too (they ignore it)
        ("lora", "ddp", 2),
        # the process count of one 8-GPU node (notebook A's machine): every rank's state saved and resumed.
        # FSDP2 is GPU-only in accelerate, so full fine-tuning runs DDP here (the plan says so).
        ("full", "ddp", 8),
    ],
)
def test_torchrun_preempted_and_resumed(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any, method: str, sharding: str, nproc: int
) -> None:
    out = tmp_path / "run"
    log = tmp_path / "train.log"
    config = trainer_config(
        out, tiny_model, method=method, tracking_uri=mlflow_server.uri, maxSteps=12, saveSteps=6
    )
    root = checkpoints.checkpoints_root(out)

    # the LoRA run loads its data in two worker processes per rank, as the GPU plan does
    workers = {"KUBETUNE_DATALOADER_WORKERS": "2"} if method == "lora" else {}
    proc = _launch(config, log, nproc, workers)
    deadline = time.monotonic() + 600
    while "'loss'" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)  # what the kubelet does to the pod's first process
    code = wait_or_kill(proc, 600)
    assert code == EXIT_PREEMPTED, log.read_text()[-4000:]
    first = json.loads((out / TRAIN_RESULT_FILE).read_text())
    assert first["status"] == "preempted" and first["world_size"] == nproc
    step = first["preempted_at_step"]
    saved = checkpoints.latest_complete(root)
    assert saved is not None and saved.step == step
    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]

    code = wait_or_kill(_launch(config, log, nproc, workers), 600)
    assert code == 0, log.read_text()[-4000:]
    result = json.loads((out / TRAIN_RESULT_FILE).read_text())
    assert result["world_size"] == nproc and result["global_step"] == 12
    assert result["resumed_from_step"] == step and result["mlflow_run_id"] == run_id
    assert result["plan"]["sharding"] == sharding, result["plan"]["reasons"]
    assert result["plan"]["dataloader_workers"] == (2 if workers else 0), result["plan"]["reasons"]
    # packed rows: each micro-step's rows dealt across the ranks by their work
    assert f"packed rows dealt across {nproc} ranks" in log.read_text()
    # the resumed (sharded) state trains on: a finite loss below the first one
    assert math.isfinite(result["final_loss"]) and result["final_loss"] < result["first_loss"], result[
        "losses"
    ]

    # One checkpoint set (not one per rank), each complete and holding every rank's RNG state.
    listed = checkpoints.list_checkpoints(root)
    assert [c.step for c in listed][-1] == 12 and all(c.complete for c in listed) and len(listed) <= 2
    for ckpt in listed:
        assert all((ckpt.path / f"rng_state_{rank}.pth").is_file() for rank in range(nproc))
        assert json.loads((ckpt.path / COMPLETE_MARKER).read_text())["world_size"] == nproc
    assert (out / "final" / COMPLETE_MARKER).is_file()

    # One MLflow run across both attempts and both ranks: only rank 0 talks to MLflow.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert [r.info.run_id for r in client.search_runs([run.info.experiment_id])] == [run_id]
    assert run.data.params["kubetune.worldSize"] == str(nproc)
