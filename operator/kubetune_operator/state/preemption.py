"""Training that Kueue took back: preempted for a higher-priority workload, or evicted for another of
Kueue's reasons. Pure; the same for both engines (a PyTorchJob's ``runPolicy.suspend``, a TrainJob's
``spec.suspend``: the training object reads ``Suspended`` either way, :mod:`..observations`).

Kueue (v0.17) evicts a job by setting its Workload's ``Evicted`` condition (reason ``Preempted``, or
``PodsReadyTimeout``, ``Deactivated``...; a preemption adds a ``Preempted`` condition whose reason
says where: ``InClusterQueue``, ``InCohortReclamation``...) and suspending the job; the pods get
SIGTERM and the trainer saves a checkpoint. The job is queued again and, once admitted, resumes from
its newest complete checkpoint (``status.checkpoints.latest``: restarts always continue from the
job's own newest one, whatever ``spec.resume`` says).

- :func:`verdict`: whether a queued job's suspended training object was evicted (its Workload says
  so; or, when the Workload cannot be read, the job had trained before), and the conditions' reason
  and message. Once said, it stays until the training object runs again (a pass that cannot read the
  Workload, or sees it admitted a moment before Kueue lifts the suspension, changes nothing).
- :func:`record`: ``status.preemptions`` (how many, the last one's reason, the checkpoint it resumes
  from, the seconds spent evicted) and the events: one when Kueue evicts the training, one when it
  runs again.
"""

from __future__ import annotations

from typing import Any

from kubetune_api.status import Condition, ConditionType, EventReason, FineTuneJobStatus, Preemptions, Reason

from ..observations import KueueWorkload, parse_time
from ..state_types import Decided, Event
from .observation import Observation

# the Suspended condition's reasons of a job Kueue evicted
EVICTED_REASONS = (Reason.PREEMPTED_BY_KUEUE, Reason.EVICTED_BY_KUEUE)


def was_evicted(prev: FineTuneJobStatus) -> Condition | None:
    """The previous status's Suspended condition, when it said Kueue had evicted the training."""
    for c in prev.conditions or []:
        if c.type == ConditionType.SUSPENDED and c.status == "True" and c.reason in EVICTED_REASONS:
            return c
    return None


def verdict(obs: Observation, kind: str) -> Decided | None:
    """A queued job whose training object is suspended (not by ``spec.suspend``): the reason and
    message when Kueue evicted it; None when it is only queued (waiting for its first admission)."""
    prev = obs.previous or FineTuneJobStatus()
    workload = obs.kueue
    before = was_evicted(prev)
    if workload is not None and workload.evicted:
        reason = Reason.PREEMPTED_BY_KUEUE if workload.preempted else Reason.EVICTED_BY_KUEUE
        return Decided(True, reason, _message(kind, reason, _said(workload), workload.name, prev))
    if before is not None:  # said before: the same until the training object runs again
        record = prev.preemptions or Preemptions()
        said = _said_before(record)
        return Decided(True, before.reason, _message(kind, before.reason, said, record.workload or "", prev))
    if workload is None and prev.start_time:
        # it trained, and Kueue holds it again: evicted, though its Workload cannot say why
        said = "its Workload could not be read to say why"
        return Decided(True, Reason.EVICTED_BY_KUEUE, _message(kind, Reason.EVICTED_BY_KUEUE, said, "", prev))
    return None


def _said(workload: KueueWorkload) -> str:
    """Kueue's reason and message, as the conditions quote them."""
    why = workload.preemption_reason or workload.reason or "no reason given"
    return f"{why}: {workload.message}" if workload.message else why


def _said_before(record: Preemptions) -> str:
    why = record.last_preemption_reason or record.last_reason
    if why is None:
        return "its Workload could not be read to say why"
    return f"{why}: {record.last_message}" if record.last_message else why


def resume_point(prev: FineTuneJobStatus) -> str:
    """Where the training resumes when admitted again: its newest complete checkpoint."""
    ckpt = prev.checkpoints
    if ckpt is None or ckpt.latest_step is None:
        return "the start (no complete checkpoint yet)"
    where = f" ({ckpt.latest})" if ckpt.latest else ""
    return f"its newest checkpoint, step {ckpt.latest_step}{where}"


def _message(kind: str, reason: str, said: str, workload: str, prev: FineTuneJobStatus) -> str:
    what = "preempted" if reason == Reason.PREEMPTED_BY_KUEUE else "evicted"
    queue = f"spec.resources.queueName; Workload {workload}" if workload else "spec.resources.queueName"
    return (
        f"Kueue {what} the {kind} ({said}); it waits to be admitted again ({queue}), then training resumes "
        f"from {resume_point(prev)}"
    )


def record(
    prev: FineTuneJobStatus, obs: Observation, suspended: Decided | None, kind: str
) -> tuple[dict[str, Any] | None, list[Event]]:
    """``status.preemptions`` after this pass (None: never evicted) and its events. ``suspended``:
    the Suspended condition the pass decided (None: not decided, as once training finished)."""
    evicted_now = suspended is not None and suspended[0] and suspended[1] in EVICTED_REASONS
    before = was_evicted(prev)
    current = prev.preemptions
    events: list[Event] = []
    if evicted_now:
        assert suspended is not None
        workload = obs.kueue if obs.kueue is not None and obs.kueue.evicted else None
        since = workload.since if workload is not None else ""
        old = current or Preemptions()
        said: dict[str, Any] = {}  # Kueue's words, when its Workload was read
        if workload is not None:
            said = {
                "last_reason": workload.reason or None,
                "last_preemption_reason": workload.preemption_reason or None,
                "last_message": workload.message or None,
                "workload": workload.name or None,
            }
        # a new eviction: none was said before, or Kueue evicted it again (a later time) before a
        # pass saw it run; the first one's wait is then counted up to the second
        again = before is not None and bool(since) and old.last_reason is not None and since != old.last_time
        if before is None or again:
            waited = _seconds(old.last_time, since) if again else 0.0
            current = Preemptions(
                count=old.count + 1,
                last_time=since or obs.now,
                preempted_seconds=old.preempted_seconds + waited,
                **said,
            )
            # a preemption is Kueue doing its job; another eviction may need a person (a stopped queue)
            if suspended[1] == Reason.PREEMPTED_BY_KUEUE:
                events.append(Event("Normal", suspended[1], suspended[2]))
            else:
                events.append(Event("Warning", suspended[1], suspended[2]))
        elif said and old.last_reason is None:  # said before without Kueue's words: now it has them
            current = old.model_copy(update=said)
        assert current is not None
        ckpt = prev.checkpoints
        current = current.model_copy(
            update={
                "resume_from": ckpt.latest if ckpt else None,
                "resume_step": ckpt.latest_step if ckpt else None,
            }
        )
    elif before is not None and current is not None and not (suspended is not None and suspended[0]):
        # admitted again: the time spent evicted is counted, and said once
        waited = _seconds(current.last_time, obs.now)
        current = current.model_copy(
            update={"readmitted_time": obs.now, "preempted_seconds": current.preempted_seconds + waited}
        )
        resumed = f"step {current.resume_step}" if current.resume_step is not None else "the start"
        events.append(
            Event(
                "Normal",
                EventReason.READMITTED,
                f"Kueue admitted the {kind} again after {waited:.0f} s evicted; training resumes from {resumed}",
            )
        )
    if current is None:
        return None, events
    # unset fields as null: a merge patch removes what an earlier eviction said (readmittedTime...)
    return current.model_dump(by_alias=True, mode="json"), events


def _seconds(start: str | None, end: str) -> float:
    began, ended = parse_time(start or ""), parse_time(end)
    if began is None or ended is None:
        return 0.0
    return max(0.0, (ended - began).total_seconds())
