"""Training pods that cannot start, against the real API server: the FineTuneJob says why (the pod,
the controller's own words), once as a Warning event, and clears it when they start.

The test plays the controllers that do not run here, writing what they write: the Training
Operator (the PyTorchJob's status, its pods with their labels and owner, its ``FailedCreatePod`` and
``SuccessfulCreatePod`` events), kube-scheduler (``PodScheduled=False``, reason ``Unschedulable``)
and the kubelet (an image pull's waiting reason). The same cases through the real controllers:
tests/cluster/test_real_controllers.py.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    events_for,
    get_job,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.integration]

SCHEDULER = (
    "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes "
    "are available: 4 Preemption is not helpful for scheduling."
)
PULL = 'failed to pull and unpack image "registry.example.com/kubetune/trainer:test": not found'


def _stamp(ago: float = 0.0) -> str:
    return (datetime.now(UTC) - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _start(kube: Any, namespace: str, *, created: bool = True) -> tuple[str, dict[str, Any]]:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    kube.create(doc)
    name = str(doc["metadata"]["name"])
    ptj = wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"), what="the PyTorchJob"
    )
    wait_phase(kube, namespace, name, "Pending")
    if created:
        set_pytorchjob_condition(kube, namespace, f"{name}-train", "Created")
    return name, ptj


def _training(kube: Any, namespace: str, name: str, reason: str) -> dict[str, Any] | None:
    obj = get_job(kube, namespace, name)
    training = [c for c in (obj.get("status") or {}).get("conditions") or [] if c["type"] == "Training"]
    return obj if training and training[0]["reason"] == reason else None


def _create_pod(kube: Any, ptj: dict[str, Any], replica: str = "master", index: int = 0) -> str:
    """The pod as the Training Operator makes it: the template's labels and its own, owned by the PyTorchJob."""
    template = ptj["spec"]["pytorchReplicaSpecs"][replica.capitalize()]["template"]
    meta = ptj["metadata"]
    name = f"{meta['name']}-{replica}-{index}"
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": meta["namespace"],
                "labels": {
                    **template["metadata"]["labels"],
                    "training.kubeflow.org/job-name": meta["name"],
                    "training.kubeflow.org/operator-name": "pytorchjob-controller",
                    "training.kubeflow.org/replica-type": replica,
                    "training.kubeflow.org/replica-index": str(index),
                },
                "ownerReferences": [
                    {
                        "apiVersion": "kubeflow.org/v1",
                        "kind": "PyTorchJob",
                        "name": meta["name"],
                        "uid": meta["uid"],
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": template["spec"],
        }
    )
    return name


def _pod_status(kube: Any, namespace: str, pod: str, status: dict[str, Any]) -> None:
    kube.patch("v1", "Pod", namespace, pod, {"status": status}, subresource="status")


def _unschedulable(since: str, message: str = SCHEDULER) -> dict[str, Any]:
    return {
        "phase": "Pending",
        "conditions": [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": since,
            }
        ],
    }


def _running(kube: Any, namespace: str, ptj: str, pod: str) -> None:
    t = _stamp()
    _pod_status(
        kube,
        namespace,
        pod,
        {
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": t}],
            "containerStatuses": [
                {
                    "name": "pytorch",
                    "image": "registry.example.com/kubetune/trainer:test",
                    "imageID": "",
                    "ready": True,
                    "restartCount": 0,
                    "state": {"running": {"startedAt": t}},
                }
            ],
        },
    )
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    kube.patch(
        "kubeflow.org/v1",
        "PyTorchJob",
        namespace,
        ptj,
        {"status": {"replicaStatuses": {"Master": {"active": 1}}}},
        subresource="status",
    )


def _ptj_event(kube: Any, ptj: dict[str, Any], reason: str, message: str, type_: str) -> None:
    """An Event on the PyTorchJob, as client-go's recorder in the Training Operator writes it."""
    meta = ptj["metadata"]
    t = _stamp()
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{time.time_ns():x}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": "kubeflow.org/v1",
                "kind": "PyTorchJob",
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
            },
            "reason": reason,
            "message": message,
            "type": type_,
            "count": 1,
            "firstTimestamp": t,
            "lastTimestamp": t,
            "source": {"component": "pytorchjob-controller"},
            "reportingComponent": "pytorchjob-controller",
        }
    )


def _warnings(kube: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in events_for(kube, namespace, name) if e["reason"] == reason and e["type"] == "Warning"]


def _first_warnings(kube: Any, namespace: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The operator's Warnings of that reason once the first has arrived: kopf posts events from a
    queue after the status write that the test saw, so the first may come a moment later."""
    wait_for(lambda: _warnings(kube, namespace, name, reason), what=f"a {reason} event")
    return _warnings(kube, namespace, name, reason)


def test_a_pod_the_scheduler_cannot_place_shows_after_a_while_and_clears_once_scheduled(
    kube: Any, namespace: str, operator: Any
) -> None:
    name, ptj = _start(kube, namespace)
    pod = _create_pod(kube, ptj)
    # unschedulable for 25 s: not news yet; no event of any object brings the pass that shows it at
    # 30 s, the operator's own look while pods start does
    _pod_status(kube, namespace, pod, _unschedulable(_stamp(25)))
    wait_for(lambda: _training(kube, namespace, name, "TrainingCreated"), what="TrainingCreated")
    obj = wait_for(lambda: _training(kube, namespace, name, "Unschedulable"), 30, "Unschedulable")
    assert obj["status"]["phase"] == "Pending"
    training, ready = condition(obj, "Training"), condition(obj, "Ready")
    assert training["status"] == "False"
    assert f"the scheduler cannot place pod {pod}: {SCHEDULER}" in training["message"]
    assert (ready["reason"], ready["message"]) == ("Unschedulable", training["message"])
    assert len(_first_warnings(kube, namespace, name, "Unschedulable")) == 1
    # the scheduler tries again and says something else: the message follows, no second event
    other = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu. preemption: not eligible"
    _pod_status(kube, namespace, pod, _unschedulable(_stamp(60), other))
    wait_for(
        lambda: other in condition(get_job(kube, namespace, name), "Training")["message"],
        what="the new message",
    )
    time.sleep(2)  # passes of the operator's timer (1 s here)
    assert len(_warnings(kube, namespace, name, "Unschedulable")) == 1
    # scheduled: cleared; running: Training
    _pod_status(
        kube,
        namespace,
        pod,
        {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp()}]},
    )
    obj = wait_for(lambda: _training(kube, namespace, name, "TrainingCreated"), what="cleared")
    assert condition(obj, "Ready")["reason"] == "NotReady"
    _running(kube, namespace, f"{name}-train", pod)
    obj = wait_phase(kube, namespace, name, "Training")
    assert condition(obj, "Training")["status"] == "True"


def test_a_pod_the_training_operator_cannot_create_shows_its_message_until_it_is_created(
    kube: Any, namespace: str, operator: Any
) -> None:
    # the Training Operator v1.9 writes no status while it cannot create a pod (it returns the error
    # before its status update): the PyTorchJob has none, as here
    name, ptj = _start(kube, namespace, created=False)
    wait_for(lambda: _training(kube, namespace, name, "WaitingForTrainingOperator"), what="no status yet")
    pod = f"{name}-train-master-0"
    refused = f'Error creating: pods "{pod}" is forbidden: no PriorityClass with name training-preemptible was found'
    # the event comes after the pass that the PyTorchJob's status brought: the operator looks again
    _ptj_event(kube, ptj, "FailedCreatePod", refused, "Warning")
    obj = wait_for(lambda: _training(kube, namespace, name, "PodsNotCreated"), 60, "PodsNotCreated")
    assert obj["status"]["phase"] == "Pending"
    message = condition(obj, "Training")["message"]
    assert f"the Training Operator cannot create pod {pod} of PyTorchJob {name}-train: {refused}" in message
    assert condition(obj, "Ready")["reason"] == "PodsNotCreated"
    assert len(_first_warnings(kube, namespace, name, "PodsNotCreated")) == 1
    # the Training Operator retries, fails again (the event's count grows): still one event of ours
    _ptj_event(kube, ptj, "FailedCreatePod", refused, "Warning")
    time.sleep(2)
    assert _training(kube, namespace, name, "PodsNotCreated")
    assert len(_warnings(kube, namespace, name, "PodsNotCreated")) == 1
    # the PriorityClass exists now: the Training Operator creates the pod (its event, then the pod's)
    _ptj_event(kube, ptj, "SuccessfulCreatePod", f"Created pod: {pod}", "Normal")
    _create_pod(kube, ptj)
    wait_for(lambda: _training(kube, namespace, name, "WaitingForTrainingOperator"), what="cleared")
    set_pytorchjob_condition(kube, namespace, f"{name}-train", "Created")
    wait_for(lambda: _training(kube, namespace, name, "TrainingCreated"), what="TrainingCreated")
    _running(kube, namespace, f"{name}-train", pod)
    wait_phase(kube, namespace, name, "Training")
    # preempted later: the pod is gone for a moment (the Training Operator counts it no more); the
    # old failure, followed by a creation, does not come back
    kube.delete("v1", "Pod", namespace, pod, uid=kube.get("v1", "Pod", namespace, pod)["metadata"]["uid"])
    wait_for(lambda: kube.get("v1", "Pod", namespace, pod) is None, what="the pod gone")
    kube.patch(
        "kubeflow.org/v1",
        "PyTorchJob",
        namespace,
        f"{name}-train",
        {"status": {"replicaStatuses": {"Master": {"active": 0}}}},
        subresource="status",
    )
    time.sleep(3)
    assert len(_warnings(kube, namespace, name, "PodsNotCreated")) == 1
    assert not _training(kube, namespace, name, "PodsNotCreated")


def test_an_image_that_cannot_be_pulled_shows_until_the_pod_runs(
    kube: Any, namespace: str, operator: Any
) -> None:
    name, ptj = _start(kube, namespace)
    pod = _create_pod(kube, ptj)
    waiting: dict[str, Any] = {
        "phase": "Pending",
        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": _stamp()}],
        "containerStatuses": [
            {
                "name": "pytorch",
                "image": "registry.example.com/kubetune/trainer:test",
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": "ErrImagePull", "message": PULL}},
            }
        ],
    }
    _pod_status(kube, namespace, pod, waiting)
    obj = wait_for(lambda: _training(kube, namespace, name, "ImagePullFailed"), 15, "ImagePullFailed")
    message = condition(obj, "Training")["message"]
    assert f"pod {pod} cannot pull its image: container pytorch" in message and PULL in message
    # the kubelet backs off: ImagePullBackOff, the same trouble, no second event
    waiting["containerStatuses"][0]["state"]["waiting"] = {
        "reason": "ImagePullBackOff",
        "message": "Back-off pulling",
    }
    _pod_status(kube, namespace, pod, waiting)
    wait_for(lambda: "ImagePullBackOff" in condition(get_job(kube, namespace, name), "Training")["message"])
    assert len(_first_warnings(kube, namespace, name, "ImagePullFailed")) == 1
    _running(kube, namespace, f"{name}-train", pod)
    obj = wait_phase(kube, namespace, name, "Training")
    assert condition(obj, "Training")["reason"] != "ImagePullFailed"
