"""Which children the normal path needs (:func:`wanted`), and the next request about them
(:func:`next_step`). Pure.

Creation order: identity, volume and config, the preparation Job, then the training object whose
pods need them all, then the registration Job once training Succeeded. A pass stops at the first
conflict (a training object must never mount a stranger's volume) and at the first refused request.
"""

from __future__ import annotations

from kubetune_api import spec as api
from kubetune_api.engines import Engine
from kubetune_api.status import FineTuneJobStatus, Phase

from .. import builders
from ..children import is_ours
from ..observations import POD_CONDITIONS, pods_running, training_observation
from .actions import Action, EnsureChild, FollowChild, ObserveTraining, Plan, SyncDeadline, SyncSuspend
from .observation import Child, Fact, Observation
from .status_view import preparation_needed, registration_forced, registration_wanted, training_succeeded

_BASE = (Child.IDENTITY, Child.CHECKPOINT_CLAIM, Child.CONFIG_MAP)


def trained_and_gone(obs: Observation, job: api.FineTuneJob) -> bool:
    """Training that the status says succeeded is never started again: a training object deleted since
    (by hand, or by a TTL) is not created anew while the model registers; training stays Succeeded."""
    if not training_succeeded(obs.previous or FineTuneJobStatus()):
        return False
    return obs.read(Fact.TRAINING_JOB, builders.pytorchjob_name(job), held=True) is None


def wanted(obs: Observation, job: api.FineTuneJob | None = None) -> tuple[Child, ...]:
    """The children the normal path needs, in creation order, as far as the pass has seen them: the
    rest depends on what the ones before it say (nothing GPU-sized before the preparation has
    succeeded; the registration Job once training has)."""
    job = job or obs.job
    assert job is not None
    if any(child not in obs.had for child in _BASE):
        return _BASE
    if trained_and_gone(obs, job):
        return (*_BASE, Child.REGISTRATION_JOB)
    out = list(_BASE)
    if obs.preparation_enabled and preparation_needed(obs.previous or FineTuneJobStatus()):
        out.append(Child.PREPARATION_JOB)
        prep = obs.preparation
        if Child.PREPARATION_JOB not in obs.had or prep is None or prep.state != "Succeeded":
            return tuple(out)
    out.append(Child.TRAINING_JOB)
    if Child.TRAINING_JOB in obs.observed and obs.training.condition == "Succeeded":
        out.append(Child.REGISTRATION_JOB)
    return tuple(out)


def next_step(obs: Observation, job: api.FineTuneJob) -> Plan | None:
    """The next requests about the children ``wanted``; None once the pass has them all (or stopped
    at a conflict or a refusal)."""
    if obs.conflict or obs.child_error is not None:
        return None
    for child in wanted(obs, job):
        if child == Child.REGISTRATION_JOB:
            step = _registration(obs, job)
            if step is not None:
                return step
        elif child not in obs.had:
            return Plan((EnsureChild(child, job, create_first=not_made_yet(obs, child)),))
        elif child == Child.TRAINING_JOB and child not in obs.observed:
            return Plan(_training(obs, job))
    return None


def not_made_yet(obs: Observation, child: Child) -> bool:
    """Whether the previous status says the child is not made yet: no children recorded at all (a new
    job), no preparation Job recorded, or, for the training object, a job not past its preparation
    (no phase yet, or Preparing). Only which request goes first follows from it (``create_first``):
    a child made by a pass whose status write was lost is found all the same."""
    prev = obs.previous or FineTuneJobStatus()
    if prev.children is None:
        return True
    if child == Child.PREPARATION_JOB:
        return prev.children.preparation_job is None
    if child == Child.TRAINING_JOB:
        return prev.phase in (None, Phase.PREPARING)
    return False


def _training(obs: Observation, job: api.FineTuneJob) -> tuple[Action, ...]:
    """The training object was had: its suspension and deadline kept in line with the spec, and what
    its status does not say read (its pods only once they could have trouble, its failure's reason,
    its restarts)."""
    had = obs.had[Child.TRAINING_JOB]
    live = had.obj
    condition = training_observation(live).condition
    actions: list[Action] = []
    if live is not None and condition not in ("Succeeded", "Failed"):
        actions.append(SyncSuspend(job))
    if live is not None and condition == "Running":
        actions.append(SyncDeadline(job))
    running = pods_running(live)
    actions.append(
        ObserveTraining(
            job,
            pods=live is not None
            and not had.created  # nothing can have happened to it yet
            and not job.spec.suspend
            and condition in POD_CONDITIONS
            and not running,
            failure=live is not None and condition == "Failed",
            restarts=live is not None
            and not had.created
            and condition in ("Restarting", "Created", "Running")
            and (condition != "Running" or not running),
            # held under a queue (not by spec.suspend): Kueue's Workload says whether it was preempted
            kueue=live is not None
            and condition == "Suspended"
            and not job.spec.suspend
            and job.spec.resources.queue_name is not None,
        )
    )
    return tuple(actions)


def _registration(obs: Observation, job: api.FineTuneJob) -> Plan | None:
    """Training finished: the registration Job, created when registration is on. Turned off after its
    Job was created, that Job still registers the model, so it is followed to its end and reported
    (turning it off only stops one not yet created)."""
    if Child.REGISTRATION_JOB in obs.had:
        return None
    prev = obs.previous or FineTuneJobStatus()
    if obs.registry_refusal:
        # the registry's names are the platform's (kubetune_api.tenancy), checked again here: a job
        # that started before tenancy was on, or whose status was written by someone else, registers
        # nothing under another namespace's name; the status decision says why (machine._after_training)
        return None
    if registration_wanted(job, prev):
        # after GateNotMet, only the retry annotation creates it: it registers past the gate
        return Plan((EnsureChild(Child.REGISTRATION_JOB, job, force=registration_forced(prev)),))
    live = obs.read(Fact.REGISTRATION_JOB, builders.registration_job_name(job), held=True)
    if live is not None and is_ours(live, job):
        return Plan((FollowChild(Child.REGISTRATION_JOB, job, live),))
    return None


def children_names(obs: Observation, job: api.FineTuneJob) -> dict[str, str]:
    """``status.children``: the names of the children the pass has (the base three always: the
    training object under its engine's key, ``pytorchJob`` or ``trainJob``)."""
    training = "trainJob" if obs.engine == Engine.TRAINJOB else "pytorchJob"
    names = {
        "checkpointClaim": builders.checkpoint_claim(job),
        "configMap": builders.config_map_name(job),
        training: builders.pytorchjob_name(job),
    }
    if Child.PREPARATION_JOB in obs.had:
        names["preparationJob"] = builders.preparation_job_name(job)
    if Child.REGISTRATION_JOB in obs.had:
        names["registrationJob"] = builders.registration_job_name(job)
    return names
