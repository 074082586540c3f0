"""The ways out of a final phase that are not a refused child's spec change (``reopens``): the
registration retried, registration turned on later, the alias moved. Pure: what they need to read
(the training object, the registration Job, the alias Jobs) they ask for (:class:`~.observation.Unread`).

- Succeeded with registration off, and ``registration.enabled`` now true, training known to have
  finished (:func:`trained`): ``Reregister.ENABLED`` (:func:`turned_on`).
- Failed in registration, or Succeeded with the gate not met, and the
  ``kubetune.io/retry-registration`` annotation set to a value no pass acted on yet
  (:func:`retry_requested`): registered again (:func:`retry`).
- Succeeded, and ``registration.alias`` differs from the alias the registered version carries: the
  alias Job moves it; the phase stays Succeeded (:func:`alias_move`).
- Otherwise a final job stays as it is (its ``observedGeneration`` follows the spec: :func:`observed`).
"""

from __future__ import annotations

from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION
from kubetune_api.status import ConditionType, FineTuneJobStatus, Phase, Reason

from .. import builders
from ..children import is_ours
from ..observations import JOB_ENDED, RegistrationObservation, registration_observation, training_observation
from ..state_types import Transition
from .actions import Commit, DeleteChild, EnsureChild, Outcome, Plan
from .alias import alias_held, alias_transition
from .observation import Child, Fact, Observation
from .status_view import (
    Reregister,
    failed_in_registration,
    finished_without_registration,
    gate_not_met,
    training_succeeded,
)


def previous(obs: Observation) -> FineTuneJobStatus:
    return obs.previous or FineTuneJobStatus()


def observed(outcome: Outcome, generation: int) -> Plan:
    """A pass with nothing to do for this generation still says it saw it (``status.observedGeneration``)."""
    status = {"observedGeneration": generation}
    return Plan((Commit(outcome, Transition(status=status, events=[], phase=outcome.phase)),))


def trained(obs: Observation) -> bool:
    """Whether training finished: the status says so (a pass then never creates the training object
    again), or the job's training object is there and Succeeded. A pass that registers never trains
    again."""
    if training_succeeded(previous(obs)):
        return True
    if obs.engine is None:  # no engine was ever chosen (state.engine): nothing was trained
        return False
    assert obs.job is not None
    live = obs.read(Fact.TRAINING_JOB, builders.pytorchjob_name(obs.job))
    return training_observation(live).condition == "Succeeded"


def turned_on(obs: Observation) -> Reregister | None:
    """``ENABLED``: the job succeeded with registration off and ``registration.enabled`` is now
    true, and training is known to have finished (:func:`trained`); the pass registers. None otherwise."""
    if not finished_without_registration(previous(obs)) or obs.job is None:
        return None
    if obs.job.spec.registration.enabled and trained(obs):
        return Reregister.ENABLED
    return None


def retry_requested(obs: Observation) -> str | None:
    """The ``kubetune.io/retry-registration`` annotation's value when no pass has acted on it yet
    (``status.registrationRetry``); None otherwise."""
    value = obs.annotations.get(RETRY_REGISTRATION_ANNOTATION)
    return value if value and value != previous(obs).registration_retry else None


def retry(obs: Observation) -> tuple[Reregister | None, tuple[DeleteChild, ...]]:  # noqa: PLR0911
    """Whether a job that failed in registration (or whose gate was not met) is registered again
    now, and how; with the deletion of a failed registration Job that the request makes.

    Only the user's request retries: the ``kubetune.io/retry-registration`` annotation set to a
    value not acted on yet (:func:`retry_requested`). A failed Job that merely disappears (deleted by
    hand, or by a TTL that an admission policy gives every Job) leaves the job Failed: were its
    deletion the trigger, such a policy would retry a failed registration forever.

    ``RETRY``: asked, and the failed Job is gone: the pass creates it again. A failed Job still
    there is deleted first (by its uid), and the pass its deletion brings goes on. ``RETRY_DISABLED``:
    asked while ``registration.enabled`` is false: the pass finds training finished with
    registration off (Succeeded, nothing registered). ``FOLLOW``: a registration Job exists that
    has not failed (created by a retry whose status write lost a race, or before an operator
    restart): the pass follows it. None: the job stays as it is (not a registration failure, no new
    request, or training not known to have finished, :func:`trained`: a retry never trains again).
    """
    prev, job = previous(obs), obs.job
    if not (failed_in_registration(prev) or gate_not_met(prev)) or job is None:
        return None, ()
    if not trained(obs):
        return None, ()
    name = builders.registration_job_name(job)
    live = obs.read(Fact.REGISTRATION_JOB, name)
    if live is not None and (live.get("metadata") or {}).get("deletionTimestamp"):
        return None, ()  # still going: its deletion is the next event
    if live is not None and job.spec.registration.enabled:
        seen = registration_observation(live, [], builders.REGISTER_CONTAINER)
        if seen.state not in ("Failed", "Skipped", "GateNotMet"):
            return Reregister.FOLLOW, ()
    if retry_requested(obs) is None:
        return None, ()
    if live is not None:
        # the Job's deletion brings the pass that registers (or a stranger's Job stays)
        if is_ours(live, job) and name not in obs.deleted:
            return None, (DeleteChild("batch/v1", "Job", name, live["metadata"]["uid"]),)
        return None, ()
    return (Reregister.RETRY if job.spec.registration.enabled else Reregister.RETRY_DISABLED), ()


def alias_move(obs: Observation) -> Plan:  # noqa: PLR0911  one return per step of a move
    """Succeeded, then ``registration.alias`` changed: run the (idempotent) registration again to move
    it (the alias Job); the phase stays Succeeded, ``AliasSynced`` follows the Job."""
    prev, job = previous(obs), obs.job
    done = Outcome(phase=Phase.SUCCEEDED)
    if job is None:
        return observed(done, obs.generation)
    model = prev.registered_model
    wanted = job.spec.registration.alias or None
    synced = next((c for c in prev.conditions or [] if c.type == ConditionType.ALIAS_SYNCED), None)
    # An alias the status shows is only settled when no move is under way: after production, then
    # champion again while production's Job runs, that Job would leave production in MLflow.
    settled = synced is None or synced.status == "True"
    if model is None or ((model.alias or None) == wanted and settled):
        return observed(done, obs.generation)
    held = _alias_held(obs, wanted)
    if held is not None:
        reason, message = held
        t = alias_held(prev, reason, message, now=obs.now, generation=obs.generation)
        return Plan((Commit(Outcome(phase=done.phase, message=message), t),))
    # One alias move at a time: an earlier change's Job still running finishes first, so the alias
    # MLflow keeps is the one asked for last (two Jobs at once would finish in any order).
    mine = builders.alias_job_name(job)
    earlier = [
        j["metadata"]["name"]
        for j in obs.read(Fact.ALIAS_JOBS, mine)
        if j["metadata"]["name"] != mine and registration_observation(j, [], "").state not in JOB_ENDED
    ]
    if earlier:
        pending = RegistrationObservation(True, "Running")
        t = alias_transition(prev, wanted, pending, now=obs.now, generation=obs.generation)
        outcome = Outcome(phase=done.phase, waiting=True, message=f"alias Job {earlier[0]} still running")
        return Plan((Commit(outcome, t),))
    if obs.conflict:
        return Plan((Commit(Outcome(phase=done.phase, message=obs.conflict)),))
    # the Job reads the trainer config: it must carry the new alias first
    if Child.CONFIG_MAP not in obs.had:
        return Plan((EnsureChild(Child.CONFIG_MAP, job, held=False, announce=False),))
    if Child.ALIAS_JOB not in obs.had or obs.alias_job is None:
        return Plan((EnsureChild(Child.ALIAS_JOB, job, held=False),))
    t = alias_transition(prev, wanted, obs.alias_job, now=obs.now, generation=obs.generation)
    return Plan((Commit(Outcome(phase=done.phase, waiting=t.waiting), t),))


def _alias_held(obs: Observation, wanted: str | None) -> tuple[str, str] | None:
    """Why a changed ``registration.alias`` is not moved now (reason, message), or None.

    The registry's names are the platform's (:mod:`kubetune_api.tenancy`): a version registered
    before tenancy was on (or under a status someone else wrote) gets no alias moved by this job.
    With ``registration.enabled`` false the move waits: it is made once registration is on again
    (the field is kept, not refused, since it may change; the condition and a Warning say so).
    """
    assert obs.job is not None
    move = f"alias {wanted!r} not moved" if wanted else "alias not removed"
    if obs.registry_refusal:
        return Reason.MODEL_NAME_NOT_ALLOWED, f"{move}: {obs.registry_refusal}"
    if not obs.job.spec.registration.enabled:
        return (
            Reason.REGISTRATION_DISABLED,
            f"{move}: spec.registration.enabled is false (done once it is true)",
        )
    return None
