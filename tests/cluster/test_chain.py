"""A chained job through the real controllers and real pods: job B (LoRA) from job A's trained
LoRA adapter. B waits while A trains, then its preparation and training pods read A's checkpoint
volume (mounted read-only), and B registers a model whose lineage names A.

The same chain with preference tuning (issue 34 item 1): DPO with LoRA on the model an SFT job
trained, its reward margin rising in status.progress and MLflow.

The tiny model on CPU, as test_real_controllers.py runs it, on both engines.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kubetune_trainer.tiny_data import preference_pairs, write_jsonl
from tests.cluster.conftest import TESTDATA_DIR, tiny_job, wait_for
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


@pytest.mark.parametrize("engine", ENGINES)
def test_dpo_on_the_model_an_sft_job_trained_raises_the_reward_margin(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """issue 34 item 1: SFT, then DPO with LoRA from its model (fromJob), through the real controllers.
    The pairs are 16 of the tiny ones, evaluated on themselves (a tiny random model learns the pairs it
    has seen, not new ones): the reward margin rises from 0 (the policy is its reference at the first
    step) and reaches status.progress and MLflow."""
    pairs = cluster.image_files[TESTDATA_DIR] / "pairs16"
    for split in ("train", "test"):
        write_jsonl(preference_pairs(16), pairs / f"{split}.jsonl")
    for p in [pairs, *pairs.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o055)
    with explained(cluster, ns, engine):
        dpo = tiny_job(
            "pref-dpo",
            ns,
            **on(engine),
            model={"fromJob": {"name": "pref-sft"}},
            objective="dpo",
            dataset={"path": f"{TESTDATA_DIR}/pairs16", "evalSplit": "test"},
        )
        apply_job(cluster, dpo)
        apply_job(cluster, tiny_job("pref-sft", ns, **on(engine)))
        wait_phase(cluster, ns, "pref-sft", "Succeeded")
        b = wait_phase(cluster, ns, "pref-dpo", "Succeeded", timeout=TRAIN_TIMEOUT)
        assert b["parent"]["job"] == "pref-sft"
        progress = b["progress"]
        assert progress["evalRewardAccuracy"] > 0.5 and progress["evalRewardMargin"] > 0.5, progress

        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=mlflow_server.uri)
        run_id = b["mlflow"]["runId"]
        margins = [
            m.value
            for m in sorted(client.get_metric_history(run_id, "rewards_margins"), key=lambda m: m.step)
        ]
        assert margins and abs(margins[0]) < 1e-6 and max(margins) > 0.5, json.dumps(margins)
        assert versions(mlflow_server, f"{ns}-pref-dpo"), "the DPO model is registered"
