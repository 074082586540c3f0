"""Chained jobs on this machine: ``kubetune run --local`` of a job whose ``spec.model`` is another
job's output (``fromJob``: its run folder beside this one's) or a registered model (``models:/``,
from the local MLflow store the runs share).

The tiny model on the CPU, no network (``HF_HUB_OFFLINE=1``). Proof that a child starts from its
parent's trained weights and not from the base: its first loss is far below the parent's first loss
on the same data, near the parent's last one; the registered versions carry the parent's lineage.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import TINY_DATA, trainer_env

from kubetune_api.trainer_config import REGISTER_RESULT_FILE, START_FILE, TRAIN_RESULT_FILE

pytestmark = [pytest.mark.e2e, pytest.mark.training]

STEPS = 10


def manifest(folder: Path, name: str, model: dict[str, Any], method: str, **registration: Any) -> Path:
    spec: dict[str, Any] = {
        "model": model,
        "dataset": {"path": str(TINY_DATA), "format": "messages", "evalFraction": 0.1, "seed": 42},
        "method": method,
        "training": {
            "maxSteps": STEPS,
            "batchSize": 8,
            "learningRate": 1e-2 if method == "lora" else 2e-3,
            "warmupSteps": 1,
            "weightDecay": 0.0,
            "maxLength": 256,
            "precision": "fp32",
            "loggingSteps": 1,
            "evalSteps": 5,
            "saveSteps": 5,
        },
        "resources": {"gpusPerNode": 0},
        "registration": {"experiment": "kubetune/chain", "modelName": name, **registration},
    }
    if method == "lora":
        spec["lora"] = {"r": 8, "alpha": 32, "dropout": 0.0}
    doc = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": spec,
    }
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def run_local(cwd: Path, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    env = trainer_env()
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "run", str(path), "--local", *extra],
        check=False,
        cwd=cwd,  # run folders: ./runs/<name>
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]


def result(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / TRAIN_RESULT_FILE).read_text()))


def version_tags(tracking_uri: str, run: Path) -> dict[str, str]:
    from mlflow import MlflowClient

    reg = json.loads((run / REGISTER_RESULT_FILE).read_text())
    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
    return dict(client.get_model_version(reg["name"], reg["version"]).tags)


def assert_started_from(parent: dict[str, Any], child: dict[str, Any]) -> None:
    """The child's first loss is the parent's trained level, far below the parent's start."""
    assert child["first_loss"] < 0.6 * parent["first_loss"], (parent, child)
    assert child["first_loss"] < parent["final_loss"] * 1.5, (parent, child)


def test_lora_then_lora_from_job_folder(tmp_path: Path, tiny_model: Path) -> None:
    """Job B (LoRA) from job A's final LoRA adapter: A's adapter merged into the tiny base, a fresh
    adapter trained on the merged weights, the lineage on B's registered version."""
    runs = tmp_path / "runs"
    a = manifest(tmp_path, "chain-a", {"path": str(tiny_model)}, "lora")
    b = manifest(tmp_path, "chain-b", {"fromJob": {"name": "chain-a"}}, "lora")

    missing = run_local(tmp_path, b)  # A has not run yet: refused, naming the field and the folder
    assert missing.returncode == 2, missing.stderr[-3000:]
    assert "spec.model.fromJob.name chain-a" in missing.stderr and str(runs / "chain-a") in missing.stderr

    ok(run_local(tmp_path, a))
    proc = run_local(tmp_path, b)
    ok(proc)
    first_a, first_b = result(runs / "chain-a"), result(runs / "chain-b")
    assert_started_from(first_a, first_b)
    start = json.loads((runs / "chain-b" / START_FILE).read_text())
    assert start["parent"]["job"] == "chain-a" and start["parent"]["method"] == "lora"
    merged = runs / "chain-b" / "prepared" / "model"
    assert (merged / "model.safetensors").is_file() and not (merged / "adapter_config.json").exists()
    assert "started from    FineTuneJob chain-a" in proc.stdout

    tags = version_tags(f"sqlite:///{runs / 'chain-b' / 'mlflow.db'}", runs / "chain-b")
    run_a = json.loads((runs / "chain-a" / "mlflow-run.json").read_text())["run_id"]
    assert tags["kubetune.parent.job"] == "chain-a"
    assert tags["kubetune.parent.run_id"] == run_a
    assert tags["kubetune.parent.model_uri"] == "models:/chain-a/1"
    assert tags["kubetune.parent.checkpoint"] == "final"


def test_full_then_lora_and_registered_alias(tmp_path: Path, tiny_model: Path) -> None:
    """Job F trains full weights and registers them under an alias in a shared local store; job L
    (LoRA) trains from F's folder; job R (LoRA) from ``models:/chain-f@champion`` in that store."""
    runs = tmp_path / "runs"
    (tmp_path / "shared").mkdir()
    store = f"sqlite:///{tmp_path / 'shared' / 'registry.db'}"  # not MLflow's default ./mlflow.db
    f = manifest(tmp_path, "chain-f", {"path": str(tiny_model)}, "full", alias="champion")
    lo = manifest(tmp_path, "chain-l", {"fromJob": {"name": "chain-f", "checkpoint": "bestEval"}}, "lora")
    r = manifest(tmp_path, "chain-r", {"registered": "models:/chain-f@champion"}, "lora")

    ok(run_local(tmp_path, f, "--tracking-uri", store))
    ok(run_local(tmp_path, lo, "--tracking-uri", store))
    parent = result(runs / "chain-f")
    assert_started_from(parent, result(runs / "chain-l"))
    start = json.loads((runs / "chain-l" / START_FILE).read_text())
    assert start["parent"]["method"] == "full"
    # a LoRA child keeps its starting model on its own volume (its registration's base, its children's)
    assert (runs / "chain-l" / "prepared" / "model" / "config.json").is_file()

    # the registered alias: not in this run's own store (a clear refusal), then from the shared one
    own = run_local(tmp_path, r)
    assert own.returncode == 2, own.stderr[-3000:]
    assert "spec.model.registered models:/chain-f@champion" in own.stderr and "--tracking-uri" in own.stderr
    ok(run_local(tmp_path, r, "--tracking-uri", store))
    assert_started_from(parent, result(runs / "chain-r"))
    tags = version_tags(store, runs / "chain-r")
    assert tags["kubetune.parent.model_uri"] == "models:/chain-f/1"
    assert tags["kubetune.parent.version"] == "1"
    assert tags["kubetune.parent.registered"] == "models:/chain-f@champion"
    assert (
        tags["kubetune.parent.run_id"]
        == json.loads((runs / "chain-f" / "mlflow-run.json").read_text())["run_id"]
    )
    report = json.loads((runs / "chain-r" / "prepared" / "report.json").read_text())
    assert report["modelRevision"] == "models:/chain-f/1"
