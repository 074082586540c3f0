"""The ``AliasSynced`` condition of a Succeeded job whose ``registration.alias`` changed: the alias
Job's progress into the status (the rest of the lifecycle is :mod:`kubetune_operator.state`)."""

from __future__ import annotations

from typing import Any, Literal

from kubetune_api.status import ConditionType, FineTuneJobStatus, Reason

from ..observations import JOB_ENDED, RegistrationObservation
from ..state_types import Event, Transition
from ..state_types import condition_of as _condition


def alias_transition(
    previous: FineTuneJobStatus,
    wanted: str | None,
    job: RegistrationObservation,
    *,
    now: str,
    generation: int,
) -> Transition:
    """A Succeeded job whose ``registration.alias`` changed: the alias Job's progress into the status.

    The phase stays Succeeded (the model is registered either way); the ``AliasSynced`` condition
    says whether the version carries the alias the spec asks for, and ``registeredModel.alias``
    follows once the alias Job reports it.
    """
    model = previous.registered_model
    assert model is not None  # only called for a registered model
    target = f"{model.name} version {model.version}"
    status: dict[str, Any] = {"observedGeneration": generation}
    decided: tuple[bool, str, str]
    if job.state == "Complete" and job.result is not None:
        moved = str(job.result["alias"]) if job.result.get("alias") else None
        status["registeredModel"] = {**model.wire(), "alias": moved}
        text = f"alias {moved!r} points at {target}" if moved else f"{target} has no kubetune alias now"
        decided = (True, Reason.ALIAS_MOVED, text)
        kind: Literal["Normal", "Warning"] = "Normal"
    elif job.state in ("Failed", "Skipped"):
        decided = (False, Reason.ALIAS_FAILED, f"moving the alias to {wanted!r} failed: {job.message}")
        kind = "Warning"
    else:
        decided = (False, Reason.MOVING_ALIAS, f"pointing alias {wanted!r} at {target}")
        kind = "Normal"
    previous_conditions = {c.type: c for c in previous.conditions or []}
    condition = _condition(
        previous_conditions, ConditionType.ALIAS_SYNCED, decided, now=now, generation=generation
    )
    kept = [c for c in previous.conditions or [] if c.type != ConditionType.ALIAS_SYNCED]
    status["conditions"] = [
        c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in [*kept, condition]
    ]
    before = previous_conditions.get(ConditionType.ALIAS_SYNCED)
    events = (
        [] if before is not None and before.reason == decided[1] else [Event(kind, decided[1], decided[2])]
    )
    waiting = job.state not in JOB_ENDED
    return Transition(status=status, events=events, phase=str(previous.phase), waiting=waiting)


def alias_held(
    previous: FineTuneJobStatus, reason: str, message: str, *, now: str, generation: int
) -> Transition:
    """A Succeeded job whose ``registration.alias`` changed, the move held back (no alias Job):
    ``AliasSynced`` is False with ``reason`` and ``message``, a Warning event says it once, and the
    phase stays Succeeded. Held back: a model name outside its namespace's names
    (:mod:`kubetune_api.tenancy`, ``ModelNameNotAllowed``), or ``registration.enabled`` false (the
    move waits until it is true, ``RegistrationDisabled``)."""
    decided = (False, reason, message)
    previous_conditions = {c.type: c for c in previous.conditions or []}
    condition = _condition(
        previous_conditions, ConditionType.ALIAS_SYNCED, decided, now=now, generation=generation
    )
    kept = [c for c in previous.conditions or [] if c.type != ConditionType.ALIAS_SYNCED]
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": [
            c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in [*kept, condition]
        ],
    }
    before = previous_conditions.get(ConditionType.ALIAS_SYNCED)
    news = before is None or before.reason != reason or before.message != message
    events = [Event("Warning", reason, message)] if news else []
    return Transition(status=status, events=events, phase=str(previous.phase))
