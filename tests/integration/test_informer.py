"""The pod runner's informer (tests/support/informer.py) on a real API server: its cache follows what
is created, changed and deleted, across the watch's renewals and across a dropped connection."""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from tests.support import informer as informer_module
from tests.support.informer import Informer

pytestmark = pytest.mark.integration


def _eventually(check: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the informer's cache never caught up"
        time.sleep(0.05)


def _data(informer: Informer) -> dict[str, dict[str, str]]:
    return {cm.metadata.name: dict(cm.data or {}) for cm in informer.items()}


@pytest.fixture
def core(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


@pytest.fixture
def started() -> Iterator[list[Informer]]:
    informers: list[Informer] = []
    yield informers
    for informer in informers:
        informer.stop()


def _config_map(name: str, value: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "data": {"value": value}}


def test_the_cache_follows_creates_changes_and_deletes(
    core: Any, namespace: str, started: list[Informer]
) -> None:
    core.create_namespaced_config_map(namespace, _config_map("before", "1"))
    informer = Informer(core.list_namespaced_config_map, "config-maps", namespace=namespace)
    started.append(informer)
    informer.start()
    informer.wait_synced(30)
    assert _data(informer) == {"before": {"value": "1"}}  # what the list found

    informer.changed.clear()
    core.create_namespaced_config_map(namespace, _config_map("after", "2"))
    assert informer.changed.wait(20), "no change signalled for a create"
    core.patch_namespaced_config_map("before", namespace, {"data": {"value": "changed"}})
    core.delete_namespaced_config_map("after", namespace)
    _eventually(lambda: _data(informer) == {"before": {"value": "changed"}})


def test_a_renewed_watch_misses_nothing(
    core: Any, namespace: str, started: list[Informer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Watches of one second: the objects made across many renewals are all in the cache."""
    monkeypatch.setattr(informer_module, "WATCH_SECONDS", 1)
    informer = Informer(core.list_namespaced_config_map, "config-maps", namespace=namespace)
    started.append(informer)
    informer.start()
    informer.wait_synced(30)
    for i in range(8):
        core.create_namespaced_config_map(namespace, _config_map(f"cm-{i}", str(i)))
        time.sleep(0.4)
    _eventually(lambda: _data(informer) == {f"cm-{i}": {"value": str(i)} for i in range(8)})


def test_after_a_dropped_connection_the_list_replaces_the_cache(
    core: Any, namespace: str, started: list[Informer]
) -> None:
    """While the watch is down an object is deleted: the next list drops it from the cache."""
    core.create_namespaced_config_map(namespace, _config_map("kept", "1"))
    core.create_namespaced_config_map(namespace, _config_map("deleted-meanwhile", "2"))
    watching, resume = threading.Event(), threading.Event()
    calls = {"watch": 0}

    @functools.wraps(core.list_namespaced_config_map)  # its docstring tells the watch the type
    def list_or_drop(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("watch"):
            calls["watch"] += 1
            if calls["watch"] == 1:  # the first watch: the connection drops
                watching.set()
                assert resume.wait(30)
                raise ConnectionResetError("connection dropped")
        return core.list_namespaced_config_map(*args, **kwargs)

    informer = Informer(list_or_drop, "config-maps", namespace=namespace)
    started.append(informer)
    informer.start()
    informer.wait_synced(30)
    assert watching.wait(30)
    assert set(_data(informer)) == {"kept", "deleted-meanwhile"}
    core.delete_namespaced_config_map("deleted-meanwhile", namespace)
    resume.set()
    _eventually(lambda: set(_data(informer)) == {"kept"})
    assert any("connection dropped" in e for e in informer.errors), informer.errors
