"""A child's event pokes its FineTuneJob (kubetune_operator.pokes): the events that arrive while a
job's pass waits for a thread make no pass of their own, those that arrive while it runs make exactly
one more after it, and a poke never waits for a thread."""

from __future__ import annotations

import concurrent.futures
import contextvars
import logging
import threading
from typing import Any

import kopf

from kubetune_operator import handlers
from kubetune_operator.pokes import Pokes

LOG = logging.getLogger("test")


def test_events_while_a_pass_waits_for_a_thread_make_no_pass_of_their_own() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    release = threading.Event()
    pool.submit(release.wait)  # the only thread is busy
    passes: list[tuple[str, str]] = []
    pokes = Pokes(pool, lambda ns, name, logger: passes.append((ns, name)))
    for _ in range(5):
        pokes.poke("ns", "a", None)  # returns at once: no thread free
    pokes.poke("ns", "b", None)
    release.set()
    pool.shutdown(wait=True)
    assert sorted(passes) == [("ns", "a"), ("ns", "b")]
    assert pokes.pending() == 0


def test_events_while_a_pass_runs_make_exactly_one_more_after_it() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(4)
    started, release = threading.Event(), threading.Event()
    passes: list[str] = []

    def run(ns: str, name: str, logger: Any) -> None:
        passes.append(name)
        if len(passes) == 1:
            started.set()
            release.wait(timeout=10)

    pokes = Pokes(pool, run)
    pokes.poke("ns", "a", None)
    assert started.wait(timeout=10)
    for _ in range(3):
        pokes.poke("ns", "a", None)  # the running pass may have read the child before this change
    release.set()
    pool.shutdown(wait=True)
    assert passes == ["a", "a"]
    assert pokes.pending() == 0


def test_a_failed_pass_is_logged_and_the_next_poke_runs_another() -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    calls: list[int] = []

    def run(ns: str, name: str, logger: Any) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the API server went away")

    pokes = Pokes(pool, run)
    pokes.poke("ns", "a", None)
    pool.submit(lambda: None).result(timeout=10)  # the first pass is over
    pokes.poke("ns", "a", None)
    pool.shutdown(wait=True)
    assert len(calls) == 2


def test_a_childs_event_pokes_its_job_with_the_handlers_context(monkeypatch: Any) -> None:
    """The pass runs in the handlers' pool with the context of the event's handler (kopf.event finds
    its queue through context variables), and the handler returns without a thread."""
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker")
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="handlers")
    seen: list[tuple[str, str, str, str]] = []

    def reconcile(ctx: Any, namespace: str, name: str) -> None:
        seen.append((namespace, name, threading.current_thread().name, marker.get("lost")))

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    memo = kopf.Memo(kube=None, settings=None)
    memo.pokes = Pokes(pool, lambda ns, name, logger: handlers._poked(memo, ns, name, logger))
    body = {"metadata": {"name": "j-prepare", "namespace": "ns", "labels": {"kubetune.io/job": "j"}}}
    marker.set("kopf's context")
    handlers._child_event(kopf.Body(body), memo, LOG)  # type: ignore[arg-type]
    pool.shutdown(wait=True)
    assert len(seen) == 1
    namespace, name, thread, context = seen[0]
    assert (namespace, name, context) == ("ns", "j", "kopf's context")
    assert thread.startswith("handlers")
