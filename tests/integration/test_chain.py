"""Chained jobs (spec.model.fromJob) against the real API server and the operator: the child waits
for its parent (creating nothing), starts from it once it Succeeded (its pods mount the parent's
checkpoint volume read-only, its trainer config names the parent's model), and fails with the
parent's reason, when the parent is deleted after it was seen, or in a cycle.

The test plays the Training Operator and the Job controller for the parent, as
test_operator_flow.py does; the parent is a real FineTuneJob the operator reconciles.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import yaml
from tests.integration.conftest import (
    API_VERSION,
    condition,
    events_for,
    finish_registration_job,
    get_job,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.integration]

PARENT_MOUNT = "/var/lib/kubetune-parent"
RESULT = {"name": "chain_a", "version": "2", "uri": "models:/chain_a/2", "run_id": "a1b2c3"}


def _job(namespace: str, name: str, *, parent: str | None = None, register: bool = True) -> dict[str, Any]:
    doc = copy.deepcopy(load_example("qwen3-4b-full.yaml", namespace))
    doc["metadata"]["name"] = name
    doc["spec"]["registration"] = {"modelName": name.replace("-", "_"), "enabled": register}
    if parent is not None:
        doc["spec"]["model"] = {"fromJob": {"name": parent}}
        doc["spec"]["method"] = "lora"
    return doc


def _parent_ready(obj: dict[str, Any]) -> dict[str, Any]:
    return condition(obj, "ParentReady")


def _waiting(kube: Any, namespace: str, name: str, says: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get_job(kube, namespace, name)
        try:
            c = _parent_ready(obj)
        except AssertionError:
            return None
        return obj if c["reason"] == "WaitingForParent" and says in c["message"] else None

    result: dict[str, Any] = wait_for(check, what=f"{name} waiting ({says})")
    return result


def _with_parent(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    """The job once its status records the parent it started from (the folder: written after its
    children are created; while it waits, only the parent's name and uid are)."""

    def check() -> dict[str, Any] | None:
        obj = get_job(kube, namespace, name)
        return obj if ((obj.get("status") or {}).get("parent") or {}).get("path") else None

    result: dict[str, Any] = wait_for(check, what=f"{name}'s status.parent")
    return result


def _no_children(kube: Any, namespace: str, name: str) -> None:
    assert kube.get("v1", "PersistentVolumeClaim", namespace, f"{name}-ckpt") is None
    assert kube.get("v1", "ConfigMap", namespace, f"{name}-config") is None
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train") is None
    assert kube.get("batch/v1", "Job", namespace, f"{name}-prepare") is None


def _train(kube: Any, namespace: str, name: str, outcome: str = "Succeeded") -> None:
    """Play the Training Operator for ``name``'s PyTorchJob: running, then ``outcome``."""
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what=f"{ptj}")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    wait_phase(kube, namespace, name, "Training")
    set_pytorchjob_condition(kube, namespace, ptj, outcome)


def _succeed(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    _train(kube, namespace, name)
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job")
    finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    return wait_phase(kube, namespace, name, "Succeeded")


def test_child_waits_then_trains_from_the_parent(kube: Any, namespace: str, operator: Any) -> None:
    # applied child first (kubectl apply of a two-job file may do that): it waits for a parent never seen
    kube.create(_job(namespace, "chain-b", parent="chain-a"))
    obj = _waiting(kube, namespace, "chain-b", "does not exist yet")
    assert obj["status"]["phase"] == "Pending"
    assert condition(obj, "Ready")["reason"] == "WaitingForParent"

    kube.create(_job(namespace, "chain-a"))
    _waiting(kube, namespace, "chain-b", "now Pending")
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, "chain-a-train"), what="a's PyTorchJob"
    )
    set_pytorchjob_condition(kube, namespace, "chain-a-train", "Running")
    _waiting(kube, namespace, "chain-b", "now Training")
    _no_children(kube, namespace, "chain-b")

    a = _succeed(kube, namespace, "chain-a")
    ptj = wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, "chain-b-train"), what="b's PyTorchJob"
    )
    pod = ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]
    assert {
        "name": "parent",
        "persistentVolumeClaim": {"claimName": "chain-a-ckpt", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "parent", "mountPath": PARENT_MOUNT, "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    # the status is written after the children are created, in the same pass
    obj = _with_parent(kube, namespace, "chain-b")
    assert _parent_ready(obj)["status"] == "True" and _parent_ready(obj)["reason"] == "ParentSucceeded"
    assert obj["status"]["parent"] == {
        "job": "chain-a",
        "uid": a["metadata"]["uid"],
        "runId": "a1b2c3",
        "modelUri": "models:/chain_a/2",
        "path": "final",
        "claim": "chain-a-ckpt",
        "method": "full",
    }
    config = yaml.safe_load(kube.get("v1", "ConfigMap", namespace, "chain-b-config")["data"]["config.yaml"])
    assert config["parent"] == {
        "job": "chain-a",
        "uid": a["metadata"]["uid"],
        "runId": "a1b2c3",
        "modelUri": "models:/chain_a/2",
        "path": f"{PARENT_MOUNT}/final",
        "method": "full",
    }
    # kopf posts events from a queue, after the status write
    wanted = {"WaitingForParent", "ParentSucceeded"}
    wait_for(
        lambda: wanted <= {e["reason"] for e in events_for(kube, namespace, "chain-b")}, what="b's events"
    )

    # trained: the registration reads only b's own volume (its starting model is there), so a parent
    # deleted by now cannot hold it up
    _train(kube, namespace, "chain-b")
    reg = wait_for(
        lambda: kube.get("batch/v1", "Job", namespace, "chain-b-register"), what="b's registration"
    )
    assert all(v["name"] != "parent" for v in reg["spec"]["template"]["spec"]["volumes"])


def test_a_failed_parent_fails_the_child(kube: Any, namespace: str, operator: Any) -> None:
    kube.create(_job(namespace, "fail-a"))
    kube.create(_job(namespace, "fail-b", parent="fail-a"))
    _waiting(kube, namespace, "fail-b", "fail-a")
    _train(kube, namespace, "fail-a", "Failed")
    wait_phase(kube, namespace, "fail-a", "Failed")
    obj = wait_phase(kube, namespace, "fail-b", "Failed")
    ready = condition(obj, "Ready")
    assert ready["reason"] == "ParentFailed" and _parent_ready(obj)["reason"] == "ParentFailed"
    assert "FineTuneJob fail-a" in ready["message"] and "TrainingFailed" in ready["message"]
    _no_children(kube, namespace, "fail-b")


def test_a_parent_deleted_after_it_was_seen_is_missing(kube: Any, namespace: str, operator: Any) -> None:
    kube.create(_job(namespace, "gone-a", register=False))
    kube.create(_job(namespace, "gone-b", parent="gone-a"))
    _train(kube, namespace, "gone-a")
    wait_phase(kube, namespace, "gone-a", "Succeeded")
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, "gone-b-train"), what="b's PyTorchJob"
    )
    wait_for(
        lambda: (get_job(kube, namespace, "gone-b")["status"].get("parent") or {}).get("job") == "gone-a"
    )

    a = get_job(kube, namespace, "gone-a")
    kube.delete(API_VERSION, "FineTuneJob", namespace, "gone-a", uid=a["metadata"]["uid"])
    obj = wait_phase(kube, namespace, "gone-b", "Failed")
    ready = condition(obj, "Ready")
    assert ready["reason"] == "ParentMissing" and "was deleted" in ready["message"]
    # its training stops (the GPUs are freed): the PyTorchJob is suspended, its children kept
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, "gone-b-train")["spec"]["runPolicy"][
            "suspend"
        ],
        what="b's PyTorchJob suspended",
    )
    assert condition(obj, "ChildrenReady")["status"] == "True"


def test_a_parent_deleted_while_the_child_waits_fails_the_child(
    kube: Any, namespace: str, operator: Any
) -> None:
    """The child records which parent it waits for; deleted before it Succeeded, the child fails
    instead of waiting for a job that no longer exists. Nothing of the child was created."""
    kube.create(_job(namespace, "early-a", register=False))
    kube.create(_job(namespace, "early-b", parent="early-a"))
    a = get_job(kube, namespace, "early-a")
    wait_for(
        lambda: (
            ((get_job(kube, namespace, "early-b").get("status") or {}).get("parent") or {}).get("uid")
            == a["metadata"]["uid"]
        ),
        what="b recording the parent it waits for",
    )
    kube.delete(API_VERSION, "FineTuneJob", namespace, "early-a", uid=a["metadata"]["uid"])
    obj = wait_phase(kube, namespace, "early-b", "Failed")
    ready = condition(obj, "Ready")
    assert ready["reason"] == "ParentMissing" and "was deleted before it Succeeded" in ready["message"]
    _no_children(kube, namespace, "early-b")


def test_a_cycle_fails_both_jobs(kube: Any, namespace: str, operator: Any) -> None:
    kube.create(_job(namespace, "loop-a", parent="loop-b"))
    kube.create(_job(namespace, "loop-b", parent="loop-a"))
    for name, chain in (("loop-a", "loop-a -> loop-b -> loop-a"), ("loop-b", "loop-b -> loop-a -> loop-b")):
        obj = wait_phase(kube, namespace, name, "Failed")
        ready = condition(obj, "Ready")
        assert ready["reason"] == "ParentCycle" and chain in ready["message"]
        _no_children(kube, namespace, name)


@pytest.fixture
def preparation_on(operator_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator with its preparation step (the integration default turns it off)."""
    monkeypatch.setenv("KUBETUNE_PREPARATION", "true")


def test_the_preparation_job_mounts_the_parent_volume(
    kube: Any, namespace: str, preparation_on: None, operator: Any
) -> None:
    kube.create(_job(namespace, "prep-a"))
    kube.create(_job(namespace, "prep-b", parent="prep-a"))
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, "prep-a-prepare"), what="a's preparation Job")
    _waiting(kube, namespace, "prep-b", "prep-a")
    _no_children(kube, namespace, "prep-b")
    # the parent's preparation and training are not played here: its status says it Succeeded
    # (a final phase, which the operator keeps)
    done = {
        "phase": "Succeeded",
        "children": {"checkpointClaim": "prep-a-ckpt"},
        "checkpoints": {"bestStep": 25},
    }
    kube.patch(API_VERSION, "FineTuneJob", namespace, "prep-a", {"status": done}, subresource="status")
    prep = wait_for(
        lambda: kube.get("batch/v1", "Job", namespace, "prep-b-prepare"), what="b's preparation Job"
    )
    pod = prep["spec"]["template"]["spec"]
    assert {"name": "parent", "persistentVolumeClaim": {"claimName": "prep-a-ckpt", "readOnly": True}} in pod[
        "volumes"
    ]
    assert {"name": "parent", "mountPath": PARENT_MOUNT, "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    # nothing GPU-sized before the child's own preparation has succeeded
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, "prep-b-train") is None
