"""What a pass knows when it asks the state machine: raw facts in (:class:`Observation`).

A pass starts from the FineTuneJob as read (its status, its spec or why the spec cannot be used,
its annotations), the operator's settings that shape a pass and the training engine; every fact the
machine asks for on the way (:class:`~.actions.Read`) and every child it had ensured or observed
(:class:`~.actions.EnsureChild`...) is added by the reconciler, which then asks again. The folded
facts about the children (``training``, ``registration``, ``pods``...) are what
:mod:`kubetune_operator.observations` makes of the objects read; :func:`~.machine.transition` decides
the status from them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from kubetune_api import spec as api
from kubetune_api.engines import AUTO, Engine
from kubetune_api.failures import TrainingFailure
from kubetune_api.status import BudgetStatus, FineTuneJobStatus, TrainingRestarts

from ..observations import (
    ChildError,
    KueueWorkload,
    PodsObservation,
    PreparationObservation,
    RegistrationObservation,
    TrainingObservation,
)
from ..training_failures import RestartEvidence
from .chaining import ParentObservation
from .status_view import Reregister


class Fact(StrEnum):
    """What a pass may have to read before it can decide (:class:`~.actions.Read`)."""

    TRAINING_JOB = "trainingJob"  # the engine's training object (the PyTorchJob)
    REGISTRATION_JOB = "registrationJob"
    ALIAS_JOBS = "aliasJobs"  # every alias Job of the FineTuneJob (a list)
    FINETUNEJOB = "fineTuneJob"  # a FineTuneJob of the namespace (the parent, and up its chain)
    SERVED = "served"  # whether the API server serves an engine's resource (by the engine's name): a bool


class Child(StrEnum):
    """The children of a FineTuneJob, in the order a pass creates them."""

    IDENTITY = "identity"  # the trainer's ServiceAccount (and what it needs)
    CHECKPOINT_CLAIM = "checkpointClaim"
    CONFIG_MAP = "configMap"
    PREPARATION_JOB = "preparationJob"
    TRAINING_JOB = "trainingJob"  # the engine's training object (the PyTorchJob)
    REGISTRATION_JOB = "registrationJob"
    ALIAS_JOB = "aliasJob"


@dataclass(frozen=True)
class Had:
    """A child as a pass had it: the object (as created, read or patched), whether this pass created it."""

    obj: dict[str, Any] | None
    created: bool = False


@dataclass(frozen=True)
class Observation:
    generation: int
    now: str  # RFC 3339

    # --- raw facts: the FineTuneJob as read, and what the reconciler read and did for the machine ---
    previous: FineTuneJobStatus | None = None  # the status as read (None: a new job)
    job: api.FineTuneJob | None = None  # the spec, parsed (None: invalid_spec says why, or not given)
    annotations: Mapping[str, str] = field(default_factory=dict)
    # the training engine of this pass (None: not decided yet; the machine decides it, state.engine,
    # and the reconciler sets it: UseEngine) and the operator's default for a spec that names none
    engine: Engine | None = None
    default_engine: Engine | str = AUTO
    preparation_enabled: bool = True  # the operator's settings: a preparation Job before training
    retry_seconds: float = 15.0  # the operator's settings: backoff of a refused child request ...
    resync_seconds: float = 300.0  # ... capped at the slow re-sync
    # what the machine asked to read (Read: by fact, name and how a refusal counts) and its answer
    reads: Mapping[tuple[Fact, str, bool], Any] = field(default_factory=dict)
    had: Mapping[Child, Had] = field(default_factory=dict)  # the children ensured (or followed) so far
    observed: frozenset[Child] = frozenset()  # the children whose state has been read after ensuring
    deleted: frozenset[str] = frozenset()  # names of the children this pass deleted
    alias_job: RegistrationObservation | None = None  # the alias Job, observed (an alias move)

    # --- folded facts: what the pass made of the children (the machine's status decision reads these) ---
    suspend: bool = False
    registration_enabled: bool = True  # status_view.registration_wanted: spec.registration and spec.budget
    # the trainer stopped at spec.budget (its report in status.budget)
    budget: BudgetStatus | None = None
    # why the PyTorchJob failed (its pods say), when it did
    failure: TrainingFailure | None = None
    # while training: what this pass saw of the restarts (the PyTorchJob's pod incarnations, the
    # JobSet's count; None: nothing), why the last attempt ended (a failed pod still there), and the
    # limit on restarts in a row without progress (the operator's trainBackoffLimit)
    restart_evidence: RestartEvidence | None = None
    attempt_failure: TrainingFailure | None = None
    restart_limit: int = 6
    checkpoint_step: int | None = None  # the trainer's newest complete checkpoint (status.checkpoints)
    restarts: TrainingRestarts | None = None  # counted (advance fills it from the previous status)
    queued_by_kueue: bool = False  # spec has a queueName: a suspended PyTorchJob is waiting for quota
    # what Kueue's Workload says of the suspended training object of a queued job: whether Kueue
    # evicted it (preempted it) and why (None: not read, there is none, or it cannot be read)
    kueue: KueueWorkload | None = None
    invalid_spec: str | None = None
    invalid_reason: str = "InvalidSpec"  # the condition's reason when invalid_spec is set
    # the job cannot have its training engine yet (state.engine): the condition's reason and message
    engine_refusal: tuple[str, str] | None = None
    # why the job may not use the registry names it names (kubetune_api.tenancy), if so
    registry_refusal: str | None = None
    # why the job's spec.env may not run on this operator (kubetune_api.pod_env: its test hook), if so
    fault_injection_refusal: str | None = None
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

    def read(self, fact: Fact, name: str, *, held: bool = False) -> Any:
        """What a Read of ``fact`` answered; raises :class:`Unread` when nobody read it yet."""
        key = (fact, name, held)
        if key not in self.reads:
            raise Unread(fact, name, held)
        return self.reads[key]


class Unread(Exception):  # noqa: N818  a question, not an error
    """The machine needs a fact nobody read yet (the pass reads it and asks again)."""

    def __init__(self, fact: Fact, name: str, held: bool) -> None:
        super().__init__(f"{fact} {name}")
        self.fact, self.name, self.held = fact, name, held
