"""The state machine's inputs and outputs (:mod:`kubetune_operator.state`): what a pass observed of
the children, the decision per condition, the events, and the next status."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from kubetune_api.failures import TrainingFailure
from kubetune_api.status import BudgetStatus, Condition, Phase, TrainingRestarts

from .observations import (
    ChildError,
    PodsObservation,
    PreparationObservation,
    RegistrationObservation,
    TrainingObservation,
)
from .parent import ParentObservation
from .status_view import Reregister


@dataclass(frozen=True)
class Observation:
    generation: int
    now: str  # RFC 3339
    suspend: bool = False
    registration_enabled: bool = True  # status_view.registration_wanted: spec.registration and spec.budget
    # the trainer stopped at spec.budget (its report in status.budget)
    budget: BudgetStatus | None = None
    # why the PyTorchJob failed (its pods say), when it did
    failure: TrainingFailure | None = None
    # while training: the Training Operator's restart events counted this pass (None: not looked),
    # why the last attempt ended (a failed pod still there), and the limit on restarts in a row
    # without progress (the operator's trainBackoffLimit)
    restart_events: int | None = None
    attempt_failure: TrainingFailure | None = None
    restart_limit: int = 6
    checkpoint_step: int | None = None  # the trainer's newest complete checkpoint (status.checkpoints)
    restarts: TrainingRestarts | None = None  # counted (advance fills it from the previous status)
    queued_by_kueue: bool = False  # spec has a queueName: a suspended PyTorchJob is waiting for quota
    invalid_spec: str | None = None
    conflict: str | None = None  # message naming the foreign object, if any
    child_error: ChildError | None = None  # the pass stopped at a request the API server refused
    training: TrainingObservation = field(default_factory=TrainingObservation)
    registration: RegistrationObservation = field(default_factory=RegistrationObservation)
    pods: PodsObservation = field(default_factory=PodsObservation)
    # None: preparation has no say in this pass (turned off in the settings, or done earlier)
    preparation: PreparationObservation | None = None
    # spec.model.fromJob: the parent job's state (None: no parent job)
    parent: ParentObservation | None = None
    children: dict[str, str] = field(default_factory=dict)
    # a finished job registered again, and the retry annotation's value no pass has acted on yet
    reregister: Reregister | None = None
    retry_request: str | None = None
    # For actionable messages.
    namespace: str = "default"
    job_name: str = ""
    pytorchjob_name: str = ""
    registration_job_name: str = ""
    preparation_job_name: str = ""
    checkpoint_claim: str = ""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Transition:
    """The next status (fields the operator owns) and the events for what changed."""

    status: dict[str, Any]
    events: list[Event]
    phase: str
    # True when only time (or the outside world) can move things on: re-check soon.
    waiting: bool = False


@dataclass(frozen=True)
class Decision:
    """The phase, and per condition (``ready``, ``children``, ``training``, ``suspended``,
    ``registered``) its (status, reason, message); ``waiting``: only time can move things on."""

    phase: Phase
    conditions: dict[str, tuple[bool, str, str]]
    waiting: bool = False


def condition_of(
    previous: dict[str, Condition],
    type_: str,
    decided: tuple[bool, str, str],
    *,
    now: str,
    generation: int,
) -> Condition:
    """A condition as decided (status, reason, message); its transition time moves only when the
    status flips (Kubernetes convention)."""
    status, reason, message = decided
    value: Literal["True", "False"] = "True" if status else "False"
    old = previous.get(type_)
    # lastTransitionTime moves only when the status flips (Kubernetes convention).
    when = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
