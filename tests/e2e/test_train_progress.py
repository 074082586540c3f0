"""Progress reports reach a real FineTuneJob status (kube-apiserver with our CRD) and keep the rest.

The structural CRD schema prunes unknown fields silently, so reading the object back proves that
every field the trainer sends is one the API knows; the merge patch must leave the operator's
phase alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kubetune_api.spec import GROUP, PLURAL, VERSION
from kubetune_trainer.training.progress import ProgressReporter, status_patcher

pytestmark = [pytest.mark.e2e, pytest.mark.integration]


def _job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "FineTuneJob",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "Qwen/Qwen2-0.5B"},
            "dataset": {"name": "trl-lib/Capybara"},
            "training": {"maxSteps": 100},
        },
    }


def test_progress_and_checkpoints_land_in_the_status(api_client: Any, namespace: str) -> None:
    from kubernetes import client

    api = client.CustomObjectsApi(api_client)
    api.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, _job("progress"))
    # The operator owns the phase; the trainer must not erase it.
    api.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "progress", {"status": {"phase": "Training"}}
    )

    run = {"trackingUri": "http://mlflow.ml:5000", "experimentId": "7", "runId": "0123abcd"}
    reporter = ProgressReporter(
        status_patcher(api_client, namespace, "progress"), total_steps=100, mlflow=lambda: run
    )
    reporter.state.loss, reporter.state.tokens_per_second = 1.25, 4321.0
    reporter.state.base_eval_loss = 2.5  # measured before the first step (registration.gate)
    reporter.on_step(40, 0.4)
    reporter.on_log({"eval_loss": 1.5}, None)
    reporter.on_checkpoint(Path("/var/lib/kubetune/checkpoints/checkpoint-40"), 40, 2)
    assert reporter.sent == 2

    obj: Any = api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "progress")
    status = obj["status"]
    assert status["phase"] == "Training"
    progress = status["progress"]
    assert progress["step"] == 40 and progress["totalSteps"] == 100 and progress["percent"] == 40
    assert progress["loss"] == 1.25 and progress["evalLoss"] == 1.5 and progress["tokensPerSecond"] == 4321.0
    assert progress["epoch"] == 0.4 and "etaSeconds" in progress and progress["updatedAt"].endswith("Z")
    assert progress["baseEvalLoss"] == 2.5  # kept by the schema (status.evaluation is the operator's)
    assert status["checkpoints"] == {
        "latest": "/var/lib/kubetune/checkpoints/checkpoint-40",
        "latestStep": 40,
        "count": 2,
    }
    assert status["mlflow"] == run  # kept by the schema: the run is in the status during training


def test_a_missing_job_does_not_fail_training(api_client: Any, namespace: str) -> None:
    reporter = ProgressReporter(
        status_patcher(api_client, namespace, "gone"), total_steps=10, min_interval_s=0
    )
    reporter.on_step(1, None)  # 404: logged, swallowed
    assert reporter.sent == 0
