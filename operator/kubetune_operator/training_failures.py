"""Why training failed or restarted, from the PyTorchJob's pods and events: the failure the trainer
classified (its termination message), the kubelet's ``OOMKilled``, an eviction, the PyTorchJob's
deadline (a TrainJob's: its training Job's); and the restarts the operator counts itself. Pure: the reads are the reconciler's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetune_api.failures import Failure, TrainingFailure, parse_failure
from kubetune_api.status import PodIncarnations, TrainingRestarts

from . import builders
from .observations import JOBSET_NAME_LABEL, TRAINING_OPERATOR_JOB_LABEL, TrainingObservation

# The Training Operator's words when a job ran past runPolicy.activeDeadlineSeconds (v1.9,
# pkg/controller.v1/common/job.go: "Job <name> has failed because it was active longer than specified
# deadline", reason PyTorchJobFailed); the job's own name may say "deadline" too.
DEADLINE_WORDS = "active longer than specified deadline"
# Trainer v2.2's reason on a TrainJob past its own spec.activeDeadlineSeconds (kubetune sets the
# deadline on its training Job instead: children.sync_deadline), and the Job controller's on a Job
JOB_DEADLINE_REASON = builders.JOB_DEADLINE_REASON

# --- why training failed --------------------------------------------------------------------------------


def training_failure(
    training: TrainingObservation,
    pods: list[dict[str, Any]],
    container: str,
    step_job: dict[str, Any] | None = None,
) -> TrainingFailure | None:
    """Why a Failed PyTorchJob failed, from its pods (``training.kubeflow.org/job-name``): the failure
    the trainer classified (its termination message), the kubelet's ``OOMKilled``, an eviction, or
    the exit code and log tail; the PyTorchJob's own deadline (a TrainJob's: its training Job's,
    ``step_job``, or its own). The first pod to fail tells the cause (the others often only saw it
    go away); None when no pod says anything.
    """
    if DEADLINE_WORDS in (training.message or "").lower() or training.reason == JOB_DEADLINE_REASON:
        return TrainingFailure.of(Failure.DEADLINE_EXCEEDED, training.message or training.reason)
    past = step_deadline(step_job)
    if past is not None:
        return past
    found: list[tuple[str, int, TrainingFailure]] = []
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name") or ""
        status = pod.get("status") or {}
        if status.get("reason") == "Evicted":
            message = f"pod {name}: {status.get('message') or 'evicted'}"
            found.append(("", 1, TrainingFailure.of(Failure.EVICTED, message)))
            continue
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            terminated = (cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get(
                "terminated"
            )
            if not terminated or terminated.get("exitCode") in (0, None):
                continue
            failure = _from_terminated(name, pod, terminated, container)
            # a preemption is never the cause when something else failed
            rank = 2 if failure.reason in (Failure.PREEMPTED, Failure.UNKNOWN) else 0
            found.append((str(terminated.get("finishedAt") or ""), rank, failure))
    if not found:
        return None
    found.sort(key=lambda f: (f[1], f[0]))
    return found[0][2]


def step_deadline(step_job: dict[str, Any] | None) -> TrainingFailure | None:
    """A TrainJob's training Job (``<tj>-node-0``) that failed past its hard deadline: the Job
    controller's ``Failed`` condition with reason ``DeadlineExceeded`` (JobSet then fails the JobSet
    by ``builders.DEADLINE_RULE``, and the TrainJob's own condition says only ``applying FailJobSet
    failure policy action``). The message has the PyTorchJob's shape, naming the TrainJob."""
    if not step_job:
        return None
    meta = step_job.get("metadata") or {}
    status = step_job.get("status") or {}
    if not any(
        c.get("type") == "Failed" and c.get("status") == "True" and c.get("reason") == JOB_DEADLINE_REASON
        for c in status.get("conditions") or []
    ):
        return None
    trainjob = (meta.get("labels") or {}).get(JOBSET_NAME_LABEL) or "of this job"
    seconds = (step_job.get("spec") or {}).get("activeDeadlineSeconds")
    return TrainingFailure.of(
        Failure.DEADLINE_EXCEEDED,
        f"TrainJob {trainjob} has failed because its Job {meta.get('name')} was {DEADLINE_WORDS}"
        + (f" ({seconds} s from its start)" if seconds else ""),
    )


def _from_terminated(
    pod_name: str, pod: dict[str, Any], terminated: dict[str, Any], container: str
) -> TrainingFailure:
    if terminated.get("reason") == "OOMKilled":
        limit = next(
            (
                ((c.get("resources") or {}).get("limits") or {}).get("memory")
                for c in (pod.get("spec") or {}).get("containers") or []
                if c.get("name") == container
            ),
            None,
        )
        return TrainingFailure.of(
            Failure.HOST_OUT_OF_MEMORY,
            f"the kernel killed the trainer in pod {pod_name} for host memory (exit code "
            f"{terminated.get('exitCode')}; memory limit {limit or 'none: the node ran out'})",
        )
    message = str(terminated.get("message") or "")
    failure = parse_failure(message)
    if failure is not None:
        return failure.model_copy(update={"message": f"pod {pod_name}: {failure.message}"})
    tail = "\n".join(message.strip().splitlines()[-8:])
    return TrainingFailure.of(
        Failure.UNKNOWN,
        f"pod {pod_name} exited {terminated.get('exitCode')} ({terminated.get('reason') or 'Error'})"
        + (f"; its last log lines:\n{tail}" if tail else ""),
    )


# --- restarts -------------------------------------------------------------------------------------------

# The Training Operator (v1.9) deletes a pod that exited with a retryable code (restartPolicy
# ExitCode: 128-255) and creates it again under the same name. Its own backoffLimit never counts
# those restarts (it sums the restartCount of running pods; kubeflow/trainer#2045), so a pod killed
# for memory at every start would restart forever: the operator counts them instead, once per
# restart, from the pods. Not from its events: it writes two ``PyTorchJobRestarting`` events per
# restart (the shared pod reconciler's "job <name> is restarting because <type> replica(s) failed."
# and the PyTorchJob status update's "PyTorchJob <name> is restarting because <n> <type>
# replica(s) failed.", the latter also for a permanent exit code), each aggregated into one Event
# whose count grows; they expire an hour after their last update; and its recorder drops an
# object's events past a burst of 25 (client-go's spam filter, then one per five minutes), which a
# pod restarting at every start reaches after four or five restarts.
# A TrainJob's restarts are its JobSet's ``status.restarts``: one per restart of the gang, kept in
# the JobSet's status (no expiry), and a pod's ``jobset.sigs.k8s.io/restart-attempt``.
KEPT_INCARNATIONS = 4  # UIDs kept per pod name: enough that a late look at an older one is known


@dataclass(frozen=True)
class RestartEvidence:
    """What one pass saw of the training's restarts, each one-per-restart and counted against what
    ``status.trainingRestarts`` remembers: a PyTorchJob's pod incarnations (name, UID), older first
    (the pod watch's, then the pass's own list); a TrainJob's JobSet ``status.restarts`` (None: not
    read)."""

    pods: tuple[tuple[str, str], ...] = ()
    jobset_restarts: int | None = None


def incarnation(pod: dict[str, Any]) -> tuple[str, str] | None:
    """A PyTorchJob pod's (name, UID): one incarnation of its replica. None for a pod being deleted
    (its end is not a new incarnation; a suspension deletes them all) and for a pod no Training
    Operator made (a TrainJob's: its JobSet counts the restarts)."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if TRAINING_OPERATOR_JOB_LABEL not in labels or meta.get("deletionTimestamp"):
        return None
    name, uid = meta.get("name"), meta.get("uid")
    return (str(name), str(uid)) if name and uid else None


def incarnations(pods: list[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
    """The incarnations among ``pods`` (a pass's list of the PyTorchJob's pods)."""
    return tuple(i for i in (incarnation(p) for p in pods) if i is not None)


def failed_attempt(pods: list[dict[str, Any]], container: str) -> TrainingFailure | None:
    """Why a training pod that failed (and is about to be replaced) ended, if one is still there."""
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    return training_failure(TrainingObservation(), failed, container) if failed else None


def count_restarts(
    previous: TrainingRestarts | None,
    evidence: RestartEvidence | None,
    checkpoint_step: int | None,
    failure: TrainingFailure | None,
    *,
    suspended: bool = False,
) -> TrainingRestarts | None:
    """The restarts counted so far, with this pass's evidence added (None: the pass saw nothing of
    them): a pod name seen before under a UID not among its own is one restart; the JobSet's
    ``status.restarts`` above the one last read, that many. ``sinceProgress`` starts over when a
    newer complete checkpoint appeared (the trainer's ``status.checkpoints.latestStep``). While the
    training is ``suspended`` its pods are gone: the incarnations are forgotten, so the pods of the
    resume are no restart. None: nothing to write."""
    prev = previous or TrainingRestarts()
    forget = suspended and bool(prev.pods)
    if evidence is None and failure is None and not forget:
        return None
    pods = {} if suspended else {p.name: list(p.uids) for p in prev.pods or []}
    new = 0
    for name, uid in () if evidence is None or suspended else evidence.pods:
        known = pods.setdefault(name, [])
        if uid in known:
            continue
        new += 1 if known else 0
        pods[name] = [*known, uid][-KEPT_INCARNATIONS:]
    jobset = prev.job_set_restarts
    if evidence is not None and evidence.jobset_restarts is not None:
        # an older operator kept the JobSet's count in ``events``; a JobSet made anew starts at zero
        seen = jobset if jobset is not None else prev.events or 0
        new += max(0, evidence.jobset_restarts - seen)
        jobset = evidence.jobset_restarts
    since = prev.since_progress
    if checkpoint_step is not None and checkpoint_step != prev.checkpoint_step:
        since = 0
    return TrainingRestarts(
        total=prev.total + new,
        since_progress=since + new,
        checkpoint_step=checkpoint_step,
        last=failure.describe() if failure is not None else prev.last,
        last_reason=str(failure.reason) if failure is not None else prev.last_reason,
        pods=[PodIncarnations(name=n, uids=u) for n, u in pods.items()] if pods or prev.pods else None,
        job_set_restarts=jobset,
    )
