"""A cache of one kind of Kubernetes object, kept current by a watch: what a kubelet's informers do.

The pod runner (tests/support/podrunner.py) used to list pods, Services, claims, volumes and storage
classes about three times a second each, for every cluster of a test run: 14 LISTs a second of an
idle cluster, each one a read of every such object from etcd, its encoding in the API server and
its decoding into the Python client's models, whose cost grows with every pod a run leaves behind.
An :class:`Informer` lists once, then watches from that list's ``resourceVersion``, so the API
server sends only what changed; the runner's loops read the cache.

A watch that ends (its timeout, a dropped connection) is resumed from the last version seen; one
the API server no longer serves (410 Gone: too old) or any other error starts over with a fresh
list, which replaces the cache whole (an object deleted in between leaves it). ``changed`` is set
after every change, for a loop that wants to act at once rather than at its next tick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

# How long one watch request lasts before it is renewed from the last version seen (the API server
# ends it with an empty response), and how long to wait after an error before listing again.
WATCH_SECONDS = 30
RETRY_S = 0.5


class Informer:
    """``list_fn`` (a list call of the Python client, e.g. ``CoreV1Api.list_pod_for_all_namespaces``)
    with ``list_kwargs``, listed once and then watched, in a daemon thread of its own."""

    def __init__(self, list_fn: Callable[..., Any], name: str, **list_kwargs: Any) -> None:
        self.list_fn = list_fn
        self.name = name
        self.list_kwargs = list_kwargs
        self.changed = threading.Event()
        self.synced = threading.Event()
        self.errors: list[str] = []
        self._objects: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"informer-{self.name}")
        self._thread.start()

    def stop(self) -> None:
        """The thread ends at its watch's next event or end (a daemon: nothing waits for it)."""
        self._stop.set()

    def wait_synced(self, timeout: float) -> None:
        if not self.synced.wait(timeout):
            raise TimeoutError(f"informer {self.name}: no list in {timeout:.0f}s: {self.errors[-3:]}")

    def items(self) -> list[Any]:
        """The objects as last seen (a snapshot: safe to iterate while the cache changes)."""
        with self._lock:
            return list(self._objects.values())

    # --- the thread --------------------------------------------------------------------------------

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version = self._list()
                while not self._stop.is_set():
                    version = self._watch(version)
            except Exception as e:  # 410 Gone, a dropped connection, a server stopping: list again
                if self._stop.is_set():
                    return
                self.errors.append(f"{type(e).__name__}: {e}"[:300])
                del self.errors[:-20]
                self._stop.wait(RETRY_S)

    def _list(self) -> str:
        listed = self.list_fn(**self.list_kwargs)
        with self._lock:
            self._objects = {o.metadata.uid: o for o in listed.items}
        self.synced.set()
        self.changed.set()
        return str(listed.metadata.resource_version)

    def _watch(self, version: str) -> str:
        """One watch request from ``version``; returns the last version seen (to resume from)."""
        from kubernetes import watch

        stream = watch.Watch()
        for event in stream.stream(
            self.list_fn,
            resource_version=version,
            timeout_seconds=WATCH_SECONDS,
            allow_watch_bookmarks=True,
            **self.list_kwargs,
        ):
            if self._stop.is_set():
                stream.stop()
                break
            kind, obj = event["type"], event["object"]
            if kind == "BOOKMARK":
                version = str(event["raw_object"]["metadata"]["resourceVersion"])
                continue
            with self._lock:
                if kind == "DELETED":
                    self._objects.pop(obj.metadata.uid, None)
                else:  # ADDED, MODIFIED
                    self._objects[obj.metadata.uid] = obj
            version = str(obj.metadata.resource_version)
            self.changed.set()
        return version
