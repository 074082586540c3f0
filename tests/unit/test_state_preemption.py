"""Training that Kueue preempts (issue 31 item 3): the one state machine, on both engines, from the
objects the real controllers write. Kueue v0.17 evicts the job's Workload (``Evicted`` reason
``Preempted``, and a ``Preempted`` condition saying where: ``InClusterQueue``...) and suspends the
training object (a PyTorchJob's ``runPolicy.suspend``, a TrainJob's ``spec.suspend``), whose
controller then reads ``Suspended``. The job says it was preempted, by Kueue, why, and from which
checkpoint it resumes; ``status.preemptions`` counts it; once admitted again and running, it is
Training, with the time spent preempted counted."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from tests.unit.test_state_advance import World, drive, first, manifest

from kubetune_api.status import ConditionType, EventReason, FineTuneJobStatus, Phase, Reason
from kubetune_operator import builders, observations, state
from kubetune_operator.state import Child

T_RUN = "2026-12-01T00:00:00Z"
T_PREEMPTED = "2026-12-01T00:10:00Z"
T_LATER = "2026-12-01T00:12:00Z"
T_BACK = "2026-12-01T00:25:00Z"
T_AGAIN = "2026-12-01T01:00:00Z"
QUEUED = {"gpusPerNode": 8, "queueName": "team-a"}
PREEMPTION_MESSAGE = (
    "Preempted to accommodate a workload (UID: 9f542104-a9e2-4344-ad2e-9c136204da18, JobUID: "
    "a20d0a6a-64a3-46ce-9b95-8cfb3bf6e675) due to prioritization in the ClusterQueue; preemptor path: "
    "/team-a; preemptee path: /team-a"
)
CHECKPOINTS = {"latest": "/ckpt/checkpoint-120", "latestStep": 120, "count": 2}


def pytorchjob(suspended: bool) -> dict[str, Any]:
    """The PyTorchJob ``j-train`` as the Training Operator v1.9 writes it, running or suspended
    (Kueue set ``runPolicy.suspend``; the Training Operator deleted the pods)."""
    conditions = [
        {"type": "Created", "status": "True", "reason": "PyTorchJobCreated"},
        {"type": "Running", "status": str(not suspended), "reason": "PyTorchJobRunning"},
    ]
    if suspended:
        conditions.append(
            {
                "type": "Suspended",
                "status": "True",
                "reason": "PyTorchJobSuspended",
                "message": "PyTorchJob j-train is suspended.",
            }
        )
    active = 0 if suspended else 1
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "PyTorchJob",
        "metadata": {"name": "j-train", "uid": "uid-j-train", "ownerReferences": [{"uid": "uid-j"}]},
        "spec": {
            "runPolicy": {"suspend": suspended},
            "pytorchReplicaSpecs": {"Master": {"replicas": 1}},
        },
        "status": {"conditions": conditions, "replicaStatuses": {"Master": {"active": active}}},
    }


def trainjob(suspended: bool) -> dict[str, Any]:
    """The TrainJob ``j-train`` as Trainer v2.2 writes it: ``Suspended`` True while Kueue holds it,
    False (``Resumed``) once admitted again; ``jobsStatus`` from its JobSet."""
    status: dict[str, Any] = {
        "jobsStatus": [{"name": "node", "active": 0 if suspended else 1, "ready": 0 if suspended else 1}]
    }
    status["conditions"] = [
        {
            "type": "Suspended",
            "status": str(suspended),
            "reason": "Suspended" if suspended else "Resumed",
            "message": "TrainJob is suspended" if suspended else "TrainJob is resumed",
        }
    ]
    return {
        "apiVersion": builders.TRAINJOB_API_VERSION,
        "kind": "TrainJob",
        "metadata": {"name": "j-train", "uid": "uid-j-train", "ownerReferences": [{"uid": "uid-j"}]},
        "spec": {"suspend": suspended},
        "status": status,
    }


LIVE = {state.Engine.PYTORCHJOB: pytorchjob, state.Engine.TRAINJOB: trainjob}


def workload(
    engine: state.Engine,
    *,
    evicted: str | None = "Preempted",
    preempted: str | None = "InClusterQueue",
    since: str = T_PREEMPTED,
    readmitted: bool = False,
) -> dict[str, Any]:
    """Kueue's Workload of ``j-train``: evicted (reason ``evicted``, with a ``Preempted`` condition
    of reason ``preempted``), or admitted again (both False, reason QuotaReserved, "Previously: ...")."""
    kind = str(engine)
    conditions: list[dict[str, Any]] = []
    if evicted is not None and not readmitted:
        conditions += [
            {
                "type": "QuotaReserved",
                "status": "False",
                "reason": "Pending",
                "message": "insufficient quota",
            },
            {"type": "Admitted", "status": "False", "reason": "NoReservation", "message": "no reservation"},
            {
                "type": "Evicted",
                "status": "True",
                "reason": evicted,
                "message": PREEMPTION_MESSAGE if preempted else f"{evicted} message",
                "lastTransitionTime": since,
            },
            {"type": "Requeued", "status": "True", "reason": evicted, "lastTransitionTime": since},
        ]
        if preempted is not None:
            conditions.append(
                {
                    "type": "Preempted",
                    "status": "True",
                    "reason": preempted,
                    "message": PREEMPTION_MESSAGE,
                    "lastTransitionTime": since,
                }
            )
    elif readmitted:
        conditions += [
            {"type": "QuotaReserved", "status": "True", "reason": "QuotaReserved"},
            {"type": "Admitted", "status": "True", "reason": "Admitted"},
            {
                "type": "Evicted",
                "status": "False",
                "reason": "QuotaReserved",
                "message": f"Previously: {PREEMPTION_MESSAGE}",
            },
            {
                "type": "Preempted",
                "status": "False",
                "reason": "QuotaReserved",
                "message": f"Previously: {PREEMPTION_MESSAGE}",
            },
        ]
    else:  # never admitted yet: queued
        conditions.append(
            {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": "insufficient quota"}
        )
    return {
        "apiVersion": observations.KUEUE_WORKLOAD_API_VERSION,
        "kind": "Workload",
        "metadata": {
            "name": f"{kind.lower()}-j-train-3f2a1",
            "namespace": "ml",
            "labels": {observations.KUEUE_JOB_UID_LABEL: "uid-j-train"},
            "ownerReferences": [{"kind": kind, "name": "j-train", "uid": "uid-j-train", "controller": True}],
        },
        "spec": {"queueName": "team-a"},
        "status": {"conditions": conditions},
    }


def run_pass(
    engine: state.Engine,
    status: dict[str, Any] | None,
    live: dict[str, Any],
    workloads: list[dict[str, Any]],
    now: str,
    **spec: Any,
) -> tuple[list[Any], state.Transition]:
    obj = manifest(status=status, resources=QUEUED, **spec)
    seen = replace(first(obj, engine=engine), now=now)
    done, commit = drive(seen, World(children={Child.TRAINING_JOB: live}, workloads=workloads))
    assert commit.transition is not None
    return done, commit.transition


def conditions(t: state.Transition) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in t.status["conditions"]}


def merged(previous: dict[str, Any] | None, t: state.Transition, **trainer: Any) -> dict[str, Any]:
    """The status after the pass's merge patch (and the trainer's own fields)."""
    out = {**(previous or {}), **t.status, **trainer}
    return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize("engine", list(LIVE))
def test_a_preempted_job_says_so_and_resumes_from_its_checkpoint(engine: state.Engine) -> None:
    kind = str(engine)
    live = LIVE[engine]
    _, running = run_pass(engine, None, live(False), [], T_RUN)
    assert running.phase == Phase.TRAINING
    assert "preemptions" not in running.status
    status = merged(None, running, checkpoints=CHECKPOINTS)

    # Kueue preempts: its Workload Evicted (Preempted), the training object suspended
    done, preempted = run_pass(engine, status, live(True), [workload(engine)], T_PREEMPTED)
    observe = [a for a in done if isinstance(a, state.ObserveTraining)]
    assert observe and observe[0].kueue  # the Workload is read while Kueue holds the object
    assert preempted.phase == Phase.PENDING
    held = conditions(preempted)
    for ctype in (ConditionType.SUSPENDED, ConditionType.TRAINING, ConditionType.READY):
        assert held[ctype]["reason"] == Reason.PREEMPTED_BY_KUEUE, ctype
    assert held[ConditionType.SUSPENDED]["status"] == "True"
    message = held[ConditionType.SUSPENDED]["message"]
    assert message.startswith(f"Kueue preempted the {kind} (InClusterQueue: {PREEMPTION_MESSAGE})")
    assert f"Workload {kind.lower()}-j-train-3f2a1" in message
    assert "resumes from its newest checkpoint, step 120 (/ckpt/checkpoint-120)" in message
    assert "waits for Kueue to admit it" not in message
    record = preempted.status["preemptions"]
    assert record["count"] == 1
    assert record["lastTime"] == T_PREEMPTED  # Kueue's time, not the pass's
    assert (record["lastReason"], record["lastPreemptionReason"]) == ("Preempted", "InClusterQueue")
    assert record["lastMessage"] == PREEMPTION_MESSAGE
    assert (record["resumeFrom"], record["resumeStep"]) == ("/ckpt/checkpoint-120", 120)
    assert record["preemptedSeconds"] == 0 and record["readmittedTime"] is None
    assert [(e.type, e.reason) for e in preempted.events] == [("Normal", Reason.PREEMPTED_BY_KUEUE)]

    # the trainer's checkpoint on SIGTERM lands: the resume point follows it; nothing is counted twice
    status = merged(
        status, preempted, checkpoints={**CHECKPOINTS, "latest": "/ckpt/checkpoint-130", "latestStep": 130}
    )
    _, later = run_pass(engine, status, live(True), [workload(engine)], T_LATER)
    assert later.status["preemptions"]["count"] == 1
    assert later.status["preemptions"]["resumeStep"] == 130
    assert "step 130 (/ckpt/checkpoint-130)" in conditions(later)[ConditionType.TRAINING]["message"]
    assert later.events == []

    # a pass that cannot read the Workload (403, Kueue gone) keeps what it said
    status = merged(status, later)
    _, unread = run_pass(engine, status, live(True), [], T_LATER)
    assert conditions(unread)[ConditionType.SUSPENDED]["reason"] == Reason.PREEMPTED_BY_KUEUE
    assert f"InClusterQueue: {PREEMPTION_MESSAGE}" in conditions(unread)[ConditionType.SUSPENDED]["message"]
    assert unread.status["preemptions"]["count"] == 1 and unread.events == []

    # admitted again: training runs, the preemption is recorded, with the time it took
    status = merged(status, unread)
    back_workload = workload(engine, readmitted=True)
    _, back = run_pass(engine, status, live(False), [back_workload], T_BACK)
    assert back.phase == Phase.TRAINING
    again = conditions(back)
    assert again[ConditionType.SUSPENDED]["status"] == "False"
    assert again[ConditionType.SUSPENDED]["reason"] == Reason.NOT_SUSPENDED
    assert again[ConditionType.TRAINING]["status"] == "True"
    record = back.status["preemptions"]
    assert record["count"] == 1 and record["readmittedTime"] == T_BACK
    assert record["preemptedSeconds"] == 15 * 60  # 00:10 to 00:25
    readmitted = [e for e in back.events if e.reason == EventReason.READMITTED]
    assert len(readmitted) == 1
    assert readmitted[0].message == (
        f"Kueue admitted the {kind} again after 900 s evicted; training resumes from step 130"
    )
    FineTuneJobStatus.model_validate(merged(status, back))  # the status model reads it back

    # preempted a second time: counted again, its own time
    status = merged(status, back)
    _, second = run_pass(engine, status, live(True), [workload(engine, since=T_AGAIN)], T_AGAIN)
    record = second.status["preemptions"]
    assert record["count"] == 2 and record["lastTime"] == T_AGAIN
    assert record["readmittedTime"] is None  # null: the merge patch removes the last one's
    assert record["preemptedSeconds"] == 15 * 60
    assert [e.reason for e in second.events] == [Reason.PREEMPTED_BY_KUEUE]


@pytest.mark.parametrize("engine", list(LIVE))
def test_queued_before_its_first_admission_is_not_preempted(engine: state.Engine) -> None:
    queued_workload = workload(engine, evicted=None, preempted=None)
    for workloads in ([queued_workload], []):  # Kueue's queued Workload, or none yet
        _, t = run_pass(engine, None, LIVE[engine](True), workloads, T_RUN)
        assert t.phase == Phase.PENDING
        assert conditions(t)[ConditionType.SUSPENDED]["reason"] == Reason.QUEUED
        assert "preemptions" not in t.status


@pytest.mark.parametrize("engine", list(LIVE))
def test_another_eviction_by_kueue_names_kueues_reason(engine: state.Engine) -> None:
    _, running = run_pass(engine, None, LIVE[engine](False), [], T_RUN)
    evicted = workload(engine, evicted="PodsReadyTimeout", preempted=None)
    _, t = run_pass(engine, merged(None, running), LIVE[engine](True), [evicted], T_PREEMPTED)
    held = conditions(t)[ConditionType.SUSPENDED]
    assert held["reason"] == Reason.EVICTED_BY_KUEUE
    assert held["message"].startswith(
        f"Kueue evicted the {engine} (PodsReadyTimeout: PodsReadyTimeout message)"
    )
    assert "resumes from the start (no complete checkpoint yet)" in held["message"]
    assert t.status["preemptions"]["lastReason"] == "PodsReadyTimeout"
    assert t.status["preemptions"]["lastPreemptionReason"] is None
    assert [(e.type, e.reason) for e in t.events] == [("Warning", Reason.EVICTED_BY_KUEUE)]


def test_a_job_that_trained_and_is_held_again_without_its_workload_was_evicted() -> None:
    engine = state.Engine.PYTORCHJOB
    _, running = run_pass(engine, None, pytorchjob(False), [], T_RUN)
    _, t = run_pass(engine, merged(None, running), pytorchjob(True), [], T_PREEMPTED)
    held = conditions(t)[ConditionType.SUSPENDED]
    assert held["reason"] == Reason.EVICTED_BY_KUEUE
    assert "its Workload could not be read to say why" in held["message"]
    assert t.status["preemptions"]["count"] == 1 and t.status["preemptions"]["lastTime"] == T_PREEMPTED


def test_spec_suspend_is_the_users_and_reads_no_workload() -> None:
    done, t = run_pass(
        state.Engine.PYTORCHJOB,
        None,
        pytorchjob(True),
        [workload(state.Engine.PYTORCHJOB)],
        T_RUN,
        suspend=True,
    )
    assert not any(isinstance(a, state.ObserveTraining) and a.kueue for a in done)
    assert t.phase == Phase.SUSPENDED
    assert conditions(t)[ConditionType.SUSPENDED]["reason"] == Reason.SUSPENDED_BY_USER


def test_the_workload_fold_reads_what_kueue_writes() -> None:
    engine = state.Engine.TRAINJOB
    seen = observations.kueue_workload([workload(engine)], "uid-j-train")
    assert seen is not None and seen.evicted and seen.preempted
    assert (seen.reason, seen.preemption_reason, seen.since) == ("Preempted", "InClusterQueue", T_PREEMPTED)
    assert seen.name == "trainjob-j-train-3f2a1" and seen.message == PREEMPTION_MESSAGE
    back = observations.kueue_workload([workload(engine, readmitted=True)], "uid-j-train")
    assert back is not None and not back.evicted  # "Previously: ..." conditions are False
    assert observations.kueue_workload([], "uid-j-train") is None
    # one owned by the training object wins over another with the label (a stale copy)
    stranger = workload(engine, evicted="Deactivated", preempted=None)
    stranger["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    stranger["metadata"]["name"] = "stale"
    ours = observations.kueue_workload([stranger, workload(engine, readmitted=True)], "uid-j-train")
    assert ours is not None and ours.name == "trainjob-j-train-3f2a1" and not ours.evicted


def test_the_pass_reads_the_workload_by_kueues_job_uid_label_and_a_refusal_holds_nothing() -> None:
    """The reconciler's read: Kueue's Workloads of the training object, by the job-uid label Kueue
    puts on them; a refused list (403: the RBAC of an older install; 404: no Kueue) is logged and the
    pass goes on without them."""
    from typing import cast

    from kubetune_operator import reconcile
    from kubetune_operator.kube import ApiError, Kube

    class Workloads:
        def __init__(self, answer: list[dict[str, Any]] | ApiError) -> None:
            self.answer, self.asked = answer, []

        def list(self, api_version: str, kind: str, namespace: str, selector: str = "") -> Any:
            self.asked.append((api_version, kind, namespace, selector))
            if isinstance(self.answer, ApiError):
                raise self.answer
            return self.answer

    live = {**pytorchjob(True), "metadata": {**pytorchjob(True)["metadata"], "namespace": "ml"}}
    kube = Workloads([workload(state.Engine.PYTORCHJOB)])
    ctx = reconcile.Context(kube=cast(Kube, kube), settings=cast(Any, None), emit=lambda *_: None)
    seen = reconcile._kueue_workload(ctx, live)
    assert kube.asked == [("kueue.x-k8s.io/v1beta2", "Workload", "ml", "kueue.x-k8s.io/job-uid=uid-j-train")]
    assert seen is not None and seen.preempted and seen.preemption_reason == "InClusterQueue"
    forbidden = Workloads(ApiError(403, "Forbidden", '{"message": "workloads.kueue.x-k8s.io is forbidden"}'))
    ctx = reconcile.Context(kube=cast(Kube, forbidden), settings=cast(Any, None), emit=lambda *_: None)
    assert reconcile._kueue_workload(ctx, live) is None


def test_evicted_again_before_a_pass_saw_it_run_is_counted_with_the_first_wait() -> None:
    engine = state.Engine.PYTORCHJOB
    _, running = run_pass(engine, None, pytorchjob(False), [], T_RUN)
    status = merged(None, running)
    _, first_time = run_pass(engine, status, pytorchjob(True), [workload(engine)], T_PREEMPTED)
    status = merged(status, first_time)
    # admitted and preempted again between two passes: Kueue's Evicted time moved on
    _, second = run_pass(engine, status, pytorchjob(True), [workload(engine, since=T_BACK)], T_BACK)
    record = second.status["preemptions"]
    assert (record["count"], record["lastTime"], record["preemptedSeconds"]) == (2, T_BACK, 15 * 60)
    assert [e.reason for e in second.events] == [Reason.PREEMPTED_BY_KUEUE]


def test_kueues_words_fill_in_an_eviction_said_without_them() -> None:
    engine = state.Engine.PYTORCHJOB
    _, running = run_pass(engine, None, pytorchjob(False), [], T_RUN)
    status = merged(None, running)
    _, unknown = run_pass(engine, status, pytorchjob(True), [], T_PREEMPTED)  # the Workload unread
    assert unknown.status["preemptions"]["lastReason"] is None
    status = merged(status, unknown)
    _, known = run_pass(engine, status, pytorchjob(True), [workload(engine, since=T_LATER)], T_LATER)
    record = known.status["preemptions"]
    assert record["count"] == 1 and record["lastTime"] == T_PREEMPTED  # the same eviction, not a second
    assert (record["lastReason"], record["lastPreemptionReason"]) == ("Preempted", "InClusterQueue")
    assert conditions(known)[ConditionType.SUSPENDED]["reason"] == Reason.PREEMPTED_BY_KUEUE
    assert known.events == []
