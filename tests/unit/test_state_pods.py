"""The state machine when the training pods cannot start: the pods and the PyTorchJob's events folded
into one trouble (``pods_observation``), and what the FineTuneJob's status and events say about it:
the scheduler cannot place a pod (``Unschedulable``, after ``SHOW_UNSCHEDULABLE_AFTER``), the Training
Operator cannot create one (``PodsNotCreated``), an image cannot be pulled (``ImagePullFailed``); each
appears once, with a Warning event, and clears when the pods start.

The objects are shaped as the real controllers write them (kube-scheduler's PodScheduled condition,
the kubelet's waiting reasons, the Training Operator v1.9's events through client-go's recorder).
"""

from __future__ import annotations

from typing import Any

import pytest

from kubetune_api.status import FineTuneJobStatus
from kubetune_operator import observations, state
from kubetune_operator.observations import PodTrouble
from kubetune_operator.state import Observation, PodsObservation, TrainingObservation

PTJ_UID = "0b7c4c8e-5d2a-4f4e-9a53-1c0de0000001"
T0 = "2026-01-01T00:00:00Z"
SCHEDULER = (
    "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector. preemption: 0/4 nodes "
    "are available: 4 Preemption is not helpful for scheduling."
)
NO_PRIORITY_CLASS = (
    'Error creating: pods "j-train-master-0" is forbidden: no PriorityClass with name '
    "training-preemptible was found"
)
PULL = 'rpc error: code = NotFound desc = failed to pull and unpack image "registry.example.com/t:nope"'


def pytorchjob(workers: int = 0, active: dict[str, int] | None = None) -> dict[str, Any]:
    specs: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": "ExitCode"}}
    if workers:
        specs["Worker"] = {"replicas": workers, "restartPolicy": "ExitCode"}
    obj: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j-train", "namespace": "ml", "uid": PTJ_UID},
        "spec": {"pytorchReplicaSpecs": specs},
    }
    if active is not None:
        obj["status"] = {"replicaStatuses": {k: {"active": v} for k, v in active.items()}}
    return obj


def pod(
    name: str = "j-train-master-0",
    *,
    owner: str = PTJ_UID,
    phase: str = "Pending",
    unschedulable_since: str | None = None,
    waiting: tuple[str, str] | None = None,
    init_waiting: tuple[str, str] | None = None,
    deleting: bool = False,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "labels": {observations.TRAINING_OPERATOR_JOB_LABEL: "j-train"},
        "ownerReferences": [
            {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "name": "j-train", "uid": owner}
        ],
    }
    if deleting:
        meta["deletionTimestamp"] = T0
    status: dict[str, Any] = {"phase": phase}
    if unschedulable_since is not None:
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": SCHEDULER,
                "lastProbeTime": None,
                "lastTransitionTime": unschedulable_since,
            }
        ]
    else:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": T0}]
    if waiting is not None:
        status["containerStatuses"] = [
            {
                "name": "trainer",
                "image": "registry.example.com/t:nope",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": waiting[0], "message": waiting[1]}},
            }
        ]
    if init_waiting is not None:
        status["initContainerStatuses"] = [
            {
                "name": "init-pytorch",
                "image": "alpine:3.10",
                "ready": False,
                "restartCount": 0,
                "state": {"waiting": {"reason": init_waiting[0], "message": init_waiting[1]}},
            }
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "status": status}


def event(
    reason: str, message: str, last: str, *, uid: str = PTJ_UID, type_: str = "Warning"
) -> dict[str, Any]:
    """A core/v1 Event as client-go's recorder writes it (seconds-resolution timestamps, a count)."""
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"j-train.{abs(hash((reason, last))):x}",
            "namespace": "ml",
            "creationTimestamp": last,
        },
        "involvedObject": {
            "apiVersion": "kubeflow.org/v1",
            "kind": "PyTorchJob",
            "name": "j-train",
            "uid": uid,
        },
        "reason": reason,
        "message": message,
        "type": type_,
        "count": 3,
        "firstTimestamp": last,
        "lastTimestamp": last,
        "eventTime": None,
        "source": {"component": "pytorchjob-controller"},
    }


def created(pod_name: str, last: str) -> dict[str, Any]:
    return event(observations.SUCCESSFUL_CREATE_POD, f"Created pod: {pod_name}", last, type_="Normal")


# --- folding pods and events ----------------------------------------------------------------------------


def test_replica_pods_are_named_as_the_training_operator_names_them() -> None:
    assert observations.replica_pods(pytorchjob()) == ["j-train-master-0"]
    assert observations.replica_pods(pytorchjob(workers=2)) == [
        "j-train-master-0",
        "j-train-worker-0",
        "j-train-worker-1",
    ]
    no_count = {"metadata": {"name": "x"}, "spec": {"pytorchReplicaSpecs": {"Master": {}}}}
    assert observations.replica_pods(no_count) == ["x-master-0"]


@pytest.mark.parametrize(
    ("ptj", "running"),
    [
        (pytorchjob(active={"Master": 1}), True),
        (pytorchjob(workers=2, active={"Master": 1, "Worker": 2}), True),
        (pytorchjob(workers=2, active={"Master": 1, "Worker": 1}), False),  # a Worker not running
        (pytorchjob(workers=1, active={"Master": 1}), False),
        (pytorchjob(active={"Master": 0}), False),
        (pytorchjob(), False),  # no status yet
        (None, False),
    ],
)
def test_pods_running_reads_the_training_operators_active_counts(ptj: Any, running: bool) -> None:
    assert observations.pods_running(ptj) is running


def test_an_unschedulable_pod_with_the_schedulers_message_and_since_when() -> None:
    got = observations.pods_observation(pytorchjob(), [pod(unschedulable_since=T0)], [])
    assert got == PodsObservation(
        trouble=PodTrouble(state.Reason.UNSCHEDULABLE, "j-train-master-0", SCHEDULER, since=T0)
    )


def test_a_scheduled_or_running_pod_is_no_trouble() -> None:
    assert observations.pods_observation(pytorchjob(), [pod()], []) == PodsObservation()
    assert observations.pods_observation(pytorchjob(), [pod(phase="Running")], []) == PodsObservation()


@pytest.mark.parametrize(
    "reason", ["ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"]
)
def test_an_image_that_cannot_be_pulled(reason: str) -> None:
    got = observations.pods_observation(pytorchjob(), [pod(waiting=(reason, PULL))], [])
    assert got.trouble is not None
    assert got.trouble.reason == state.Reason.IMAGE_PULL_FAILED
    assert got.trouble.message == f"container trainer (image registry.example.com/t:nope): {reason}: {PULL}"


def test_a_worker_init_container_image_that_cannot_be_pulled() -> None:
    pods = [
        pod(phase="Running"),
        pod("j-train-worker-0", init_waiting=("ImagePullBackOff", "Back-off pulling")),
    ]
    trouble = observations.pods_observation(pytorchjob(workers=1), pods, []).trouble
    assert trouble is not None and trouble.pod == "j-train-worker-0"
    assert trouble.message == "container init-pytorch (image alpine:3.10): ImagePullBackOff: Back-off pulling"


@pytest.mark.parametrize("reason", ["ContainerCreating", "PodInitializing", "CrashLoopBackOff"])
def test_other_waiting_reasons_are_not_image_troubles(reason: str) -> None:
    assert observations.pods_observation(pytorchjob(), [pod(waiting=(reason, ""))], []) == PodsObservation()


def test_a_pod_the_training_operator_cannot_create() -> None:
    events = [event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS, "2026-01-01T00:00:05Z")]
    got = observations.pods_observation(pytorchjob(), [], events)
    assert got == PodsObservation(
        trouble=PodTrouble(
            state.Reason.PODS_NOT_CREATED, "j-train-master-0", NO_PRIORITY_CLASS, since="2026-01-01T00:00:05Z"
        )
    )


def test_a_missing_pod_with_no_event_yet_is_missing_not_a_trouble() -> None:
    assert observations.pods_observation(pytorchjob(), [], []) == PodsObservation(
        missing=("j-train-master-0",)
    )


def test_a_failure_followed_by_a_creation_is_outdated() -> None:
    """The PriorityClass was created, the pod made; later the pod is deleted (preempted): the old
    failure does not explain it (the Training Operator is about to make it again)."""
    events = [
        event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS, "2026-01-01T00:00:05Z"),
        created("j-train-master-0", "2026-01-01T00:01:00Z"),
    ]
    assert observations.pods_observation(pytorchjob(), [], events) == PodsObservation(
        missing=("j-train-master-0",)
    )
    # a creation in the same second as the failure: the creation wins (no flash of an old failure)
    same = [event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS, T0), created("j-train-master-0", T0)]
    assert observations.pods_observation(pytorchjob(), [], same).trouble is None
    # a failure after the creation (deleted, then refused): it explains the missing pod again
    again = [*events, event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS, "2026-01-01T00:02:00Z")]
    trouble = observations.pods_observation(pytorchjob(), [], again).trouble
    assert trouble is not None and trouble.since == "2026-01-01T00:02:00Z"


def test_a_failure_naming_no_pod_explains_any_missing_pod_until_a_later_creation() -> None:
    text = "Error creating: Internal error occurred: resource quota evaluation timed out"
    events = [event(observations.FAILED_CREATE_POD, text, "2026-01-01T00:00:05Z")]
    trouble = observations.pods_observation(pytorchjob(), [], events).trouble
    assert trouble is not None and (trouble.pod, trouble.message) == ("j-train-master-0", text)
    later = [*events, created("j-train-worker-0", "2026-01-01T00:00:06Z")]
    assert observations.pods_observation(pytorchjob(), [], later).trouble is None


def test_events_and_pods_of_another_pytorchjob_of_the_same_name_are_ignored() -> None:
    """A FineTuneJob re-created under the same name: the old PyTorchJob's leftovers say nothing."""
    old = "old-uid"
    events = [event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS, T0, uid=old)]
    got = observations.pods_observation(pytorchjob(), [pod(owner=old, unschedulable_since=T0)], events)
    assert got == PodsObservation(missing=("j-train-master-0",))


def test_a_pod_being_deleted_counts_as_missing() -> None:
    got = observations.pods_observation(pytorchjob(), [pod(deleting=True, unschedulable_since=T0)], [])
    assert got == PodsObservation(missing=("j-train-master-0",))


def test_the_most_decisive_trouble_is_reported_and_its_kind_counted() -> None:
    pods = [
        pod(waiting=("ErrImagePull", PULL)),
        pod("j-train-worker-1", unschedulable_since=T0),
        pod("j-train-worker-2", unschedulable_since=T0),
    ]
    events = [event(observations.FAILED_CREATE_POD, NO_PRIORITY_CLASS.replace("master-0", "worker-0"), T0)]
    got = observations.pods_observation(pytorchjob(workers=3), pods, events).trouble
    assert got is not None and (got.reason, got.pod, got.others) == (
        state.Reason.PODS_NOT_CREATED,
        "j-train-worker-0",
        0,
    )
    got = observations.pods_observation(
        pytorchjob(workers=3), [*pods, pod("j-train-worker-0")], events
    ).trouble
    assert got is not None and (got.reason, got.pod, got.others) == (
        state.Reason.UNSCHEDULABLE,
        "j-train-worker-1",
        1,
    )


# --- the status and events ------------------------------------------------------------------------------


def obs(
    pods: PodsObservation,
    *,
    now: str = "2026-01-01T00:01:00Z",
    condition: str | None = "Created",
    exists: bool = True,
    **kw: Any,
) -> Observation:
    base: dict[str, Any] = {
        "generation": 1,
        "now": now,
        "namespace": "ml",
        "job_name": "j",
        "pytorchjob_name": "j-train",
        "registration_job_name": "j-register",
        "checkpoint_claim": "j-ckpt",
        "children": {"checkpointClaim": "j-ckpt", "configMap": "j-config", "pytorchJob": "j-train"},
        "training": TrainingObservation(exists=exists, condition=condition),
        "pods": pods,
    }
    base.update(kw)
    return Observation(**base)


def cond(t: state.Transition, type_: str) -> dict[str, Any]:
    return next(c for c in t.status["conditions"] if c["type"] == type_)


def then(t: state.Transition) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate({k: v for k, v in t.status.items() if v is not None})


def unschedulable(since: str = T0) -> PodsObservation:
    return PodsObservation(
        trouble=PodTrouble(state.Reason.UNSCHEDULABLE, "j-train-master-0", SCHEDULER, since=since)
    )


def not_created() -> PodsObservation:
    return PodsObservation(
        trouble=PodTrouble(state.Reason.PODS_NOT_CREATED, "j-train-master-0", NO_PRIORITY_CLASS, since=T0)
    )


def image_pull() -> PodsObservation:
    detail = f"container trainer (image registry.example.com/t:nope): ErrImagePull: {PULL}"
    return PodsObservation(trouble=PodTrouble(state.Reason.IMAGE_PULL_FAILED, "j-train-master-0", detail))


CASES = {
    # reason, the pods, the words the message must carry
    "unschedulable": (
        state.Reason.UNSCHEDULABLE,
        unschedulable(),
        [
            "the scheduler cannot place pod j-train-master-0",
            SCHEDULER,
            "nvidia.com/gpu.product",
            "gpuProduct",
        ],
    ),
    "pods-not-created": (
        state.Reason.PODS_NOT_CREATED,
        not_created(),
        [
            "the Training Operator cannot create pod j-train-master-0 of PyTorchJob j-train",
            NO_PRIORITY_CLASS,
            "priorityClassName",
        ],
    ),
    "image-pull-failed": (
        state.Reason.IMAGE_PULL_FAILED,
        image_pull(),
        [
            "pod j-train-master-0 cannot pull its image",
            PULL,
            "spec.image",
            "kubectl describe pod -n ml j-train-master-0",
        ],
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_a_trouble_appears_once_and_clears_when_the_pods_start(case: str) -> None:
    reason, pods, words = CASES[case]
    created_ = state.transition(None, obs(PodsObservation(), now=T0))
    assert cond(created_, state.ConditionType.TRAINING)["reason"] == state.Reason.TRAINING_CREATED
    # appears: Pending, Training and Ready say why, one Warning event
    first = state.transition(then(created_), obs(pods))
    assert first.phase == "Pending"
    training, ready = cond(first, state.ConditionType.TRAINING), cond(first, state.ConditionType.READY)
    assert (training["status"], training["reason"]) == ("False", reason)
    assert (ready["status"], ready["reason"], ready["message"]) == ("False", reason, training["message"])
    for word in words:
        assert word in training["message"], (word, training["message"])
    assert [(e.type, e.reason, e.message) for e in first.events] == [("Warning", reason, training["message"])]
    assert not observations.settling(
        first.status
    )  # pod events (or the Training Operator's pod) bring the news now
    # the next pass with the same trouble: the same status, no second event
    again = state.transition(then(first), obs(pods, now="2026-01-01T00:02:00Z"))
    assert cond(again, state.ConditionType.TRAINING)["reason"] == reason and again.events == []
    # cleared: the pods exist and are scheduled (Created), then run
    cleared = state.transition(then(again), obs(PodsObservation(), now="2026-01-01T00:03:00Z"))
    assert cleared.phase == "Pending"
    assert cond(cleared, state.ConditionType.TRAINING)["reason"] == state.Reason.TRAINING_CREATED
    assert cond(cleared, state.ConditionType.READY)["reason"] == state.Reason.NOT_READY
    assert cleared.events == []
    running = state.transition(then(cleared), obs(PodsObservation(), condition="Running"))
    assert running.phase == "Training" and cond(running, state.ConditionType.TRAINING)["status"] == "True"
    assert [e.reason for e in running.events] == [state.EventReason.TRAINING_STARTED]


def test_a_pytorchjob_without_status_whose_pod_cannot_be_created() -> None:
    """The Training Operator v1.9 returns a pod creation error before its status update: the
    PyTorchJob never gets a condition, and the job would say "is the Training Operator running?"."""
    waiting = state.transition(
        None, obs(PodsObservation(missing=("j-train-master-0",)), condition=None, now=T0)
    )
    assert cond(waiting, state.ConditionType.TRAINING)["reason"] == state.Reason.WAITING_FOR_TRAINING_OPERATOR
    assert observations.settling(waiting.status)
    t = state.transition(then(waiting), obs(not_created(), condition=None))
    assert t.phase == "Pending"
    assert cond(t, state.ConditionType.TRAINING)["reason"] == state.Reason.PODS_NOT_CREATED
    assert NO_PRIORITY_CLASS in cond(t, state.ConditionType.TRAINING)["message"]
    assert [e.reason for e in t.events] == [state.Reason.PODS_NOT_CREATED]


def test_a_pod_waiting_for_a_node_is_news_only_after_a_while() -> None:
    start = state.transition(None, obs(PodsObservation(), now=T0))
    early = state.transition(then(start), obs(unschedulable(since=T0), now="2026-01-01T00:00:29Z"))
    assert (
        cond(early, state.ConditionType.TRAINING)["reason"] == state.Reason.TRAINING_CREATED
        and early.events == []
    )
    assert observations.settling(early.status)  # the operator looks again without an event
    late = state.transition(then(early), obs(unschedulable(since=T0), now="2026-01-01T00:00:30Z"))
    assert cond(late, state.ConditionType.TRAINING)["reason"] == state.Reason.UNSCHEDULABLE
    assert [e.reason for e in late.events] == [state.Reason.UNSCHEDULABLE]


def test_a_worker_that_cannot_be_placed_while_the_master_runs() -> None:
    """The PyTorchJob says Running (its Master runs): the phase is Training, and Training says why
    it cannot go on (the Master waits for the Worker at the rendezvous)."""
    trouble = PodTrouble(state.Reason.UNSCHEDULABLE, "j-train-worker-0", SCHEDULER, since=T0)
    running = state.transition(None, obs(PodsObservation(), condition="Running", now=T0))
    t = state.transition(then(running), obs(PodsObservation(trouble=trouble), condition="Running"))
    assert t.phase == "Training"
    assert cond(t, state.ConditionType.TRAINING)["status"] == "False"
    assert cond(t, state.ConditionType.TRAINING)["reason"] == state.Reason.UNSCHEDULABLE
    assert "pod j-train-worker-0" in cond(t, state.ConditionType.TRAINING)["message"]
    restarting = state.transition(then(t), obs(PodsObservation(trouble=trouble), condition="Restarting"))
    assert cond(restarting, state.ConditionType.TRAINING)["reason"] == state.Reason.UNSCHEDULABLE


def test_more_pods_with_the_same_trouble_are_counted() -> None:
    trouble = PodTrouble(state.Reason.UNSCHEDULABLE, "j-train-master-0", SCHEDULER, since=T0, others=2)
    t = state.transition(None, obs(PodsObservation(trouble=trouble)))
    assert "pod j-train-master-0 (and 2 more)" in cond(t, state.ConditionType.TRAINING)["message"]


@pytest.mark.parametrize(
    ("condition", "extra", "reason"),
    [
        (None, {"exists": False}, state.Reason.WAITING_FOR_TRAINING_OPERATOR),  # no PyTorchJob
        ("Suspended", {"queued_by_kueue": True}, state.Reason.QUEUED),  # Kueue holds it: no pods by design
        ("Created", {"suspend": True}, state.Reason.SUSPENDED_BY_USER),
        ("Succeeded", {}, state.Reason.TRAINING_SUCCEEDED),
        ("Failed", {}, state.Reason.TRAINING_FAILED),
    ],
)
def test_pod_troubles_say_nothing_where_pods_are_not_expected_to_run(
    condition: str | None, extra: dict[str, Any], reason: str
) -> None:
    t = state.transition(None, obs(not_created(), condition=condition, **extra))
    assert cond(t, state.ConditionType.TRAINING)["reason"] == reason
    assert all(e.reason not in state.POD_TROUBLE for e in t.events)


@pytest.mark.parametrize(
    ("phase", "reason", "settling"),
    [
        ("Pending", state.Reason.TRAINING_CREATED, True),
        ("Training", state.Reason.TRAINING_RESTARTING, True),
        ("Pending", state.Reason.UNSCHEDULABLE, False),
        ("Pending", state.Reason.PODS_NOT_CREATED, False),
        ("Pending", state.Reason.IMAGE_PULL_FAILED, False),
        ("Pending", state.Reason.QUEUED, False),
        (
            "Pending",
            state.Reason.WAITING_FOR_TRAINING_OPERATOR,
            True,
        ),  # a pod it cannot create changes nothing watched
        ("Training", state.Reason.TRAINING_RUNNING, False),
        ("Succeeded", state.Reason.TRAINING_SUCCEEDED, False),
    ],
)
def test_settling_while_pods_start_with_nothing_wrong_known(phase: str, reason: str, settling: bool) -> None:
    status = {"phase": phase, "conditions": [{"type": "Training", "status": "False", "reason": reason}]}
    assert observations.settling(status) is settling
    assert not observations.settling(None) and not observations.settling({"phase": "Pending"})
