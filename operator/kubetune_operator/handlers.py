"""Every kopf handler of the operator. Thin: each one runs the same reconcile pass.

- FineTuneJob create / update (spec: suspend, registration.alias) / resume (operator start):
  reconcile; ``kopf.TemporaryError`` while a conflict or a pending result needs time,
  ``kopf.PermanentError`` for a spec the operator can never use.
- PyTorchJob (or TrainJob), preparation, registration and alias Job, and their pods' and training pod events
  (selected by the ``kubetune.io/job`` label): poke the FineTuneJob named in the label
  (:mod:`.pokes`: one pass queued per job, however many events; one more after a running pass). A
  training pod that the scheduler cannot place, or whose image cannot be pulled, or one that
  starts at last, changes the FineTuneJob's status through these. The handlers run in kopf's event
  loop and hold no thread.
- A FineTuneJob's events re-reconcile the jobs that start from its model (``spec.model.fromJob``),
  found through an in-memory index of those jobs by parent, while they can still change: waiting for
  it, or recorded as started from it (its deletion fails them, ``ParentMissing``).
- A slow timer re-syncs every FineTuneJob: the safety net for missed events. A fast one
  (``KUBETUNE_RETRY_SECONDS``) runs only while a job's pods are starting with nothing wrong known
  (``observations.settling``): a pod the Training Operator cannot create sends no pod event, and a pod
  that waits long for a node is only news after a while.

kopf keeps its finalizer (``kubetune.io/finalizer``), handler progress and last-handled
configuration in annotations under ``kubetune.io``, never in the status: the status schema is
strict and belongs to the operator (and ``progress`` to the trainer). Handlers return nothing, so
kopf writes no handler results into the status either.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import kopf

from kubetune_api import spec as api
from kubetune_api.engines import Engine
from kubetune_api.status import Phase, Reason

from . import builders, metrics, observations, pokes, state, watched
from .kube import ApiError, Kube, load_api_client
from .reconcile import Context, StatusConflictError, forget, note_training_pod, reconcile
from .settings import Settings

# Read at import: kopf needs the timer intervals when the decorators run.
_RESYNC_SECONDS = Settings.from_env().resync_seconds
_RETRY_SECONDS = Settings.from_env().retry_seconds
TRAINJOB = Engine.TRAINJOB
_JOB_COMPONENTS = (builders.COMPONENT_PREPARATION, builders.COMPONENT_REGISTRATION, builders.COMPONENT_ALIAS)

# Threads for the (sync) handlers and the passes children's events poke (.pokes). kopf's default pool
# has min(32, CPUs + 4): 6 on a two-core node. A reconcile pass is a few API requests in a row and
# mostly waits for the API server: under a burst of 500 new jobs, 6 threads made each job wait ~48 s
# (p50) for its PyTorchJob; 16, with the check of ``finetunejob_unobserved`` out of the pool, ~2.4 s,
# with the same CPU (hack/bench_operator_scale.py, docs/benchmarks-history.md "The operator at
# scale"). The operator's client keeps as many connections open (kube.load_api_client): no request
# waits for a connection or pays a new TLS handshake.
HANDLER_THREADS = 16


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = f"{api.GROUP}/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=api.GROUP, key="last-handled-configuration"
    )
    # Only our own events (kopf.event below) and kopf's warnings/errors reach `kubectl describe`;
    # "Handler ... succeeded" on every pass is noise.
    settings.posting.level = logging.WARNING
    # Watches are re-established at this interval (seconds), so a lost connection heals quickly.
    settings.watching.server_timeout = 120
    settings.watching.client_timeout = 150
    # Server-side filtering: watch only our children, never every pod/job of the cluster. Jobs: the
    # registration's and the alias move's; pods: theirs and the training pods (labels copied from the
    # PyTorchJob's pod template), all followed by the handlers below.
    ours = builders.LABEL_JOB
    component = builders.LABEL_COMPONENT
    jobs = f"{ours},{component} in ({','.join(sorted(_JOB_COMPONENTS))})"
    pods = f"{ours},{component} in ({','.join(sorted((*_JOB_COMPONENTS, builders.COMPONENT_TRAINING)))})"
    settings.watching.label_selectors["kubeflow.org", "v1", "pytorchjobs"] = ours
    settings.watching.label_selectors[TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural] = ours
    settings.watching.label_selectors["batch", "v1", "jobs"] = jobs
    settings.watching.label_selectors["v1", "pods"] = pods
    settings.execution.max_workers = HANDLER_THREADS
    memo.executor = settings.execution.executor
    memo.pokes = pokes.Pokes(memo.executor, functools.partial(_poked, memo))
    memo.settings = Settings.from_env()
    memo.kube = Kube(load_api_client(connections=HANDLER_THREADS))
    memo.metrics_server = None
    if memo.settings.metrics_port:
        # None when the process serves them already (a replica that waited for the leader Lease)
        memo.metrics_server = metrics.serve(memo.settings.metrics_port, memo.settings.metrics_address)
        if memo.metrics_server is not None:
            logging.getLogger(__name__).info(
                f"metrics on http://{memo.settings.metrics_address}:{memo.settings.metrics_port}/metrics"
            )
    metrics.leading(True)  # kopf runs: this process reconciles


@kopf.on.cleanup()
def stop_metrics(memo: kopf.Memo, **_: Any) -> None:
    metrics.leading(False)
    server = getattr(memo, "metrics_server", None)
    if server is not None:
        metrics.stop(server)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    # The same credentials as the operator's own client (kube.load_api_client): the pod's
    # ServiceAccount in a cluster, $KUBECONFIG (read at start, not at import) elsewhere.
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster(kopf.login_with_service_account(**kwargs))
    return kopf.login_with_kubeconfig(**kwargs)


def in_cluster(info: kopf.ConnectionInfo | None) -> kopf.ConnectionInfo | None:
    """The pod's ServiceAccount credentials at the API server's address that the kubelet puts in the
    environment (``KUBERNETES_SERVICE_HOST``/``PORT``), as the operator's own client and client-go
    use it. kopf's ``login_with_service_account`` names ``https://kubernetes.default.svc`` instead,
    which only the cluster's DNS resolves: with DNS down, or where a pod cannot use it, kopf would
    lose the API server that the Lease's and the reconcile passes' client still reach."""
    if info is None:
        return None
    host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if ":" in host:  # an IPv6 address
        host = f"[{host}]"
    return dataclasses.replace(info, server=f"https://{host}:{port}")


def _context(memo: kopf.Memo, logger: kopf.Logger, *, fresh: bool = False) -> Context:
    def emit(body: Any, event: state.Event) -> None:  # a FineTuneJob as read (a dict) or kopf's Body
        kopf.event(body, type=event.type, reason=event.reason, message=event.message[:1000])

    return Context(kube=memo.kube, settings=memo.settings, emit=emit, logger=logger, fresh=fresh)


def _run(
    memo: kopf.Memo, logger: kopf.Logger, namespace: str | None, name: str, *, fresh: bool = False
) -> None:
    try:
        outcome = reconcile(_context(memo, logger, fresh=fresh), namespace or "default", name)
    except (ApiError, StatusConflictError) as e:
        # The API server said no for now (throttled, restarting, a race): retry soon, not in kopf's
        # default minute. A persistent 403 also lands here and shows in the kopf progress annotation.
        raise kopf.TemporaryError(str(e), delay=memo.settings.retry_seconds) from e
    if outcome is None:
        return
    if outcome.invalid:
        raise kopf.PermanentError(outcome.message)
    if outcome.waiting:
        delay = outcome.retry_in or memo.settings.retry_seconds
        raise kopf.TemporaryError(outcome.message or "waiting", delay=delay)


@kopf.on.resume(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.create(api.GROUP, api.VERSION, api.PLURAL)
@kopf.on.update(api.GROUP, api.VERSION, api.PLURAL)
def finetunejob_changed(
    memo: kopf.Memo, logger: kopf.Logger, namespace: str | None, name: str, reason: str = "", **_: Any
) -> None:
    # the operator's start reads every child again (Context.fresh): nothing learned is older than it
    _run(memo, logger, namespace, name, fresh=reason == kopf.Reason.RESUME)


async def _in_thread(memo: kopf.Memo, fn: Callable[..., None], *args: Any) -> None:
    """Run blocking work in the handlers' thread pool with this handler's context (``kopf.event``
    needs it), the way kopf runs a sync handler."""
    call = functools.partial(contextvars.copy_context().run, fn, *args)
    await asyncio.get_running_loop().run_in_executor(memo.executor, call)


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def finetunejob_unobserved(
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    namespace: str | None,
    name: str,
    type: str | None,
    **_: Any,
) -> None:
    """Level-triggered guard: a spec generation no reconcile pass has observed yet is reconciled now,
    and so is a retry the ``kubetune.io/retry-registration`` annotation asks for.

    kopf detects updates by diffing the spec against the last one it handled. A change made while an
    earlier one's handler waits for its retry, and that returns the spec to the last handled one
    (alias production, then back to champion), leaves kopf no diff and nothing to run: the change
    would wait for the slow re-sync. The generation says it was never observed. kopf's diff leaves
    out annotations under ``kubetune.io/`` (its own storage's prefix), so a new retry value is
    compared with the one the status records as acted on.

    The check runs in the event loop: nearly every event (each status write, kopf's own patches)
    needs no pass, and kopf handles a job's creation only after this handler has returned for the
    same event, so waiting for a free thread just to return held every new job up behind a busy pool.
    """
    if type == "DELETED":
        metrics.saw(namespace or "default", name, None)  # gone: out of the phase gauge
        forget(namespace or "default", name)  # and out of what passes kept of its children
        return
    if (body.get("metadata") or {}).get("deletionTimestamp"):
        return
    meta, status = body.get("metadata") or {}, body.get("status") or {}
    retry = (meta.get("annotations") or {}).get(api.RETRY_REGISTRATION_ANNOTATION)
    # failed in registration, or succeeded with spec.registration.gate not met (GateNotMet)
    registered: dict[str, Any] = next(
        (c for c in status.get("conditions") or [] if c.get("type") == "Registered"), {}
    )
    retryable = status.get("phase") == Phase.FAILED or registered.get("reason") == Reason.GATE_NOT_MET
    asked = retryable and retry and retry != status.get("registrationRetry")
    generation = meta.get("generation")
    observed = status.get("observedGeneration")
    if not asked and (generation is None or observed is None or generation == observed):
        return  # new objects are the create handler's; observed ones have nothing new
    await _in_thread(memo, _reconcile_unobserved, memo, logger, namespace, name, generation)


@kopf.index(api.GROUP, api.VERSION, api.PLURAL)
def jobs_by_parent(
    namespace: str | None, name: str, spec: kopf.Spec, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], tuple[str, str | None, str | None]]:
    """Jobs that start from another job's model (``spec.model.fromJob``), by (namespace, parent):
    (name, phase, the uid of the parent it started from)."""
    parent = ((dict(spec).get("model") or {}).get("fromJob") or {}).get("name")
    if not parent:
        return {}
    seen = dict(status).get("parent") or {}
    recorded = seen.get("uid") if seen.get("path") else None  # started from it (not only waiting for it)
    return {(namespace or "default", parent): (name, dict(status).get("phase"), recorded)}


@kopf.on.event(api.GROUP, api.VERSION, api.PLURAL)
async def parent_changed(
    body: kopf.Body,
    memo: kopf.Memo,
    logger: kopf.Logger,
    namespace: str | None,
    name: str,
    type: str | None,
    **kwargs: Any,
) -> None:
    """A job changed: the jobs waiting for it (or started from it, when it is deleted or
    replaced) are reconciled. A job that recorded this very parent has nothing to learn from its
    status writes; a final job nothing at all."""
    ns = namespace or "default"
    uid = (body.get("metadata") or {}).get("uid")
    gone = type == "DELETED" or bool((body.get("metadata") or {}).get("deletionTimestamp"))
    index: kopf.Index[tuple[str, str], tuple[str, str | None, str | None]] = kwargs["jobs_by_parent"]
    for child, phase, recorded in index.get((ns, name), []):
        if phase in (Phase.SUCCEEDED, Phase.FAILED) or (recorded == uid and not gone):
            continue
        await _in_thread(memo, _reconcile_child, memo, logger, ns, child)


def _reconcile_child(memo: kopf.Memo, logger: kopf.Logger, namespace: str, name: str) -> None:
    try:
        reconcile(_context(memo, logger), namespace, name)
    except (ApiError, StatusConflictError) as e:
        logger.info(f"job {name}, which starts from this one, not reconciled yet ({e}); the re-sync will")


def _reconcile_unobserved(
    memo: kopf.Memo, logger: kopf.Logger, namespace: str | None, name: str, generation: Any
) -> None:
    try:
        reconcile(_context(memo, logger), namespace or "default", name)
    except (ApiError, StatusConflictError) as e:
        logger.info(
            f"spec generation {generation} (or a retry) not reconciled yet ({e}); the next event or re-sync will"
        )


@kopf.timer(api.GROUP, api.VERSION, api.PLURAL, interval=_RESYNC_SECONDS, initial_delay=_RESYNC_SECONDS)
def resync(memo: kopf.Memo, logger: kopf.Logger, namespace: str | None, name: str, **_: Any) -> None:
    # the safety net reads every child again (Context.fresh), not what earlier passes learned
    outcome = reconcile(_context(memo, logger, fresh=True), namespace or "default", name)
    if outcome is not None and outcome.retry_in is not None:
        # a refused child request (403, 5xx...): the timer retries with backoff, not a re-sync later
        raise kopf.TemporaryError(outcome.message, delay=outcome.retry_in)


def _settling(status: kopf.Status, **_: Any) -> bool:
    return observations.settling(dict(status or {}))


@kopf.timer(
    api.GROUP,
    api.VERSION,
    api.PLURAL,
    interval=_RETRY_SECONDS,
    initial_delay=_RETRY_SECONDS,
    when=_settling,
)
def pods_starting(memo: kopf.Memo, logger: kopf.Logger, namespace: str | None, name: str, **_: Any) -> None:
    """While the pods start: a pod not created, or waiting long for a node, is seen without an event."""
    reconcile(_context(memo, logger), namespace or "default", name)


@kopf.on.delete(api.GROUP, api.VERSION, api.PLURAL, optional=True)
def finetunejob_deleted(logger: kopf.Logger, spec: kopf.Spec, **_: Any) -> None:
    # Owner references let the garbage collector delete the children; a kept PVC stays.
    storage = dict(spec).get("storage") or {}
    if storage.get("keepOnDelete") and not storage.get("existingClaim"):
        logger.info("keeping the checkpoint PVC (spec.storage.keepOnDelete)")


def _poked(memo: kopf.Memo, namespace: str, name: str, logger: kopf.Logger) -> None:
    """One pass over a job whose child sent an event (:mod:`.pokes`)."""
    try:
        reconcile(_context(memo, logger), namespace, name)
    except (ApiError, StatusConflictError) as e:
        logger.info(
            f"FineTuneJob {namespace}/{name} not reconciled yet ({e}); the next event or re-sync will"
        )


def _child_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger) -> None:
    """Poke the FineTuneJob named in the child's label (:mod:`.pokes`): in kopf's event loop, no thread."""
    meta = body.get("metadata") or {}
    parent = (meta.get("labels") or {}).get(builders.LABEL_JOB)
    if parent:
        memo.pokes.poke(meta["namespace"], parent, logger)


_CHILD = {builders.LABEL_JOB: kopf.PRESENT}


@kopf.on.event("kubeflow.org", "v1", "pytorchjobs", labels=_CHILD)
async def pytorchjob_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _child_event(body, memo, logger)


@kopf.on.event(TRAINJOB.group, TRAINJOB.version, TRAINJOB.plural, labels=_CHILD)
async def trainjob_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """A TrainJob's status (Kubeflow Trainer v2): watched once its CRD is served (kopf waits for a
    resource that is not served, and starts watching when it appears)."""
    _child_event(body, memo, logger)


def _preparation_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, type: str | None) -> None:
    """Kept as the event shows it (:mod:`.watched`: a pass reads no preparation Job or pod the events
    showed), then the job is poked."""
    meta = body.get("metadata") or {}
    parent = (meta.get("labels") or {}).get(builders.LABEL_JOB)
    if parent:
        watched.PREPARATIONS.saw(meta["namespace"], parent, dict(body), deleted=type == "DELETED")
    _child_event(body, memo, logger)


@kopf.on.event(
    "batch", "v1", "jobs", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_PREPARATION}
)
async def preparation_job_event(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, type: str | None, **_: Any
) -> None:
    _preparation_event(body, memo, logger, type)


@kopf.on.event("v1", "pods", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_PREPARATION})
async def preparation_pod_event(
    body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, type: str | None, **_: Any
) -> None:
    """Its termination message (the report or the refusal) is in the pod's status, which may land
    after the Job's."""
    _preparation_event(body, memo, logger, type)


@kopf.on.event(
    "batch", "v1", "jobs", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_REGISTRATION}
)
async def registration_job_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _child_event(body, memo, logger)


@kopf.on.event("v1", "pods", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_REGISTRATION})
async def registration_pod_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _child_event(body, memo, logger)


@kopf.on.event("v1", "pods", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_TRAINING})
async def training_pod_event(
    body: kopf.Body, event: kopf.RawEvent, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """Scheduled or not, pulling its image or not, running: the Training condition follows. A pod
    that failed is noted first: the Training Operator replaces it before a pass may list it; so is
    each new incarnation of a PyTorchJob's pod, one restart when its name was seen before."""
    meta = body.get("metadata") or {}
    parent = (meta.get("labels") or {}).get(builders.LABEL_JOB)
    if parent:
        note_training_pod(meta["namespace"], parent, dict(body), deleted=event.get("type") == "DELETED")
    _child_event(body, memo, logger)


@kopf.on.event("batch", "v1", "jobs", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_ALIAS})
async def alias_job_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _child_event(body, memo, logger)


@kopf.on.event("v1", "pods", labels={**_CHILD, builders.LABEL_COMPONENT: builders.COMPONENT_ALIAS})
async def alias_pod_event(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _child_event(body, memo, logger)
