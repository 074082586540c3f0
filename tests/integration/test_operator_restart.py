"""The operator survives its own death at any point, and never takes over a stranger's object."""

from __future__ import annotations

import json
import urllib.request
import uuid
from typing import Any

import pytest
from tests.integration.conftest import (
    API_VERSION,
    QWEN3_REGISTRATION_RESULT,
    OperatorProcess,
    condition,
    events_for,
    finish_registration_job,
    get_job,
    kopf_runner,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.integration.test_operator_children import children_by_kind

from kubetune_api.spec import parse_job
from kubetune_operator import builders
from kubetune_operator.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

RESULT = QWEN3_REGISTRATION_RESULT


def _exactly_one_of_each(kube: Any, ns: str, name: str, *, registration: bool) -> None:
    assert children_by_kind(kube, ns, name) == {
        "PersistentVolumeClaim": [f"{name}-ckpt"],
        "ConfigMap": [f"{name}-config"],
        "PyTorchJob": [f"{name}-train"],
        "Job": [f"{name}-register"] if registration else [],
    }
    for kind, api_version in (
        ("ServiceAccount", "v1"),
        ("Role", "rbac.authorization.k8s.io/v1"),
        ("RoleBinding", "rbac.authorization.k8s.io/v1"),
    ):
        items = kube.list(api_version, kind, ns, f"{builders.LABEL_JOB}={name}")
        assert [i["metadata"]["name"] for i in items] == [f"{name}-trainer"], kind


# The operator's creation order; each stage is "the operator died right after creating these".
STAGES = {
    "after-pvc": ["ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim"],
    "after-config": ["ServiceAccount", "Role", "RoleBinding", "PersistentVolumeClaim", "ConfigMap"],
    "after-pytorchjob": [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "ConfigMap",
        "PyTorchJob",
    ],
    "after-registration-job": [
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "PersistentVolumeClaim",
        "ConfigMap",
        "PyTorchJob",
        "Job",
    ],
}


@pytest.mark.parametrize("stage", list(STAGES))
def test_restart_after_each_child(
    kube: Any, namespace: str, operator_env: dict[str, str], stage: str
) -> None:
    """What a killed operator leaves behind (children made exactly as it makes them, with the
    job's uid) is adopted by the next one: no duplicates, and the job still completes."""
    doc = load_example("qwen3-4b-full.yaml", namespace)
    kube.create(doc)
    name = doc["metadata"]["name"]
    job = parse_job(get_job(kube, namespace, name))
    ptj_name = f"{name}-train"
    for child in builders.build_children(job, Settings.from_env()):
        if child["kind"] in STAGES[stage]:
            kube.create(child)
    if stage == "after-registration-job":
        set_pytorchjob_condition(kube, namespace, ptj_name, "Succeeded")

    with kopf_runner(namespace):
        if stage == "after-registration-job":
            wait_phase(kube, namespace, name, "Registering")
        else:
            wait_phase(kube, namespace, name, "Pending")
            _exactly_one_of_each(kube, namespace, name, registration=False)
            set_pytorchjob_condition(kube, namespace, ptj_name, "Running")
            wait_phase(kube, namespace, name, "Training")
            set_pytorchjob_condition(kube, namespace, ptj_name, "Succeeded")
            wait_phase(kube, namespace, name, "Registering")
        wait_for(
            lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job"
        )
        finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
        obj = wait_phase(kube, namespace, name, "Succeeded")
    assert obj["status"]["registeredModel"]["version"] == "1"
    _exactly_one_of_each(kube, namespace, name, registration=True)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def test_kill_operator_process_midflight(
    kube: Any, namespace: str, operator_process: OperatorProcess
) -> None:
    """SIGKILL the real operator process at every phase; each restart picks up where it was."""
    doc = load_example("qwen3-4b-full.yaml", namespace)
    name = doc["metadata"]["name"]
    ptj = f"{name}-train"

    operator_process.start()
    kube.create(doc)
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), timeout=60, what="the PyTorchJob"
    )
    operator_process.kill()

    set_pytorchjob_condition(kube, namespace, ptj, "Running")  # while no operator runs
    operator_process.start()
    wait_phase(kube, namespace, name, "Training", timeout=60)
    operator_process.kill()

    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    operator_process.start()
    wait_phase(kube, namespace, name, "Registering", timeout=60)
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job")
    operator_process.kill()

    finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    operator_process.start()
    obj = wait_phase(kube, namespace, name, "Succeeded", timeout=60)
    assert obj["status"]["registeredModel"]["name"] == "qwen3_4b_assistant"
    _exactly_one_of_each(kube, namespace, name, registration=True)
    # kopf keeps its bookkeeping under our group, in annotations, never in the status.
    annotations = obj["metadata"].get("annotations") or {}
    assert any(k.startswith("kubetune.io/") for k in annotations), annotations
    assert not any(k.startswith("kopf.zalando.org") for k in annotations), annotations
    assert obj["metadata"]["finalizers"] == ["kubetune.io/finalizer"]
    assert "kopf" not in obj["status"]


def test_foreign_child_is_reported_and_not_overwritten(kube: Any, namespace: str, operator: Any) -> None:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    name = doc["metadata"]["name"]
    foreign = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{name}-config",
            "namespace": namespace,
            "ownerReferences": [
                {
                    "apiVersion": API_VERSION,
                    "kind": "FineTuneJob",
                    "name": "another-job",
                    "uid": str(uuid.uuid4()),
                }
            ],
        },
        "data": {"config.yaml": "not ours"},
    }
    kube.create(foreign)
    kube.create(doc)

    def conflict_reported() -> dict[str, Any] | None:
        obj = get_job(kube, namespace, name)
        try:
            c = condition(obj, "ChildrenReady")
        except AssertionError:
            return None
        return c if c["reason"] == "ChildConflict" else None

    c = wait_for(conflict_reported, what="a ChildConflict condition")
    assert c["status"] == "False"
    assert f"ConfigMap {name}-config already exists" in c["message"]
    assert "FineTuneJob/another-job" in c["message"]
    assert get_job(kube, namespace, name)["status"]["phase"] == "Pending"
    assert kube.get("v1", "ConfigMap", namespace, f"{name}-config")["data"] == {"config.yaml": "not ours"}
    # Nothing that would use the stranger's config is created.
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train") is None
    wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "ChildConflict"],
        what="a ChildConflict event",
    )

    # Once the stranger's object is gone, the operator carries on by itself.
    kube.request("DELETE", f"/api/v1/namespaces/{namespace}/configmaps/{name}-config")
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"), what="the PyTorchJob"
    )
    obj = wait_for(
        lambda: (
            (o := get_job(kube, namespace, name)) and condition(o, "ChildrenReady")["status"] == "True" and o
        ),
        what="ChildrenReady",
    )
    assert condition(obj, "ChildrenReady")["reason"] == "ChildrenCreated"
    cm = kube.get("v1", "ConfigMap", namespace, f"{name}-config")
    assert cm["metadata"]["ownerReferences"][0]["uid"] == obj["metadata"]["uid"]
