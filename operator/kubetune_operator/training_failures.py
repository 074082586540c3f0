"""Why training failed or restarted, from the PyTorchJob's pods and events: the failure the trainer
classified (its termination message), the kubelet's ``OOMKilled``, an eviction, the PyTorchJob's
deadline; and the restarts the operator counts itself. Pure: the reads are the reconciler's.
"""

from __future__ import annotations

from typing import Any

from kubetune_api.failures import Failure, TrainingFailure, parse_failure
from kubetune_api.status import TrainingRestarts

from .observations import TrainingObservation

# The Training Operator's words when a job ran past runPolicy.activeDeadlineSeconds (v1.9,
# pkg/controller.v1/common/job.go: "Job <name> has failed because it was active longer than specified
# deadline", reason PyTorchJobFailed); the job's own name may say "deadline" too.
DEADLINE_WORDS = "active longer than specified deadline"

# --- why training failed --------------------------------------------------------------------------------


def training_failure(
    training: TrainingObservation, pods: list[dict[str, Any]], container: str
) -> TrainingFailure | None:
    """Why a Failed PyTorchJob failed, from its pods (``training.kubeflow.org/job-name``): the failure
    the trainer classified (its termination message), the kubelet's ``OOMKilled``, an eviction, or
    the exit code and log tail; the PyTorchJob's own deadline. The first pod to fail tells the cause
    (the others often only saw it go away); None when no pod says anything.
    """
    if DEADLINE_WORDS in (training.message or "").lower():
        return TrainingFailure.of(Failure.DEADLINE_EXCEEDED, training.message or training.reason)
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

# The Training Operator (v1.9) deletes and recreates a pod that exited with a retryable code
# (restartPolicy ExitCode: 128-255) and records a Warning ``PyTorchJobRestarting`` event on the
# PyTorchJob each time (aggregated: one Event whose ``count`` grows). Its own backoffLimit never
# counts those (it sums the restartCount of running pods; kubeflow/trainer#2045), so a pod killed
# for memory at every start would restart forever: the operator counts them instead.
RESTARTING_EVENT = "PyTorchJobRestarting"


def restart_events(events: list[dict[str, Any]], uid: str | None) -> int:
    """How many restarts the PyTorchJob's ``Restarting`` events record (each Event's count)."""
    total = 0
    for e in events:
        involved = e.get("involvedObject") or {}
        if e.get("reason") != RESTARTING_EVENT or (
            uid is not None and involved.get("uid") not in (None, uid)
        ):
            continue
        series = e.get("series") or {}
        total += int(series.get("count") or e.get("count") or 1)
    return total


def failed_attempt(pods: list[dict[str, Any]], container: str) -> TrainingFailure | None:
    """Why a training pod that failed (and is about to be replaced) ended, if one is still there."""
    failed = [p for p in pods if (p.get("status") or {}).get("phase") == "Failed"]
    return training_failure(TrainingObservation(), failed, container) if failed else None


def count_restarts(
    previous: TrainingRestarts | None,
    events: int | None,
    checkpoint_step: int | None,
    failure: TrainingFailure | None,
) -> TrainingRestarts | None:
    """The restarts counted so far, with this pass's look at the restart events (``events``: None
    when the pass did not look); ``sinceProgress`` starts over when a newer complete checkpoint
    appeared (the trainer's ``status.checkpoints.latestStep``)."""
    if events is None and failure is None:
        return None
    prev = previous or TrainingRestarts()
    events = prev.events if events is None else events
    new = max(0, events - prev.events)  # fewer than before: old events expired
    since = prev.since_progress
    if checkpoint_step is not None and checkpoint_step != prev.checkpoint_step:
        since = 0
    return TrainingRestarts(
        total=prev.total + new,
        since_progress=since + new,
        checkpoint_step=checkpoint_step,
        last=failure.describe() if failure is not None else prev.last,
        last_reason=str(failure.reason) if failure is not None else prev.last_reason,
        events=events,
    )
