"""What a FineTuneJob's status says: the questions the reconciler and the state machine ask of it.

Pure reads of a :class:`~kubetune_api.status.FineTuneJobStatus` (``state`` re-exports them).
"""

from __future__ import annotations

from enum import StrEnum

from kubetune_api.spec import FineTuneJob
from kubetune_api.status import ConditionType, FineTuneJobStatus, Phase, Reason

FINAL_PHASES = (Phase.SUCCEEDED, Phase.FAILED)


def registration_wanted(job: FineTuneJob, status: FineTuneJobStatus) -> bool:
    """Whether the trained model is to be registered: ``spec.registration.enabled``, unless training
    stopped at ``spec.budget`` (status.budget, the trainer's report) and ``budget.register`` is false."""
    budget = job.spec.budget
    stopped = status.budget is not None and status.budget.reached
    return job.spec.registration.enabled and not (
        stopped and budget is not None and not budget.register_model
    )


def failed_in_registration(status: FineTuneJobStatus) -> bool:
    """Failed after training finished, in registration: the one final phase that can be left.

    The status message tells the user to set the ``kubetune.io/retry-registration`` annotation once
    the tracking URI or credentials are fixed; the operator then registers again (the registration
    is idempotent: a version of this run and config already in MLflow is found, not registered twice).
    """
    if status.phase != Phase.FAILED:
        return False
    ready = next((c for c in status.conditions or [] if c.type == ConditionType.READY), None)
    return ready is not None and ready.reason == Reason.REGISTRATION_FAILED


def gate_not_met(status: FineTuneJobStatus) -> bool:
    """Succeeded with nothing registered because ``spec.registration.gate`` was not met
    (``Registered=False``, ``GateNotMet``): the retry annotation registers the model anyway."""
    if status.phase != Phase.SUCCEEDED:
        return False
    registered = next((c for c in status.conditions or [] if c.type == ConditionType.REGISTERED), None)
    return registered is not None and registered.reason == Reason.GATE_NOT_MET


def registration_forced(status: FineTuneJobStatus) -> bool:
    """Whether a registration Job created now registers past the gate: the status holds a verdict of
    the gate not met (``status.evaluation.gatePassed`` false). Only a retry after ``GateNotMet``
    creates a registration Job then; a job's first registration has no verdict yet."""
    return status.evaluation is not None and status.evaluation.gate_passed is False


def preparation_needed(status: FineTuneJobStatus) -> bool:
    """Whether the preparation Job still decides what comes next: not once the status says
    Prepared, and not for a job whose training started before kubetune had a preparation step
    (Training, Suspended or Registering without a Prepared condition)."""
    prepared = next((c for c in status.conditions or [] if c.type == ConditionType.PREPARED), None)
    if prepared is not None:
        return prepared.status != "True"
    return status.phase not in (Phase.TRAINING, Phase.SUSPENDED, Phase.REGISTERING)


def training_succeeded(status: FineTuneJobStatus) -> bool:
    """The status says training finished (its Training condition is TrainingSucceeded)."""
    training = next((c for c in status.conditions or [] if c.type == ConditionType.TRAINING), None)
    return training is not None and training.reason == Reason.TRAINING_SUCCEEDED


def finished_without_registration(status: FineTuneJobStatus) -> bool:
    """Succeeded with registration off: turning ``registration.enabled`` on registers the model."""
    if status.phase != Phase.SUCCEEDED or status.registered_model is not None:
        return False
    registered = next((c for c in status.conditions or [] if c.type == ConditionType.REGISTERED), None)
    return registered is not None and registered.reason == Reason.REGISTRATION_DISABLED


def rejected_child(status: FineTuneJobStatus) -> bool:
    """Failed because the API server refused to create a child as this spec builds it."""
    if status.phase != Phase.FAILED:
        return False
    ready = next((c for c in status.conditions or [] if c.type == ConditionType.READY), None)
    return ready is not None and ready.reason == Reason.CHILD_REJECTED


def reopens(status: FineTuneJobStatus, generation: int) -> bool:
    """A job Failed with ``ChildRejected`` whose spec changed since: it starts over from Pending.

    The refused object was built from the spec, so only a new spec can be accepted (or the same
    one, once an admission policy was changed: any accepted spec change retries). Children created
    before the refusal are ours and are kept; the pass creates the missing ones.
    """
    if not rejected_child(status):
        return False
    ready = next(c for c in status.conditions or [] if c.type == ConditionType.READY)
    return (ready.observed_generation or 0) < generation


class Reregister(StrEnum):
    """How a finished job is registered again: the ways out of Succeeded and Failed through
    registration (an alias move is :func:`alias_transition`; a refused child's spec change, ``reopens``).
    The reconciler observes which one applies (it reads the annotation and the registration Job)."""

    # Succeeded with registration off, and registration.enabled is now true: register the trained model
    ENABLED = "enabled"
    # Failed in registration, the retry annotation set to a new value, the failed Job gone: create it anew
    RETRY = "retry"
    # the same, asked while registration.enabled is false: training finished, nothing registered
    RETRY_DISABLED = "retry-disabled"
    # Failed in registration, and a registration Job that has not failed exists (created by a retry
    # whose status write lost a race, or before an operator restart): follow it
    FOLLOW = "follow"
