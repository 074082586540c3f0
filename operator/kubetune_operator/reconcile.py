"""One reconcile pass for one FineTuneJob: read it, ensure its children, fold their status, write status.

Every trigger (the job's own create/update/resume, an event on one of its children, the slow
re-sync timer) runs the same pass, so a restarted operator simply continues where the objects
say it is. Passes for the same job are serialised in-process, and the status is written with the
object's resourceVersion as a precondition, so a pass that acted on stale data retries instead of
overwriting newer news. Only the fields the operator owns are written: ``progress`` and
``checkpoints`` belong to the trainer and are never touched.

A request about a child that the API server refuses ends the pass there, and the refusal goes into
the status like any other observation (``state.ChildError``): the job fails at once when the
object built from the spec is invalid, and shows a condition and retries with backoff otherwise
(``Outcome.retry_in``; the attempts in a row are counted here, in memory).
"""

from __future__ import annotations

import collections
import functools
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kubetune_api import spec as api
from kubetune_api.failures import TrainingFailure
from kubetune_api.status import FineTuneJobStatus, Phase

from . import builders, observations, parent, state, training_failures
from .children import ChildApiError, about_child, ensure, is_ours, sync_config, sync_deadline, sync_suspend
from .kube import ApiError, Kube
from .settings import Settings

EmitFn = Callable[[dict[str, Any], state.Event], None]

_locks: dict[tuple[str, str], threading.Lock] = collections.defaultdict(threading.Lock)
_locks_guard = threading.Lock()


def _lock(namespace: str, name: str) -> threading.Lock:
    with _locks_guard:
        return _locks[(namespace, name)]


# Passes in a row, per job, that a refusal other than "invalid" stopped (read and written under the
# job's lock). Lost on restart: a condition already shown stays until a pass gets through.
_failed_passes: dict[tuple[str, str], int] = {}
# Per FineTuneJob: why its last training attempt ended, from the training pod's own watch event (the
# Training Operator deletes a pod that exited with a retryable code at once, often before a pass
# could list it); the next pass takes it (``_restarts``).
_attempt_failures: dict[tuple[str, str], TrainingFailure] = {}
_attempt_failures_guard = threading.Lock()


def note_training_pod(namespace: str, job_name: str, pod: dict[str, Any]) -> None:
    """Remember why a training pod ended, when it failed (its watch event's body)."""
    failure = training_failures.failed_attempt([pod], builders.TRAIN_CONTAINER)
    if failure is not None:
        with _attempt_failures_guard:
            _attempt_failures[(namespace, job_name)] = failure


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Context:
    kube: Kube
    settings: Settings
    emit: EmitFn
    logger: logging.Logger | logging.LoggerAdapter[Any] = field(
        default_factory=lambda: logging.getLogger(__name__)
    )


@dataclass
class Outcome:
    phase: str
    waiting: bool = False
    invalid: bool = False
    message: str = ""
    # a child request was refused in a way that may pass: try again in this many seconds (backoff)
    retry_in: float | None = None


@dataclass
class Step:
    """What one pass decided: its outcome, the status to write (None: nothing), and the children it
    created (each announced by an event, whether or not the status write goes through)."""

    outcome: Outcome
    transition: state.Transition | None = None
    created: list[dict[str, Any]] = field(default_factory=list)


class StatusConflictError(Exception):
    """The FineTuneJob changed between read and status write: run the pass again."""


def reconcile(ctx: Context, namespace: str, name: str, *, attempts: int = 5) -> Outcome | None:
    """Reconcile one FineTuneJob; None when it is gone or being deleted.

    Each pass reads the job, observes its children and asks the state machine (:mod:`.state`) what
    follows; its step is written here, the one place the status is written (:func:`_commit`)."""
    with _lock(namespace, name):
        for _ in range(attempts):
            obj = ctx.kube.get(api.API_VERSION, api.KIND, namespace, name)
            if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                _failed_passes.pop((namespace, name), None)
                return None
            try:
                step = _pass(ctx, obj)
                _commit(ctx, obj, step)
            except StatusConflictError:
                continue
            return step.outcome
        raise StatusConflictError(f"{namespace}/{name}: status kept changing under the operator")


def _commit(ctx: Context, obj: dict[str, Any], step: Step) -> None:
    """Announce the children created, write the status (if it changed) and, once written, the events
    of its transitions."""
    for manifest in step.created:
        ctx.emit(
            obj,
            state.Event("Normal", "Created", f"created {manifest['kind']} {manifest['metadata']['name']}"),
        )
    if step.transition is not None and _write_status(ctx, obj, step.transition):
        for event in step.transition.events:
            ctx.emit(obj, event)


def _previous(obj: dict[str, Any]) -> FineTuneJobStatus:
    raw_status = obj.get("status") or {}
    try:
        return FineTuneJobStatus.model_validate(raw_status)
    except ValidationError:
        return FineTuneJobStatus(phase=raw_status.get("phase"))


def _pass(ctx: Context, obj: dict[str, Any]) -> Step:
    meta = obj["metadata"]
    ns, name = meta["namespace"], meta["name"]
    generation = int(meta.get("generation") or 1)
    previous = _previous(obj)
    # A final job stays as it is, unless it is registered again (the state machine takes it out of
    # Succeeded or Failed: state.Reregister), its alias moves, or its refused child's spec changed.
    reregister: state.Reregister | None = None
    if previous.phase == Phase.SUCCEEDED:
        reregister = _registration_turned_on(ctx, obj, previous) or _registration_retry(ctx, obj, previous)
        if reregister is None:
            return _follow_alias(ctx, obj, previous, generation)
    elif previous.phase in state.FINAL_PHASES and not state.reopens(previous, generation):
        reregister = _registration_retry(ctx, obj, previous)
        if reregister is None:
            return _observed(Outcome(phase=str(previous.phase)), generation)
    asks = (state.Reregister.RETRY, state.Reregister.RETRY_DISABLED, state.Reregister.FOLLOW)
    retry_request = retry_requested(obj, previous) if reregister in asks else None
    first = state.Observation(
        generation=generation, now=now(), namespace=ns, reregister=reregister, retry_request=retry_request
    )

    try:
        job = api.parse_job(obj)
    except ValidationError as e:
        message = f"the spec cannot be used: {_short(e)}"
        transition = state.advance(previous, replace(first, invalid_spec=message))
        return Step(Outcome(phase=transition.phase, invalid=True, message=message), transition)

    # spec.model.fromJob: nothing is created before the parent job has Succeeded
    read = functools.partial(ctx.kube.get, api.API_VERSION, api.KIND, ns)
    job, found = parent.for_pass(job, read, ctx.settings.preparation, state.training_succeeded(previous))
    seen = _observe(ctx, job, previous) if parent.lets_start(found) else _parent_gone(ctx, job, found)
    obs = replace(
        first,
        suspend=job.spec.suspend,
        registration_enabled=state.registration_wanted(job, previous),
        budget=previous.budget if previous.budget and previous.budget.reached else None,
        failure=seen.failure,
        restart_events=seen.restart_events,
        attempt_failure=seen.attempt_failure,
        restart_limit=ctx.settings.train_backoff_limit,
        checkpoint_step=previous.checkpoints.latest_step if previous.checkpoints else None,
        queued_by_kueue=job.spec.resources.queue_name is not None,
        conflict=seen.conflict,
        child_error=seen.child_error,
        training=seen.training,
        registration=seen.registration,
        pods=seen.pods,
        preparation=seen.preparation,
        parent=found,
        children=seen.children,
        job_name=name,
        pytorchjob_name=builders.pytorchjob_name(job),
        registration_job_name=builders.registration_job_name(job),
        preparation_job_name=builders.preparation_job_name(job),
        checkpoint_claim=builders.checkpoint_claim(job),
    )
    transition = state.advance(previous, obs)
    ctx.logger.debug("reconciled %s/%s: %s", ns, name, transition.phase)
    running = seen.pytorchjob is not None and seen.training.condition not in (
        "Succeeded",
        "Failed",
        "Suspended",
    )
    if transition.phase == Phase.FAILED and running and seen.pytorchjob is not None:
        _stop_training(ctx, job, seen.pytorchjob)
    error = seen.child_error
    if error is not None and error.verdict != "rejected":
        settings = ctx.settings
        delay = observations.retry_delay(
            error.attempts, settings.retry_seconds, max(settings.retry_seconds, settings.resync_seconds)
        )
        outcome = Outcome(phase=transition.phase, waiting=True, message=error.describe(), retry_in=delay)
    else:
        outcome = Outcome(phase=transition.phase, waiting=transition.waiting, message=seen.conflict or "")
    return Step(outcome, transition, seen.created)


def _parent_gone(ctx: Context, job: api.FineTuneJob, found: Any) -> _Seen:
    """Held by its parent job: nothing is created; a PyTorchJob started from a gone parent is stopped."""
    if not parent.started_from(found):
        return _Seen(children={})
    name = builders.pytorchjob_name(job)
    live = ctx.kube.get(builders.PYTORCHJOB_API_VERSION, "PyTorchJob", job.metadata.namespace, name)
    return _Seen(children={}, pytorchjob=live, training=observations.training_observation(live))


@dataclass
class _Seen:
    """What a pass found of the children, and what it created on the way."""

    children: dict[str, str]
    created: list[dict[str, Any]] = field(default_factory=list)
    conflict: str | None = None
    training: state.TrainingObservation = field(default_factory=state.TrainingObservation)
    registration: state.RegistrationObservation = field(default_factory=state.RegistrationObservation)
    pods: state.PodsObservation = field(default_factory=state.PodsObservation)
    # None: no preparation in this pass (turned off, or done: the status says Prepared)
    preparation: observations.PreparationObservation | None = None
    child_error: state.ChildError | None = None
    failure: TrainingFailure | None = None  # why the PyTorchJob failed (its pods say)
    restart_events: int | None = None  # the Training Operator's restart events (None: not looked)
    attempt_failure: TrainingFailure | None = None  # why the last attempt ended (a failed pod seen)
    pytorchjob: dict[str, Any] | None = None


def _observe(ctx: Context, job: api.FineTuneJob, previous: FineTuneJobStatus) -> _Seen:
    """Ensure the children and observe them; a request the API server refused stops the pass there
    (``child_error``, with the attempts in a row it has failed)."""
    ns, name = job.metadata.namespace, job.metadata.name
    seen = _Seen(
        children={
            "checkpointClaim": builders.checkpoint_claim(job),
            "configMap": builders.config_map_name(job),
            "pytorchJob": builders.pytorchjob_name(job),
        }
    )
    key = (ns, name)
    try:
        _children(ctx, job, previous, seen)
        _failed_passes.pop(key, None)
    except ChildApiError as e:
        attempts = _failed_passes.get(key, 0) + 1
        _failed_passes[key] = attempts
        seen.child_error = state.ChildError(
            verb=e.verb,
            kind=e.kind,
            name=e.name,
            code=e.error.status,
            reason=e.error.status_reason,
            message=e.error.message,
            attempts=attempts,
        )
        if seen.child_error.verdict == "rejected":
            _failed_passes.pop(key, None)
        ctx.logger.info("%s/%s: %s", ns, name, seen.child_error.describe())
    return seen


def _children(
    ctx: Context,
    job: api.FineTuneJob,
    previous: FineTuneJobStatus,
    seen: _Seen,
) -> None:
    """Ensure the children in order and fold their status into ``seen`` (conflict, preparation,
    training, registration, pods).

    ``seen.created`` and ``seen.children`` are filled as it goes, so a pass stopped by
    ``ChildApiError`` (a refused request) still reports what it created.
    """
    ns, settings = job.metadata.namespace, ctx.settings
    # Creation order: identity, volume and config, the preparation Job, then the PyTorchJob whose
    # pods need them all. Stop at the first conflict: a PyTorchJob must never mount a stranger's volume.
    wanted: list[dict[str, Any]] = [*builders.build_trainer_identity(job, settings)]
    pvc = builders.build_pvc(job, settings)
    if pvc is not None:
        wanted.append(pvc)
    wanted.append(builders.build_config_map(job, settings))
    for manifest in wanted:
        result = _ensure(ctx, job, manifest, seen)
        if result is None:
            return
        if not result.created and manifest["kind"] == "ConfigMap":
            sync_config(ctx.kube, result.obj, manifest)
    # Training that the status says succeeded is never started again: a PyTorchJob deleted since (by
    # hand, or by a TTL) is not created anew while the model registers; training stays Succeeded.
    if state.training_succeeded(previous):
        ptj_name = builders.pytorchjob_name(job)
        with about_child("get", "PyTorchJob", ptj_name):
            gone = ctx.kube.get("kubeflow.org/v1", "PyTorchJob", ns, ptj_name) is None
        if gone:
            seen.training = state.TrainingObservation(
                condition="Succeeded",
                message=f"training finished (PyTorchJob {ptj_name} has been deleted since)",
            )
            _registration(ctx, job, seen, previous)
            return
    if settings.preparation and state.preparation_needed(previous):
        _preparation(ctx, job, seen)
        if seen.conflict or seen.preparation is None or seen.preparation.state != "Succeeded":
            return  # nothing GPU-sized before the preparation has succeeded
    _training(ctx, job, seen, previous)


def _ensure(ctx: Context, job: api.FineTuneJob, manifest: dict[str, Any], seen: _Seen) -> Any:
    """Create the child or read it (``children.ensure``); None, with ``seen.conflict`` set, when a
    stranger's object has its name."""
    result = ensure(ctx.kube, manifest, job)
    if result.conflict:
        seen.conflict = result.conflict
        return None
    if result.created:
        seen.created.append(manifest)
    return result


def _training(ctx: Context, job: api.FineTuneJob, seen: _Seen, previous: FineTuneJobStatus) -> None:
    """The PyTorchJob, created and observed (its pods when they do not start); then registration."""
    manifest = builders.build_pytorchjob(job, ctx.settings)
    result = _ensure(ctx, job, manifest, seen)
    if result is None:
        return
    pytorchjob = result.obj
    seen.training = observations.training_observation(pytorchjob)
    if pytorchjob is not None and seen.training.condition not in ("Succeeded", "Failed"):
        pytorchjob = sync_suspend(ctx.kube, pytorchjob, job)
    if pytorchjob is not None and seen.training.condition == "Running":
        pytorchjob = sync_deadline(ctx.kube, pytorchjob, job, datetime.now(UTC))
    if (
        pytorchjob is not None
        and not result.created  # nothing can have happened to it yet
        and not job.spec.suspend
        and seen.training.condition in observations.POD_CONDITIONS
        and not observations.pods_running(pytorchjob)
    ):
        seen.pods = _pods_observation(ctx, pytorchjob)
    if pytorchjob is not None and seen.training.condition == "Failed":
        seen.failure = _training_failure(ctx, pytorchjob, seen.training)
    if (
        pytorchjob is not None
        and not result.created
        and seen.training.condition in ("Restarting", "Created", "Running")
        and (seen.training.condition != "Running" or not observations.pods_running(pytorchjob))
    ):
        _restarts(ctx, job.metadata.name, pytorchjob, seen)
    seen.pytorchjob = pytorchjob
    if seen.training.condition == "Succeeded":
        _registration(ctx, job, seen, previous)


def _preparation(ctx: Context, job: api.FineTuneJob, seen: _Seen) -> None:
    """The preparation Job, created and observed (with its pods' termination messages)."""
    manifest = builders.build_preparation_job(job, ctx.settings)
    result = _ensure(ctx, job, manifest, seen)
    if result is None:
        return
    seen.children["preparationJob"] = builders.preparation_job_name(job)
    selector = _selector(job, builders.COMPONENT_PREPARATION)
    pods: list[dict[str, Any]] = []
    if not result.created:
        with about_child("list", "Pod", selector):
            pods = ctx.kube.list("v1", "Pod", job.metadata.namespace, selector)
    seen.preparation = observations.preparation_observation(result.obj, pods, builders.PREPARE_CONTAINER)
    if not pods and not result.created and seen.preparation.state == "Running":
        # no pod at all: the Job controller may be unable to create it (a quota, a policy)
        blocked = _job_pod_not_created(ctx, result.obj)
        if blocked:
            seen.preparation = replace(seen.preparation, message=blocked)


def _job_pod_not_created(ctx: Context, job_obj: dict[str, Any]) -> str:
    """The Job controller's newest FailedCreate event of this Job (its pod cannot be created); best
    effort, like the training pods' trouble."""
    meta = job_obj["metadata"]
    try:
        events = ctx.kube.list(
            "v1", "Event", meta["namespace"], field_selector=f"involvedObject.uid={meta['uid']}"
        )
    except ApiError as e:
        ctx.logger.warning("cannot read the events of Job %s: %s", meta["name"], e)
        return ""
    failed = [e for e in events if e.get("reason") == "FailedCreate"]
    failed.sort(key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
    return str(failed[-1].get("message") or "") if failed else ""


def _registration(ctx: Context, job: api.FineTuneJob, seen: _Seen, previous: FineTuneJobStatus) -> None:
    """Training finished: the registration Job, created when registration is on, and observed."""
    ns, settings = job.metadata.namespace, ctx.settings
    if state.registration_wanted(job, previous):
        # after GateNotMet, only the retry annotation creates it: it registers past the gate
        manifest = builders.build_registration_job(job, settings, force=state.registration_forced(previous))
        result = _ensure(ctx, job, manifest, seen)
        if result is None:
            return
        seen.children["registrationJob"] = builders.registration_job_name(job)
        seen.registration = _registration_observation(ctx, job, result.obj, builders.COMPONENT_REGISTRATION)
        return
    # registration turned off after its Job was created: that Job still registers the model, so
    # it is followed to its end and reported (turning it off only stops one not yet created)
    reg_name = builders.registration_job_name(job)
    with about_child("get", "Job", reg_name):
        live = ctx.kube.get("batch/v1", "Job", ns, reg_name)
    if live is not None and is_ours(live, job):
        seen.children["registrationJob"] = reg_name
        seen.registration = _registration_observation(ctx, job, live, builders.COMPONENT_REGISTRATION)


def _training_failure(ctx: Context, pytorchjob: dict[str, Any], training: state.TrainingObservation) -> Any:
    """Why the Failed PyTorchJob failed, from its pods (best effort: a refused read is logged and the
    generic message stands)."""
    meta = pytorchjob["metadata"]
    try:
        pods = ctx.kube.list(
            "v1", "Pod", meta["namespace"], f"{observations.TRAINING_OPERATOR_JOB_LABEL}={meta['name']}"
        )
    except ApiError as e:
        ctx.logger.warning("cannot read the pods of PyTorchJob %s: %s", meta["name"], e)
        pods = []
    return training_failures.training_failure(training, pods, builders.TRAIN_CONTAINER)


def _restarts(ctx: Context, job_name: str, pytorchjob: dict[str, Any], seen: _Seen) -> None:
    """The Training Operator's restart events of the PyTorchJob, and why the last attempt ended when
    its failed pod is still there (best effort, like the pods' trouble)."""
    meta = pytorchjob["metadata"]
    ns = meta["namespace"]
    try:
        events = ctx.kube.list("v1", "Event", ns, field_selector=f"involvedObject.uid={meta['uid']}")
        pods = ctx.kube.list("v1", "Pod", ns, f"{observations.TRAINING_OPERATOR_JOB_LABEL}={meta['name']}")
    except ApiError as e:
        ctx.logger.warning("cannot read the restarts of PyTorchJob %s/%s: %s", ns, meta["name"], e)
        return
    seen.restart_events = training_failures.restart_events(events, meta.get("uid"))
    with _attempt_failures_guard:
        noted = _attempt_failures.pop((ns, job_name), None)
    seen.attempt_failure = training_failures.failed_attempt(pods, builders.TRAIN_CONTAINER) or noted


def _stop_training(ctx: Context, job: api.FineTuneJob, pytorchjob: dict[str, Any]) -> None:
    """The job failed while its PyTorchJob still runs (its pods restarted too often): suspend the
    PyTorchJob, so the Training Operator stops its pods and the GPUs are free."""
    meta = pytorchjob["metadata"]
    patch = {
        "metadata": {"annotations": {builders.ANNOTATION_SUSPENDED_BY_US: "true"}},
        "spec": {"runPolicy": {"suspend": True}},
    }
    try:
        ctx.kube.patch(pytorchjob["apiVersion"], "PyTorchJob", meta["namespace"], meta["name"], patch)
    except ApiError as e:  # the status says Failed either way; the pods keep restarting until it works
        ctx.logger.warning(
            "cannot suspend PyTorchJob %s of the failed job %s: %s", meta["name"], job.metadata.name, e
        )


def _pods_observation(ctx: Context, pytorchjob: dict[str, Any]) -> state.PodsObservation:
    """Why the PyTorchJob's pods do not run, if they cannot start: one list of its pods and, only
    when one is missing, one of its events. Called only while its status does not count every pod
    as running. Best effort: a refused read (the RBAC of an older install) is logged, never holds
    the job."""
    meta = pytorchjob["metadata"]
    ns = meta["namespace"]
    try:
        pods = ctx.kube.list("v1", "Pod", ns, f"{observations.TRAINING_OPERATOR_JOB_LABEL}={meta['name']}")
        events: list[dict[str, Any]] = []
        pod_events: list[dict[str, Any]] = []
        if observations.missing_pods(pytorchjob, pods):
            events = ctx.kube.list("v1", "Event", ns, field_selector=f"involvedObject.uid={meta['uid']}")
        if any((p.get("status") or {}).get("phase") in (None, "Pending") for p in pods):
            # a pending pod may wait for its volumes: the kubelet says so only in events
            for reason in sorted(observations.MOUNT_EVENT_REASONS):
                selector = f"involvedObject.kind=Pod,reason={reason}"
                pod_events += ctx.kube.list("v1", "Event", ns, field_selector=selector)
    except ApiError as e:
        ctx.logger.warning(
            "cannot read the pods or events of PyTorchJob %s/%s (their trouble is not shown): %s",
            ns,
            meta["name"],
            e,
        )
        return state.PodsObservation()
    return observations.pods_observation(pytorchjob, pods, events, pod_events)


def _follow_alias(ctx: Context, obj: dict[str, Any], previous: FineTuneJobStatus, generation: int) -> Step:
    """Succeeded, then ``registration.alias`` changed: run the (idempotent) registration again to move it."""
    done = Outcome(phase=Phase.SUCCEEDED)
    model = previous.registered_model
    try:
        job = api.parse_job(obj)
    except ValidationError:
        return _observed(done, generation)
    wanted = job.spec.registration.alias or None
    synced = next((c for c in previous.conditions or [] if c.type == state.ConditionType.ALIAS_SYNCED), None)
    # An alias the status shows is only settled when no move is under way: after production, then
    # champion again while production's Job runs, that Job would leave production in MLflow.
    settled = synced is None or synced.status == "True"
    if model is None or not job.spec.registration.enabled or ((model.alias or None) == wanted and settled):
        return _observed(done, generation)
    # One alias move at a time: an earlier change's Job still running finishes first, so the alias
    # MLflow keeps is the one asked for last (two Jobs at once would finish in any order).
    mine = builders.alias_job_name(job)
    earlier = [
        j["metadata"]["name"]
        for j in ctx.kube.list(
            "batch/v1", "Job", job.metadata.namespace, _selector(job, builders.COMPONENT_ALIAS)
        )
        if j["metadata"]["name"] != mine
        and observations.registration_observation(j, [], "").state not in observations.JOB_ENDED
    ]
    if earlier:
        pending = state.RegistrationObservation(True, "Running")
        transition = state.alias_transition(previous, wanted, pending, now=now(), generation=generation)
        return Step(
            Outcome(phase=done.phase, waiting=True, message=f"alias Job {earlier[0]} still running"),
            transition,
        )
    # the Job reads the trainer config: it must carry the new alias first
    config = builders.build_config_map(job, ctx.settings)
    result = ensure(ctx.kube, config, job)
    if result.conflict:
        return Step(Outcome(phase=done.phase, message=result.conflict))
    if not result.created:
        sync_config(ctx.kube, result.obj, config)
    manifest = builders.build_alias_job(job, ctx.settings)
    result = ensure(ctx.kube, manifest, job)
    if result.conflict:
        return Step(Outcome(phase=done.phase, message=result.conflict))
    observed = _registration_observation(ctx, job, result.obj, builders.COMPONENT_ALIAS)
    transition = state.alias_transition(previous, wanted, observed, now=now(), generation=generation)
    return Step(
        Outcome(phase=done.phase, waiting=transition.waiting),
        transition,
        [manifest] if result.created else [],
    )


def _parsed(obj: dict[str, Any]) -> api.FineTuneJob | None:
    """The FineTuneJob's typed form; None when its spec does not validate (the decisions then leave it be)."""
    try:
        return api.parse_job(obj)
    except ValidationError:
        return None


def _trained(ctx: Context, job: api.FineTuneJob, previous: FineTuneJobStatus) -> bool:
    """Whether training finished: the status says so (the pass then never creates the PyTorchJob
    again, see ``_pass``), or the job's PyTorchJob is there and Succeeded. A pass that registers
    never trains again."""
    if state.training_succeeded(previous):
        return True
    trained = ctx.kube.get(
        "kubeflow.org/v1", "PyTorchJob", job.metadata.namespace, builders.pytorchjob_name(job)
    )
    return observations.training_observation(trained).condition == "Succeeded"


def _registration_turned_on(
    ctx: Context, obj: dict[str, Any], previous: FineTuneJobStatus
) -> state.Reregister | None:
    """``ENABLED``: the job succeeded with registration off and ``registration.enabled`` is now
    true, and training is known to have finished (``_trained``); the pass registers. None otherwise."""
    if not state.finished_without_registration(previous) or (job := _parsed(obj)) is None:
        return None
    if job.spec.registration.enabled and _trained(ctx, job, previous):
        return state.Reregister.ENABLED
    return None


def retry_requested(obj: dict[str, Any], previous: FineTuneJobStatus) -> str | None:
    """The ``kubetune.io/retry-registration`` annotation's value when no pass has acted on it yet
    (``status.registrationRetry``); None otherwise."""
    value = ((obj.get("metadata") or {}).get("annotations") or {}).get(api.RETRY_REGISTRATION_ANNOTATION)
    return value if value and value != previous.registration_retry else None


def _registration_retry(  # noqa: PLR0911  one return per case the docstring lists
    ctx: Context, obj: dict[str, Any], previous: FineTuneJobStatus
) -> state.Reregister | None:
    """Whether a job that failed in registration is registered again now, and how.

    Only the user's request retries: the ``kubetune.io/retry-registration`` annotation set to a
    value not acted on yet (``retry_requested``). A failed Job that merely disappears (deleted by
    hand, or by a TTL that an admission policy gives every Job) leaves the job Failed: were its
    deletion the trigger, such a policy would retry a failed registration forever.

    ``RETRY``: asked, and the failed Job is gone: the pass creates it again. A failed Job still
    there is deleted first (by its uid), and the pass its deletion brings goes on. ``RETRY_DISABLED``:
    asked while ``registration.enabled`` is false: the pass finds training finished with
    registration off (Succeeded, nothing registered). ``FOLLOW``: a registration Job exists that
    has not failed (created by a retry whose status write lost a race, or before an operator
    restart): the pass follows it. None: the job stays as it is (not a registration failure, no new
    request, or training not known to have finished, ``_trained``: a retry never trains again).
    """
    retryable = state.failed_in_registration(previous) or state.gate_not_met(previous)
    if not retryable or (job := _parsed(obj)) is None:
        return None
    if not _trained(ctx, job, previous):
        return None
    ns, reg = job.metadata.namespace, builders.registration_job_name(job)
    live = ctx.kube.get("batch/v1", "Job", ns, reg)
    if live is not None and (live.get("metadata") or {}).get("deletionTimestamp"):
        return None  # still going: its deletion is the next event
    if live is not None and job.spec.registration.enabled:
        observed = observations.registration_observation(live, [], builders.REGISTER_CONTAINER)
        if observed.state not in ("Failed", "Skipped", "GateNotMet"):
            return state.Reregister.FOLLOW
    if retry_requested(obj, previous) is None:
        return None
    if live is not None:
        if is_ours(live, job):
            ctx.kube.delete("batch/v1", "Job", ns, reg, uid=live["metadata"]["uid"])
        return None  # the Job's deletion brings the pass that registers (or a stranger's Job stays)
    return state.Reregister.RETRY if job.spec.registration.enabled else state.Reregister.RETRY_DISABLED


def _observed(outcome: Outcome, generation: int) -> Step:
    """A pass with nothing to do for this generation still says it saw it (``status.observedGeneration``)."""
    return Step(
        outcome, state.Transition(status={"observedGeneration": generation}, events=[], phase=outcome.phase)
    )


def _selector(job: api.FineTuneJob, component: str) -> str:
    """The label selector of one child's objects (its Jobs, their pods)."""
    return ",".join(f"{k}={v}" for k, v in builders.selector_labels(job, component).items())


def _registration_observation(
    ctx: Context, job: api.FineTuneJob, registration_job: dict[str, Any] | None, component: str
) -> state.RegistrationObservation:
    """A registration (or alias) Job and its pods, folded into one observation."""
    selector = _selector(job, component)
    with about_child("list", "Pod", selector):
        pods = ctx.kube.list("v1", "Pod", job.metadata.namespace, selector)
    return observations.registration_observation(registration_job, pods, builders.REGISTER_CONTAINER)


def _write_status(ctx: Context, obj: dict[str, Any], transition: state.Transition) -> bool:
    """Merge-patch the status if it changed; False when there was nothing to write."""
    current = obj.get("status") or {}
    changed = {k: v for k, v in transition.status.items() if not _contains(current.get(k), v)}
    if not changed:
        return False
    meta = obj["metadata"]
    patch = {"metadata": {"resourceVersion": meta["resourceVersion"]}, "status": changed}
    try:
        ctx.kube.patch(
            api.API_VERSION, api.KIND, meta["namespace"], meta["name"], patch, subresource="status"
        )
    except ApiError as e:
        if e.conflict:
            raise StatusConflictError(str(e)) from e
        raise
    return True


def _contains(current: Any, wanted: Any) -> bool:
    """Whether a merge patch with ``wanted`` would leave ``current`` unchanged."""
    if isinstance(wanted, dict):
        if not isinstance(current, dict):
            return False
        return all(_contains(current.get(k), v) for k, v in wanted.items())
    return bool(current == wanted)


def _short(error: ValidationError) -> str:
    parts = []
    for item in error.errors()[:3]:
        where = ".".join(str(p) for p in item["loc"])
        parts.append(f"{where}: {item['msg']}")
    return "; ".join(parts)
