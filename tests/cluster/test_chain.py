"""A chained job through the real controllers and real pods: job B (LoRA) from job A's trained
LoRA adapter. B waits while A trains, then its preparation and training pods read A's checkpoint
volume (mounted read-only), and B registers a model whose lineage names A.

The tiny model on CPU, as test_real_controllers.py runs it, on both engines.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.cluster.conftest import tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    ENGINES,
    TRAIN_TIMEOUT,
    apply_job,
    explained,
    get,
    job_status,
    on,
    versions,
    wait_phase,
)
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def pod_volumes(cluster: Cluster, ns: str, name: str, engine: str) -> list[dict[str, Any]]:
    """The volumes of the job's training pods, as its engine's object holds them (a TrainJob's in
    the job's own TrainingRuntime)."""
    if engine == "PyTorchJob":
        ptj = get(cluster, "pytorchjob", ns, f"{name}-train")
        return list(ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"])
    runtime = get(cluster, "trainingruntime", ns, f"{name}-train")
    (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
    return list(node["template"]["spec"]["template"]["spec"]["volumes"])


@pytest.mark.parametrize("engine", ENGINES)
def test_b_waits_for_a_then_trains_from_its_adapter(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    with explained(cluster, ns, engine):
        chained(cluster, mlflow_server, ns, engine)


def chained(cluster: Cluster, mlflow_server: MlflowServer, ns: str, engine: str) -> None:
    apply_job(cluster, tiny_job("chain-b", ns, **on(engine), model={"fromJob": {"name": "chain-a"}}))
    apply_job(cluster, tiny_job("chain-a", ns, **on(engine)))

    def waiting() -> dict[str, Any] | None:
        status = job_status(cluster, ns, "chain-b")
        return status if _condition(status, "ParentReady").get("reason") == "WaitingForParent" else None

    status = wait_for(waiting, 60, "chain-b waiting for chain-a", cluster)
    assert status["phase"] == "Pending"
    assert get(cluster, "pvc", ns, "chain-b-ckpt") is None

    a = wait_phase(cluster, ns, "chain-a", "Succeeded")
    b = wait_phase(cluster, ns, "chain-b", "Succeeded", timeout=TRAIN_TIMEOUT)
    assert _condition(b, "ParentReady")["status"] == "True"
    assert b["parent"]["job"] == "chain-a" and b["parent"]["runId"] == a["mlflow"]["runId"]
    assert b["parent"]["modelUri"] == a["registeredModel"]["uri"]
    volumes = pod_volumes(cluster, ns, "chain-b", engine)
    assert {
        "name": "parent",
        "persistentVolumeClaim": {"claimName": "chain-a-ckpt", "readOnly": True},
    } in volumes

    # B's registered version names its parent (lineage tags, written by the trainer)
    [version] = versions(mlflow_server, f"{ns}-chain-b")
    from mlflow.tracking import MlflowClient

    run = MlflowClient(tracking_uri=mlflow_server.uri).get_run(version.run_id)
    tags = {**run.data.tags, **(version.tags or {})}
    assert tags.get("kubetune.parent.job") == "chain-a", tags
