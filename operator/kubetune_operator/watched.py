"""Each FineTuneJob's preparation Job and pods as their watch events last showed them.

The operator watches its preparation Jobs and pods (handlers: ``preparation_job_event``,
``preparation_pod_event``), and every event pokes the job. A pass over a preparing job needs exactly
what those events carried: the Job's conditions and its pods' statuses (the report is the pod's
termination message). Reading them again on every pass was two requests in a row of the four a
preparing job's pass makes (the Job, then its pods), on every event of every preparing job.

So the events' objects are kept here (only what a pass reads of them: metadata and status), and a
pass takes them from here when it has both the Job and at least one of its pods; otherwise (the
operator just started, the Job was just created, its pod's first event not handled yet) it reads
them as before. What is kept is never newer than the API server; it may be older by the events not
handled yet, each of which pokes the job again, so the last pass sees the last event. A fresh pass
(``Context.fresh``) reads them anyway.
"""

from __future__ import annotations

import threading
from typing import Any

Key = tuple[str, str]  # (namespace, FineTuneJob name)
_META = ("name", "namespace", "uid", "ownerReferences", "labels", "creationTimestamp", "deletionTimestamp")


def _slim(body: dict[str, Any]) -> dict[str, Any]:
    """What a pass reads of a preparation Job or pod: its metadata's identity and its status."""
    meta = body.get("metadata") or {}
    return {
        "apiVersion": body.get("apiVersion"),
        "kind": body.get("kind"),
        "metadata": {k: meta[k] for k in _META if k in meta},
        "status": body.get("status") or {},
    }


class Preparations:
    """The preparation Job and pods per FineTuneJob, from their watch events."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._jobs: dict[Key, dict[str, Any]] = {}
        self._pods: dict[Key, dict[str, dict[str, Any]]] = {}

    def saw(self, namespace: str, job: str, body: dict[str, Any], *, deleted: bool) -> None:
        """A watch event of the job's preparation Job or one of its pods."""
        key, kind = (namespace, job), body.get("kind")
        uid = str((body.get("metadata") or {}).get("uid") or "")
        with self._guard:
            if kind == "Job":
                if deleted:
                    self._jobs.pop(key, None)
                else:
                    self._jobs[key] = _slim(body)
            elif kind == "Pod":
                pods = self._pods.setdefault(key, {})
                if deleted:
                    pods.pop(uid, None)
                else:
                    pods[uid] = _slim(body)

    def get(self, namespace: str, job: str, name: str) -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        """The Job called ``name`` and its pods as last seen, or None when a pass must read them: the
        Job not seen yet (or another of that name), or none of its pods."""
        key = (namespace, job)
        with self._guard:
            seen = self._jobs.get(key)
            if seen is None or seen["metadata"].get("name") != name:
                return None
            uid = seen["metadata"].get("uid")
            pods = [
                p
                for p in (self._pods.get(key) or {}).values()
                if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
            ]
            return (seen, pods) if pods else None

    def forget(self, namespace: str, job: str) -> None:
        with self._guard:
            self._jobs.pop((namespace, job), None)
            self._pods.pop((namespace, job), None)


PREPARATIONS = Preparations()
