"""``spec.registration.registryUri``: a model registry apart from the tracking server (issue 33 item 7).

The run and the logged model go to the session's MLflow server (``tests/e2e/conftest.py``); the
model version is created in another store, a sqlite registry, and only there. The preparation's
lookup of ``spec.model.registered`` reads the same registry. No training: the final model is made
as training leaves it (``tests/e2e/test_register_e2e.py``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.test_register_e2e import FAKE_TOKEN, make_final, run_register_process
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.training]

MODEL_NAME = "registry-apart"


def write_config(tmp: Path, base: Path, tracking_uri: str, registry_uri: str) -> Path:
    from kubetune_api.spec import FineTuneJob
    from kubetune_api.trainer_config import resolve

    job = FineTuneJob.model_validate(
        {
            "metadata": {"name": "tiny-registry", "namespace": "team-a", "uid": "uid-registry-1"},
            "spec": {
                "model": {"path": str(base)},
                "dataset": {"path": "/data/tiny-chat.jsonl"},
                "method": "full",
                "training": {"maxSteps": 1, "precision": "fp32"},
                "registration": {"modelName": MODEL_NAME, "alias": "champion", "registryUri": registry_uri},
                "secrets": {"mlflowTrackingToken": {"name": "mlflow", "key": "token"}},
            },
        }
    )
    # the operator's default registry loses to the spec's
    cfg = resolve(
        job,
        default_tracking_uri=tracking_uri,
        default_registry_uri="databricks-uc",
        output_dir=str(tmp / "out"),
    )
    assert cfg.registry_uri == registry_uri
    path = tmp / "config.yaml"
    path.write_text(cfg.to_yaml())
    return path


def versions(tracking_uri: str, registry_uri: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri, registry_uri=registry_uri)
    return list(client.search_model_versions(f"name='{MODEL_NAME}'"))


def test_the_version_is_registered_in_the_registry_apart_from_the_tracking_server(
    tmp_path: Path, tiny_model: Path, mlflow_server: MlflowServer
) -> None:
    from kubetune_api.trainer_config import TrainerConfig
    from kubetune_trainer.sources.chain import ChainError, resolve_registered

    tracking = mlflow_server.uri
    registry = f"sqlite:///{tmp_path / 'registry.db'}"
    config = write_config(tmp_path, tiny_model, tracking, registry)
    make_final(tmp_path / "out", tiny_model, "full")

    done = run_register_process(config, {"MLFLOW_TRACKING_TOKEN": FAKE_TOKEN})
    assert done.returncode == 0, done.stderr[-4000:]
    assert FAKE_TOKEN not in done.stdout + done.stderr

    result = json.loads((tmp_path / "out" / "register-result.json").read_text())
    assert (result["name"], result["version"], result["alias"]) == (MODEL_NAME, "1", "champion")
    in_registry = versions(tracking, registry)
    assert [str(v.version) for v in in_registry] == ["1"]
    assert in_registry[0].run_id == result["run_id"]
    assert len(in_registry[0].tags["kubetune.config_hash"]) == 16  # the lineage goes with it
    # the run (and its logged model) is on the tracking server; no version of it is in its registry
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=tracking).get_run(result["run_id"])
    assert run.data.tags["kubetune.registered_model"] == f"{MODEL_NAME}/1"
    assert versions(tracking, tracking) == []

    # the preparation's lookup of spec.model.registered asks the same registry
    chained = TrainerConfig.load(config)
    chained.spec.model.registered = f"models:/{MODEL_NAME}@champion"
    assert str(resolve_registered(chained).version) == "1"
    on_tracking = chained.model_copy(update={"registry_uri": None})
    with pytest.raises(ChainError, match="has no registered model"):
        resolve_registered(on_tracking)
