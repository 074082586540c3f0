"""The FineTuneJob's one decision tree: an observation in, the actions of a pass out. Pure.

- :func:`advance` (:mod:`.plan`): every way into and out of every phase, as typed actions
  (:mod:`.actions`): what to read, create, sync, delete or stop, and the status to commit.
- :func:`wanted` (:mod:`.wanted`): which children the normal path needs.
- :class:`Observation` (:mod:`.observation`): the raw facts (the job as read, its annotations, the
  objects read, the children had, the engine) and what the pass made of the children.
- :mod:`.engine`: the training engine a job runs on, chosen once and recorded.
- :func:`transition` (:mod:`.machine`): the status decision, from the previous status and the
  children's state; :mod:`.exits`: the ways out of a final phase; :mod:`.chaining`: the parent job's
  verdict; :mod:`.alias`: an alias move's condition; :mod:`.status_view`: what a status says.

The reconciler (:mod:`kubetune_operator.reconcile`) only observes, carries the actions out and
commits the status.
"""

from __future__ import annotations

from kubetune_api.status import ConditionType, EventReason, Reason

from ..observations import (
    POD_TROUBLE,
    SHOW_TRANSIENT_AFTER,
    ChildError,
    KueueWorkload,
    PodsObservation,
    PreparationObservation,
    RegistrationObservation,
    TrainingObservation,
)
from ..state_types import Decided, Decision, Event, Transition, Verdicts
from . import actions, chaining, engine, exits
from .actions import (
    Commit,
    DeleteChild,
    EnsureChild,
    FollowChild,
    ObserveTraining,
    Outcome,
    Plan,
    Read,
    StopTraining,
    SyncDeadline,
    SyncSuspend,
    UseEngine,
)
from .alias import alias_transition
from .chaining import ParentObservation
from .machine import CONDITION_TYPES, decide, transition
from .observation import Child, Engine, Fact, Had, Observation
from .plan import advance
from .status_view import (
    FINAL_PHASES,
    Reregister,
    failed_in_registration,
    finished_without_registration,
    gate_not_met,
    preparation_needed,
    registration_forced,
    registration_wanted,
    rejected_child,
    reopens,
    training_succeeded,
)
from .wanted import wanted

__all__ = [
    "CONDITION_TYPES",
    "FINAL_PHASES",
    "POD_TROUBLE",
    "SHOW_TRANSIENT_AFTER",
    "Child",
    "ChildError",
    "Commit",
    "ConditionType",
    "Decided",
    "Decision",
    "DeleteChild",
    "Engine",
    "EnsureChild",
    "Event",
    "EventReason",
    "Fact",
    "FollowChild",
    "Had",
    "KueueWorkload",
    "Observation",
    "ObserveTraining",
    "Outcome",
    "ParentObservation",
    "Plan",
    "PodsObservation",
    "PreparationObservation",
    "Read",
    "Reason",
    "RegistrationObservation",
    "Reregister",
    "StopTraining",
    "SyncDeadline",
    "SyncSuspend",
    "TrainingObservation",
    "Transition",
    "UseEngine",
    "Verdicts",
    "actions",
    "advance",
    "alias_transition",
    "chaining",
    "decide",
    "engine",
    "exits",
    "failed_in_registration",
    "finished_without_registration",
    "gate_not_met",
    "preparation_needed",
    "registration_forced",
    "registration_wanted",
    "rejected_child",
    "reopens",
    "training_succeeded",
    "transition",
    "wanted",
]
