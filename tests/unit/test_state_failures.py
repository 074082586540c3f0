"""Why training failed, from the PyTorchJob's pods onto the FineTuneJob: the trainer's classified
failure (its termination message), the kubelet's OOMKilled, an eviction, the deadline; the reason on
Training and Ready and a Warning event. And a run stopped at its budget: Succeeded with
BudgetReached, registered unless ``budget.register`` is false."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.support.state_obs import T0, obs

from kubetune_api.failures import HINTS, Failure, TrainingFailure
from kubetune_api.spec import parse_job
from kubetune_api.status import BudgetStatus, ConditionType, FineTuneJobStatus, Phase, Reason
from kubetune_operator import state
from kubetune_operator.observations import RegistrationObservation
from kubetune_operator.state import TrainingObservation
from kubetune_operator.training_failures import RestartEvidence, incarnations, training_failure

FAILED = TrainingObservation(True, "Failed", "PyTorchJobFailed", "PyTorchJob j-train is failed")


def pod(name: str, terminated: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    cs = [{"name": "pytorch", "state": {"terminated": terminated}}] if terminated else []
    return {
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "pytorch", "resources": {"limits": {"memory": "2Gi"}}}]},
        "status": {"phase": "Failed", "containerStatuses": cs, **status},
    }


def test_the_trainers_failure_is_read_from_the_termination_message() -> None:
    disk = TrainingFailure.of(Failure.DISK_FULL, "No space left on device: 0.0 GiB free of 10.0 GiB", step=40)
    pods = [
        pod("j-train-master-0", {"exitCode": 3, "message": disk.termination_message(), "finishedAt": "t2"})
    ]
    got = training_failure(FAILED, pods, "pytorch")
    assert got is not None and got.reason == Failure.DISK_FULL and got.step == 40
    assert got.message.startswith("pod j-train-master-0: No space left on device")


def test_oom_killed_is_host_out_of_memory_with_the_limit() -> None:
    pods = [pod("j-train-master-0", {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "t1"})]
    got = training_failure(FAILED, pods, "pytorch")
    assert got is not None and got.reason == Failure.HOST_OUT_OF_MEMORY
    assert "memory limit 2Gi" in got.message


def test_the_first_pod_to_fail_tells_the_cause_and_a_preemption_never_hides_one() -> None:
    nccl = TrainingFailure.of(Failure.NCCL_ERROR, "peer went away")
    oom = TrainingFailure.of(Failure.CUDA_OUT_OF_MEMORY, "CUDA out of memory")
    pre = TrainingFailure.of(Failure.PREEMPTED, "SIGTERM")
    pods = [
        pod(
            "a",
            {"exitCode": 142, "message": nccl.termination_message(), "finishedAt": "2026-01-01T00:00:09Z"},
        ),
        pod("b", {"exitCode": 3, "message": oom.termination_message(), "finishedAt": "2026-01-01T00:00:05Z"}),
        pod(
            "c", {"exitCode": 143, "message": pre.termination_message(), "finishedAt": "2026-01-01T00:00:01Z"}
        ),
    ]
    got = training_failure(FAILED, pods, "pytorch")
    assert got is not None and got.reason == Failure.CUDA_OUT_OF_MEMORY


def test_an_evicted_pod_a_log_tail_and_the_deadline() -> None:
    evicted = pod("e", reason="Evicted", message="The node was low on resource: memory.")
    got = training_failure(FAILED, [evicted], "pytorch")
    assert got is not None and got.reason == Failure.EVICTED and "low on resource" in got.message
    crash = pod("x", {"exitCode": 1, "reason": "Error", "message": "Traceback\nValueError: boom"})
    got = training_failure(FAILED, [crash], "pytorch")
    assert got is not None and got.reason == Failure.UNKNOWN and "ValueError: boom" in got.message
    late = TrainingObservation(
        True,
        "Failed",
        "PyTorchJobFailed",
        "Job j-train has failed because it was active longer than specified deadline",
    )
    got = training_failure(late, [], "pytorch")
    assert got is not None and got.reason == Failure.DEADLINE_EXCEEDED
    # a job whose name says "deadline", failed for another reason, is not a deadline
    named = TrainingObservation(
        True,
        "Failed",
        "PyTorchJobFailed",
        "PyTorchJob paper-deadline-train has failed because 1 Master replica(s) failed.",
    )
    assert training_failure(named, [crash], "pytorch").reason == Failure.UNKNOWN  # type: ignore[union-attr]
    assert training_failure(FAILED, [], "pytorch") is None


@pytest.mark.parametrize("reason", list(Failure))
def test_every_reason_lands_on_training_and_ready_with_its_hint_and_a_warning_event(reason: Failure) -> None:
    failure = TrainingFailure.of(reason, "what happened", step=7)
    previous = FineTuneJobStatus(phase=Phase.TRAINING)
    t = state.transition(previous, obs(training=FAILED, failure=failure))
    assert t.phase == Phase.FAILED
    conds = {c["type"]: c for c in t.status["conditions"]}
    for kind in (ConditionType.READY, ConditionType.TRAINING):
        assert conds[kind]["status"] == "False" and conds[kind]["reason"] == reason
        assert "what happened" in conds[kind]["message"] and HINTS[reason] in conds[kind]["message"]
    assert [(e.type, e.reason) for e in t.events] == [("Warning", reason)]


def test_without_a_classified_failure_the_generic_message_stands() -> None:
    t = state.transition(FineTuneJobStatus(phase=Phase.TRAINING), obs(training=FAILED))
    conds = {c["type"]: c for c in t.status["conditions"]}
    assert conds[ConditionType.READY]["reason"] == Reason.TRAINING_FAILED


BUDGET = BudgetStatus(reached=True, limit="maxDuration 30s", step=12, total_steps=400)
DONE = TrainingObservation(True, "Succeeded", "PyTorchJobSucceeded", "")


def test_a_budget_stop_is_succeeded_with_budget_reached_and_registered() -> None:
    result = {"name": "m", "version": "1", "uri": "models:/m/1"}
    reg = RegistrationObservation(exists=True, state="Complete", result=result)
    t = state.transition(
        FineTuneJobStatus(phase=Phase.REGISTERING), obs(training=DONE, budget=BUDGET, registration=reg)
    )
    assert t.phase == Phase.SUCCEEDED
    conds = {c["type"]: c for c in t.status["conditions"]}
    budget = conds[ConditionType.BUDGET_REACHED]
    assert budget["status"] == "True" and budget["reason"] == Reason.BUDGET_REACHED
    assert "maxDuration 30s" in budget["message"] and "step 12 of 400" in budget["message"]
    assert conds[ConditionType.REGISTERED]["status"] == "True"


def test_a_budget_stop_with_register_false_is_succeeded_without_registration() -> None:
    t = state.transition(
        FineTuneJobStatus(phase=Phase.TRAINING), obs(training=DONE, budget=BUDGET, registration_enabled=False)
    )
    assert t.phase == Phase.SUCCEEDED
    conds = {c["type"]: c for c in t.status["conditions"]}
    assert conds[ConditionType.REGISTERED]["reason"] == Reason.REGISTRATION_DISABLED
    assert "spec.budget.register is false" in conds[ConditionType.REGISTERED]["message"]
    assert ConditionType.BUDGET_REACHED in conds


def test_a_job_without_a_budget_has_no_budget_condition() -> None:
    t = state.transition(
        FineTuneJobStatus(phase=Phase.TRAINING), obs(training=DONE, registration_enabled=False)
    )
    assert ConditionType.BUDGET_REACHED not in {c["type"] for c in t.status["conditions"]}


def _job(budget: dict[str, Any] | None) -> Any:
    spec: dict[str, Any] = {
        "model": {"name": "Qwen/Qwen2-0.5B"},
        "dataset": {"name": "org/data"},
        "training": {"maxSteps": 10},
        "resources": {"gpusPerNode": 8, "nodes": 2},
        "storage": {"accessMode": "ReadWriteMany"},
    }
    if budget is not None:
        spec["budget"] = budget
    return parse_job({"metadata": {"name": "j", "namespace": "ml"}, "spec": spec})


def test_registration_is_wanted_unless_the_budget_stopped_it_with_register_false() -> None:
    stopped = FineTuneJobStatus(budget=BUDGET)
    assert state.registration_wanted(_job({"maxDuration": "30s"}), stopped)
    assert not state.registration_wanted(_job({"maxDuration": "30s", "register": False}), stopped)
    assert state.registration_wanted(_job({"maxDuration": "30s", "register": False}), FineTuneJobStatus())


def test_the_pytorchjob_gets_no_deadline_at_creation() -> None:
    """The Training Operator's clock starts before the pods run (waiting for GPUs counts): the budget's
    deadline is set only once they run (``children.sync_deadline``, through the real API server in
    tests/integration/test_operator_failures.py)."""
    from kubetune_operator.builders import build_pytorchjob
    from kubetune_operator.settings import Settings

    policy = build_pytorchjob(_job({"maxDuration": "2h"}), Settings())["spec"]["runPolicy"]
    assert "activeDeadlineSeconds" not in policy


def test_the_deadline_is_the_budget_plus_a_margin() -> None:
    job = _job({"maxDuration": "2h"})
    assert job.spec.budget is not None and job.spec.budget.deadline_seconds(16) == 7200 + 1800
    # 16 GPU-hours on 16 GPUs is one hour of wall time; the margin is at least 15 minutes
    job = _job({"maxGpuHours": 16})
    assert job.spec.budget is not None and job.spec.budget.deadline_seconds(16) == 3600 + 900


def test_a_pod_that_cannot_mount_its_volume_shows_mount_failed_while_it_waits() -> None:
    from kubetune_operator.observations import pods_observation, shown_trouble

    ptj = {
        "metadata": {"name": "j-train", "uid": "ptj"},
        "spec": {"pytorchReplicaSpecs": {"Master": {"replicas": 1}}},
    }
    owner = [{"uid": "ptj", "controller": True}]
    pending = {
        "metadata": {"name": "j-train-master-0", "uid": "p1", "ownerReferences": owner},
        "status": {"phase": "Pending"},
    }
    event = {
        "reason": "FailedMount",
        "involvedObject": {"kind": "Pod", "uid": "p1"},
        "message": 'MountVolume.SetUp failed for volume "ckpt": persistentvolumeclaim "j-ckpt" not found',
        "lastTimestamp": "2026-01-01T00:00:00Z",
    }
    seen = pods_observation(ptj, [pending], [], [event])
    assert seen.trouble is not None and seen.trouble.reason == Reason.MOUNT_FAILED
    shown = shown_trouble(
        seen, TrainingObservation(True, "Created"), now="x", namespace="ml", pytorchjob_name="j-train"
    )
    assert shown is not None and shown[0] == Reason.MOUNT_FAILED and '"j-ckpt" not found' in shown[1]
    # the same event for another pod, or a running pod, is no trouble
    assert pods_observation(ptj, [{**pending, "status": {"phase": "Running"}}], [], [event]).trouble is None


# --- restarts the Training Operator never fails (kubeflow/trainer#2045): the operator counts them ----


class TrainingOperator:
    """What the Training Operator v1.9 leaves for the operator to read when it restarts a pod that
    exited with a retryable code (``restartPolicy: ExitCode``): the failed pod deleted and created
    again under its name with a new UID, and TWO ``PyTorchJobRestarting`` events, the shared pod
    reconciler's and the PyTorchJob status update's, each aggregated into one Event whose count
    grows (pkg/controller.v1/common/pod.go, pytorch/pytorchjob_controller.go)."""

    def __init__(self, *names: str) -> None:
        self.uids = dict.fromkeys(names, 0)
        self.events: dict[str, dict[str, Any]] = {}

    def pods(self) -> list[dict[str, Any]]:
        labels = {"training.kubeflow.org/job-name": "j-train"}
        return [
            {"metadata": {"name": n, "uid": f"{n}-{i}", "labels": labels}, "status": {"phase": "Running"}}
            for n, i in self.uids.items()
        ]

    def restart(self, name: str) -> None:
        self.uids[name] += 1
        replica = name.split("-")[-2].capitalize()
        for message in (
            f"job j-train is restarting because {replica} replica(s) failed.",
            f"PyTorchJob j-train is restarting because 1 {replica} replica(s) failed.",
        ):
            event = self.events.setdefault(
                message, {"reason": "PyTorchJobRestarting", "message": message, "count": 0}
            )
            event["count"] += 1


RESTARTING = TrainingObservation(True, "Restarting", "PyTorchJobRestarting", "restarting")


def _pass(status: FineTuneJobStatus, to: TrainingOperator, **kw: Any) -> state.Transition:
    """One pass of the operator over what the Training Operator wrote: its list of the pods."""
    seen = RestartEvidence(pods=incarnations(to.pods()))
    return state.transition(status, obs(**{"training": RESTARTING, "restart_evidence": seen, **kw}))


def _next(t: state.Transition) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate({**t.status, "phase": t.status["phase"]})


def test_two_restarting_events_per_restart_count_once_and_the_limit_is_the_one_allowed() -> None:
    """The Training Operator's two events per restart made the operator count each restart twice: a
    limit of 6 failed the job after 3 restarts. Counted from the recreated pods, 6 restarts are
    allowed and the 7th fails the job, with the last attempt's reason."""
    oom = training_failure(FAILED, [pod("m", {"exitCode": 137, "reason": "OOMKilled"})], "pytorch")
    to = TrainingOperator("j-train-master-0")
    t = _pass(FineTuneJobStatus(phase=Phase.TRAINING), to, restart_limit=6)  # the first pod
    for n in range(1, 7):
        to.restart("j-train-master-0")
        t = _pass(_next(t), to, restart_limit=6, attempt_failure=oom)
        assert t.phase == Phase.TRAINING, (n, t.status["conditions"])
        # a pass that sees the same pods again counts nothing more
        t = _pass(_next(t), to, restart_limit=6)
        assert t.status["trainingRestarts"]["sinceProgress"] == n
    assert sum(e["count"] for e in to.events.values()) == 12  # what the events said: twice as many
    assert t.status["trainingRestarts"]["lastReason"] == Failure.HOST_OUT_OF_MEMORY
    to.restart("j-train-master-0")
    t = _pass(_next(t), to, restart_limit=6)
    assert t.phase == Phase.FAILED
    ready = next(c for c in t.status["conditions"] if c["type"] == ConditionType.READY)
    assert ready["reason"] == Failure.HOST_OUT_OF_MEMORY
    assert "restarted 7 times without a new checkpoint (limit 6" in ready["message"]
    assert "memory limit 2Gi" in ready["message"]


def test_each_recreated_pod_of_a_two_node_job_is_one_restart() -> None:
    to = TrainingOperator("j-train-master-0", "j-train-worker-0")
    t = _pass(FineTuneJobStatus(phase=Phase.TRAINING), to)
    to.restart("j-train-worker-0")
    t = _pass(_next(t), to)
    assert t.status["trainingRestarts"]["total"] == 1
    to.restart("j-train-worker-0")
    to.restart("j-train-master-0")
    t = _pass(_next(t), to)
    assert t.status["trainingRestarts"]["total"] == 3


def test_an_operator_restarted_mid_job_neither_loses_nor_doubles_the_count() -> None:
    """The count and the incarnations seen live in the status: a new operator process (no pod watch
    notes, the old events still there) reads the same pods and counts nothing again; a restart
    during its absence counts once; one after it, once more."""
    to = TrainingOperator("j-train-master-0")
    t = _pass(FineTuneJobStatus(phase=Phase.TRAINING), to)
    for _ in range(3):
        to.restart("j-train-master-0")
        t = _pass(_next(t), to)
    stored = json.loads(json.dumps(t.status))  # what the API server keeps of the status
    # the new process: only the status and the cluster's objects
    t = _pass(FineTuneJobStatus.model_validate(stored), to)
    assert t.status["trainingRestarts"]["total"] == 3
    to.restart("j-train-master-0")  # while no operator ran
    t = _pass(FineTuneJobStatus.model_validate(stored), to)
    assert t.status["trainingRestarts"]["total"] == 4
    to.restart("j-train-master-0")
    t = _pass(_next(t), to)
    assert t.status["trainingRestarts"] | {"pods": None} == {
        "total": 5, "sinceProgress": 5, "pods": None
    }  # fmt: skip


def test_the_pod_watchs_incarnations_between_two_passes_each_count() -> None:
    """A pod that failed and was recreated twice between two passes: the pod watch saw each
    incarnation (older first), the pass's list the newest; a pod being deleted is none."""
    to = TrainingOperator("j-train-master-0")
    t = _pass(FineTuneJobStatus(phase=Phase.TRAINING), to)
    to.restart("j-train-master-0")
    watched = incarnations(to.pods())
    to.restart("j-train-master-0")
    listed = incarnations(to.pods())
    deleting = [{**p, "metadata": {**p["metadata"], "deletionTimestamp": T0}} for p in to.pods()]
    assert incarnations(deleting) == ()
    seen = RestartEvidence(pods=watched + listed + listed)
    t = state.transition(_next(t), obs(training=RESTARTING, restart_evidence=seen))
    assert t.status["trainingRestarts"]["total"] == 2


def test_a_suspended_pytorchjobs_resume_is_no_restart() -> None:
    """Suspended (Kueue, spec.suspend), the Training Operator deletes the pods; those of the resume
    are new incarnations, not restarts."""
    to = TrainingOperator("j-train-master-0")
    t = _pass(FineTuneJobStatus(phase=Phase.TRAINING), to)
    to.restart("j-train-master-0")
    t = _pass(_next(t), to)
    suspended = TrainingObservation(True, "Suspended", "PyTorchJobSuspended", "suspended")
    t = state.transition(_next(t), obs(training=suspended))
    assert t.status["trainingRestarts"]["pods"] == []
    to.uids["j-train-master-0"] += 1  # the resume's pod
    t = _pass(_next(t), to)
    assert t.status["trainingRestarts"]["total"] == 1


def test_a_new_checkpoint_starts_the_count_over() -> None:
    to = TrainingOperator("j-train-master-0")
    status = FineTuneJobStatus.model_validate(
        {"phase": "Training", "trainingRestarts": {"total": 6, "sinceProgress": 6, "checkpointStep": 100}}
    )
    t = _pass(status, to, checkpoint_step=100)
    # preempted again and again, but each attempt saved a newer checkpoint: never the limit
    for _ in range(2):
        to.restart("j-train-master-0")
    t = _pass(_next(t), to, checkpoint_step=200, restart_limit=6)
    assert t.phase == Phase.TRAINING
    assert (t.status["trainingRestarts"]["total"], t.status["trainingRestarts"]["sinceProgress"]) == (7, 1)
    assert t.status["trainingRestarts"]["checkpointStep"] == 200
    # without a new checkpoint the count goes on
    to.restart("j-train-master-0")
    t = _pass(_next(t), to, checkpoint_step=200, restart_limit=6)
    assert (t.status["trainingRestarts"]["total"], t.status["trainingRestarts"]["sinceProgress"]) == (8, 2)


def test_a_trainjobs_restarts_are_its_jobsets_count_and_an_older_operators_is_kept() -> None:
    """JobSet ``status.restarts``: one per restart of the gang; the count an older operator kept in
    ``trainingRestarts.events`` is the one already counted."""
    status = FineTuneJobStatus.model_validate(
        {"phase": "Training", "trainingRestarts": {"total": 2, "sinceProgress": 2, "events": 2}}
    )
    t = state.transition(
        status, obs(training=RESTARTING, restart_evidence=RestartEvidence(jobset_restarts=3))
    )
    assert t.status["trainingRestarts"]["total"] == 3 and t.status["trainingRestarts"]["jobSetRestarts"] == 3
    t = state.transition(
        _next(t), obs(training=RESTARTING, restart_evidence=RestartEvidence(jobset_restarts=3))
    )
    assert t.status["trainingRestarts"]["total"] == 3


def test_a_preparation_pod_that_cannot_pull_its_image_shows_while_the_job_prepares() -> None:
    from kubetune_operator.observations import preparation_observation

    job = {"metadata": {"name": "j-prepare", "uid": "pj"}, "status": {"active": 1}}
    waiting = {"reason": "ErrImagePull", "message": "dial tcp: lookup registry.invalid: no such host"}
    pod = {
        "metadata": {"name": "j-prepare-abc", "ownerReferences": [{"uid": "pj"}], "creationTimestamp": "t"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "prepare", "image": "registry.invalid/x:0", "state": {"waiting": waiting}}
            ],
        },
    }
    prep = preparation_observation(job, [pod], "prepare")
    assert (
        prep.state == "Running" and prep.trouble is not None and prep.trouble[0] == Reason.IMAGE_PULL_FAILED
    )
    t = state.transition(
        FineTuneJobStatus(phase=Phase.PREPARING), obs(preparation=prep, preparation_job_name="j-prepare")
    )
    assert t.phase == Phase.PREPARING
    conds = {c["type"]: c for c in t.status["conditions"]}
    for kind in (ConditionType.PREPARED, ConditionType.READY):
        assert conds[kind]["reason"] == Reason.IMAGE_PULL_FAILED
        assert "no such host" in conds[kind]["message"] and "j-prepare" in conds[kind]["message"]


def test_the_deadline_is_set_again_after_each_restart_of_the_pods() -> None:
    """The Training Operator keeps status.startTime across pod restarts: a preempted job that waited
    for GPUs again must not reach the deadline for that wait. Set once per start and restart count."""
    from datetime import UTC, datetime, timedelta

    from kubetune_api.status import TrainingRestarts
    from kubetune_operator.children import sync_deadline

    class Kube:
        def __init__(self) -> None:
            self.patches: list[dict[str, Any]] = []

        def patch(self, _api: str, _kind: str, _ns: str, _name: str, body: dict[str, Any]) -> dict[str, Any]:
            self.patches.append(body)
            meta = {"name": "j-train", "namespace": "ml", **body["metadata"]}
            return {"apiVersion": "kubeflow.org/v1", "metadata": meta, "spec": body["spec"]}

    now = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    started = (now - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job = _job({"maxDuration": "2h"})
    ptj: dict[str, Any] = {
        "apiVersion": "kubeflow.org/v1",
        "metadata": {"name": "j-train", "namespace": "ml"},
        "status": {"startTime": started},
    }
    kube = Kube()
    first = sync_deadline(kube, ptj, job, now)  # type: ignore[arg-type]
    assert kube.patches[-1]["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600 + 7200 + 1800
    assert sync_deadline(kube, {**first, "status": ptj["status"]}, job, now) is not None
    assert len(kube.patches) == 1  # the same start: set once
    job.status = FineTuneJobStatus(trainingRestarts=TrainingRestarts(total=1))
    later = now + timedelta(hours=2)  # preempted, waited for GPUs, running again
    sync_deadline(kube, {**first, "status": ptj["status"]}, job, later)  # type: ignore[arg-type]
    assert len(kube.patches) == 2
    assert kube.patches[-1]["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3 * 3600 + 7200 + 1800
    assert kube.patches[-1]["metadata"]["annotations"]["kubetune.io/deadline-for-start"].endswith(
        "after 1 restarts"
    )
