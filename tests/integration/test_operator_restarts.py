"""The training restarts the operator counts, through the real API server: the test plays the
Training Operator v1.9 as it restarts a pod that exited with a retryable code (the failed pod
deleted and created again under its name, and its TWO ``PyTorchJobRestarting`` events, each
aggregated into one Event whose count grows); the operator, a real process killed and started again
mid-job, counts each restart once and fails the job only after the restarts it allows."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    get_job,
    load_example,
    now,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.operator import OperatorProcess

from kubetune_api.failures import Failure

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

LIMIT = 3  # the operator's trainBackoffLimit here (KUBETUNE_TRAIN_BACKOFF_LIMIT)


class TrainingOperator:
    """The Training Operator's writes for one PyTorchJob, through the API server."""

    def __init__(self, kube: Any, namespace: str, ptj_name: str) -> None:
        self.kube, self.ns, self.name = kube, namespace, ptj_name
        self.ptj = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj_name)
        self.pod_name = f"{ptj_name}-master-0"
        self.events: dict[str, str] = {}  # message -> the Event's name (its recorder's cache)

    def create_pod(self) -> str:
        template = self.ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]
        labels = {
            **template["metadata"]["labels"],
            "training.kubeflow.org/job-name": self.name,
            "training.kubeflow.org/replica-type": "master",
            "training.kubeflow.org/replica-index": "0",
        }
        meta = self.ptj["metadata"]
        owner = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": self.name, "uid": meta["uid"]}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": self.pod_name,
                "namespace": self.ns,
                "labels": labels,
                "ownerReferences": [owner],
            },
            "spec": template["spec"],
        }
        uid: str = self.kube.create(pod)["metadata"]["uid"]
        self._pod_status("Running", {"running": {"startedAt": now()}})
        set_pytorchjob_condition(self.kube, self.ns, self.name, "Running")
        return uid

    def _pod_status(self, phase: str, state: dict[str, Any]) -> None:
        cs = {"name": "pytorch", "image": "t", "imageID": "", "ready": phase == "Running", "restartCount": 0}
        status = {"phase": phase, "containerStatuses": [{**cs, "state": state}]}
        self.kube.patch("v1", "Pod", self.ns, self.pod_name, {"status": status}, subresource="status")

    def _event(self, message: str) -> None:
        name = self.events.get(message)
        if name is not None:  # aggregated: the same Event, its count one more
            ev = self.kube.get("v1", "Event", self.ns, name)
            self.kube.patch("v1", "Event", self.ns, name, {"count": ev["count"] + 1, "lastTimestamp": now()})
            return
        self.events[message] = name = f"{self.name}.{time.time_ns():x}"
        meta = self.ptj["metadata"]
        self.kube.create(
            {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": self.ns},
                "involvedObject": {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": self.name,
                    "namespace": self.ns,
                    "uid": meta["uid"],
                },
                "reason": "PyTorchJobRestarting",
                "message": message,
                "type": "Warning",
                "count": 1,
                "firstTimestamp": now(),
                "lastTimestamp": now(),
                "source": {"component": "pytorchjob-controller"},
            }
        )

    def oom_and_restart(self) -> str:
        """The trainer killed for memory (137, OOMKilled); the pod deleted, its two events, the pod
        made again (pkg/controller.v1/common/pod.go, pytorch/pytorchjob_controller.go)."""
        old = self.kube.get("v1", "Pod", self.ns, self.pod_name)
        self._pod_status(
            "Failed", {"terminated": {"exitCode": 137, "reason": "OOMKilled", "finishedAt": now()}}
        )
        time.sleep(0.3)  # the Training Operator's informer sees the failed pod, then deletes it
        self.kube.delete("v1", "Pod", self.ns, self.pod_name, uid=old["metadata"]["uid"])
        self._event(f"job {self.name} is restarting because Master replica(s) failed.")
        set_pytorchjob_condition(self.kube, self.ns, self.name, "Restarting", "restarting")
        self._event(f"PyTorchJob {self.name} is restarting because 1 Master replica(s) failed.")
        wait_for(lambda: self.kube.get("v1", "Pod", self.ns, self.pod_name) is None, what="the pod deleted")
        return self.create_pod()

    def restarting_events(self) -> int:
        events = self.kube.list(
            "v1", "Event", self.ns, field_selector=f"involvedObject.uid={self.ptj['metadata']['uid']}"
        )
        return sum(e.get("count") or 1 for e in events if e.get("reason") == "PyTorchJobRestarting")


def _restarts(kube: Any, namespace: str, name: str) -> dict[str, Any]:
    return dict((get_job(kube, namespace, name).get("status") or {}).get("trainingRestarts") or {})


def _counted(kube: Any, namespace: str, name: str, total: int, uid: str) -> dict[str, Any]:
    """The status once it counted ``total`` restarts and saw the pod ``uid``."""

    def check() -> dict[str, Any] | None:
        r = _restarts(kube, namespace, name)
        uids = [u for p in r.get("pods") or [] for u in p["uids"]]
        return r if r.get("total") == total and uid in uids else None

    try:
        result: dict[str, Any] = wait_for(check, 30, f"{total} restarts counted, pod {uid} seen")
    except AssertionError as e:
        raise AssertionError(f"{e}; status: {get_job(kube, namespace, name).get('status')}") from None
    return result


def test_each_restart_counts_once_and_an_operator_restart_loses_and_doubles_none(
    kube: Any, namespace: str, operator_env: dict[str, str], tmp_path: Path
) -> None:
    operator = OperatorProcess(
        namespace, {**operator_env, "KUBETUNE_TRAIN_BACKOFF_LIMIT": str(LIMIT)}, tmp_path / "operator.log"
    )
    doc = load_example("qwen3-4b-full.yaml", namespace)
    name = doc["metadata"]["name"]
    try:
        operator.start()
        kube.create(doc)
        ptj = wait_for(
            lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"),
            60,
            "the PyTorchJob",
        )
        to = TrainingOperator(kube, namespace, ptj["metadata"]["name"])
        uid = to.create_pod()
        _counted(kube, namespace, name, 0, uid)
        for n in (1, 2):
            uid = to.oom_and_restart()
            _counted(kube, namespace, name, n, uid)
        # the events say four: counted from them, the limit of 3 was passed after two restarts
        assert to.restarting_events() == 4
        obj = wait_phase(kube, namespace, name, "Training")
        assert _restarts(kube, namespace, name)["lastReason"] == Failure.HOST_OUT_OF_MEMORY
        operator.kill()

        # a restart while no operator runs, then a new operator process: counted once, none again
        uid = to.oom_and_restart()
        operator.start()
        restarts = _counted(kube, namespace, name, 3, uid)
        assert restarts["sinceProgress"] == 3
        obj = wait_phase(kube, namespace, name, "Training")
        time.sleep(3)  # passes of the new operator (its retry timer is 1 s): nothing counted again
        assert _restarts(kube, namespace, name)["total"] == 3

        # one more than the limit: Failed, with the last attempt's reason
        to.oom_and_restart()
        obj = wait_phase(kube, namespace, name, "Failed")
        ready = condition(obj, "Ready")
        assert ready["reason"] == Failure.HOST_OUT_OF_MEMORY, ready
        assert f"restarted 4 times without a new checkpoint (limit {LIMIT}" in ready["message"], ready
        assert to.restarting_events() == 8
    finally:
        operator.kill()


def test_a_resume_after_a_suspension_is_no_restart(kube: Any, namespace: str, operator: Any) -> None:
    """Suspended (Kueue's preemption, spec.suspend), the Training Operator deletes the pods and makes
    them again on the resume: new UIDs under the same names, and no restart."""
    doc = load_example("qwen3-4b-full.yaml", namespace)
    name = doc["metadata"]["name"]
    kube.create(doc)
    ptj = wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"), 60, "the PyTorchJob"
    )
    to = TrainingOperator(kube, namespace, ptj["metadata"]["name"])
    uid = to.create_pod()
    _counted(kube, namespace, name, 0, uid)
    # suspended: its pod deleted (gracefully: it is marked first), the PyTorchJob Suspended
    kube.patch("v1", "Pod", namespace, to.pod_name, {"metadata": {"finalizers": ["kubetune.test/hold"]}})
    kube.delete("v1", "Pod", namespace, to.pod_name, uid=uid)
    set_pytorchjob_condition(kube, namespace, to.name, "Suspended", "PyTorchJob is suspended.")
    wait_for(lambda: _restarts(kube, namespace, name).get("pods") == [], what="the incarnations forgotten")
    kube.patch("v1", "Pod", namespace, to.pod_name, {"metadata": {"finalizers": None}})
    wait_for(lambda: kube.get("v1", "Pod", namespace, to.pod_name) is None, what="the pod gone")
    uid = to.create_pod()  # the resume
    assert _counted(kube, namespace, name, 0, uid)["sinceProgress"] == 0
    uid = to.oom_and_restart()
    _counted(kube, namespace, name, 1, uid)
