"""Leader election on a ``coordination.k8s.io/v1`` Lease: of several operator replicas, one reconciles.

Why a Lease and not kopf's peering: kopf's peering is priority-based. An operator pauses while one of
a higher priority runs; operators of the same priority (every replica of one Deployment) all warn and
freeze, leaving the cluster unserved (kopf's documentation, "Peering"). Giving each pod a priority of
its own would still leave no deadline after which a replica that lost contact must stop, and it needs
kopf's peering CRDs installed cluster-wide. A Lease is what controller-runtime's (and client-go's)
operators use: a built-in object, with a holder, a duration and a renewal time, written with
optimistic concurrency (``resourceVersion``), so that of two replicas that try at once only one
succeeds.

How it runs (``python -m kubetune_operator`` with ``KUBETUNE_LEADER_ELECTION=true``):

- A replica that does not hold the Lease is a **candidate**: it starts no kopf, watches nothing and
  writes nothing but its attempts on the Lease, every ``retry period``. It takes the Lease when it
  is free (released, or no holder) or expired: unchanged for ``lease duration`` seconds as this
  replica's own clock measured since it last saw it change (never by comparing the holder's
  timestamps with its clock, so clock skew between nodes does not matter).
- The **leader** runs kopf (every handler) and renews the Lease every ``retry period``, from a thread
  and connection pool of its own (a busy handler pool does not delay a renewal). A watchdog thread
  ends the process (exit code :data:`EXIT_LOST`) once ``renew deadline`` seconds have passed since
  the start of the last renewal that succeeded, or at once when a renewal finds another holder:
  Kubernetes restarts the container, which comes back as a candidate.
- Because ``renew deadline`` < ``lease duration``, a leader that cannot renew has stopped before any
  candidate may take over: two replicas never reconcile at once. The margin
  (``lease duration - renew deadline``) covers the time the watchdog needs to end the process. A
  process frozen whole for longer (a stopped VM) is the limit of any lease without fencing tokens.
- On SIGTERM (a rollout, a drain) the leader stops kopf, waits for the handler passes in flight,
  then releases the Lease (no holder, a duration of one second), so the next replica takes over
  within a ``retry period`` instead of a whole ``lease duration``.

After a leader dies without releasing (SIGKILL, a lost node), a candidate that has been running takes
over within ``lease duration + 2 * retry period`` of the dead leader's last renewal (one period for
it to see that renewal, one between its attempts), then starts kopf, whose resume handlers reconcile
every FineTuneJob from what the objects say: :data:`Timing.takeover_bound`.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import logging
import os
import signal
import socket
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import kopf

from . import metrics
from .kube import ApiError, Kube, load_api_client
from .settings import Settings

API_VERSION = "coordination.k8s.io/v1"
# The process's exit code when it lost the Lease (it stops at once: never two leaders).
EXIT_LOST = 3
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

logger = logging.getLogger("kubetune_operator.leader")


@dataclass(frozen=True)
class Timing:
    """controller-runtime's defaults: 15 s, 10 s, 2 s."""

    lease_duration: int = 15  # seconds a Lease not renewed stays the holder's (a whole number: the API's)
    renew_deadline: float = 10.0  # seconds the leader keeps leading without a successful renewal
    retry_period: float = 2.0  # seconds between two attempts to renew, or to acquire

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry_period > 0:
            raise ValueError(
                "leader election needs lease duration > renew deadline > retry period > 0, got "
                f"{self.lease_duration} s, {self.renew_deadline} s, {self.retry_period} s"
            )

    @property
    def takeover_bound(self) -> float:
        """Seconds from a dead leader's last renewal until a running candidate holds the Lease."""
        return self.lease_duration + 2 * self.retry_period


def identity() -> str:
    """This process's name in the Lease: the host name (in a pod: the pod's name) and a random part,
    unique to each start of the process."""
    return f"{socket.gethostname()}_{uuid.uuid4().hex[:10]}"


def namespace_of_this_pod() -> str | None:
    """The namespace of the pod this runs in (its ServiceAccount's), None outside a pod."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text(encoding="utf-8").strip() or None
    except OSError:
        return None


def _now() -> str:
    """A MicroTime, as the Lease's acquireTime and renewTime hold it."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseElector:
    """One replica's side of the election on the Lease ``namespace/name``."""

    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        holder: str,
        timing: Timing,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.holder = kube, namespace, name, holder
        self.timing, self.clock = timing, clock
        self._path = f"/apis/{API_VERSION}/namespaces/{namespace}/leases"
        # the Lease as last seen (its resourceVersion) and when, by this replica's clock
        self._observed_version: str | None = None
        self._observed_at = 0.0
        self._renewed_at: float | None = None  # start of the last successful renewal
        self._stop = threading.Event()
        self._lost = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- one attempt -------------------------------------------------------------------------------

    def try_acquire_or_renew(self, *, leading: bool = False) -> bool:
        """One attempt to take or keep the Lease; True when this replica holds it now. A leader
        (``leading``) only renews: a Lease that names another holder, or none, was lost meanwhile
        (another replica led), and is not taken back."""
        try:
            lease = self.kube.request("GET", f"{self._path}/{self.name}")
        except ApiError as e:
            if not e.not_found:
                raise
            return not leading and self._create()
        version = lease["metadata"].get("resourceVersion")
        if version != self._observed_version:
            self._observed_version, self._observed_at = version, self.clock()
        spec = lease.get("spec") or {}
        current = spec.get("holderIdentity") or ""
        duration = int(spec.get("leaseDurationSeconds") or self.timing.lease_duration)
        if leading and current != self.holder:
            return False
        if current and current != self.holder and self.clock() < self._observed_at + duration:
            return False  # another replica holds it, and renewed it less than a lease ago
        now = _now()
        new_spec = {**spec, "holderIdentity": self.holder, "leaseDurationSeconds": self.timing.lease_duration}
        new_spec["renewTime"] = now
        if current != self.holder:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (1 if current else 0)
        return self._write({**lease, "spec": new_spec}, taken_from=current)

    def _create(self) -> bool:
        now = _now()
        lease = {
            "apiVersion": API_VERSION,
            "kind": "Lease",
            "metadata": {"name": self.name, "namespace": self.namespace},
            "spec": {
                "holderIdentity": self.holder,
                "leaseDurationSeconds": self.timing.lease_duration,
                "acquireTime": now,
                "renewTime": now,
                "leaseTransitions": 0,
            },
        }
        try:
            created = self.kube.request("POST", self._path, lease)
        except ApiError as e:
            if e.conflict:  # another replica created it first
                return False
            raise
        self._observed_version, self._observed_at = created["metadata"].get("resourceVersion"), self.clock()
        logger.info(f"{self.holder} acquired the Lease {self.namespace}/{self.name} (created it)")
        return True

    def _write(self, lease: dict[str, Any], taken_from: str) -> bool:
        try:  # a replace carries the resourceVersion read: 409 when anyone wrote in between
            written = self.kube.request("PUT", f"{self._path}/{self.name}", lease)
        except ApiError as e:
            if e.conflict:
                return False
            raise
        self._observed_version, self._observed_at = written["metadata"].get("resourceVersion"), self.clock()
        if taken_from != self.holder:
            was = f"from {taken_from} (expired)" if taken_from else "(it was free)"
            logger.info(f"{self.holder} acquired the Lease {self.namespace}/{self.name} {was}")
        return True

    # --- the candidate -----------------------------------------------------------------------------

    def acquire(self, stop: threading.Event) -> bool:
        """Wait as a candidate until this replica holds the Lease (True), or ``stop`` is set (False)."""
        logger.info(
            f"{self.holder}: waiting to lead (Lease {self.namespace}/{self.name}; lease "
            f"{self.timing.lease_duration} s, renew deadline {self.timing.renew_deadline} s, retry "
            f"{self.timing.retry_period} s)"
        )
        while not stop.is_set():
            started = self.clock()
            try:
                if self.try_acquire_or_renew():
                    self._renewed_at = started
                    return True
            except ApiError as e:
                logger.warning(f"Lease {self.namespace}/{self.name} not read or written: {e}")
            stop.wait(self.timing.retry_period)
        return False

    # --- the leader --------------------------------------------------------------------------------

    def keep_leading(self, on_lost: Callable[[str], None]) -> None:
        """Renew the Lease every retry period from a thread of its own; a watchdog thread calls
        ``on_lost`` (once) when no renewal succeeded for ``renew deadline`` seconds, or when another
        replica holds the Lease."""
        assert self._renewed_at is not None, "keep_leading() before acquire()"
        self._threads = [
            threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True),
            threading.Thread(target=self._watchdog, args=(on_lost,), name="lease-watchdog", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.timing.retry_period):
            started = self.clock()
            try:
                held = self.try_acquire_or_renew(leading=True)
            except ApiError as e:
                logger.warning(f"Lease {self.namespace}/{self.name} not renewed: {e}")
                continue
            if not held:
                self._lost.set()  # someone else holds it: stop now, not at the deadline
                return
            self._renewed_at = started

    def _watchdog(self, on_lost: Callable[[str], None]) -> None:
        while not self._stop.is_set():
            assert self._renewed_at is not None
            left = self._renewed_at + self.timing.renew_deadline - self.clock()
            if self._lost.is_set():
                on_lost(f"another replica holds the Lease {self.namespace}/{self.name}")
                return
            if left <= 0:
                on_lost(
                    f"the Lease {self.namespace}/{self.name} was not renewed for "
                    f"{self.timing.renew_deadline} s"
                )
                return
            self._lost.wait(min(left, self.timing.retry_period / 4))

    def stop_renewing(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timing.renew_deadline)

    def release(self) -> bool:
        """Give the Lease up (no holder, one second left), if this replica still holds it."""
        try:
            lease = self.kube.request("GET", f"{self._path}/{self.name}")
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != self.holder:
                return False
            now = _now()
            spec = {**spec, "holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": now}
            self.kube.request("PUT", f"{self._path}/{self.name}", {**lease, "spec": spec})
        except ApiError as e:
            logger.warning(f"Lease {self.namespace}/{self.name} not released (it expires by itself): {e}")
            return False
        logger.info(f"{self.holder} released the Lease {self.namespace}/{self.name}")
        return True


def exit_now(reason: str) -> None:
    """Stop reconciling at once: the whole process, handler threads in the middle of a pass included
    (what a ``kill -9`` leaves, the next leader picks up: every pass is idempotent)."""
    metrics.leading(False)
    logger.critical(f"leadership lost: {reason}; exiting (code {EXIT_LOST}) so that two never act at once")
    logging.shutdown()
    os._exit(EXIT_LOST)


# --- the process: wait as a candidate, then run kopf as the leader ---------------------------------


def run_elected(
    settings: Settings,
    liveness: str | None,
    run_kopf: Callable[[Any, asyncio.AbstractEventLoop, asyncio.Future[None]], None],
) -> int:
    """Wait for the Lease (serving the liveness probe and /metrics meanwhile), then run kopf
    (``run_kopf(memo, loop, stop_flag)``: kopf in ``loop``, stopping when ``stop_flag`` is done) while
    the Lease is renewed; release it after kopf stops on a signal.

    SIGTERM and SIGINT stop the replica from its start to its end: while it waits, and in the moment
    between winning the Lease and kopf's own signal handlers, where the default action once killed
    the leader, leaving its Lease to expire instead of handing it over. The stop flag is an asyncio
    future of kopf's loop (a threading flag would keep a thread of kopf's executor waiting on it, and
    kopf's shutdown waiting on that thread, when a signal stopped kopf instead)."""
    timing = Timing(
        settings.lease_duration_seconds, settings.renew_deadline_seconds, settings.retry_period_seconds
    )
    namespace = settings.leader_election_namespace or namespace_of_this_pod()
    if not namespace:
        raise ValueError(
            "KUBETUNE_LEADER_ELECTION=true outside a pod needs KUBETUNE_LEADER_ELECTION_NAMESPACE: "
            "the namespace of the Lease the replicas share"
        )
    # a client of its own: renewals never wait behind the handlers' requests; a request may take
    # half the renew deadline, so a hung one leaves time for another try
    kube = Kube(load_api_client(connections=2), timeout=timing.renew_deadline / 2)
    elector = LeaseElector(kube, namespace, settings.leader_election_lease, identity(), timing)
    metrics.leading(False)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port, settings.metrics_address)
    stop = threading.Event()
    loop = asyncio.new_event_loop()
    stop_flag: asyncio.Future[None] = loop.create_future()

    def stopped() -> None:
        if not stop_flag.done():
            stop_flag.set_result(None)

    def stop_kopf() -> (
        None
    ):  # a signal after kopf's loop closed (a second one, while draining) only sets stop
        if not loop.is_closed():
            loop.call_soon_threadsafe(stopped)

    with _stopped_by_signals(stop, stop_kopf):
        with _standby_liveness(liveness):
            if not elector.acquire(stop):
                logger.info(f"{elector.holder}: stopped while waiting to lead")
                loop.close()
                return 0
        logger.info(f"{elector.holder}: leading; starting the operator")
        metrics.leading(True)
        elector.keep_leading(exit_now)
        memo = kopf.Memo()
        try:
            run_kopf(memo, loop, stop_flag)
        finally:
            loop.close()
            drained = _drain(memo, timing.renew_deadline)
            elector.stop_renewing()
            if drained:
                elector.release()
            metrics.leading(False)
    return 0


def _drain(memo: Any, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for the handler passes still running in kopf's thread pool."""
    executor = getattr(memo, "executor", None)
    if executor is None:
        return True
    waiter = threading.Thread(target=executor.shutdown, kwargs={"wait": True}, daemon=True)
    waiter.start()
    waiter.join(timeout)
    if waiter.is_alive():
        logger.warning(f"handler passes still running after {timeout} s: the Lease is left to expire")
        return False
    return True


@contextlib.contextmanager
def _stopped_by_signals(stop: threading.Event, also: Callable[[], Any]) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` and call ``also`` (kopf's own handlers take over while its
    loop runs)."""
    signals = (signal.SIGTERM, signal.SIGINT)

    def handle(*_: Any) -> None:
        stop.set()
        also()

    previous = {sig: signal.signal(sig, handle) for sig in signals}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class _Healthy(http.server.BaseHTTPRequestHandler):
    path_served = "/healthz"

    def do_GET(self) -> None:
        ok = urllib.parse.urlsplit(self.path).path == self.path_served
        body = b'{"candidate": "waiting for the leader Lease"}' if ok else b""
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # the kubelet probes every few seconds
        return


@contextlib.contextmanager
def _standby_liveness(url: str | None) -> Iterator[None]:
    """The liveness endpoint while kopf (which serves it once it runs) does not run yet: a waiting
    candidate is alive."""
    if not url:
        yield
        return
    parts = urllib.parse.urlsplit(url)
    handler = type("Healthy", (_Healthy,), {"path_served": parts.path or "/healthz"})
    server = http.server.ThreadingHTTPServer((parts.hostname or "0.0.0.0", parts.port or 80), handler)  # noqa: S104
    thread = threading.Thread(target=server.serve_forever, name="standby-liveness", daemon=True)
    thread.start()
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
