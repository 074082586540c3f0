"""``spec.model.registered`` in the cluster's preparation step, against a real MLflow server.

The preparation command (``python -m kubetune_trainer.prepare``, the preparation Job's) resolves
``models:/<name>@<alias>`` to a version once, downloads its model files onto the volume and records
the version; a later preparation keeps that version after the alias moved; an alias that does not
exist is refused with ``ModelNotFound`` naming the field. No training: the versions are the tiny
model logged with MLflow's transformers flavour, as registration logs a merged model.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, trainer_config, trainer_env

from kubetune_api.trainer_config import START_FILE, TrainerConfig

pytestmark = [pytest.mark.e2e]


def register_tiny(server: Any, model_dir: Path, name: str, alias: str, seed_shift: float) -> str:
    """Log the tiny model (its weights shifted by ``seed_shift``, so versions differ) and register it."""
    import mlflow
    import torch
    from mlflow import MlflowClient
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kubetune_trainer.registration.register import pip_requirements

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.norm.weight.add_(seed_shift)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    mlflow.set_tracking_uri(server.uri)
    mlflow.set_experiment("chain-registered")
    with mlflow.start_run():
        info = mlflow.transformers.log_model(
            transformers_model={"model": model, "tokenizer": tokenizer},
            name="model",
            task="llm/v1/chat",
            pip_requirements=pip_requirements(peft=False),  # as registration logs it
        )
    version = mlflow.register_model(info.model_uri, name)
    MlflowClient(server.uri).set_registered_model_alias(name, alias, version.version)
    return str(version.version)


def prepare(config: Path, tmp_path: Path) -> tuple[int, str, str]:
    term = tmp_path / "termination-log"
    env = {**trainer_env(), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetune_trainer.prepare",
            "--config",
            str(config),
            "--termination-log",
            str(term),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return proc.returncode, proc.stderr, term.read_text() if term.exists() else ""


def registered_config(tmp_path: Path, model: Path, server: Any, uri: str) -> Path:
    path = trainer_config(tmp_path / "out", model, method="lora", tracking_uri=server.uri, name="child")
    data = json.loads(json.dumps(TrainerConfig.load(path).wire()))
    data["spec"]["model"] = {"registered": uri}
    path.write_text(TrainerConfig.model_validate(data).to_yaml())
    return path


def test_preparation_resolves_an_alias_once_and_downloads_the_version(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    import torch
    from safetensors.torch import load_file

    name = f"chain-reg-{os.getpid()}"
    first = register_tiny(mlflow_server, tiny_model, name, "champion", 0.5)
    config = registered_config(tmp_path, tiny_model, mlflow_server, f"models:/{name}@champion")

    code, err, term = prepare(config, tmp_path)
    assert code == 0, err[-4000:]
    out = tmp_path / "out"
    start = json.loads((out / START_FILE).read_text())
    assert start["parent"]["modelUri"] == f"models:/{name}/{first}"
    assert start["parent"]["runId"]
    assert json.loads(term)["report"]["modelRevision"] == f"models:/{name}/{first}"
    weights = load_file(str(out / "prepared" / "model" / "model.safetensors"))
    base = load_file(str(tiny_model / "model.safetensors"))
    assert torch.allclose(weights["model.norm.weight"], base["model.norm.weight"] + 0.5)
    assert (out / "prepared" / "model" / "tokenizer.json").is_file()
    hash_v1 = TrainerConfig.load(config).training_hash()

    # the alias moves on: this job keeps the version it resolved (its checkpoints stay its own)
    register_tiny(mlflow_server, tiny_model, name, "champion", 1.0)
    code, err, _ = prepare(config, tmp_path)
    assert code == 0, err[-4000:]
    assert json.loads((out / START_FILE).read_text())["parent"]["modelUri"] == f"models:/{name}/{first}"
    assert TrainerConfig.load(config).training_hash() == hash_v1


def test_an_alias_that_does_not_exist_is_refused_naming_the_field(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    name = f"chain-missing-{os.getpid()}"
    register_tiny(mlflow_server, tiny_model, name, "champion", 0.0)
    config = registered_config(tmp_path, tiny_model, mlflow_server, f"models:/{name}@nosuchalias")
    code, err, term = prepare(config, tmp_path)
    assert code == 2, err[-4000:]
    refusal = json.loads(term)["refusal"]
    assert refusal["reason"] == "ModelNotFound"
    assert f"spec.model.registered models:/{name}@nosuchalias" in refusal["message"]
    assert "alias 'nosuchalias'" in refusal["message"]
    assert not (tmp_path / "out" / START_FILE).exists()
