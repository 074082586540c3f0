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


def test_the_budget_deadline_is_not_set_on_a_trainjob() -> None:
    """Trainer v2.2 makes ``activeDeadlineSeconds`` immutable: nothing is patched."""
    from datetime import UTC, datetime

    from kubetune_api.spec import parse_job

    live = {**trainjob(active=1), "metadata": {"name": "j-train", "namespace": "ml"}}
    live["status"]["startTime"] = "2026-12-01T00:00:00Z"
    job = parse_job(manifest(budget={"maxGpuHours": 1}))
    assert children.sync_deadline(None, live, job, datetime.now(UTC)) is live  # type: ignore[arg-type]


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
