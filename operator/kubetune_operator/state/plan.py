"""One pass's decisions: :func:`advance` answers an observation with the next actions. Pure.

The order it decides in: a final job leaves its phase only through :mod:`.exits` (registration
retried or turned on, the alias moved) or a refused child's spec change (``reopens``); a spec that
cannot be used fails the job; a parent job (``spec.model.fromJob``) holds the job until it has
Succeeded (:mod:`.chaining`); otherwise the children the pass needs (:mod:`.wanted`) are requested in
order, and once the pass has them all, :func:`~.machine.transition` decides the status the pass
commits. A job that fails while its training object runs has it stopped.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kubetune_api import spec as api
from kubetune_api.status import FineTuneJobStatus, Phase, Reason

from .. import builders
from ..children import is_ours
from ..observations import TrainingObservation, retry_delay, training_observation
from . import chaining, engine, exits, wanted
from .actions import Action, Commit, DeleteChild, Outcome, Plan, Read, StopTraining, UseEngine
from .machine import transition
from .observation import Child, Fact, Observation, Unread
from .status_view import FINAL_PHASES, Reregister, registration_wanted, reopens, training_succeeded

# the ways out of a final phase whose request the status records (status.registrationRetry)
_ASKED = (Reregister.RETRY, Reregister.RETRY_DISABLED, Reregister.FOLLOW)


def advance(obs: Observation) -> Plan:
    """The next actions of the pass ``obs`` describes: what to read, create, sync, delete or stop,
    and, last, the status to commit (:class:`~.actions.Commit`)."""
    try:
        return _advance(obs)
    except Unread as need:
        return Plan((Read(need.fact, need.name, need.held),))


def _advance(obs: Observation) -> Plan:
    prev = obs.previous or FineTuneJobStatus()
    if obs.engine is None:  # the engine the status records, first of all (state.engine)
        recorded = engine.recorded(prev)
        if recorded is not None:
            return Plan((UseEngine(recorded),))
    reregister: Reregister | None = None
    deletes: tuple[DeleteChild, ...] = ()
    if prev.phase == Phase.SUCCEEDED:
        reregister = exits.turned_on(obs)
        if reregister is None:
            reregister, deletes = exits.retry(obs)
        if reregister is None:
            return _after(deletes, exits.alias_move(obs))
    elif prev.phase in FINAL_PHASES and not reopens(prev, obs.generation):
        reregister, deletes = exits.retry(obs)
        if reregister is None:
            return _after(deletes, exits.observed(Outcome(phase=str(prev.phase)), obs.generation))
    return _after(deletes, _normal(obs, prev, reregister))


def _after(first: tuple[DeleteChild, ...], plan: Plan) -> Plan:
    return Plan((*first, *plan.actions))


def _normal(obs: Observation, prev: FineTuneJobStatus, reregister: Reregister | None) -> Plan:
    """A job that is not final, reopened, or registered again."""
    retry_request = exits.retry_requested(obs) if reregister in _ASKED else None
    first = replace(obs, reregister=reregister, retry_request=retry_request)
    before = _before_children(first, prev)
    if before is not None:
        return before
    assert obs.job is not None
    # spec.model.fromJob: nothing is created before the parent job has Succeeded
    job, found = chaining.for_pass(
        obs.job,
        lambda name: obs.read(Fact.FINETUNEJOB, name),
        obs.preparation_enabled,
        training_succeeded(prev),
    )
    live: dict[str, Any] | None = None
    starts = chaining.lets_start(found)
    if starts:
        step = wanted.next_step(obs, job)
        if step is not None:
            return step
        children = wanted.children_names(obs, job)
        training = obs.training
        if Child.TRAINING_JOB in obs.observed:
            live = obs.had[Child.TRAINING_JOB].obj
        elif _trained_and_gone(obs, job):
            name = builders.pytorchjob_name(job)
            training = TrainingObservation(
                condition="Succeeded",
                message=f"training finished ({obs.engine} {name} has been deleted since)",
            )
    else:
        children, training = {}, TrainingObservation()
        if chaining.started_from(found):  # a training object started from a parent gone since is stopped
            live = obs.read(Fact.TRAINING_JOB, builders.pytorchjob_name(job))
            training = training_observation(live)
    final = replace(first, children=children, training=training, parent=found, **_spec_facts(job, prev))
    t = transition(prev, final)
    actions: list[Action] = []
    running = live is not None and training.condition not in ("Succeeded", "Failed", "Suspended")
    if t.phase == Phase.FAILED and running:
        actions.append(StopTraining(builders.pytorchjob_name(job)))
    error = final.child_error
    if error is not None and error.verdict != "rejected":
        delay = retry_delay(error.attempts, obs.retry_seconds, max(obs.retry_seconds, obs.resync_seconds))
        outcome = Outcome(phase=t.phase, waiting=True, message=error.describe(), retry_in=delay)
    else:
        outcome = Outcome(phase=t.phase, waiting=t.waiting, message=final.conflict or "")
    forget = starts and (error is None or error.verdict == "rejected")
    actions.append(Commit(outcome, t, forget_refusals=forget))
    return Plan(tuple(actions))


def _before_children(obs: Observation, prev: FineTuneJobStatus) -> Plan | None:
    """What stops a job before anything is created: a spec that cannot be used, names in the
    registry that are not the namespace's or a test hook the operator does not honour (Failed), no
    training engine (yet: waiting). Otherwise the pass goes on with its engine (None)."""
    if obs.job is None:
        message = obs.invalid_spec or "the spec cannot be used"
        t = transition(prev, replace(obs, invalid_spec=message))
        return Plan((Commit(Outcome(phase=t.phase, invalid=True, message=message), t),))
    # What the platform refuses before anything is created; a job whose training object exists (and is
    # its own) keeps it. The registry's names are the platform's (kubetune_api.tenancy): a job that
    # started keeps training (an upgrade that turns tenancy on stops no running job), and the rule is
    # checked again before the registration Job (wanted._registration, the status:
    # machine._after_training) and before an alias move (exits.alias_move). The trainer's test hook on
    # an operator that does not honour it (kubetune_api.pod_env): a started job's training object was
    # made while the setting was on, and every child made from now on goes without it
    # (kubetune_operator.pod_env).
    refusal = _platform_refusal(obs)
    if refusal is not None and not _training_started(obs, prev):
        reason, message = refusal
        t = transition(prev, replace(obs, invalid_spec=message, invalid_reason=reason))
        return Plan((Commit(Outcome(phase=t.phase, invalid=True, message=message), t),))
    # the training engine: chosen once, before anything is created (state.engine)
    if obs.engine is None:
        chosen = engine.choose(obs, obs.job)
        if isinstance(chosen, tuple):
            return _no_engine(prev, obs, chosen, obs.retry_seconds)
        return Plan((UseEngine(chosen),))
    if obs.engine not in engine.IMPLEMENTED:
        return _no_engine(prev, obs, engine.not_implemented(obs.engine), obs.resync_seconds)
    return None


def _platform_refusal(obs: Observation) -> tuple[str, str] | None:
    """The condition's reason and message of what the platform's settings refuse in this job, if so."""
    if obs.registry_refusal:
        return Reason.MODEL_NAME_NOT_ALLOWED, obs.registry_refusal
    if obs.fault_injection_refusal:
        return Reason.INVALID_SPEC, obs.fault_injection_refusal
    return None


def _training_started(obs: Observation, prev: FineTuneJobStatus) -> bool:
    """Whether the job's training object exists and is ours, as the API server says: never the
    status alone, which whoever may patch the job's status can write (a shared trainer
    ServiceAccount, ``KUBETUNE_TRAINER_SERVICE_ACCOUNT``, may patch every job's status in its
    namespace, and a user who can mint its token can reset a refused job to Pending). A status
    without a phase or an engine had nothing created: no read."""
    if prev.phase is None or obs.engine is None or obs.engine not in engine.IMPLEMENTED:
        return False
    assert obs.job is not None
    live = obs.read(Fact.TRAINING_JOB, builders.pytorchjob_name(obs.job))
    return live is not None and is_ours(live, obs.job)


def _no_engine(
    prev: FineTuneJobStatus, obs: Observation, refusal: tuple[str, str], look_again: float
) -> Plan:
    """The job cannot have its training engine (yet): it waits, Pending, with the condition saying
    why, and nothing is created; the pass looks again in ``look_again`` seconds."""
    t = transition(prev, replace(obs, engine_refusal=refusal))
    outcome = Outcome(phase=t.phase, waiting=True, message=refusal[1], retry_in=look_again)
    return Plan((Commit(outcome, t),))


def _trained_and_gone(obs: Observation, job: api.FineTuneJob) -> bool:
    """The pass found the training object the status says succeeded gone (it had read it)."""
    try:
        return wanted.trained_and_gone(obs, job)
    except Unread:
        return False


def _spec_facts(job: api.FineTuneJob, prev: FineTuneJobStatus) -> dict[str, Any]:
    """What the status decision reads of the spec and of the previous status, and the names its
    messages give."""
    return {
        "suspend": job.spec.suspend,
        "registration_enabled": registration_wanted(job, prev),
        "budget": prev.budget if prev.budget and prev.budget.reached else None,
        "checkpoint_step": prev.checkpoints.latest_step if prev.checkpoints else None,
        "queued_by_kueue": job.spec.resources.queue_name is not None,
        "job_name": job.metadata.name,
        "pytorchjob_name": builders.pytorchjob_name(job),
        "registration_job_name": builders.registration_job_name(job),
        "preparation_job_name": builders.preparation_job_name(job),
        "checkpoint_claim": builders.checkpoint_claim(job),
    }
