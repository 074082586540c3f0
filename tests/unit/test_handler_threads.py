"""The handlers under a burst (hack/bench_operator_scale.py): a FineTuneJob event that needs no pass
never waits for a handler thread, one that needs a pass runs it in the handlers' pool with kopf's
context, and the operator's client keeps a connection for each handler thread."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
from pathlib import Path
from typing import Any

import kopf
import pytest

from kubetune_operator import handlers

LOG = logging.getLogger("test")


def job(generation: int, observed: int | None, type: str = "MODIFIED") -> dict[str, Any]:
    status = {} if observed is None else {"phase": "Pending", "observedGeneration": observed}
    body = {"metadata": {"name": "j", "namespace": "ns", "generation": generation}, "status": status}
    return {"body": body, "namespace": "ns", "name": "j", "type": type, "logger": LOG}


@pytest.mark.parametrize(
    "event",
    [job(1, None, "ADDED"), job(1, 1), job(3, 3)],
    ids=["new job (the create handler's)", "observed", "observed, later generation"],
)
def test_an_event_that_needs_no_pass_returns_while_every_thread_is_busy(event: dict[str, Any]) -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    release = threading.Event()
    pool.submit(release.wait)  # the only thread is busy
    memo = kopf.Memo(executor=pool)  # and no client: a pass would fail

    async def handle() -> None:
        await asyncio.wait_for(handlers.finetunejob_unobserved(memo=memo, **event), timeout=5)

    try:
        asyncio.run(handle())
    finally:
        release.set()
        pool.shutdown()


def test_an_unobserved_generation_is_reconciled_in_the_pool_with_the_handlers_context(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    marker: contextvars.ContextVar[str] = contextvars.ContextVar("marker")
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="handlers")
    seen: list[tuple[str, str, str, str]] = []

    def reconcile(ctx: Any, namespace: str, name: str) -> None:
        seen.append((namespace, name, threading.current_thread().name, marker.get("lost")))

    monkeypatch.setattr(handlers, "reconcile", reconcile)
    memo = kopf.Memo(executor=pool, kube=None, settings=None)

    async def handle() -> None:
        marker.set("kopf's context")  # kopf.event finds its queue through context variables
        await handlers.finetunejob_unobserved(memo=memo, **job(2, 1))

    try:
        asyncio.run(handle())
    finally:
        pool.shutdown()
    assert len(seen) == 1
    namespace, name, thread, context = seen[0]
    assert (namespace, name, context) == ("ns", "j", "kopf's context")
    assert thread.startswith("handlers")


def test_the_client_keeps_a_connection_per_handler_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    settings = kopf.OperatorSettings()
    memo = kopf.Memo()
    handlers.configure(settings=settings, memo=memo)
    assert settings.execution.max_workers == handlers.HANDLER_THREADS > 6  # kopf's default on two cores
    assert memo.executor is settings.execution.executor
    pool = memo.kube.api.rest_client.pool_manager.connection_pool_kw
    assert pool["maxsize"] >= handlers.HANDLER_THREADS
