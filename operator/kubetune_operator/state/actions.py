"""What the state machine asks a pass to do (:func:`~.advance`'s answer): typed, in order.

The reconciler carries the actions out one after the other and adds what each one found to the
observation. A plan that ends with :class:`Commit` is the pass's last; any other plan ends where the
machine needs to see a result before it can go on, and the reconciler asks again.

``held``: a refusal of the request stops the pass as a child error (``state.ChildError``: the status
says it, the pass retries with backoff); otherwise the API server's error ends the pass as an error.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kubetune_api import spec as api
from kubetune_api.engines import Engine

from ..state_types import Transition
from .observation import Child, Fact


@dataclass(frozen=True)
class Read:
    """Read one fact (an object, or the alias Jobs) and ask again."""

    fact: Fact
    name: str
    held: bool = False


@dataclass(frozen=True)
class UseEngine:
    """The pass runs on this training engine (recorded, or chosen now: :mod:`.engine`): the reconciler
    reads, creates and follows that engine's training object, and asks again."""

    engine: Engine


@dataclass(frozen=True)
class EnsureChild:
    """Create the child from ``job`` (the spec, with its parent recorded) if it is missing, or read
    it; a stranger's object of its name is a conflict. A ConfigMap read is brought up to date
    (``children.sync_config``). The preparation, registration and alias Jobs are observed at once
    (with their pods). ``announce``: a created child gets its ``Created`` event; ``force``: a
    registration Job registers past ``spec.registration.gate``; ``create_first``: the status says
    the child is not made yet, so the create is tried before any read (one request, not two; an
    object of that name already there is read then, as always)."""

    child: Child
    job: api.FineTuneJob
    held: bool = True
    announce: bool = True
    force: bool = False
    create_first: bool = False


@dataclass(frozen=True)
class FollowChild:
    """Observe a child this pass does not create (a registration Job created before registration was
    turned off), as read."""

    child: Child
    job: api.FineTuneJob
    obj: dict[str, Any]


@dataclass(frozen=True)
class SyncSuspend:
    """Make the training object's suspension follow ``spec.suspend`` (``children.sync_suspend``)."""

    job: api.FineTuneJob


@dataclass(frozen=True)
class SyncDeadline:
    """Arm the training object's hard deadline from ``spec.budget`` (``children.sync_deadline``)."""

    job: api.FineTuneJob


@dataclass(frozen=True)
class ObserveTraining:
    """Read what the training object's status does not say: its pods' trouble, why it failed, its
    restarts, why Kueue holds it (its Workload: queued, or preempted) (each best effort)."""

    job: api.FineTuneJob
    pods: bool = False
    failure: bool = False
    restarts: bool = False
    kueue: bool = False


@dataclass(frozen=True)
class DeleteChild:
    """Delete one child, by its uid (never a newer object of the same name)."""

    api_version: str
    kind: str
    name: str
    uid: str


@dataclass(frozen=True)
class StopTraining:
    """Suspend the training object of a failed job (its pods stop, the GPUs are free); best effort."""

    name: str


@dataclass(frozen=True)
class Outcome:
    """What the pass tells its trigger: the phase, whether to look again soon, whether the spec can
    never be used, why, and the backoff of a refused child request."""

    phase: str
    waiting: bool = False
    invalid: bool = False
    message: str = ""
    retry_in: float | None = None  # a child request was refused in a way that may pass: try again then


@dataclass(frozen=True)
class Commit:
    """The pass's end: write ``transition``'s status (None: nothing to write) and, once written, emit
    its events. ``forget_refusals``: the children's requests went through (or were refused for good),
    so the count of refused passes in a row starts again."""

    outcome: Outcome
    transition: Transition | None = None
    forget_refusals: bool = False


Action = (
    Read
    | UseEngine
    | EnsureChild
    | FollowChild
    | SyncSuspend
    | SyncDeadline
    | ObserveTraining
    | DeleteChild
    | StopTraining
    | Commit
)


@dataclass(frozen=True)
class Plan:
    """The actions of one step of a pass, in order; the last step ends with a :class:`Commit`."""

    actions: tuple[Action, ...] = field(default_factory=tuple)

    @property
    def commit(self) -> Commit | None:
        last = self.actions[-1] if self.actions else None
        return last if isinstance(last, Commit) else None
