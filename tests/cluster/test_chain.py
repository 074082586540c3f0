"""A chained job through the real controllers and real pods: job B (LoRA) from job A's trained
LoRA adapter. B waits while A trains, then its preparation and training pods read A's checkpoint
volume (mounted read-only), and B registers a model whose lineage names A.

The tiny model on CPU, as test_real_controllers.py runs it.
"""

from __future__ import annotations

from typing import Any

from tests.cluster.conftest import tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    TRAIN_TIMEOUT,
    apply_job,
    get,
    job_status,
    versions,
    wait_phase,
)
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess


def _condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == type_), {})


def test_b_waits_for_a_then_trains_from_its_adapter(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    apply_job(cluster, tiny_job("chain-b", ns, model={"fromJob": {"name": "chain-a"}}))
    apply_job(cluster, tiny_job("chain-a", ns))

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
    ptj = get(cluster, "pytorchjob", ns, "chain-b-train")
    volumes = ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["volumes"]
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
