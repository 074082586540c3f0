"""Idempotent ``ensure_*`` steps: create a child if it is missing, never overwrite one that is not ours.

A child is ours when it has an owner reference with the FineTuneJob's uid, or, lacking any owner
reference (a PVC kept on delete), the ``kubetune.io/job-uid`` label with that uid. "Already exists"
is success only then; otherwise the step reports a conflict and leaves the object alone.

Any other refusal from the API server leaves a step as ``ChildApiError``: which child, what the
operator was doing with it, and the API server's answer (``state.ChildError`` decides what it means).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import yaml

from kubetune_api import admission
from kubetune_api import spec as api

from . import builders
from .kube import ApiError, Kube

log = logging.getLogger(__name__)


class ChildApiError(Exception):
    """The API server refused (or did not answer) a request about one child."""

    def __init__(self, verb: str, kind: str, name: str, error: ApiError) -> None:
        super().__init__(f"{verb} {kind} {name}: {error}")
        self.verb = verb
        self.kind = kind
        self.name = name
        self.error = error


@contextlib.contextmanager
def about_child(verb: str, kind: str, name: str) -> Iterator[None]:
    """Requests inside name the child they are about when the API server refuses them."""
    try:
        yield
    except ApiError as e:
        raise ChildApiError(verb, kind, name, e) from e


@dataclass(frozen=True)
class Ensured:
    obj: dict[str, Any]
    created: bool = False
    conflict: str | None = None


def is_ours(obj: dict[str, Any], job: api.FineTuneJob) -> bool:
    meta = obj.get("metadata") or {}
    uid = job.metadata.uid
    refs = meta.get("ownerReferences") or []
    if refs:
        return any(r.get("uid") == uid for r in refs)
    return bool(uid) and (meta.get("labels") or {}).get(builders.LABEL_JOB_UID) == uid


def conflict_message(obj: dict[str, Any], kind: str, name: str) -> str:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    owner = ", ".join(f"{r.get('kind')}/{r.get('name')}" for r in refs) or "no owner"
    hint = " (or set spec.storage.existingClaim to use it)" if kind == "PersistentVolumeClaim" else ""
    return (
        f"{kind} {name} already exists and is not owned by this FineTuneJob ({owner}); kubetune does not "
        f"overwrite it: delete or rename it{hint}, and kubetune creates its own"
    )


def ensure(
    kube: Kube, manifest: dict[str, Any], job: api.FineTuneJob, *, create_first: bool = False
) -> Ensured:
    """Create the child unless an object of its name is there (ours: had; a stranger's: a conflict).
    ``create_first``: try the create before any read (a child not made yet costs one request, not
    two); one already there answers 409 and is read then."""
    kind, name = manifest["kind"], manifest["metadata"]["name"]
    ns = manifest["metadata"]["namespace"]
    existing = None
    if not create_first:
        with about_child("get", kind, name):
            existing = kube.get(manifest["apiVersion"], kind, ns, name)
    if existing is None:
        try:
            return Ensured(kube.create(manifest), created=True)
        except ApiError as e:
            if not e.conflict:
                raise ChildApiError("create", kind, name, e) from e
            # Someone (another reconcile of the same job, or a stranger) was faster.
            with about_child("get", kind, name):
                existing = kube.get(manifest["apiVersion"], kind, ns, name)
            if existing is None:
                raise ChildApiError("create", kind, name, e) from e
    if is_ours(existing, job):
        return Ensured(existing)
    return Ensured(existing, conflict=conflict_message(existing, kind, name))


def suspended(training: dict[str, Any]) -> bool:
    """Whether a training object is suspended: a PyTorchJob's ``runPolicy.suspend``, a TrainJob's
    ``spec.suspend``."""
    spec = training.get("spec") or {}
    if training.get("kind") == "TrainJob":
        return bool(spec.get("suspend"))
    return bool((spec.get("runPolicy") or {}).get("suspend"))


def suspend_patch(training: dict[str, Any], suspend: bool) -> dict[str, Any]:
    """The merge patch that suspends (or resumes) a training object, marked as kubetune's doing."""
    field = (
        {"suspend": suspend} if training.get("kind") == "TrainJob" else {"runPolicy": {"suspend": suspend}}
    )
    mark = "true" if suspend else None
    return {"metadata": {"annotations": {builders.ANNOTATION_SUSPENDED_BY_US: mark}}, "spec": field}


def sync_suspend(kube: Kube, pytorchjob: dict[str, Any], job: api.FineTuneJob) -> dict[str, Any]:
    """Make the training object's suspension (a PyTorchJob's ``runPolicy.suspend``, a TrainJob's
    ``spec.suspend``) follow ``spec.suspend``; return the (possibly patched) object.

    Only what kubetune suspended is un-suspended: a training object that Kueue holds back for quota
    carries no ``kubetune.io/suspended-by-kubetune`` annotation and stays as Kueue wants it.
    """
    meta = pytorchjob.get("metadata") or {}
    by_us = (meta.get("annotations") or {}).get(builders.ANNOTATION_SUSPENDED_BY_US) == "true"
    patch: dict[str, Any] | None = None
    if job.spec.suspend and not (suspended(pytorchjob) and by_us):
        patch = suspend_patch(pytorchjob, True)
    elif not job.spec.suspend and by_us:
        patch = suspend_patch(pytorchjob, False)
    if patch is None:
        return pytorchjob
    kind = pytorchjob["kind"]
    with about_child("update", kind, meta["name"]):
        return kube.patch(pytorchjob["apiVersion"], kind, meta["namespace"], meta["name"], patch)


def sync_deadline(
    kube: Kube, pytorchjob: dict[str, Any], job: api.FineTuneJob, now: datetime
) -> dict[str, Any]:
    """Once the training runs, set its hard deadline (``activeDeadlineSeconds``) a margin above
    ``spec.budget``, counted from when it started running; return the (possibly patched) object.

    A PyTorchJob's is its ``runPolicy.activeDeadlineSeconds``. The Training Operator counts it from
    the PyTorchJob's ``status.startTime`` (its first look, or its last resume), waiting for GPUs
    included, while the budget counts the trainer's own time: so the deadline is set only when the
    pods run, as the time waited plus the budget's deadline, and again after a resume (a new
    ``startTime``) and after each restart of its pods (the Training Operator keeps ``startTime``
    across restarts, while the time a restarted pod waits for its GPUs again is not the trainer's
    either): a hung job still ends within the budget's deadline of its last start. The annotation
    records the start (and restarts) it was set for.

    A TrainJob's is its training Job's (:func:`_sync_trainjob_deadline`): the same deadline of each
    attempt, counted the same way.
    """
    budget = job.spec.budget
    res = job.spec.resources
    deadline = budget.deadline_seconds(max(1, res.gpus_per_node) * res.nodes) if budget else None
    if deadline is None:
        return pytorchjob
    if pytorchjob.get("kind") == "TrainJob":
        return _sync_trainjob_deadline(kube, pytorchjob, job, deadline, now)
    meta = pytorchjob.get("metadata") or {}
    started = (pytorchjob.get("status") or {}).get("startTime")
    restarts = job.status.training_restarts.total if job.status and job.status.training_restarts else 0
    arm_for = f"{started} after {restarts} restarts" if restarts else started
    done_for = (meta.get("annotations") or {}).get(builders.ANNOTATION_DEADLINE_FOR)
    if not started or done_for == arm_for:
        return pytorchjob
    patch = {
        "metadata": {"annotations": {builders.ANNOTATION_DEADLINE_FOR: arm_for}},
        "spec": {"runPolicy": {"activeDeadlineSeconds": _waited(started, now) + deadline}},
    }
    with about_child("update", "PyTorchJob", meta["name"]):
        return kube.patch(pytorchjob["apiVersion"], "PyTorchJob", meta["namespace"], meta["name"], patch)


def _waited(started: str, now: datetime) -> int:
    """Seconds from an object's ``status.startTime`` to ``now``."""
    start = datetime.fromisoformat(str(started).replace("Z", "+00:00"))
    return max(0, int((now - start).total_seconds()))


# The annotation's value on a TrainJob whose JobSet would restart a Job past its deadline (its
# runtime made by a kubetune without the deadline rule): no deadline is set on it
NO_DEADLINE_RULE = "unset: its JobSet has no rule failing it on a deadline"


def trainjob_attempt(trainjob: dict[str, Any], job: api.FineTuneJob) -> str:
    """A TrainJob's attempt, as the deadline is set once per attempt: its JobSet's restarts (each
    one makes new Jobs) and its last resume (which resets its Jobs' ``startTime``: the TrainJob's
    ``Suspended`` condition turned False)."""
    restarts = job.status.training_restarts if job.status else None
    count = (restarts.job_set_restarts or 0) if restarts else 0
    resumed = next(
        (
            c.get("lastTransitionTime")
            for c in (trainjob.get("status") or {}).get("conditions") or []
            if c.get("type") == "Suspended" and c.get("status") == "False"
        ),
        None,
    )
    return f"attempt {count} resumed {resumed or 'never'}"


def _sync_trainjob_deadline(
    kube: Kube, trainjob: dict[str, Any], job: api.FineTuneJob, deadline: int, now: datetime
) -> dict[str, Any]:
    """A TrainJob's hard deadline: ``activeDeadlineSeconds`` on its training Job (``<tj>-node-0``,
    made by its JobSet), set as on a PyTorchJob once the pods run: the time waited since the Job's
    ``status.startTime`` plus the budget's deadline. The Job controller then fails the Job with
    reason ``DeadlineExceeded`` and JobSet fails the JobSet on it (``builders.DEADLINE_RULE``), so
    the TrainJob fails and the status says ``DeadlineExceeded`` (``training_failures``).

    Per attempt, as on a PyTorchJob: a JobSet restart makes new Jobs and a resume resets the Job's
    ``startTime`` (both the Job controller and JobSet do), so each attempt is set anew; the Job
    records the start it was set for, the TrainJob the attempt (:func:`trainjob_attempt`), so a
    pass of an attempt already set reads nothing. Not the TrainJob's own ``spec.activeDeadlineSeconds``
    (Trainer v2.2): immutable, so it cannot wait until the pods run, and counted from the TrainJob's
    creation or resume, time waiting for GPUs included; and expired, Trainer deletes the JobSet.

    Set only where the JobSet fails on it (``builders.fails_on_deadline``): on a JobSet from a
    runtime of an older kubetune, a Job past its deadline would restart without end."""
    meta = trainjob.get("metadata") or {}
    ns, name = meta["namespace"], meta["name"]
    attempt = trainjob_attempt(trainjob, job)
    done_for = str((meta.get("annotations") or {}).get(builders.ANNOTATION_DEADLINE_FOR) or "")
    if done_for in (attempt, f"{attempt} {NO_DEADLINE_RULE}"):
        return trainjob
    with about_child("get", "JobSet", name):
        jobset = kube.get(builders.JOBSET_API_VERSION, "JobSet", ns, name)
    if jobset is None:
        return trainjob
    if builders.fails_on_deadline(jobset):
        step_name = builders.step_job_name(name)
        with about_child("get", "Job", step_name):
            step = kube.get("batch/v1", "Job", ns, step_name)
        if not _step_running(step):
            return trainjob  # not made yet, or the attempt's Job is going: the next pass sets it
        assert step is not None
        started = step["status"]["startTime"]
        step_meta = step["metadata"]
        if (step_meta.get("annotations") or {}).get(builders.ANNOTATION_DEADLINE_FOR) != started:
            patch = {
                # the uid: a precondition, so a Job made anew since it was read is not set for this one
                "metadata": {
                    "uid": step_meta["uid"],
                    "annotations": {builders.ANNOTATION_DEADLINE_FOR: started},
                },
                "spec": {"activeDeadlineSeconds": _waited(started, now) + deadline},
            }
            with about_child("update", "Job", step_name):
                kube.patch("batch/v1", "Job", ns, step_name, patch)
        mark = attempt
    else:
        log.warning("%s: TrainJob %s gets no hard deadline (%s)", job.metadata.name, name, NO_DEADLINE_RULE)
        mark = f"{attempt} {NO_DEADLINE_RULE}"
    with about_child("update", "TrainJob", name):
        return kube.patch(
            trainjob["apiVersion"],
            "TrainJob",
            ns,
            name,
            {"metadata": {"annotations": {builders.ANNOTATION_DEADLINE_FOR: mark}}},
        )


def _step_running(step: dict[str, Any] | None) -> bool:
    """Whether a TrainJob's training Job runs: started, not suspended, not being deleted, not over."""
    if step is None or (step.get("metadata") or {}).get("deletionTimestamp"):
        return False
    status = step.get("status") or {}
    over = any(
        c.get("type") in ("Failed", "Complete", "FailureTarget", "SuccessCriteriaMet")
        and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return bool(status.get("startTime")) and not (step.get("spec") or {}).get("suspend") and not over


def sync_config(kube: Kube, live: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """Keep our ConfigMap's trainer config current.

    Only the mutable parts of the spec can differ (``suspend``, ``registration.alias``,
    ``registration.enabled``): what shapes training is immutable. The registration step reads the
    alias from this file, so an alias changed after creation must reach it.
    """
    if live.get("data") == manifest["data"]:
        return live
    data = only_mutable(live, manifest)
    if live.get("data") == data:
        return live
    meta = live["metadata"]
    with about_child("update", "ConfigMap", meta["name"]):
        return kube.patch("v1", "ConfigMap", meta["namespace"], meta["name"], {"data": data})


def only_mutable(live: dict[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The trainer config to write over ``live``: the new one (``manifest``), unless its spec changes
    what may not change after creation, which an API server whose CRD lacks the transition rules
    (an older CRD, managed apart from the chart) admits. Then the live config with only the mutable
    paths (``kubetune_api.spec.MUTABLE_SPEC_PATHS``) taken from the new spec: the Python twin of the
    transition rules (``kubetune_api.admission.check_update``), so the gate, the checkpoint chosen or
    the model name of a created job cannot be loosened through the operator either."""
    try:
        old = yaml.safe_load(live["data"][builders.CONFIG_KEY])
        new = yaml.safe_load(manifest["data"][builders.CONFIG_KEY])
        problems = admission.check_update(old["spec"], new["spec"])
    except (KeyError, TypeError, yaml.YAMLError):
        return dict(manifest["data"])
    if not problems:
        return dict(manifest["data"])
    log.warning(
        "%s: spec changes not applied (immutable once created): %s",
        live["metadata"]["name"],
        "; ".join(p.split(":")[0] for p in problems),
    )
    spec = copy.deepcopy(old["spec"])
    for path in api.MUTABLE_SPEC_PATHS:
        *parents, last = path.split(".")
        source, target = new["spec"], spec
        for key in parents:
            source, target = source.get(key) or {}, target.setdefault(key, {})
        if last in source:
            target[last] = copy.deepcopy(source[last])
        else:
            target.pop(last, None)
    return {**live["data"], builders.CONFIG_KEY: yaml.safe_dump({**old, "spec": spec}, sort_keys=False)}
