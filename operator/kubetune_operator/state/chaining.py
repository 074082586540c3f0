"""Chaining's verdict (``spec.model.fromJob``): whether the parent job lets this one start. Pure: the
pass hands in a way to read a FineTuneJob of the same namespace (:func:`observe`'s ``read``; in a
pass, the FineTuneJobs read so far, :class:`~.observation.Observation`'s ``reads``).

The verdict (:func:`observe`), in this order:

- the parent was started from (``status.parent`` with its ``path``) and is now gone or has another
  uid, while this job has not finished training: ``Failed``, ``ParentMissing`` (its volume, which
  this job reads, may be gone with it; a running PyTorchJob is stopped). Still there, or this job
  trained: ready, with what the status recorded (the parent's later changes do not matter).
- the parent waited for (``status.parent`` with its name and uid only) is gone or has another uid:
  ``Failed``, ``ParentMissing`` (nothing of this job was created).
- the parent does not exist: wait (``WaitingForParent``). ``kubectl apply`` of a file with both
  jobs may create the child first, so a parent never seen is waited for, not refused.
- ``spec.model.fromJob`` leads back to this job (B from A from B, or longer): ``Failed``,
  ``ParentCycle``, naming the chain. Self-reference is refused at admission already.
- the parent Failed: ``Failed``, ``ParentFailed``, with the parent's reason and message.
- the parent Succeeded: ready; ``status.parent`` records it (:class:`ParentStatus`).
- otherwise (Pending, Preparing, Training...): wait, saying the parent's phase, and record which
  parent (``status.parent``: name and uid).

Nothing is created while waiting (:func:`lets_start`); a job started from a parent gone since has
its PyTorchJob stopped (:func:`started_from`). What the children mount and read of the parent is
:mod:`kubetune_operator.parent`'s.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import ValidationError

from kubetune_api import rules
from kubetune_api import spec as api
from kubetune_api.status import ConditionType, ParentStatus, Phase, Reason

from ..parent import folder, parent_status, recorded, with_recorded
from ..state_types import Decided, Verdicts

# The longest chain of fromJob links followed when looking for a cycle.
MAX_CHAIN = 64

Reader = Callable[[str], dict[str, Any] | None]


@dataclass(frozen=True)
class ParentObservation:
    """``waiting`` (nothing is created), ``ready`` (``status`` is what status.parent records) or
    ``failed`` (the job ends Failed with ``reason``; ``status``: the parent it had started from)."""

    state: Literal["waiting", "ready", "failed"]
    reason: str
    message: str
    status: ParentStatus | None = None


def observe(
    job: api.FineTuneJob, read: Reader, *, preparation: bool = True, trained: bool = False
) -> ParentObservation | None:
    """The parent's state for this job; None when the job names no parent job. ``trained``: this
    job's training has finished, so a recorded parent is not read again (deleted since, it changes
    nothing for the registration)."""
    ref = job.spec.model.from_job
    if ref is None:
        return None
    seen, name = recorded(job), ref.name
    obj = None if seen is not None and trained else read(name)
    if obj is not None and (obj.get("metadata") or {}).get("deletionTimestamp"):
        obj = None  # being deleted: gone, for what this job may read of it
    if seen is not None and seen.path is not None:
        return _seen_again(seen, obj, trained=trained)
    gone = _gone_while_waited_for(seen, obj, name)
    if gone is not None:
        return gone
    if obj is None:
        return ParentObservation(
            "waiting",
            Reason.WAITING_FOR_PARENT,
            f"waiting for FineTuneJob {name} (spec.model.fromJob), which does not exist yet: this job "
            f"starts once {name} has Succeeded",
        )
    return _present(job, name, obj, read, preparation=preparation)


def _present(
    job: api.FineTuneJob, name: str, obj: dict[str, Any], read: Reader, *, preparation: bool
) -> ParentObservation:
    """A parent that exists and that this job has not started from: a cycle, or its phase; while
    waiting, which parent it waits for (name and uid: deleted meanwhile, the job fails)."""
    chain = cycle(job.metadata.name, name, obj, read)
    if chain is not None:
        return ParentObservation(
            "failed",
            Reason.PARENT_CYCLE,
            f"spec.model.fromJob makes a cycle: {' -> '.join(chain)}; no job of it can ever start. "
            "Re-create one of them with another spec.model",
        )
    found = _by_phase(job, name, obj, preparation=preparation)
    uid = (obj.get("metadata") or {}).get("uid")
    if found.state == "waiting" and uid:
        return replace(found, status=ParentStatus(job=name, uid=uid))
    return found


def _gone_while_waited_for(
    seen: ParentStatus | None, obj: dict[str, Any] | None, name: str
) -> ParentObservation | None:
    """The parent this job waited for (recorded: name and uid), deleted or replaced before it
    Succeeded; None when it is still there (or none was recorded)."""
    if seen is None or (obj is not None and (obj.get("metadata") or {}).get("uid") == seen.uid):
        return None
    what = "was deleted" if obj is None else "was deleted and re-created"
    return ParentObservation(
        "failed",
        Reason.PARENT_MISSING,
        f"FineTuneJob {name}, whose model this job waited for (spec.model.fromJob), {what} before it "
        f"Succeeded. Re-create this job once {name} (or a replacement) has Succeeded",
    )


def _seen_again(seen: ParentStatus, obj: dict[str, Any] | None, *, trained: bool) -> ParentObservation:
    """A parent recorded before: ready while it is still the same object (or this job has trained)."""
    uid = (obj or {}).get("metadata", {}).get("uid")
    if trained or uid == seen.uid:
        return ParentObservation("ready", Reason.PARENT_SUCCEEDED, _ready_message(seen), seen)
    name = seen.job
    what = "was deleted" if obj is None else f"was re-created (uid {uid}, not {seen.uid})"
    return ParentObservation(
        "failed",
        Reason.PARENT_MISSING,
        f"FineTuneJob {name}, whose model this job trains from, {what}; its checkpoint volume "
        f"{seen.claim or ''} may be gone with it. Re-create this job once {name} has Succeeded again",
        seen,  # started from it: its children exist (a running PyTorchJob is stopped)
    )


def _by_phase(
    job: api.FineTuneJob, name: str, obj: dict[str, Any], *, preparation: bool
) -> ParentObservation:
    status = obj.get("status") or {}
    phase = status.get("phase") or Phase.PENDING
    if phase == Phase.FAILED:
        ready: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
        )
        why = f"{ready.get('reason') or 'Failed'}: {ready.get('message') or 'no message'}"
        return ParentObservation(
            "failed",
            Reason.PARENT_FAILED,
            f"FineTuneJob {name}, whose model this job trains from (spec.model.fromJob), Failed ({why}). "
            f"Re-create this job once {name} (or a replacement) has Succeeded",
        )
    if phase != Phase.SUCCEEDED:
        return ParentObservation(
            "waiting",
            Reason.WAITING_FOR_PARENT,
            f"waiting for FineTuneJob {name} (spec.model.fromJob), now {phase}: this job starts once it "
            "has Succeeded",
        )
    try:
        parent = api.FineTuneJob.model_validate(obj, context={rules.ADMITTED: True})
    except ValidationError as e:
        return ParentObservation(
            "failed", Reason.PARENT_FAILED, f"FineTuneJob {name} Succeeded but its spec cannot be read: {e}"
        )
    ref = job.spec.model.from_job
    assert ref is not None
    chosen = folder(parent, ref.checkpoint)
    if chosen is None:
        return ParentObservation(
            "failed",
            Reason.PARENT_MISSING,
            f"spec.model.fromJob.checkpoint is bestEval, but FineTuneJob {name} has no checkpoint with an "
            "eval loss (no eval data, or no evaluation at a step it saved). Re-create this job with "
            "checkpoint: final",
        )
    found = parent_status(parent, chosen, preparation=preparation)
    return ParentObservation("ready", Reason.PARENT_SUCCEEDED, _ready_message(found), found)


def _ready_message(seen: ParentStatus) -> str:
    text = f"FineTuneJob {seen.job} Succeeded: training from its {seen.path}"
    if seen.method == api.Method.LORA:
        text += " (a LoRA adapter, merged into its base first)"
    return text + (f"; its registered model {seen.model_uri}" if seen.model_uri else "")


def cycle(name: str, first: str, first_obj: dict[str, Any] | None, read: Reader) -> list[str] | None:
    """The chain of fromJob links from ``name`` back to itself (``[B, A, B]``), or None.

    A cycle further up that does not pass through ``name`` is not this job's: its members fail with
    ``ParentCycle``, and this job then sees its parent Failed."""
    chain = [name]
    current, obj = first, first_obj
    while obj is not None and len(chain) <= MAX_CHAIN:
        chain.append(current)
        nxt = (((obj.get("spec") or {}).get("model") or {}).get("fromJob") or {}).get("name")
        if not nxt or nxt in chain[1:]:
            return None
        if nxt == name:
            return [*chain, name]
        current, obj = nxt, read(nxt)
    return None


def for_pass(
    job: api.FineTuneJob, read: Reader, preparation: bool, trained: bool
) -> tuple[api.FineTuneJob, ParentObservation | None]:
    """The parent's state (:func:`observe`), and the job as its children are built: with the parent
    recorded once it is ready, so that its pods mount the parent's volume."""
    found = observe(job, read, preparation=preparation, trained=trained)
    if found is not None and found.status is not None:
        job = with_recorded(job, found.status)
    return job, found


def lets_start(found: ParentObservation | None) -> bool:
    """Whether the pass may create children: no parent job, or one that Succeeded."""
    return found is None or found.state == "ready"


def started_from(found: ParentObservation | None) -> bool:
    """Whether the job had started from a parent that is gone now (its PyTorchJob is to be stopped)."""
    return found is not None and found.state == "failed" and found.status is not None


def held(found: ParentObservation, registered: Decided) -> tuple[Phase, Verdicts]:
    """A job its parent holds: Pending while it waits (nothing created), Failed when the parent cannot
    give it a model. The phase and the conditions decided."""
    decided = Decided(False, found.reason, found.message)
    if found.state == "waiting":
        phase, nothing = Phase.PENDING, "nothing is created before the parent job has Succeeded"
    else:
        phase, nothing = Phase.FAILED, "nothing was created: the parent job cannot give this job a model"
    out = Verdicts()
    out[ConditionType.PARENT_READY] = decided
    out[ConditionType.READY] = decided
    out[ConditionType.REGISTERED] = registered
    if found.status is not None:  # it had started from the parent: its children stay, training stops
        out[ConditionType.TRAINING] = (False, found.reason, "stopped: the parent job it trains from is gone")
        return phase, out
    out[ConditionType.CHILDREN_READY] = (False, found.reason, nothing)
    out[ConditionType.TRAINING] = (False, found.reason, nothing)
    return phase, out


def news(decided: Decided | None, old_reason: str | None) -> tuple[str, str, str] | None:
    """The event (type, reason, message) when ParentReady changes: waiting, or the parent Succeeded
    (a Failed parent's is the job's own Failed event)."""
    if decided is None or decided[1] == old_reason:
        return None
    if decided[1] in (Reason.WAITING_FOR_PARENT, Reason.PARENT_SUCCEEDED):
        return ("Normal", decided[1], decided[2])
    return None
