"""The operator's Prometheus metrics: every one is declared here, and served on ``/metrics``.

Served when ``KUBETUNE_METRICS_PORT`` is set (the chart sets 8081; unset or 0: off), on
``KUBETUNE_METRICS_ADDRESS`` (``0.0.0.0``). The reconcile pass (:mod:`.reconcile`) records what it
carried out and wrote; the state machine (:mod:`.state`) stays pure and records nothing; the API
client (:mod:`.kube`) counts the requests the API server refused.

Labels are bounded: a namespace, a phase, a failure reason (a closed set,
:class:`kubetune_api.status.Reason`), an outcome, a verb, a status code class. No metric has a
per-job label: per-job training progress (tokens/s, loss, ETA) stays in MLflow and the job's status.

==============================================  ===========  =========================================
Metric                                          Type         Labels
==============================================  ===========  =========================================
``kubetune_finetunejobs``                       gauge        namespace, phase (as the operator last saw)
``kubetune_finetunejob_failures_total``         counter      namespace, reason (the Ready condition's)
``kubetune_reconcile_duration_seconds``         histogram    outcome (its ``_count``: the passes)
``kubetune_api_errors_total``                   counter      verb, code_class (4xx, 5xx, none)
``kubetune_queue_wait_seconds``                 histogram    (apply → training start)
``kubetune_gpu_hours_total``                    counter      namespace (held, at a job's end)
``kubetune_productive_gpu_hours_total``         counter      namespace (in steps that count)
``kubetune_leader``                             gauge        (1: this replica reconciles; 0: it waits)
==============================================  ===========  =========================================

With leader election (:mod:`.leader`) every replica serves ``/metrics``; only the leader's job,
reconcile and GPU-hour series move, and ``sum(kubetune_leader)`` over the replicas is 1 (0 while
none leads, e.g. during a takeover).

Goodput by namespace is ``productive / held``: the dashboard (``deploy/grafana/kubetune.json``)
divides the two counters' rates.
"""

from __future__ import annotations

import threading
from datetime import datetime
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, disable_created_metrics, start_http_server

from kubetune_api.status import Phase, Reason

# Every metric name this module declares (the dashboard's test checks its queries against these).
NAMES = (
    "kubetune_finetunejobs",
    "kubetune_finetunejob_failures_total",
    "kubetune_reconcile_duration_seconds",
    "kubetune_api_errors_total",
    "kubetune_queue_wait_seconds",
    "kubetune_gpu_hours_total",
    "kubetune_productive_gpu_hours_total",
    "kubetune_leader",
)

# No ``*_created`` series beside each counter and histogram: Prometheus does not need them.
disable_created_metrics()

JOBS = Gauge(
    "kubetune_finetunejobs",
    "FineTuneJobs by namespace and phase, as the operator last saw them.",
    ["namespace", "phase"],
)
FAILURES = Counter(
    "kubetune_finetunejob_failures",
    "FineTuneJobs that failed, by namespace and the reason of their Ready condition.",
    ["namespace", "reason"],
)
RECONCILE = Histogram(
    "kubetune_reconcile_duration_seconds",
    "Reconcile passes and how long each took, by outcome (ok, waiting, invalid, refused, gone, "
    "conflict, error).",
    ["outcome"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
API_ERRORS = Counter(
    "kubetune_api_errors",
    "Requests to the API server it refused or never answered (a read of something absent is not "
    "counted), by verb and status code class.",
    ["verb", "code_class"],
)
QUEUE_WAIT = Histogram(
    "kubetune_queue_wait_seconds",
    "From a FineTuneJob's creation to the start of its training (status.startTime).",
    buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
)
GPU_HOURS = Counter(
    "kubetune_gpu_hours",
    "GPU-hours the training pods held (status.goodput.heldGpuSeconds), added when a job ends.",
    ["namespace"],
)
PRODUCTIVE_GPU_HOURS = Counter(
    "kubetune_productive_gpu_hours",
    "GPU-hours spent in optimizer steps that count (status.goodput.productiveGpuSeconds), added "
    "when a job ends.",
    ["namespace"],
)

LEADER = Gauge(
    "kubetune_leader",
    "1 while this operator replica holds the leader Lease and reconciles (always, without leader "
    "election), 0 while it waits as a candidate.",
)

OUTCOMES = ("ok", "waiting", "invalid", "refused", "gone", "conflict", "error")
FINAL = (Phase.SUCCEEDED, Phase.FAILED)
_REASONS = frozenset(str(r) for r in Reason)  # the failure reason label's closed set (and Other)

# (namespace, name) -> phase last seen: the gauge is kept from this, so each job counts once.
_seen: dict[tuple[str, str], str] = {}
_seen_guard = threading.Lock()


def saw(namespace: str, name: str, phase: str | None) -> None:
    """A pass saw the job in ``phase`` (None: gone, or not yet given one)."""
    with _seen_guard:
        old = _seen.pop((namespace, name), None) if phase is None else _seen.get((namespace, name))
        if old == phase:
            return
        if old is not None:
            JOBS.labels(namespace, old).dec()
        if phase is not None:
            _seen[(namespace, name)] = phase
            JOBS.labels(namespace, phase).inc()


def pass_done(outcome: str, seconds: float) -> None:
    RECONCILE.labels(outcome).observe(seconds)


def api_error(verb: str, status: int) -> None:
    API_ERRORS.labels(verb.upper(), f"{status // 100}xx" if status else "none").inc()


def status_written(obj: dict[str, Any], status: dict[str, Any]) -> None:
    """A pass wrote ``status`` over the job ``obj`` as it read it: what the write changed is recorded
    (a failure, the start of training, a job's end with its GPU time), once per transition."""
    meta, before = obj["metadata"], obj.get("status") or {}
    namespace, phase = meta["namespace"], status.get("phase")
    if status.get("startTime") and not before.get("startTime"):
        waited = _seconds_between(meta.get("creationTimestamp"), status["startTime"])
        if waited is not None:
            QUEUE_WAIT.observe(waited)
    if phase not in FINAL or before.get("phase") == phase:
        return
    if phase == Phase.FAILED:
        ready: dict[str, Any] = next(
            (c for c in status.get("conditions") or [] if c.get("type") == "Ready"), {}
        )
        reason = str(ready.get("reason") or "")
        FAILURES.labels(namespace, reason if reason in _REASONS else "Other").inc()
    goodput = before.get("goodput") or {}
    held = float(goodput.get("heldGpuSeconds") or 0)
    productive = float(goodput.get("productiveGpuSeconds") or 0)
    if held > 0:
        GPU_HOURS.labels(namespace).inc(held / 3600)
    if productive > 0:
        PRODUCTIVE_GPU_HOURS.labels(namespace).inc(productive / 3600)


def _seconds_between(start: str | None, end: str) -> float | None:
    if not start:
        return None
    try:
        return max(0.0, (_time(end) - _time(start)).total_seconds())
    except ValueError:
        return None


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def leading(yes: bool) -> None:
    LEADER.set(1 if yes else 0)


_server: Any = None
_server_guard = threading.Lock()


def serve(port: int, address: str) -> Any:
    """Serve ``/metrics`` on ``address:port`` in a thread; the server (:func:`stop` stops it), or
    None when this process serves them already (a candidate replica starts serving before kopf)."""
    global _server
    with _server_guard:
        if _server is not None:
            return None
        _server, _thread = start_http_server(port, addr=address)
        return _server


def stop(server: Any) -> None:
    """Stop ``server`` (what :func:`serve` returned)."""
    global _server
    with _server_guard:
        server.shutdown()
        server.server_close()
        if server is _server:
            _server = None
