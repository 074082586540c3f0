"""Every training failure reason through the real API server: the test plays the Training Operator
and the kubelet (a failed pod of the PyTorchJob with the trainer's termination message, the
kubelet's ``OOMKilled``, an eviction; the PyTorchJob's Failed condition or its deadline), the
operator reads them and writes the reason, message and hint onto the FineTuneJob's Training and
Ready conditions and a Warning event, and the Argo CD health check (the real gopher-lua) shows the
live object Degraded with the reason and the message."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from tests.integration.conftest import (
    API_VERSION as API,
)
from tests.integration.conftest import (
    condition,
    events_for,
    finish_registration_job,
    get_job,
    load_example,
    now,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import REPO
from tests.support.lua import run_health

from kubetune_api.failures import HINTS, Failure, TrainingFailure

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

SCRIPT = REPO / "deploy" / "argocd" / "health" / "finetunejob.lua"
# what the kubelet or the Training Operator says, for the reasons the trainer does not write itself
RESULT = {"name": "qwen3_4b_assistant", "version": "1", "uri": "models:/qwen3_4b_assistant/1", "run_id": "r"}
BY_KUBELET = {Failure.HOST_OUT_OF_MEMORY, Failure.EVICTED, Failure.DEADLINE_EXCEEDED}


def _failed_pod(kube: Any, namespace: str, ptj: str, reason: Failure) -> None:
    """A PyTorchJob pod that ended as ``reason`` says (created and its status set, as the kubelet
    would)."""
    name = f"{ptj}-master-0"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"training.kubeflow.org/job-name": ptj, "training.kubeflow.org/replica-type": "master"},
        },
        "spec": {
            "containers": [
                {
                    "name": "pytorch",
                    "image": "kubetune/trainer:test",
                    "resources": {"limits": {"memory": "3Gi"}},
                }
            ],
            "restartPolicy": "Never",
        },
    }
    kube.create(pod)
    terminated: dict[str, Any] = {"startedAt": now(), "finishedAt": now()}
    status: dict[str, Any] = {"phase": "Failed"}
    if reason == Failure.HOST_OUT_OF_MEMORY:
        terminated.update(exitCode=137, reason="OOMKilled")
    elif reason == Failure.EVICTED:
        status.update(reason="Evicted", message="The node was low on resource: memory.")
        terminated.update(exitCode=137, reason="Error")
    else:
        failure = TrainingFailure.of(reason, f"the trainer's own words for {reason}", step=17)
        terminated.update(exitCode=failure.exit_code, reason="Error", message=failure.termination_message())
    status["containerStatuses"] = [
        {
            "name": "pytorch",
            "image": "kubetune/trainer:test",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
    ]
    kube.patch("v1", "Pod", namespace, name, {"status": status}, subresource="status")


def test_every_failure_reason_reaches_the_status_an_event_and_argocd(
    kube: Any, namespace: str, operator: Any
) -> None:
    names = {}
    for i, reason in enumerate(Failure):
        doc = load_example("qwen3-4b-full.yaml", namespace)
        doc["metadata"]["name"] = name = f"f{i}-{reason.lower()}"[:30]
        kube.create(doc)
        names[reason] = name
    for reason, name in names.items():
        ptj = f"{name}-train"
        wait_for(lambda ptj=ptj: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what=f"{ptj}")
        if reason == Failure.DEADLINE_EXCEEDED:
            set_pytorchjob_condition(
                kube,
                namespace,
                ptj,
                "Failed",
                f"Job {ptj} has failed because it was active longer than specified deadline",
            )
        else:
            _failed_pod(kube, namespace, ptj, reason)
            set_pytorchjob_condition(
                kube, namespace, ptj, "Failed", "PyTorchJob has failed because 1 Master replica(s) failed."
            )
    for reason, name in names.items():
        obj = wait_phase(kube, namespace, name, "Failed")
        for kind in ("Ready", "Training"):
            c = condition(obj, kind)
            assert (c["status"], c["reason"]) == ("False", reason), (reason, c)
            assert HINTS[reason] in c["message"]
            if reason not in BY_KUBELET:
                assert "the trainer's own words" in c["message"] and "at step 17" in c["message"]
        if reason == Failure.HOST_OUT_OF_MEMORY:
            assert "memory limit 3Gi" in condition(obj, "Ready")["message"]
        assert kube.get("batch/v1", "Job", namespace, f"{name}-register") is None
        wait_for(
            lambda name=name, reason=reason: [
                e
                for e in events_for(kube, namespace, name)
                if e["reason"] == reason and e["type"] == "Warning"
            ],
            what=f"a {reason} warning event",
        )
        verdict = run_health(SCRIPT, obj)
        assert verdict["status"] == "Degraded", verdict
        assert reason in verdict["message"], verdict


def _budget_job(kube: Any, namespace: str, name: str, budget: dict[str, Any]) -> str:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["metadata"]["name"] = name
    doc["spec"]["budget"] = budget
    kube.create(doc)
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what=ptj)
    return ptj


def test_the_hard_deadline_is_set_once_the_pods_run_counting_the_wait(
    kube: Any, namespace: str, operator: Any
) -> None:
    ptj = _budget_job(kube, namespace, "deadline", {"maxDuration": "1h"})
    live = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)
    assert "activeDeadlineSeconds" not in live["spec"]["runPolicy"]
    # the Training Operator started it ten minutes ago; its pods waited for GPUs until now
    started = (datetime.now(UTC) - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    kube.patch(
        "kubeflow.org/v1",
        "PyTorchJob",
        namespace,
        ptj,
        {"status": {"startTime": started}},
        subresource="status",
    )
    live = wait_for(
        lambda: (
            (o := kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj))["spec"]["runPolicy"].get(
                "activeDeadlineSeconds"
            )
            and o
        ),
        what="activeDeadlineSeconds on the running PyTorchJob",
    )
    deadline = live["spec"]["runPolicy"]["activeDeadlineSeconds"]
    assert 600 + 3600 + 900 <= deadline <= 600 + 3600 + 900 + 30
    assert live["metadata"]["annotations"]["kubetune.io/deadline-for-start"] == started


@pytest.mark.parametrize("register", [True, False])
def test_a_run_stopped_at_its_budget_succeeds_with_budget_reached(
    kube: Any, namespace: str, operator: Any, register: bool
) -> None:
    name = f"budget-{str(register).lower()}"
    ptj = _budget_job(kube, namespace, name, {"maxDuration": "30m", "register": register})
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    wait_phase(kube, namespace, name, "Training")
    # the trainer's last report, then the Training Operator's verdict
    reached = {"reached": True, "limit": "maxDuration 30m", "step": 310, "totalSteps": 1000}
    kube.patch(API, "FineTuneJob", namespace, name, {"status": {"budget": reached}}, subresource="status")
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    if register:
        wait_for(
            lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job"
        )
        finish_registration_job(kube, namespace, f"{name}-register", message=json.dumps(RESULT))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    budget = condition(obj, "BudgetReached")
    assert (budget["status"], budget["reason"]) == ("True", "BudgetReached")
    assert "maxDuration 30m: step 310 of 1000" in budget["message"]
    registered = condition(obj, "Registered")
    if register:
        assert registered["status"] == "True"
    else:
        assert (
            registered["reason"] == "RegistrationDisabled"
            and "spec.budget.register is false" in registered["message"]
        )
        assert kube.get("batch/v1", "Job", namespace, f"{name}-register") is None
    verdict = run_health(SCRIPT, obj)
    assert verdict["status"] == "Healthy" and "maxDuration 30m" in verdict["message"], verdict


def test_a_pod_that_cannot_mount_its_volume_is_shown_while_the_job_waits(
    kube: Any, namespace: str, operator: Any
) -> None:
    """The kubelet's FailedMount event (created here, as the kubelet would), found by the operator's
    field selector on the real API server."""
    doc = load_example("qwen3-4b-full.yaml", namespace)
    kube.create(doc)
    name = doc["metadata"]["name"]
    ptj = f"{name}-train"
    live = wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what=ptj)
    set_pytorchjob_condition(kube, namespace, ptj, "Created")
    pod_name = f"{ptj}-master-0"
    owner = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "name": ptj,
        "uid": live["metadata"]["uid"],
        "controller": True,
    }
    pod = kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": pod_name,
                "namespace": namespace,
                "labels": {"training.kubeflow.org/job-name": ptj},
                "ownerReferences": [owner],
            },
            "spec": {"containers": [{"name": "pytorch", "image": "kubetune/trainer:test"}]},
        }
    )
    kube.patch("v1", "Pod", namespace, pod_name, {"status": {"phase": "Pending"}}, subresource="status")
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{pod_name}.mount", "namespace": namespace},
            "involvedObject": {
                "kind": "Pod",
                "name": pod_name,
                "namespace": namespace,
                "uid": pod["metadata"]["uid"],
            },
            "reason": "FailedMount",
            "type": "Warning",
            "message": 'MountVolume.SetUp failed for volume "checkpoints" : nfs: server 10.0.0.9 not responding',
            "source": {"component": "kubelet"},
            "firstTimestamp": now(),
            "lastTimestamp": now(),
            "count": 1,
        }
    )
    obj = wait_for(
        lambda: condition(o := get_job(kube, namespace, name), "Training")["reason"] == "MountFailed" and o,
        what="Training=False MountFailed",
    )
    assert "nfs: server 10.0.0.9 not responding" in condition(obj, "Ready")["message"]
    assert run_health(SCRIPT, obj)["status"] == "Degraded"
