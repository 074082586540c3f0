"""A child's event pokes its FineTuneJob: one pass per job queued at a time, however many events.

Every event on a job's children (its preparation Job and pod, its training object and pods, its
registration and alias Jobs) asks for the same thing: a pass over that job, reading what is there
now. Under a burst (hack/bench_operator_scale.py: 500 jobs applied at once) a job's children send
a dozen events within seconds: a preparation pod alone is created, scheduled, started and ended.
A pass for each, every one a dozen requests in a row and each waiting for the job's lock in a
handler thread, kept the handlers' threads busy with passes that learned nothing new, and a job
whose preparation had just completed waited behind them.

So a child's event, handled in kopf's event loop, only pokes the job (:meth:`Pokes.poke`): a job with
no pass queued gets one in the handlers' pool; a job whose pass is queued and not started yet needs
nothing more (that pass reads the job and its children when it starts, so it sees what the event
announced); a job whose pass is running gets exactly one more after it (the running pass may have
read the child before the event's change). No event is lost and none waits for a thread.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import enum
import logging
import threading
from collections.abc import Callable
from typing import Any

Key = tuple[str, str]  # (namespace, FineTuneJob name)
PassFn = Callable[[str, str, Any], None]  # (namespace, name, logger): one pass over the job


class _State(enum.Enum):
    QUEUED = "queued"  # submitted, not started: an event now needs nothing more
    RUNNING = "running"  # a pass is running: an event now asks for one more after it
    AGAIN = "again"  # running, and one more pass is owed when it ends


class Pokes:
    """At most one pass queued (and one running) per FineTuneJob for the events of its children."""

    def __init__(self, executor: concurrent.futures.Executor, run: PassFn) -> None:
        self._executor = executor
        self._run = run
        self._guard = threading.Lock()
        self._jobs: dict[Key, _State] = {}
        self.passes = 0  # passes run (for tests and the benchmark's profile)
        self.pokes = 0  # pokes received

    def poke(self, namespace: str, name: str, logger: Any) -> None:
        """Ask for a pass over the job; returns at once (called from kopf's event loop)."""
        key = (namespace, name)
        with self._guard:
            self.pokes += 1
            current = self._jobs.get(key)
            if current is _State.RUNNING:
                self._jobs[key] = _State.AGAIN
            if current is not None:
                return
            self._jobs[key] = _State.QUEUED
        # the handler's context goes along: kopf.event finds its queue through context variables
        context = contextvars.copy_context()
        self._executor.submit(context.run, self._passes, key, logger)

    def pending(self) -> int:
        """Jobs with a pass queued or running."""
        with self._guard:
            return len(self._jobs)

    def _passes(self, key: Key, logger: Any) -> None:
        while True:
            with self._guard:
                self._jobs[key] = _State.RUNNING
            try:
                self.passes += 1
                self._run(key[0], key[1], logger)
            except Exception:  # a child's event has no retry of its own: the next event, or the timers
                logging.getLogger(__name__).exception("pass over FineTuneJob %s/%s failed", *key)
            with self._guard:
                if self._jobs.get(key) is _State.AGAIN:
                    continue
                self._jobs.pop(key, None)
                return
