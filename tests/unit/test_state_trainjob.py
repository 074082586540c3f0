"""A job on Kubeflow Trainer v2 (issue 31 item 2): the TrainJob's status as Trainer v2.2 writes it
(conditions ``Suspended``/``Complete``/``Failed`` only, ``jobsStatus`` mirrored from its JobSet)
read into the same decisive condition as a PyTorchJob's, and the one state machine's decisions on
it: the phases, conditions and messages, the registration Job after ``Complete``, suspend (its
``spec.suspend``) and Kueue's queue."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.test_state_advance import World, drive, first, kinds, manifest

from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.status import ConditionType, Phase, Reason
from kubetune_operator import builders, children, observations, state, training_failures
from kubetune_operator.settings import Settings
from kubetune_operator.state import Child

TJ = state.Engine.TRAINJOB


def trainjob(*conditions: tuple[str, str, str], active: int | None = None, ready: int = 0) -> dict[str, Any]:
    """A TrainJob ``j-train`` of the job ``j`` with these (type, status, reason) conditions and, when
    ``active`` is given, the ``node`` step's jobsStatus."""
    status: dict[str, Any] = {}
    if conditions:
        status["conditions"] = [
            {"type": t, "status": s, "reason": r, "message": f"{r} message"} for t, s, r in conditions
        ]
    if active is not None:
        status["jobsStatus"] = [
            {"name": "node", "active": active, "ready": ready, "succeeded": 0, "failed": 0, "suspended": 0}
        ]
    meta = {"name": "j-train", "uid": "uid-tj", "ownerReferences": [{"uid": "uid-j", "kind": "FineTuneJob"}]}
    return {
        "apiVersion": builders.TRAINJOB_API_VERSION,
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {"suspend": False},
        "status": status,
    }


OBSERVED = {
    "no-status": (trainjob(), None),
    "jobs-not-active-yet": (trainjob(active=0), "Created"),
    # JobSet counts a Job active from its first pod, Pending included: not running before it is ready
    "pods-waiting-for-a-node": (trainjob(active=1, ready=0), "Created"),
    "running-never-suspended": (trainjob(active=1, ready=1), "Running"),
    "resumed-and-running": (trainjob(("Suspended", "False", "Resumed"), active=1, ready=1), "Running"),
    "suspended": (trainjob(("Suspended", "True", "Suspended"), active=0), "Suspended"),
    "complete": (trainjob(("Complete", "True", "AllJobsCompleted"), active=0), "Succeeded"),
    "failed": (trainjob(("Failed", "True", "FailJobSetFailurePolicyAction"), active=0), "Failed"),
    "failed-after-a-resume": (
        trainjob(("Suspended", "False", "Resumed"), ("Failed", "True", "ReachedMaxRestarts")),
        "Failed",
    ),
}


@pytest.mark.parametrize("name", list(OBSERVED))
def test_a_trainjob_status_reads_as_the_pytorchjob_condition_it_means(name: str) -> None:
    obj, condition = OBSERVED[name]
    seen = observations.training_observation(obj)
    assert seen.exists and seen.condition == condition
    if condition in ("Failed", "Succeeded", "Suspended"):
        truth = next(c for c in obj["status"]["conditions"] if c["status"] == "True")
        assert (seen.reason, seen.message) == (truth["reason"], f"{truth['reason']} message")


def test_the_pods_run_once_the_jobset_counts_the_node_job_ready() -> None:
    assert not observations.pods_running(trainjob(active=1, ready=0))
    assert observations.pods_running(trainjob(active=1, ready=1))
    assert observations.replica_pods(trainjob(active=1)) == []  # random names: none expected by name
    assert observations.training_pod_selector(trainjob()) == "jobset.sigs.k8s.io/jobset-name=j-train"


def _pass(obj: dict[str, Any], live: dict[str, Any]) -> tuple[list[str], state.Commit]:
    done, commit = drive(first(obj, engine=TJ), World(children={Child.TRAINING_JOB: live}))
    return kinds(done), commit


def _conditions(commit: state.Commit) -> dict[str, dict[str, Any]]:
    assert commit.transition is not None
    return {c["type"]: c for c in commit.transition.status["conditions"]}


def test_running_trainjob_is_training_and_the_status_names_it() -> None:
    actions, commit = _pass(manifest(), trainjob(active=1, ready=1))
    assert "SyncSuspend" in actions and "SyncDeadline" in actions
    assert commit.transition is not None
    status = commit.transition.status
    assert status["phase"] == Phase.TRAINING and status["engine"] == "TrainJob"
    assert status["children"] == {"checkpointClaim": "j-ckpt", "configMap": "j-config", "trainJob": "j-train"}
    assert _conditions(commit)[ConditionType.TRAINING]["status"] == "True"
    assert "TrainJob exist" in _conditions(commit)[ConditionType.CHILDREN_READY]["message"]


def test_complete_trainjob_creates_the_registration_job() -> None:
    actions, commit = _pass(manifest(), trainjob(("Complete", "True", "AllJobsCompleted"), active=0))
    assert "EnsureChild:registrationJob" in actions
    assert "SyncSuspend" not in actions  # a finished TrainJob is left alone
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.REGISTERING


def test_complete_trainjob_with_registration_off_succeeds() -> None:
    live = trainjob(("Complete", "True", "AllJobsCompleted"), active=0)
    actions, commit = _pass(manifest(registration={"enabled": False}), live)
    assert "EnsureChild:registrationJob" not in actions
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.SUCCEEDED


def test_failed_trainjob_fails_the_job_and_says_where_the_logs_are() -> None:
    live = trainjob(("Failed", "True", "FailJobSetFailurePolicyAction"), active=0)
    actions, commit = _pass(manifest(), live)
    assert "ObserveTraining" in actions and "StopTraining" not in actions  # it stopped by itself
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.FAILED
    training = _conditions(commit)[ConditionType.TRAINING]
    assert training["reason"] == Reason.TRAINING_FAILED
    assert "TrainJob j-train failed (FailJobSetFailurePolicyAction" in training["message"]
    assert "-l jobset.sigs.k8s.io/jobset-name=j-train" in training["message"]


def test_a_permanent_exit_code_is_explained_from_the_node_container() -> None:
    """The JobSet does not restart after a permanent exit code: the failed pod stays, and its
    ``node`` container's termination message (the trainer's classified failure) is the cause."""
    message = TrainingFailure.of(Failure.DATASET_ERROR, "column text missing").termination_message()
    pod = {
        "metadata": {"name": "j-train-node-0-0-abcde", "labels": {observations.JOBSET_NAME_LABEL: "j-train"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "node",
                    "state": {
                        "terminated": {
                            "exitCode": 3,
                            "message": message,
                            "finishedAt": "2026-12-01T00:01:00Z",
                        }
                    },
                }
            ],
        },
    }
    seen = observations.training_observation(trainjob(("Failed", "True", "FailJobSetFailurePolicyAction")))
    container = observations.TRAINING_CONTAINER[TJ]
    assert container == builders.TRAINJOB_CONTAINER == observations.training_container_of_pod(pod)
    failure = training_failures.training_failure(seen, [pod], container)
    assert failure is not None and failure.reason == Failure.DATASET_ERROR
    assert "j-train-node-0-0-abcde" in failure.message


def test_trainjob_without_status_waits_for_the_trainer_controller() -> None:
    _, commit = _pass(manifest(), trainjob())
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.PENDING
    training = _conditions(commit)[ConditionType.TRAINING]
    assert training["reason"] == Reason.WAITING_FOR_TRAINING_OPERATOR
    assert (
        "TrainJob j-train has no status yet: is the Kubeflow Trainer v2 controller running?"
        in training["message"]
    )


def test_suspended_by_the_spec() -> None:
    actions, commit = _pass(manifest(suspend=True), trainjob(("Suspended", "True", "Suspended"), active=0))
    assert "SyncSuspend" in actions
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.SUSPENDED
    assert "the TrainJob is suspended" in _conditions(commit)[ConditionType.SUSPENDED]["message"]


def test_held_by_kueue_is_queued() -> None:
    obj = manifest(resources={"gpusPerNode": 1, "queueName": "team-a"})
    _, commit = _pass(obj, trainjob(("Suspended", "True", "Suspended"), active=0))
    assert commit.transition is not None and commit.transition.status["phase"] == Phase.PENDING
    suspended = _conditions(commit)[ConditionType.SUSPENDED]
    assert suspended["reason"] == Reason.QUEUED
    assert suspended["message"] == "the TrainJob waits for Kueue to admit it (spec.resources.queueName)"


def test_suspend_flips_the_trainjobs_own_field() -> None:
    """spec.suspend reaches the TrainJob's ``spec.suspend`` (a PyTorchJob's is ``runPolicy.suspend``),
    marked as kubetune's doing, and only kubetune's suspension is lifted."""

    class Recorder:
        def __init__(self) -> None:
            self.patches: list[tuple[str, str, dict[str, Any]]] = []

        def patch(
            self, api_version: str, kind: str, ns: str, name: str, body: dict[str, Any]
        ) -> dict[str, Any]:
            self.patches.append((api_version, kind, body))
            return {**live, "spec": {**live["spec"], **body["spec"]}}

    from kubetune_api.spec import parse_job

    live = {**trainjob(active=1), "metadata": {"name": "j-train", "namespace": "ml"}}
    kube: Any = Recorder()
    suspended = children.sync_suspend(kube, live, parse_job(manifest(suspend=True)))
    assert suspended["spec"]["suspend"] is True
    assert kube.patches == [
        (
            "trainer.kubeflow.org/v1alpha1",
            "TrainJob",
            {
                "metadata": {"annotations": {builders.ANNOTATION_SUSPENDED_BY_US: "true"}},
                "spec": {"suspend": True},
            },
        )
    ]
    kube.patches.clear()  # held by Kueue (not marked as ours): left as it is
    held = {**live, "spec": {"suspend": True}}
    assert children.sync_suspend(kube, held, parse_job(manifest())) is held and kube.patches == []


class DeadlineKube:
    """The API server of a TrainJob's deadline: its JobSet and training Job as the controllers wrote
    them; the gets and patches sent."""

    def __init__(self, jobset: dict[str, Any] | None, step: dict[str, Any] | None) -> None:
        self.objects = {"JobSet": jobset, "Job": step}
        self.gets: list[str] = []
        self.patches: list[tuple[str, dict[str, Any]]] = []

    def get(self, _api: str, kind: str, _ns: str, name: str) -> dict[str, Any] | None:
        self.gets.append(f"{kind} {name}")
        return self.objects[kind]

    def patch(self, _api: str, kind: str, _ns: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        self.patches.append((f"{kind} {name}", body))
        if kind == "TrainJob":
            live = running_trainjob()
            live["metadata"]["annotations"] = body["metadata"]["annotations"]
            return live
        return {}


def running_trainjob() -> dict[str, Any]:
    live = trainjob(active=1, ready=1)
    live["metadata"]["namespace"] = "ml"
    return live


def ours_jobset() -> dict[str, Any]:
    from kubetune_api.spec import parse_job

    runtime = builders.build_training_runtime(parse_job(manifest()), Settings.from_env({}))
    return {"spec": runtime["spec"]["template"]["spec"]}


def step_job(started: str | None, uid: str = "uid-step", **more: Any) -> dict[str, Any]:
    status: dict[str, Any] = {"active": 1}
    if started:
        status["startTime"] = started
    meta = {"name": "j-train-node-0", "uid": uid, "labels": {"jobset.sigs.k8s.io/jobset-name": "j-train"}}
    return {
        "metadata": {**meta, **more.pop("metadata", {})},
        "spec": {"suspend": False},
        "status": status,
        **more,
    }


def job_condition_failed() -> dict[str, Any]:
    return {"conditions": [{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}]}


def test_the_budget_deadline_goes_on_the_trainjobs_training_job_counting_the_wait() -> None:
    """The Job controller counts activeDeadlineSeconds from the Job's startTime, waiting for GPUs
    included: set once the pods run, as the time waited plus the budget's deadline, on that Job (by
    its uid); the TrainJob records the attempt, so the next pass reads nothing."""
    from datetime import UTC, datetime, timedelta

    from kubetune_api.spec import parse_job

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    started = (now - timedelta(minutes=10)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job = parse_job(manifest(budget={"maxDuration": "1h"}))
    kube = DeadlineKube(ours_jobset(), step_job(started))
    live = children.sync_deadline(kube, running_trainjob(), job, now)  # type: ignore[arg-type]
    (step, body), (tj, mark) = kube.patches
    assert (step, tj) == ("Job j-train-node-0", "TrainJob j-train")
    assert body == {
        "metadata": {"uid": "uid-step", "annotations": {builders.ANNOTATION_DEADLINE_FOR: started}},
        "spec": {"activeDeadlineSeconds": 600 + 3600 + 900},
    }
    assert mark == {
        "metadata": {"annotations": {builders.ANNOTATION_DEADLINE_FOR: "attempt 0 resumed never"}}
    }
    kube.gets.clear()
    assert children.sync_deadline(kube, live, job, now) is live  # type: ignore[arg-type]
    assert kube.gets == [] and len(kube.patches) == 2


def test_the_trainjob_deadline_is_set_again_for_each_attempt() -> None:
    """A JobSet restart makes a new Job (the same name, a new uid and startTime), and a resume
    resets the Job's startTime: each attempt gets the deadline from its own start; a Job already set
    for its start (the TrainJob's mark lost) is left as it is."""
    from datetime import UTC, datetime, timedelta

    from kubetune_api.spec import parse_job
    from kubetune_api.status import FineTuneJobStatus, TrainingRestarts

    now = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    job = parse_job(manifest(budget={"maxDuration": "1h"}))
    done = running_trainjob()
    done["metadata"]["annotations"] = {builders.ANNOTATION_DEADLINE_FOR: "attempt 0 resumed never"}
    # restarted by JobSet: the operator counted it; the new Job started a minute ago
    job.status = FineTuneJobStatus(trainingRestarts=TrainingRestarts(total=1, jobSetRestarts=1))
    again = (now - timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    kube = DeadlineKube(ours_jobset(), step_job(again, uid="uid-step-2"))
    children.sync_deadline(kube, done, job, now)  # type: ignore[arg-type]
    assert kube.patches[0][1]["spec"] == {"activeDeadlineSeconds": 60 + 4500}
    assert kube.patches[0][1]["metadata"]["uid"] == "uid-step-2"
    assert kube.patches[1][1]["metadata"]["annotations"][builders.ANNOTATION_DEADLINE_FOR] == (
        "attempt 1 resumed never"
    )
    # resumed (Trainer's Suspended condition turned False): a new attempt; this Job was already set
    resumed = running_trainjob()
    resumed["status"]["conditions"] = [
        {
            "type": "Suspended",
            "status": "False",
            "reason": "Resumed",
            "lastTransitionTime": "2026-12-01T11:59:00Z",
        }
    ]
    resumed["metadata"]["annotations"] = {builders.ANNOTATION_DEADLINE_FOR: "attempt 1 resumed never"}
    set_for = step_job(again, metadata={"annotations": {builders.ANNOTATION_DEADLINE_FOR: again}})
    kube = DeadlineKube(ours_jobset(), set_for)
    children.sync_deadline(kube, resumed, job, now)  # type: ignore[arg-type]
    assert [(what, body["metadata"]["annotations"]) for what, body in kube.patches] == [
        ("TrainJob j-train", {builders.ANNOTATION_DEADLINE_FOR: "attempt 1 resumed 2026-12-01T11:59:00Z"})
    ]


@pytest.mark.parametrize(
    "step",
    [
        None,  # not made yet
        step_job(None),  # not started (suspended with its JobSet)
        step_job("2026-12-01T11:00:00Z", metadata={"deletionTimestamp": "2026-12-01T11:59:00Z"}),  # a restart
        {**step_job("2026-12-01T11:00:00Z"), "status": {"startTime": "x", **job_condition_failed()}},
    ],
    ids=["absent", "not-started", "being-deleted", "failed"],
)
def test_the_trainjob_deadline_waits_for_its_running_job(step: dict[str, Any] | None) -> None:
    from datetime import UTC, datetime

    from kubetune_api.spec import parse_job

    kube = DeadlineKube(ours_jobset(), step)
    live = running_trainjob()
    job = parse_job(manifest(budget={"maxDuration": "1h"}))
    assert children.sync_deadline(kube, live, job, datetime.now(UTC)) is live  # type: ignore[arg-type]
    assert kube.patches == []


def test_no_deadline_on_a_trainjob_whose_jobset_would_restart_past_it() -> None:
    """A runtime an older kubetune made has no deadline rule: JobSet's catch-all would restart a Job
    past its deadline without end, so none is set; the TrainJob is marked, so the next pass reads
    nothing. No budget: nothing read at all."""
    from datetime import UTC, datetime

    from kubetune_api.spec import parse_job

    older = ours_jobset()
    older["spec"]["failurePolicy"]["rules"] = older["spec"]["failurePolicy"]["rules"][1:]
    kube = DeadlineKube(older, step_job("2026-12-01T11:00:00Z"))
    job = parse_job(manifest(budget={"maxDuration": "1h"}))
    now = datetime.now(UTC)
    live = children.sync_deadline(kube, running_trainjob(), job, now)  # type: ignore[arg-type]
    assert [what for what, _ in kube.patches] == ["TrainJob j-train"]
    kube.gets.clear()
    assert children.sync_deadline(kube, live, job, now) is live  # type: ignore[arg-type]
    assert kube.gets == []
    unbudgeted = running_trainjob()
    assert children.sync_deadline(kube, unbudgeted, parse_job(manifest()), now) is unbudgeted  # type: ignore[arg-type]
    assert kube.gets == []


def test_a_training_job_past_its_deadline_fails_deadline_exceeded() -> None:
    """What the real controllers write: the Job controller fails the Job (reason DeadlineExceeded),
    JobSet fails the JobSet by kubetune's rule, and Trainer copies only JobSet's words onto the
    TrainJob: the reason comes from the Job, the message in the PyTorchJob's shape."""
    failed = observations.trainjob_observation(
        trainjob(("Failed", "True", "FailJobSetFailurePolicyAction"), active=0)
    )
    past = step_job("2026-12-01T11:00:00Z", spec={"activeDeadlineSeconds": 4560})
    past["status"]["conditions"] = [
        {
            "type": "Failed",
            "status": "True",
            "reason": "DeadlineExceeded",
            "message": "Job was active longer than specified deadline",
        }
    ]
    # the pod the Job controller stopped saved and exited 143 on SIGTERM: not the cause
    got = training_failures.training_failure(failed, [], builders.TRAINJOB_CONTAINER, step_job=past)
    assert got is not None and got.reason == Failure.DEADLINE_EXCEEDED
    assert got.message == (
        "TrainJob j-train has failed because its Job j-train-node-0 was active longer than specified "
        "deadline (4560 s from its start)"
    )
    # another failure of the Job: the pods say why
    other = step_job("2026-12-01T11:00:00Z")
    other["status"].update(job_condition_failed())
    assert training_failures.training_failure(failed, [], builders.TRAINJOB_CONTAINER, step_job=other) is None
    # the TrainJob's own spec.activeDeadlineSeconds (kubetune sets none; Trainer v2.2's reason)
    own = observations.trainjob_observation(trainjob(("Failed", "True", "DeadlineExceeded")))
    got = training_failures.training_failure(own, [], builders.TRAINJOB_CONTAINER)
    assert got is not None and got.reason == Failure.DEADLINE_EXCEEDED


def test_the_training_child_on_trainjob_is_the_runtime_then_the_trainjob() -> None:
    from kubetune_api.spec import parse_job

    job = parse_job(manifest())
    built = builders.build_training(TJ, job, Settings.from_env({}))
    assert [(m["kind"], m["metadata"]["name"]) for m in built] == [
        ("TrainingRuntime", "j-train"),
        ("TrainJob", "j-train"),
    ]
    assert [
        m["kind"] for m in builders.build_training(state.Engine.PYTORCHJOB, job, Settings.from_env({}))
    ] == ["PyTorchJob"]


def test_a_trainjob_pod_the_scheduler_cannot_place_is_shown() -> None:
    """The TrainJob's pods (selected by the JobSet's label, owned by its Jobs) are read as the
    PyTorchJob's: a pod waiting for a node long enough is ``Unschedulable``."""
    pod = {
        "metadata": {
            "name": "j-train-node-0-0-abcde",
            "uid": "uid-pod",
            "labels": {observations.JOBSET_NAME_LABEL: "j-train"},
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
                    "lastTransitionTime": "2026-12-01T00:00:00Z",
                }
            ],
        },
    }
    live = trainjob(active=1, ready=0)
    pods = observations.pods_observation(live, [pod], [])
    assert pods.trouble is not None and pods.trouble.reason == Reason.UNSCHEDULABLE
    shown = observations.shown_trouble(
        pods,
        observations.training_observation(live),
        now="2026-12-01T00:05:00Z",
        namespace="ml",
        pytorchjob_name="j-train",
    )
    assert shown is not None and shown[0] == Reason.UNSCHEDULABLE and "j-train-node-0-0-abcde" in shown[1]


def test_a_trainjobs_restarts_are_its_jobsets() -> None:
    """JobSet ``status.restarts`` counts the gang's restarts (the TrainJob says nothing of them); the
    failed pod of the last attempt, when still there, says why it ended. No JobSet yet: not counted."""
    from kubetune_operator import reconcile

    failure = TrainingFailure.of(Failure.CUDA_OUT_OF_MEMORY, "CUDA out of memory on rank 0")
    pod = {
        "metadata": {"name": "j-train-node-0-0-abcde", "labels": {observations.JOBSET_NAME_LABEL: "j-train"}},
        "status": {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "node",
                    "state": {"terminated": {"exitCode": 142, "message": failure.termination_message()}},
                }
            ],
        },
    }

    class Kube:
        def __init__(self, jobset: dict[str, Any] | None) -> None:
            self.jobset = jobset
            self.asked: list[tuple[str, str]] = []

        def get(self, api_version: str, kind: str, ns: str, name: str) -> dict[str, Any] | None:
            self.asked.append((api_version, kind))
            return self.jobset

        def list(self, api_version: str, kind: str, ns: str, selector: str = "") -> list[dict[str, Any]]:
            assert selector == "jobset.sigs.k8s.io/jobset-name=j-train"
            return [pod]

    live = {**trainjob(active=1), "metadata": {"name": "j-train", "namespace": "ml", "uid": "uid-tj"}}
    kube = Kube({"status": {"restarts": 2, "restartsCountTowardsMax": 1}})
    ctx = reconcile.Context(kube=kube, settings=Settings.from_env({}), emit=lambda *_: None)  # type: ignore[arg-type]
    counted = reconcile._restarts(ctx, "j", live)
    assert kube.asked == [("jobset.x-k8s.io/v1alpha2", "JobSet")]
    assert counted is not None and counted[0].jobset_restarts == 2 and counted[0].pods == ()
    assert counted[1] is not None and counted[1].reason == Failure.CUDA_OUT_OF_MEMORY
    none_yet = reconcile.Context(kube=Kube(None), settings=Settings.from_env({}), emit=lambda *_: None)  # type: ignore[arg-type]
    assert reconcile._restarts(none_yet, "j", live) is None


def test_a_trainjob_pod_the_job_controller_cannot_create_is_shown() -> None:
    """No pod of the TrainJob exists: the Job controller's newest ``FailedCreate`` on the JobSet's Job
    says why (``PodsNotCreated``), unless a pod was created since."""
    refused = {
        "reason": "FailedCreate",
        "type": "Warning",
        "message": 'Error creating: pods "j-train-node-0-0-q8x2v" is forbidden: exceeded quota: gpus',
        "lastTimestamp": "2026-12-01T00:01:00Z",
    }
    live = trainjob(active=0)
    assert observations.trainjob_pods_missing(live, [])
    assert observations.trainjob_step_job(live) == "j-train-node-0"
    pods = observations.pods_observation(live, [], [refused])
    assert pods.trouble is not None and pods.trouble.reason == Reason.PODS_NOT_CREATED
    assert pods.trouble.pod == "j-train-node-0-0-q8x2v"
    shown = observations.shown_trouble(
        pods,
        observations.training_observation(live),
        now="2026-12-01T00:02:00Z",
        namespace="ml",
        pytorchjob_name="j-train",
        kind="TrainJob",
    )
    assert shown is not None and shown[0] == Reason.PODS_NOT_CREATED
    assert shown[1].startswith(
        "the Job controller cannot create pod j-train-node-0-0-q8x2v of TrainJob j-train"
    )
    assert "exceeded quota: gpus" in shown[1] and "Training Operator" not in shown[1]
    created = {
        "reason": "SuccessfulCreate",
        "message": "Created pod: j-train-node-0-0-zz9k1",
        "lastTimestamp": "2026-12-01T00:01:30Z",
    }
    assert observations.pods_observation(live, [], [refused, created]).trouble is None
