"""One reconcile pass for one FineTuneJob: observe it, carry out what the state machine decides, write
its status.

Every trigger (the job's own create/update/resume, an event on one of its children, the slow
re-sync timer) runs the same pass, so a restarted operator simply continues where the objects
say it is. Passes for the same job are serialised in-process, and the status is written with the
object's resourceVersion as a precondition, so a pass that acted on stale data retries instead of
overwriting newer news. Only the fields the operator owns are written: ``progress`` and
``checkpoints`` belong to the trainer and are never touched.

This module makes no lifecycle decision: it reads the job into a :class:`state.Observation`, asks
:func:`state.advance` for the next actions, carries them out in order (each one's result goes into
the observation, and the machine is asked again) and commits the status the machine decided, at the
one write site (:func:`_commit`). A request about a child that the API server refuses ends the
actions there, and the refusal becomes the next observation (``state.ChildError``, with the attempts
in a row counted here, in memory).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError

from kubetune_api import ownership, pod_env, tenancy
from kubetune_api import spec as api
from kubetune_api.failures import TrainingFailure
from kubetune_api.status import FineTuneJobStatus

from . import builders, metrics, observations, state, training_failures, watched
from .children import (
    ChildApiError,
    Ensured,
    about_child,
    ensure,
    is_ours,
    suspend_patch,
    sync_config,
    sync_deadline,
    sync_suspend,
)
from .kube import ApiError, Kube
from .settings import Settings

EmitFn = Callable[[dict[str, Any], state.Event], None]
Outcome = state.Outcome

_locks: dict[tuple[str, str], threading.Lock] = collections.defaultdict(threading.Lock)
_locks_guard = threading.Lock()
# The most steps (asks of the machine) one pass takes: the children, and a parent chain's reads.
MAX_STEPS = 200


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
# Per FineTuneJob: the PyTorchJob pods' incarnations (name, UID) its watch saw, in the order seen: a
# pod that failed and was recreated between two passes is still one restart. A pass reads them
# (``_observe_training``, how many in ``_incarnations_read``) and they are dropped once its status
# is written (``_incarnations_counted``); a pass whose write conflicted leaves them to the next
# (counting is by UID: one read twice is not counted twice).
_incarnations: dict[tuple[str, str], list[tuple[str, str]]] = {}
_incarnations_read: dict[tuple[str, str], int] = {}
_attempt_failures_guard = threading.Lock()


def note_training_pod(namespace: str, job_name: str, pod: dict[str, Any], *, deleted: bool = False) -> None:
    """Remember why a training pod ended, when it failed, and which incarnation of its replica it is
    (its watch event's body; a ``deleted`` pod is no new incarnation)."""
    failure = training_failures.failed_attempt([pod], observations.training_container_of_pod(pod))
    seen = None if deleted else training_failures.incarnation(pod)
    with _attempt_failures_guard:
        if failure is not None:
            _attempt_failures[(namespace, job_name)] = failure
        if seen is not None:
            noted = _incarnations.setdefault((namespace, job_name), [])
            if seen not in noted:
                noted.append(seen)


def _incarnations_counted(namespace: str, name: str) -> None:
    """The pod incarnations the pass read are in the status it wrote: dropped (those noted since
    stay for the next pass)."""
    with _attempt_failures_guard:
        read = _incarnations_read.pop((namespace, name), 0)
        noted = _incarnations.get((namespace, name))
        if noted is not None:
            del noted[:read]
            if not noted:
                del _incarnations[(namespace, name)]


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
    # read every child again, not what earlier passes learned (the re-sync, the operator's start)
    fresh: bool = False


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

    Each pass reads the job and carries out what the state machine (:mod:`.state`) decides; its
    step is written here, the one place the status is written (:func:`_commit`)."""
    with _lock(namespace, name):
        started, result = time.monotonic(), "error"  # the pass's outcome label (metrics.pass_done)
        try:
            for _ in range(attempts):
                obj = ctx.kube.get(api.API_VERSION, api.KIND, namespace, name)
                if obj is None or (obj.get("metadata") or {}).get("deletionTimestamp"):
                    _failed_passes.pop((namespace, name), None)
                    forget(namespace, name)
                    metrics.saw(namespace, name, None)
                    result = _result(None)
                    return None
                try:
                    step = _pass(ctx, obj)
                    _commit(ctx, obj, step)
                except StatusConflictError:
                    continue
                _incarnations_counted(namespace, name)
                metrics.saw(namespace, name, step.outcome.phase or None)
                result = _result(step.outcome)
                return step.outcome
            result = "conflict"
            raise StatusConflictError(f"{namespace}/{name}: status kept changing under the operator")
        finally:
            metrics.pass_done(result, time.monotonic() - started)


def _result(outcome: Outcome | None) -> str:
    """The pass's outcome label (:mod:`.metrics`)."""
    if outcome is None:
        return "gone"
    if outcome.invalid:
        return "invalid"
    if outcome.retry_in is not None:
        return "refused"
    return "waiting" if outcome.waiting else "ok"


def _commit(ctx: Context, obj: dict[str, Any], step: Step) -> None:
    """Announce the children created, write the status (if it changed) and, once written, the events
    of its transitions."""
    for manifest in step.created:
        ctx.emit(
            obj,
            state.Event("Normal", "Created", f"created {manifest['kind']} {manifest['metadata']['name']}"),
        )
    if step.transition is not None and _write_status(ctx, obj, step.transition):
        metrics.status_written(obj, step.transition.status)
        for event in step.transition.events:
            ctx.emit(obj, event)


def _previous(obj: dict[str, Any]) -> FineTuneJobStatus:
    raw_status = obj.get("status") or {}
    try:
        return FineTuneJobStatus.model_validate(raw_status)
    except ValidationError:
        return FineTuneJobStatus(phase=raw_status.get("phase"))


def observe(ctx: Context, obj: dict[str, Any]) -> state.Observation:
    """The pass's first observation: the FineTuneJob as read (its status, its spec or why the spec
    cannot be used, its annotations) and the settings that shape a pass."""
    meta = obj["metadata"]
    settings = ctx.settings
    try:
        job: api.FineTuneJob | None = api.parse_job(obj)
        invalid = None
    except ValidationError as e:
        job, invalid = None, f"the spec cannot be used: {_short(e)}"
    grants = dict(settings.registry_model_names)
    return state.Observation(
        generation=int(meta.get("generation") or 1),
        now=now(),
        previous=_previous(obj),
        job=job,
        invalid_spec=invalid,
        registry_refusal=tenancy.refusal(job, settings.registry_tenancy, grants) if job else None,
        fault_injection_refusal=(
            pod_env.fault_injection_refusal(job.spec.env, settings.fault_injection) if job else None
        ),
        annotations=dict(meta.get("annotations") or {}),
        namespace=meta["namespace"],
        job_name=meta["name"],
        preparation_enabled=settings.preparation,
        restart_limit=settings.train_backoff_limit,
        retry_seconds=settings.retry_seconds,
        resync_seconds=settings.resync_seconds,
        default_engine=settings.engine,
    )


def _pass(ctx: Context, obj: dict[str, Any]) -> Step:
    """Ask the state machine, carry out its actions, until it commits."""
    obs = observe(ctx, obj)
    created: list[dict[str, Any]] = []
    for _ in range(MAX_STEPS):
        plan = state.advance(obs)
        for action in plan.actions:
            if isinstance(action, state.Commit):
                return _committed(ctx, obj, action, created)
            try:
                obs = carry_out(ctx, obs, action, created)
            except ChildApiError as e:
                if not getattr(action, "held", True):
                    raise
                obs = replace(obs, child_error=_refused(ctx, obj, e))
                break  # the refusal is the next observation
    raise RuntimeError(f"{obj['metadata']['name']}: the state machine did not commit in {MAX_STEPS} steps")


def _committed(
    ctx: Context, obj: dict[str, Any], commit: state.Commit, created: list[dict[str, Any]]
) -> Step:
    meta = obj["metadata"]
    if commit.forget_refusals:
        _failed_passes.pop((meta["namespace"], meta["name"]), None)
    ctx.logger.debug("reconciled %s/%s: %s", meta["namespace"], meta["name"], commit.outcome.phase)
    return Step(commit.outcome, commit.transition, created)


def _refused(ctx: Context, obj: dict[str, Any], e: ChildApiError) -> state.ChildError:
    """A request about a child that the API server refused, with the passes in a row it stopped."""
    ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
    attempts = _failed_passes.get((ns, name), 0) + 1
    _failed_passes[(ns, name)] = attempts
    error = state.ChildError(
        verb=e.verb,
        kind=e.kind,
        name=e.name,
        code=e.error.status,
        reason=e.error.status_reason,
        message=e.error.message,
        attempts=attempts,
    )
    ctx.logger.info("%s/%s: %s", ns, name, error.describe())
    return error


def carry_out(  # noqa: PLR0911  one return per kind of action
    ctx: Context, obs: state.Observation, action: state.actions.Action, created: list[dict[str, Any]]
) -> state.Observation:
    """Carry out one action; the observation with what it found."""
    ns = obs.namespace
    match action:
        case state.Read(fact, name, held):
            return replace(obs, reads={**obs.reads, (fact, name, held): _read(ctx, obs, action)})
        case state.UseEngine(engine):
            return replace(obs, engine=engine)
        case state.EnsureChild():
            return _ensure_child(ctx, obs, action, created)
        case state.FollowChild(child, job, live):
            obs = replace(obs, had={**obs.had, child: state.Had(live)})
            seen = _registration_observation(ctx, job, live, builders.COMPONENT_REGISTRATION)
            return replace(obs, registration=seen)
        case state.SyncSuspend(job):
            live = sync_suspend(ctx.kube, _had(obs), job)
            return replace(obs, had={**obs.had, state.Child.TRAINING_JOB: replace(_had_child(obs), obj=live)})
        case state.SyncDeadline(job):
            live = sync_deadline(ctx.kube, _had(obs), job, datetime.now(UTC))
            return replace(obs, had={**obs.had, state.Child.TRAINING_JOB: replace(_had_child(obs), obj=live)})
        case state.ObserveTraining():
            return _observe_training(ctx, obs, action)
        case state.DeleteChild(api_version, kind, name, uid):
            ctx.kube.delete(api_version, kind, ns, name, uid=uid)
            return replace(obs, deleted=obs.deleted | {name})
        case state.StopTraining(name):
            _stop_training(ctx, obs, name)
            return obs
    raise TypeError(f"not an action a pass carries out: {action!r}")


def _had_child(obs: state.Observation) -> state.Had:
    return obs.had[state.Child.TRAINING_JOB]


def _had(obs: state.Observation) -> dict[str, Any]:
    live = _had_child(obs).obj
    assert live is not None
    return live


def _read(ctx: Context, obs: state.Observation, action: state.Read) -> Any:
    """One fact the machine asked for; a held read names its child when the API server refuses it."""
    ns, name = obs.namespace, action.name
    if action.fact == state.Fact.ALIAS_JOBS:
        assert obs.job is not None
        return ctx.kube.list("batch/v1", "Job", ns, _selector(obs.job, builders.COMPONENT_ALIAS))
    if action.fact == state.Fact.SERVED:  # the API server's discovery of the engine's group and version
        engine = state.Engine(name)
        return observations.serves(ctx.kube.resources(engine.api_version), engine.plural)
    api_version, kind = _training_kind(obs) if action.fact == state.Fact.TRAINING_JOB else _KINDS[action.fact]
    if action.held:
        with about_child("get", kind, name):
            return ctx.kube.get(api_version, kind, ns, name)
    return ctx.kube.get(api_version, kind, ns, name)


def _training_kind(obs: state.Observation) -> tuple[str, str]:
    """The API version and kind of the pass's training object (its engine's: state.UseEngine)."""
    assert obs.engine is not None, "the state machine names the engine before the training object"
    return obs.engine.api_version, str(obs.engine)


_KINDS = {
    state.Fact.REGISTRATION_JOB: ("batch/v1", "Job"),
    state.Fact.FINETUNEJOB: (api.API_VERSION, api.KIND),
}


def _manifests(ctx: Context, engine: state.Engine | None, action: state.EnsureChild) -> list[dict[str, Any]]:
    """The objects one child is made of, as built from the job."""
    job, settings, child = action.job, ctx.settings, action.child
    if child == state.Child.IDENTITY:
        return [*builders.build_trainer_identity(job, settings)]
    if child == state.Child.CHECKPOINT_CLAIM:
        pvc = builders.build_pvc(job, settings)
        return [pvc] if pvc is not None else []
    build = {
        state.Child.CONFIG_MAP: builders.build_config_map,
        state.Child.PREPARATION_JOB: builders.build_preparation_job,
        state.Child.ALIAS_JOB: builders.build_alias_job,
    }
    if child == state.Child.REGISTRATION_JOB:
        return [builders.build_registration_job(job, settings, force=action.force)]
    if child == state.Child.TRAINING_JOB:
        assert engine is not None, "the state machine names the engine before the training object"
        return builders.build_training(engine, job, settings)
    return [build[child](job, settings)]


def _ensure_child(
    ctx: Context, obs: state.Observation, action: state.EnsureChild, created: list[dict[str, Any]]
) -> state.Observation:
    """Create the child or read it (``children.ensure``), then observe it; a stranger's object of its
    name is a conflict (the observation says so, and the child is not had)."""
    job, child = action.job, action.child
    if child == state.Child.PREPARATION_JOB and not ctx.fresh:
        seen = _watched_preparation(obs, job)
        if seen is not None:
            return seen
    had = state.Had(None)
    for manifest in _manifests(ctx, obs.engine, action):
        result = _ensure_one(ctx, action, manifest)
        if result.conflict:
            return replace(obs, conflict=result.conflict)
        if result.created and action.announce:
            created.append(manifest)
        had = state.Had(result.obj, result.created)
    return _observe_child(ctx, replace(obs, had={**obs.had, child: had}), job, child, had)


def _observe_child(
    ctx: Context, obs: state.Observation, job: api.FineTuneJob, child: state.Child, had: state.Had
) -> state.Observation:
    """What the child's state says, read with its pods where they tell it (the Jobs')."""
    if child == state.Child.PREPARATION_JOB:
        return replace(obs, preparation=_preparation_observation(ctx, job, had))
    if child == state.Child.TRAINING_JOB:
        return replace(obs, training=observations.training_observation(had.obj))
    if child == state.Child.REGISTRATION_JOB:
        seen = _registration_observation(ctx, job, had.obj, builders.COMPONENT_REGISTRATION)
        return replace(obs, registration=seen)
    if child == state.Child.ALIAS_JOB:
        return replace(obs, alias_job=_registration_observation(ctx, job, had.obj, builders.COMPONENT_ALIAS))
    return obs


def _ensure_one(ctx: Context, action: state.EnsureChild, manifest: dict[str, Any]) -> Ensured:
    """One object of a child: as an earlier pass kept it (``_KEPT``), else created or read; a
    ConfigMap read is brought up to date."""
    job, kept = action.job, action.child in _KEPT
    known = _known_child(job, manifest) if kept and not ctx.fresh else None
    result = (
        Ensured(known)
        if known is not None
        else ensure(ctx.kube, manifest, job, create_first=action.create_first)
    )
    if result.conflict:
        return result
    if not result.created and manifest["kind"] == "ConfigMap":
        result = replace(result, obj=sync_config(ctx.kube, result.obj, manifest))
    if kept:
        _learn_child(job, manifest, result.obj)
    return result


def _watched_preparation(obs: state.Observation, job: api.FineTuneJob) -> state.Observation | None:
    """The preparation Job and its pods as their watch events showed them (:mod:`.watched`), when
    they did: no request."""
    seen = watched.PREPARATIONS.get(
        job.metadata.namespace, job.metadata.name, builders.preparation_job_name(job)
    )
    if seen is None or not is_ours(seen[0], job):
        return None
    obs = replace(obs, had={**obs.had, state.Child.PREPARATION_JOB: state.Had(seen[0])})
    return replace(obs, preparation=observations.preparation_observation(*seen, builders.PREPARE_CONTAINER))


# The children that only the operator changes once made (the trainer's identity, the checkpoint claim,
# the ConfigMap), as a pass last created, read or patched them, by FineTuneJob (and its uid: a job
# deleted and made again under its name starts afresh). A pass takes them from here instead of
# reading each again (five requests in a row on every event of a job's children); a fresh pass (the
# slow re-sync, the operator's start: ``Context.fresh``) reads them all and keeps what it found. So
# a child deleted by hand is made again by the next fresh pass, no later than the re-sync.
_KEPT = frozenset({state.Child.IDENTITY, state.Child.CHECKPOINT_CLAIM, state.Child.CONFIG_MAP})
_known: dict[tuple[str, str], tuple[str | None, dict[tuple[str, str], dict[str, Any]]]] = {}
_known_guard = threading.Lock()


def _known_child(job: api.FineTuneJob, manifest: dict[str, Any]) -> dict[str, Any] | None:
    key = (job.metadata.namespace, job.metadata.name)
    with _known_guard:
        uid, objects = _known.get(key, (None, {}))
        if uid != job.metadata.uid:
            return None
        return objects.get((manifest["kind"], manifest["metadata"]["name"]))


def _learn_child(job: api.FineTuneJob, manifest: dict[str, Any], obj: dict[str, Any]) -> None:
    key = (job.metadata.namespace, job.metadata.name)
    with _known_guard:
        uid, objects = _known.get(key, (None, {}))
        if uid != job.metadata.uid:
            objects = {}
        _known[key] = (job.metadata.uid, {**objects, (manifest["kind"], manifest["metadata"]["name"]): obj})


def forget(namespace: str, name: str) -> None:
    """Drop what passes learned of a job that is gone, and its children's events (:mod:`.watched`)."""
    with _known_guard:
        _known.pop((namespace, name), None)
    watched.PREPARATIONS.forget(namespace, name)


def _preparation_observation(ctx: Context, job: api.FineTuneJob, had: state.Had) -> Any:
    """The preparation Job and its pods' termination messages (none to read on the pass that created
    it); a Job with no pod at all may be one the Job controller cannot create a pod for."""
    selector = _selector(job, builders.COMPONENT_PREPARATION)
    pods: list[dict[str, Any]] = []
    if not had.created:
        with about_child("list", "Pod", selector):
            pods = ctx.kube.list("v1", "Pod", job.metadata.namespace, selector)
    seen = observations.preparation_observation(had.obj, pods, builders.PREPARE_CONTAINER)
    if not pods and not had.created and seen.state == "Running" and had.obj is not None:
        # no pod at all: the Job controller may be unable to create it (a quota, a policy)
        blocked = _job_pod_not_created(ctx, had.obj)
        if blocked:
            seen = replace(seen, message=blocked)
    return seen


def _observe_training(
    ctx: Context, obs: state.Observation, action: state.ObserveTraining
) -> state.Observation:
    """What the training object's status does not say, as the machine asked (each best effort)."""
    live = _had_child(obs).obj
    observed = obs.observed | {state.Child.TRAINING_JOB}
    if live is None:
        return replace(obs, observed=observed)
    if action.pods:
        obs = replace(obs, pods=_pods_observation(ctx, live))
    if action.failure:
        obs = replace(obs, failure=_training_failure(ctx, live, obs.training))
    key = (live["metadata"]["namespace"], action.job.metadata.name)
    with _attempt_failures_guard:  # the pod watch's, read at every pass (dropped once written)
        noted = tuple(_incarnations.get(key, ()))
        _incarnations_read[key] = len(noted)
    if action.restarts:
        counted = _restarts(ctx, action.job.metadata.name, live, noted)
        if counted is not None:
            obs = replace(obs, restart_evidence=counted[0], attempt_failure=counted[1])
    elif noted:
        obs = replace(obs, restart_evidence=training_failures.RestartEvidence(pods=noted))
    if action.kueue:
        obs = replace(obs, kueue=_kueue_workload(ctx, live))
    return replace(obs, observed=observed)


def _kueue_workload(ctx: Context, training: dict[str, Any]) -> state.KueueWorkload | None:
    """Kueue's Workload of the suspended training object (by Kueue's job-uid label): queued, or
    evicted (preempted) and why. Best effort: Kueue not installed (404) or the RBAC of an older
    install (403) is logged, and the job shows what it can tell without it."""
    meta = training["metadata"]
    selector = f"{observations.KUEUE_JOB_UID_LABEL}={meta.get('uid')}"
    try:
        workloads = ctx.kube.list(
            observations.KUEUE_WORKLOAD_API_VERSION, "Workload", meta["namespace"], selector
        )
    except ApiError as e:
        ctx.logger.warning("cannot read Kueue's Workload of %s %s: %s", training.get("kind"), meta["name"], e)
        return None
    return observations.kueue_workload(workloads, meta.get("uid"))


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


def _training_failure(ctx: Context, pytorchjob: dict[str, Any], training: state.TrainingObservation) -> Any:
    """Why the Failed training object failed, from its pods (best effort: a refused read is logged
    and the generic message stands). A TrainJob's failed pod stays (restartPolicy Never; the JobSet
    is not restarted once it failed)."""
    meta = pytorchjob["metadata"]
    engine = observations.engine_of(pytorchjob)
    step_job = None
    try:
        if engine == state.Engine.TRAINJOB:  # its training Job may have run past its deadline
            step_job = ctx.kube.get(
                "batch/v1", "Job", meta["namespace"], observations.trainjob_step_job(pytorchjob)
            )
        pods = ctx.kube.list("v1", "Pod", meta["namespace"], observations.training_pod_selector(pytorchjob))
    except ApiError as e:
        ctx.logger.warning("cannot read the pods of %s %s: %s", engine, meta["name"], e)
        pods = []
    return training_failures.training_failure(
        training, pods, observations.TRAINING_CONTAINER[engine], step_job=step_job
    )


def _restarts(
    ctx: Context, job_name: str, pytorchjob: dict[str, Any], noted: tuple[tuple[str, str], ...] = ()
) -> tuple[training_failures.RestartEvidence, TrainingFailure | None] | None:
    """What shows the restarts of the PyTorchJob: its pods' incarnations, the pod watch's (``noted``)
    then this list's (a TrainJob's: its JobSet's ``status.restarts``), and why the last attempt
    ended when its failed pod is still there (best effort, like the pods' trouble)."""
    meta = pytorchjob["metadata"]
    ns = meta["namespace"]
    if observations.engine_of(pytorchjob) == state.Engine.TRAINJOB:
        return _jobset_restarts(ctx, job_name, pytorchjob)
    try:
        pods = ctx.kube.list("v1", "Pod", ns, f"{observations.TRAINING_OPERATOR_JOB_LABEL}={meta['name']}")
    except ApiError as e:
        ctx.logger.warning("cannot read the restarts of PyTorchJob %s/%s: %s", ns, meta["name"], e)
        return (training_failures.RestartEvidence(pods=noted), None) if noted else None
    seen = training_failures.RestartEvidence(pods=noted + training_failures.incarnations(pods))
    with _attempt_failures_guard:
        failed = _attempt_failures.pop((ns, job_name), None)
    return seen, training_failures.failed_attempt(pods, builders.TRAIN_CONTAINER) or failed


def _jobset_restarts(
    ctx: Context, job_name: str, trainjob: dict[str, Any]
) -> tuple[training_failures.RestartEvidence, TrainingFailure | None] | None:
    """A TrainJob's restarts: its JobSet's count (None while there is no JobSet, or it cannot be
    read), and why the last attempt ended (its failed pod, if the restart has not deleted it yet,
    else the one the pod watch noted)."""
    meta = trainjob["metadata"]
    ns = meta["namespace"]
    try:
        jobset = ctx.kube.get(builders.JOBSET_API_VERSION, "JobSet", ns, meta["name"])
        pods = ctx.kube.list("v1", "Pod", ns, observations.training_pod_selector(trainjob)) if jobset else []
    except ApiError as e:
        ctx.logger.warning("cannot read the restarts of TrainJob %s/%s (its JobSet): %s", ns, meta["name"], e)
        return None
    if jobset is None:
        return None
    with _attempt_failures_guard:
        noted = _attempt_failures.pop((ns, job_name), None)
    failed = training_failures.failed_attempt(pods, builders.TRAINJOB_CONTAINER)
    seen = training_failures.RestartEvidence(jobset_restarts=observations.jobset_restarts(jobset))
    return seen, failed or noted


def _stop_training(ctx: Context, obs: state.Observation, name: str) -> None:
    """Suspend the training object of a failed job (its pods restarted too often, or its parent is
    gone), so its engine stops its pods and the GPUs are free."""
    api_version, kind = _training_kind(obs)
    patch = suspend_patch({"kind": kind}, True)
    try:
        ctx.kube.patch(api_version, kind, obs.namespace, name, patch)
    except ApiError as e:  # the status says Failed either way; the pods keep restarting until it works
        ctx.logger.warning("cannot suspend %s %s of the failed job %s: %s", kind, name, obs.job_name, e)


def _pods_observation(ctx: Context, pytorchjob: dict[str, Any]) -> state.PodsObservation:
    """Why the PyTorchJob's pods do not run, if they cannot start: one list of its pods and, only
    when one is missing, one of its events (a TrainJob's: its JobSet's Job's, the Job controller's). Called only while its status does not count every pod
    as running. Best effort: a refused read (the RBAC of an older install) is logged, never holds
    the job."""
    meta = pytorchjob["metadata"]
    ns = meta["namespace"]
    try:
        pods = ctx.kube.list("v1", "Pod", ns, observations.training_pod_selector(pytorchjob))
        events: list[dict[str, Any]] = []
        pod_events: list[dict[str, Any]] = []
        if observations.missing_pods(pytorchjob, pods):
            events = ctx.kube.list("v1", "Event", ns, field_selector=f"involvedObject.uid={meta['uid']}")
        elif observations.engine_of(
            pytorchjob
        ) == state.Engine.TRAINJOB and observations.trainjob_pods_missing(pytorchjob, pods):
            # the Job controller says on the JobSet's Job why it cannot create a pod
            step_job = ctx.kube.get("batch/v1", "Job", ns, observations.trainjob_step_job(pytorchjob))
            if step_job is not None:
                uid = step_job["metadata"]["uid"]
                events = ctx.kube.list("v1", "Event", ns, field_selector=f"involvedObject.uid={uid}")
        if any((p.get("status") or {}).get("phase") in (None, "Pending") for p in pods):
            # a pending pod may wait for its volumes: the kubelet says so only in events
            for reason in sorted(observations.MOUNT_EVENT_REASONS):
                selector = f"involvedObject.kind=Pod,reason={reason}"
                pod_events += ctx.kube.list("v1", "Event", ns, field_selector=selector)
    except ApiError as e:
        ctx.logger.warning(
            "cannot read the pods or events of %s %s/%s (their trouble is not shown): %s",
            pytorchjob.get("kind"),
            ns,
            meta["name"],
            e,
        )
        return state.PodsObservation()
    return observations.pods_observation(pytorchjob, pods, events, pod_events)


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
    ownership.check_patch(changed, ownership.Writer.OPERATOR)  # never a field the trainer owns
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
