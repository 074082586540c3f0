"""What the operator observes of a FineTuneJob's children, folded into what the state machine
(:mod:`kubetune_operator.state`) decides on: the training object's decisive condition (a PyTorchJob's,
or a TrainJob's mapped onto the same conditions), the registration
(and alias) Job with its pods' results, why training pods cannot start, and a child request the API
server refused. Pure: the reads are the reconciler's.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from kubetune_api.engines import Engine
from kubetune_api.preparation import PreparationRefusal, PreparationReport, parse_termination_message
from kubetune_api.registration import GATE_NOT_MET
from kubetune_api.status import ConditionType, Phase, Reason

from .builders import TRAIN_CONTAINER, TRAINJOB_CONTAINER, TRAINJOB_STEP, step_job_name

# the training pods cannot start (Training, and Ready while not trained): most decisive first
POD_TROUBLE = (Reason.PODS_NOT_CREATED, Reason.UNSCHEDULABLE, Reason.MOUNT_FAILED, Reason.IMAGE_PULL_FAILED)
# The kubelet's and the attach-detach controller's Warning events of a pod whose volumes cannot be had
MOUNT_EVENT_REASONS = frozenset({"FailedMount", "FailedAttachVolume"})

# PyTorchJob condition types, most decisive first: the first one that is True wins.
TRAINING_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")
# A TrainJob's (Kubeflow Trainer v2.2) condition types, most decisive first, and the PyTorchJob
# condition each one means: Trainer v2 writes only these three (Complete and Failed copied from its
# JobSet, with the JobSet's reason and message); running comes from its ``jobsStatus``.
TRAINJOB_PRECEDENCE = (("Failed", "Failed"), ("Complete", "Succeeded"), ("Suspended", "Suspended"))


# --- observations -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingObservation:
    """What the PyTorchJob says: its decisive condition, if any."""

    exists: bool = False
    condition: str | None = None  # one of TRAINING_PRECEDENCE, or None (no status yet)
    reason: str = ""
    message: str = ""


# the states in which a registration or alias Job has ended
JOB_ENDED = ("Complete", "Skipped", "Failed", "GateNotMet")


@dataclass(frozen=True)
class RegistrationObservation:
    """What the registration Job (and its pod's termination message) says."""

    exists: bool = False
    # Skipped: Complete, but the pod read registration.enabled false (turned off while it ran)
    # GateNotMet: Failed with spec.registration.gate not met (nothing registered; message: both numbers)
    state: Literal["Running", "Complete", "Skipped", "Failed", "GateNotMet"] | None = None
    message: str = ""
    # the parsed termination message of the successful pod (GateNotMet: {reason, error, evaluation})
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class PreparationObservation:
    """What the preparation Job (and its pods' termination messages) says."""

    exists: bool = False
    state: Literal["Running", "Succeeded", "Failed"] | None = None
    report: PreparationReport | None = None  # Succeeded: what it found and estimated
    refusal: PreparationRefusal | None = None  # Failed with a named reason
    message: str = ""  # Failed without one (a crash, the deadline): the Job's reason and the log tail
    # Running, and its pod cannot start: (reason, the scheduler's or the kubelet's words)
    trouble: tuple[str, str] | None = None


def serves(resources: dict[str, Any] | None, plural: str) -> bool:
    """Whether a discovery answer (an ``APIResourceList``; None: the group and version are not
    served) lists the resource ``plural``."""
    return any(r.get("name") == plural for r in (resources or {}).get("resources") or [])


# --- the training pods ---------------------------------------------------------------------------------

# A pod the scheduler has not placed for this long is shown (``Unschedulable``). A shorter wait is
# normal: the checkpoint volume being provisioned, preemption making room, a node autoscaler.
SHOW_UNSCHEDULABLE_AFTER = 30.0
# The kubelet's waiting reasons of a container whose image cannot be had.
IMAGE_PULL_REASONS = frozenset(
    {
        "ErrImagePull",
        "ImagePullBackOff",
        "ErrImageNeverPull",
        "InvalidImageName",
        "ImageInspectError",
        "RegistryUnavailable",
        "SignatureValidationFailed",
    }
)
# What the Training Operator (v1.9) records on the PyTorchJob for each pod it creates or fails to
# create: a Warning ``FailedCreatePod`` "Error creating: <the API server's answer>" (which names
# ``pods "<pod>"``) and a Normal ``SuccessfulCreatePod`` "Created pod: <pod>". It sets no condition
# for a failure, and retries with a growing backoff.
FAILED_CREATE_POD = "FailedCreatePod"
SUCCESSFUL_CREATE_POD = "SuccessfulCreatePod"
# The label the Training Operator puts on the pods of a PyTorchJob (its name as the value).
TRAINING_OPERATOR_JOB_LABEL = "training.kubeflow.org/job-name"
# The label JobSet puts on the pods of a TrainJob (the JobSet is named as the TrainJob).
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
# Each engine's label on its training pods (the training object's name as the value), and the name
# of the trainer's container in them.
TRAINING_POD_LABEL = {Engine.PYTORCHJOB: TRAINING_OPERATOR_JOB_LABEL, Engine.TRAINJOB: JOBSET_NAME_LABEL}
TRAINING_CONTAINER = {Engine.PYTORCHJOB: TRAIN_CONTAINER, Engine.TRAINJOB: TRAINJOB_CONTAINER}


# The JobSet a TrainJob runs on (Trainer v2 names it as the TrainJob, ``JOBSET_API_VERSION``): its
# ``status.restarts`` counts every restart of the whole gang (a TrainJob's status does not say it restarted).


def jobset_restarts(jobset: dict[str, Any]) -> int:
    """How many times the JobSet restarted its Jobs (``status.restarts``: counted or not against its
    ``maxRestarts``)."""
    return int((jobset.get("status") or {}).get("restarts") or 0)


def engine_of(training: dict[str, Any]) -> Engine:
    """The engine of a training object, by its kind."""
    return Engine.TRAINJOB if training.get("kind") == str(Engine.TRAINJOB) else Engine.PYTORCHJOB


def training_pod_selector(training: dict[str, Any]) -> str:
    """The label selector of a training object's pods (``kubectl logs -l``, the operator's lists)."""
    return f"{TRAINING_POD_LABEL[engine_of(training)]}={(training.get('metadata') or {}).get('name')}"


def training_container_of_pod(pod: dict[str, Any]) -> str:
    """The trainer's container in a training pod (by the label its engine put on it)."""
    pod_labels = (pod.get("metadata") or {}).get("labels") or {}
    return TRAINJOB_CONTAINER if JOBSET_NAME_LABEL in pod_labels else TRAIN_CONTAINER


_POD_IN_ERROR = re.compile(r'\bpods? "([^"]+)"')
# What the Job controller records on a Job (a TrainJob's JobSet's) for a pod it cannot create
JOB_FAILED_CREATE = "FailedCreate"
JOB_SUCCESSFUL_CREATE = "SuccessfulCreate"
_POD_CREATED = re.compile(r"Created pod: (\S+)")


# The PyTorchJob's decisive conditions under which its pods should be starting or running (None: no
# status yet; the Training Operator v1.9 writes none while it cannot create a pod: it returns the
# error before its status update).
POD_CONDITIONS = (None, "Created", "Running", "Restarting")


@dataclass(frozen=True)
class PodTrouble:
    """Why a training pod cannot start, in its controller's own words."""

    reason: str  # one of POD_TROUBLE
    pod: str
    message: str  # the scheduler's, the Training Operator's or the kubelet's message, verbatim
    since: str = ""  # RFC 3339: when it began, where known (the PodScheduled condition's transition)
    others: int = 0  # more pods with the same trouble


@dataclass(frozen=True)
class PodsObservation:
    """The PyTorchJob's pods while they are not all running (``pods_running`` is False)."""

    trouble: PodTrouble | None = None
    # pods the Training Operator has not created, with nothing yet saying why: look again soon
    missing: tuple[str, ...] = ()


def replica_pods(pytorchjob: dict[str, Any]) -> list[str]:
    """The pods the Training Operator makes for a PyTorchJob: ``<name>-<replica type>-<index>``. A
    TrainJob's pods have random names (``<name>-node-0-<index>-<5>``): none is named in advance."""
    if engine_of(pytorchjob) == Engine.TRAINJOB:
        return []
    name = (pytorchjob.get("metadata") or {}).get("name") or ""
    specs = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    out = []
    for rtype in sorted(specs, key=lambda t: (t != "Master", t)):
        replicas = (specs[rtype] or {}).get("replicas")
        for index in range(1 if replicas is None else int(replicas)):
            out.append(f"{name}-{rtype.lower()}-{index}")
    return out


def pods_running(pytorchjob: dict[str, Any] | None) -> bool:
    """Whether the PyTorchJob's status counts every replica as running (``replicaStatuses.*.active``,
    the Training Operator's count of Running pods): then the pods need no look."""
    if pytorchjob is None:
        return False
    if engine_of(pytorchjob) == Engine.TRAINJOB:
        # JobSet's ``ready``: the Jobs whose pods are all ready (or done); one Job holds every node
        return any(
            int(j.get("ready") or 0) >= 1
            for j in _trainjob_steps(pytorchjob)
            if j.get("name") == TRAINJOB_STEP
        )
    specs = (pytorchjob.get("spec") or {}).get("pytorchReplicaSpecs") or {}
    counts = (pytorchjob.get("status") or {}).get("replicaStatuses") or {}
    if not specs:
        return False
    for rtype, spec in specs.items():
        replicas = (spec or {}).get("replicas")
        wanted = 1 if replicas is None else int(replicas)
        if int((counts.get(rtype) or {}).get("active") or 0) < wanted:
            return False
    return True


def pods_observation(
    pytorchjob: dict[str, Any],
    pods: list[dict[str, Any]],
    events: list[dict[str, Any]],
    pod_events: list[dict[str, Any]] | None = None,
) -> PodsObservation:
    """Fold the PyTorchJob's pods and events into why its pods cannot start, if they cannot.

    ``pods``: those labelled ``training.kubeflow.org/job-name=<PyTorchJob>`` (only this PyTorchJob's,
    by owner uid, count); ``events``: the PyTorchJob's (empty when no pod is missing). A pod that is
    missing is explained by the newest ``FailedCreatePod`` naming it, unless a ``SuccessfulCreatePod``
    for it came later (it was created since, then deleted: preempted, restarted). Troubles are ranked
    by ``POD_TROUBLE``, then by pod name; the first is reported, the others of its kind counted.
    """
    uid = (pytorchjob.get("metadata") or {}).get("uid")
    live = _live_pods(pytorchjob, pods)
    missing = missing_pods(pytorchjob, pods)
    troubles: list[PodTrouble] = []
    if engine_of(pytorchjob) == Engine.TRAINJOB and trainjob_pods_missing(pytorchjob, pods):
        troubles.extend(_trainjob_not_created(pytorchjob, events))
    unexplained: list[str] = []
    failures = _creation_failures(events, uid) if missing else {}
    for name in missing:
        failure = failures.get(name) or failures.get("")
        if failure is None:
            unexplained.append(name)
        else:
            troubles.append(PodTrouble(Reason.PODS_NOT_CREATED, name, failure[1], since=failure[0]))
    mounts = _mount_failures(pod_events or [])
    for name in sorted(live):
        troubles.extend(_pod_troubles(live[name], mounts))
    if not troubles:
        return PodsObservation(missing=tuple(unexplained))
    troubles.sort(key=lambda t: (POD_TROUBLE.index(t.reason), t.pod))
    first = troubles[0]
    same = {t.pod for t in troubles if t.reason == first.reason}
    return PodsObservation(
        trouble=PodTrouble(first.reason, first.pod, first.message, first.since, len(same) - 1),
        missing=tuple(unexplained),
    )


def trainjob_step_job(trainjob: dict[str, Any]) -> str:
    """The Job of a TrainJob's training pods (``builders.step_job_name``)."""
    return step_job_name(str((trainjob.get("metadata") or {}).get("name")))


def trainjob_pods_missing(trainjob: dict[str, Any], pods: list[dict[str, Any]]) -> bool:
    """Whether fewer of a TrainJob's pods exist than its nodes (``spec.trainer.numNodes``)."""
    nodes = int(((trainjob.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)
    return len(_live_pods(trainjob, pods)) < nodes


def _trainjob_not_created(trainjob: dict[str, Any], events: list[dict[str, Any]]) -> list[PodTrouble]:
    """Why a TrainJob's pod is missing: the Job controller's newest ``FailedCreate`` on its Job
    (``events``), unless a pod was created since (its names are generated: any later
    ``SuccessfulCreate`` outdates it)."""
    failed: tuple[datetime, str] | None = None
    created: datetime | None = None
    for e in events:
        when = _event_time(e)
        if when is None:
            continue
        if e.get("reason") == JOB_FAILED_CREATE and (failed is None or failed[0] < when):
            failed = (when, str(e.get("message") or ""))
        elif e.get("reason") == JOB_SUCCESSFUL_CREATE and (created is None or created < when):
            created = when
    if failed is None or (created is not None and created >= failed[0]):
        return []
    match = _POD_IN_ERROR.search(failed[1])
    pod = match.group(1) if match else f"a pod of Job {trainjob_step_job(trainjob)}"
    return [PodTrouble(Reason.PODS_NOT_CREATED, pod, failed[1], since=_rfc3339(failed[0]))]


def missing_pods(pytorchjob: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    """The PyTorchJob's pods (``replica_pods``) that do not exist, or are being deleted."""
    live = _live_pods(pytorchjob, pods)
    return [name for name in replica_pods(pytorchjob) if name not in live]


def _live_pods(pytorchjob: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    uid = (pytorchjob.get("metadata") or {}).get("uid")
    # a TrainJob's pods belong to its JobSet's Jobs: the JobSet's label (its name) selected them
    trainjob = engine_of(pytorchjob) == Engine.TRAINJOB
    return {
        p["metadata"]["name"]: p
        for p in pods
        if (trainjob or _owned_by(p, uid)) and not (p.get("metadata") or {}).get("deletionTimestamp")
    }


def _mount_failures(events: list[dict[str, Any]]) -> dict[str, str]:
    """Per pod uid, the newest FailedMount / FailedAttachVolume message."""
    newest: dict[str, tuple[datetime, str]] = {}
    for e in events:
        uid = str((e.get("involvedObject") or {}).get("uid") or "")
        when = _event_time(e)
        if e.get("reason") not in MOUNT_EVENT_REASONS or not uid or when is None:
            continue
        if uid not in newest or newest[uid][0] <= when:
            newest[uid] = (when, f"{e.get('reason')}: {e.get('message') or ''}")
    return {uid: text for uid, (_, text) in newest.items()}


def _pod_troubles(pod: dict[str, Any], mounts: dict[str, str] | None = None) -> list[PodTrouble]:
    name = (pod.get("metadata") or {}).get("name") or ""
    status = pod.get("status") or {}
    out = []
    mount = (mounts or {}).get(str(pod["metadata"].get("uid")))
    if status.get("phase") in (None, "Pending") and mount:
        out.append(PodTrouble(Reason.MOUNT_FAILED, name, mount))
    if status.get("phase") in (None, "Pending"):
        for c in status.get("conditions") or []:
            if (
                c.get("type") == "PodScheduled"
                and c.get("status") == "False"
                and c.get("reason") == Reason.UNSCHEDULABLE
            ):
                message = c.get("message") or "no node fits the pod"
                out.append(
                    PodTrouble(Reason.UNSCHEDULABLE, name, message, since=c.get("lastTransitionTime") or "")
                )
    for cs in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in IMAGE_PULL_REASONS:
            detail = f"container {cs.get('name')} (image {cs.get('image')}): {waiting['reason']}"
            if waiting.get("message"):
                detail += f": {waiting['message']}"
            out.append(PodTrouble(Reason.IMAGE_PULL_FAILED, name, detail))
            break
    return out


def _creation_failures(events: list[dict[str, Any]], uid: str | None) -> dict[str, tuple[str, str]]:
    """Per pod name, the newest ``FailedCreatePod`` (time, message) that no ``SuccessfulCreatePod``
    followed; a failure naming no pod under ``""`` (then any later creation outdates it)."""
    failed: dict[str, tuple[datetime, str, str]] = {}
    created: dict[str, datetime] = {}
    for e in events:
        involved = e.get("involvedObject") or {}
        if uid is not None and involved.get("uid") not in (None, uid):
            continue
        when, text = _event_time(e), str(e.get("message") or "")
        if when is None:
            continue
        if e.get("reason") == FAILED_CREATE_POD:
            match = _POD_IN_ERROR.search(text)
            key = match.group(1) if match else ""
            if key not in failed or failed[key][0] < when:
                failed[key] = (when, _rfc3339(when), text)
        elif e.get("reason") == SUCCESSFUL_CREATE_POD and (match := _POD_CREATED.search(text)):
            created[match.group(1)] = max(when, created.get(match.group(1), when))
    newest_creation = max(created.values(), default=None)
    out = {}
    for key, (when, stamp, text) in failed.items():
        after = created.get(key) if key else newest_creation
        if after is None or when > after:  # a creation in the same second wins
            out[key] = (stamp, text)
    return out


def _event_time(event: dict[str, Any]) -> datetime | None:
    """When an Event (core/v1, as client-go's recorder writes it) last happened."""
    for value in (
        (event.get("series") or {}).get("lastObservedTime"),
        event.get("lastTimestamp"),
        event.get("eventTime"),
        (event.get("metadata") or {}).get("creationTimestamp"),
    ):
        if value and (when := parse_time(str(value))) is not None:
            return when
    return None


def parse_time(value: str) -> datetime | None:
    """An RFC 3339 time (``Z`` or an offset, fractions of a second allowed); None when it is not one."""
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _rfc3339(when: datetime) -> str:
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def settling(status: dict[str, Any] | None) -> bool:
    """A status whose pods may still be starting, or restarting, with nothing wrong known yet
    (Training condition ``WaitingForTrainingOperator``, ``TrainingCreated`` or
    ``TrainingRestarting``): the operator looks again every retry interval, since a pod the Training
    Operator cannot create changes nothing the operator watches (no pod, no PyTorchJob status) and a
    wait that grows long (``SHOW_UNSCHEDULABLE_AFTER``) is only seen by looking."""
    status = status or {}
    if status.get("phase") not in (Phase.PENDING.value, Phase.TRAINING.value):
        return False
    training = next(
        (
            c
            for c in status.get("conditions") or []
            if isinstance(c, dict) and c.get("type") == ConditionType.TRAINING
        ),
        None,
    )
    return training is not None and training.get("reason") in (
        Reason.WAITING_FOR_TRAINING_OPERATOR,
        Reason.TRAINING_CREATED,
        Reason.TRAINING_RESTARTING,
    )


# --- Kueue's Workload ------------------------------------------------------------------------------------

# Kueue (v0.17) makes one Workload per job it queues, labelled with the job's uid and owned by it;
# the operator reads it only while the training object is suspended under a queue (why it is held).
KUEUE_WORKLOAD_API_VERSION = "kueue.x-k8s.io/v1beta2"
KUEUE_JOB_UID_LABEL = "kueue.x-k8s.io/job-uid"
# The Workload's condition types Kueue sets when it takes the admission back: Evicted (reason
# Preempted, PodsReadyTimeout, AdmissionCheck, ClusterQueueStopped, LocalQueueStopped, NodeFailures,
# Deactivated, ...) and, for a preemption, Preempted (reason InClusterQueue, InCohortReclamation,
# InCohortFairSharing, InCohortReclaimWhileBorrowing). Re-admitted, both turn False (reason
# QuotaReserved, message "Previously: ...").
KUEUE_EVICTED = "Evicted"
KUEUE_PREEMPTED = "Preempted"
KUEUE_EVICTED_BY_PREEMPTION = "Preempted"


@dataclass(frozen=True)
class KueueWorkload:
    """What Kueue's Workload of a suspended training object says: whether Kueue evicted it (took its
    admission back: preempted it, or another eviction) and why, in Kueue's words."""

    name: str = ""
    evicted: bool = False
    reason: str = ""  # the Evicted condition's: Preempted, PodsReadyTimeout, Deactivated, ...
    preemption_reason: str = ""  # the Preempted condition's: InClusterQueue, InCohortReclamation, ...
    message: str = ""  # Kueue's message (the Preempted condition's when there is one)
    since: str = ""  # RFC 3339: the Evicted condition's lastTransitionTime

    @property
    def preempted(self) -> bool:
        return self.evicted and self.reason == KUEUE_EVICTED_BY_PREEMPTION


def kueue_workload(workloads: list[dict[str, Any]], training_uid: str | None) -> KueueWorkload | None:
    """Fold the Workloads labelled with the training object's uid into what Kueue says of it (None:
    there is none: Kueue has not made it yet, or does not manage the object). One owned by the
    training object (by uid) is preferred; a finished one is never taken over a live one."""
    if not workloads:
        return None

    def rank(w: dict[str, Any]) -> tuple[bool, bool]:
        refs = (w.get("metadata") or {}).get("ownerReferences") or []
        owned = any(r.get("uid") == training_uid for r in refs)
        finished = any(
            c.get("type") == "Finished" and c.get("status") == "True"
            for c in (w.get("status") or {}).get("conditions") or []
        )
        return (not owned, finished)

    workload = sorted(workloads, key=rank)[0]
    name = str((workload.get("metadata") or {}).get("name") or "")
    conditions = {
        c.get("type"): c
        for c in (workload.get("status") or {}).get("conditions") or []
        if isinstance(c, dict)
    }
    evicted = conditions.get(KUEUE_EVICTED) or {}
    if evicted.get("status") != "True":
        return KueueWorkload(name=name)
    preempted = conditions.get(KUEUE_PREEMPTED) or {}
    preempted_now = preempted.get("status") == "True"
    return KueueWorkload(
        name=name,
        evicted=True,
        reason=str(evicted.get("reason") or ""),
        preemption_reason=str(preempted.get("reason") or "") if preempted_now else "",
        message=str((preempted.get("message") if preempted_now else None) or evicted.get("message") or ""),
        since=str(evicted.get("lastTransitionTime") or ""),
    )


# --- the API server refusing a child -------------------------------------------------------------------

# What a refusal means, by what the operator was doing and the API server's HTTP status:
# - rejected: creating the child was refused as invalid (422 Invalid, 400 BadRequest, 413 too large).
#   The object is built from the spec alone, so the same spec is refused again every time: the job
#   is Failed (``ChildRejected``) until a new spec generation reopens it.
# - forbidden: 403, for any request. A ResourceQuota ("exceeded quota"), the operator's RBAC, a
#   namespace being deleted or an admission policy that answers Forbidden: all can change without
#   the spec changing (quota freed, RBAC fixed), so the job is not failed. It shows at once
#   (``ChildForbidden``, an Event) and is retried with backoff.
# - transient: anything else (no answer, 429, 5xx, a webhook that cannot be reached, 404 for a
#   kind whose CRD is missing, an update refused): retried with backoff, shown (``ChildApiError``)
#   once it has failed SHOW_TRANSIENT_AFTER times in a row. 409 never gets here: ``ensure`` treats
#   "already exists" as ours or as a ``ChildConflict``.
Verdict = Literal["rejected", "forbidden", "transient"]
REJECTED_STATUSES = (400, 413, 422)
SHOW_TRANSIENT_AFTER = 3


def verdict(verb: str, code: int) -> Verdict:
    """What an API server's ``code`` for a ``verb`` (create, get, list, update) on a child means."""
    if code == 403:
        return "forbidden"
    if verb == "create" and code in REJECTED_STATUSES:
        return "rejected"
    return "transient"


def retry_delay(attempts: int, base: float, cap: float) -> float:
    """Seconds before the next try after ``attempts`` failed passes in a row: doubling from ``base``."""
    return float(min(cap, base * 2 ** min(max(attempts - 1, 0), 16)))


@dataclass(frozen=True)
class ChildError:
    """The API server's answer to a request about one child (HTTP ``code`` 0: no answer at all)."""

    verb: str  # create, get, list, update
    kind: str
    name: str
    code: int
    reason: str  # the Status' reason (Invalid, Forbidden, ...) or the HTTP reason
    message: str  # what the API server said, verbatim
    attempts: int = 1  # passes in a row that met an error (this one included)

    @property
    def verdict(self) -> Verdict:
        return verdict(self.verb, self.code)

    def describe(self) -> str:
        """``creating PyTorchJob j-train: 422 Invalid: <the API server's message>``."""
        doing = {"create": "creating", "get": "reading", "list": "listing", "update": "updating"}
        answer = (
            f"{self.code} {self.reason}" if self.code else f"no answer from the API server ({self.reason})"
        )
        return f"{doing.get(self.verb, self.verb)} {self.kind} {self.name}: {answer}: {self.message}"


def training_observation(pytorchjob: dict[str, Any] | None) -> TrainingObservation:
    """Fold a PyTorchJob's status conditions into its one decisive condition (a TrainJob's:
    :func:`trainjob_observation`)."""
    if pytorchjob is None:
        return TrainingObservation()
    if engine_of(pytorchjob) == Engine.TRAINJOB:
        return trainjob_observation(pytorchjob)
    conditions = (pytorchjob.get("status") or {}).get("conditions") or []
    by_type = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    for kind in TRAINING_PRECEDENCE:
        if kind in by_type:
            c = by_type[kind]
            return TrainingObservation(True, kind, c.get("reason") or "", c.get("message") or "")
    return TrainingObservation(exists=True)


def _trainjob_steps(trainjob: dict[str, Any]) -> list[dict[str, Any]]:
    return [j for j in (trainjob.get("status") or {}).get("jobsStatus") or [] if isinstance(j, dict)]


def trainjob_observation(trainjob: dict[str, Any]) -> TrainingObservation:
    """Fold a TrainJob's status into the PyTorchJob condition it means (``TRAINING_PRECEDENCE``), so
    one state machine decides for both engines.

    ``Failed``, ``Complete`` (as ``Succeeded``) and ``Suspended``, when True, decide, with their
    reason and message. Otherwise a TrainJob whose training Job (``jobsStatus`` of the ``node``
    step) JobSet counts ``ready`` (every pod of it ready, or done) runs (``Running``: Trainer v2
    writes no running condition; a TrainJob never suspended has no condition at all), as a
    PyTorchJob runs once its pods do; one with a status but no ready Job yet was ``Created``
    (an ``active`` Job's pods may still wait for a node, or not exist: JobSet counts a Job active
    as soon as it has a pod, Pending included); one with no status is not followed by any
    Trainer controller yet."""
    status = trainjob.get("status") or {}
    conditions = status.get("conditions") or []
    by_type = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    for theirs, ours in TRAINJOB_PRECEDENCE:
        if theirs in by_type:
            c = by_type[theirs]
            return TrainingObservation(True, ours, c.get("reason") or "", c.get("message") or "")
    steps = [j for j in _trainjob_steps(trainjob) if j.get("name") == TRAINJOB_STEP]
    if any(int(j.get("ready") or 0) > 0 for j in steps):
        return TrainingObservation(True, "Running")
    if steps or conditions:
        return TrainingObservation(True, "Created")
    return TrainingObservation(exists=True)


def registration_observation(
    job: dict[str, Any] | None, pods: list[dict[str, Any]], container: str
) -> RegistrationObservation:
    """Fold the registration Job and its pods into one observation.

    The contract with ``python -m kubetune_trainer.register``: on success it writes one JSON object
    ``{"name", "version", "uri", "run_id", "alias"}`` to ``/dev/termination-log``; the operator reads
    it from ``status.containerStatuses[name=register].state.terminated.message`` of a pod of this Job
    (ownerReference to the Job's uid) that terminated with exit code 0, once the Job is Complete.
    On failure the message is ``{"error", "reason"}`` (or, after a crash, the log tail:
    terminationMessagePolicy FallbackToLogsOnError) and goes into the Failed status message; with
    reason ``GateNotMet`` (exit code ``EXIT_GATE_NOT_MET``) the Job failed on purpose: the state is
    ``GateNotMet`` and the result holds the message's ``evaluation``.
    """
    if job is None:
        return RegistrationObservation()
    uid = (job.get("metadata") or {}).get("uid")
    own_pods = [p for p in pods if _owned_by(p, uid)]
    result, failure_tail, skipped = _termination_messages(own_pods, container)
    conditions = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    gate = _gate_not_met(own_pods, container)
    if "Failed" in conditions and gate is not None:
        return RegistrationObservation(True, "GateNotMet", str(gate.get("error") or GATE_NOT_MET), gate)
    if "Failed" in conditions:
        c = conditions["Failed"]
        text = f"{c.get('reason') or 'Failed'}: {c.get('message') or 'the registration Job failed'}"
        if failure_tail:
            text += f"; last output: {failure_tail}"
        return RegistrationObservation(True, "Failed", text)
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        if result is None and skipped:
            return RegistrationObservation(True, "Skipped", "its pod read registration.enabled: false")
        return RegistrationObservation(True, "Complete", "", result)
    return RegistrationObservation(True, "Running")


def preparation_observation(
    job: dict[str, Any] | None, pods: list[dict[str, Any]], container: str
) -> PreparationObservation:
    """Fold the preparation Job and its pods into one observation.

    The contract with ``python -m kubetune_trainer.prepare`` (:mod:`kubetune_api.preparation`): its
    pod's termination message holds ``{"report": ...}`` (exit code 0) or ``{"refusal": ...}`` (exit
    code ``EXIT_REFUSED``, which fails the Job at once); after a crash it holds the log tail.
    """
    if job is None:
        return PreparationObservation()
    uid = (job.get("metadata") or {}).get("uid")
    outcome: PreparationReport | PreparationRefusal | None = None
    tail = ""
    own = sorted(
        (p for p in pods if _owned_by(p, uid)),
        key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "",
    )
    for pod in own:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") != container or not term:
                continue
            message = (term.get("message") or "").strip()
            parsed = parse_termination_message(message)
            if parsed is not None:
                outcome = parsed
            elif message or term.get("reason") not in (None, "Completed", "Error"):
                # the kubelet's reason says what the log cannot: OOMKilled
                how = f"{term.get('reason')}, exit code {term.get('exitCode')}"
                tail = f"({how}) {message[-500:]}".strip()
    conditions = {
        c.get("type"): c
        for c in (job.get("status") or {}).get("conditions") or []
        if c.get("status") == "True"
    }
    if "Failed" in conditions:
        if isinstance(outcome, PreparationRefusal):
            return PreparationObservation(True, "Failed", refusal=outcome)
        c = conditions["Failed"]
        text = f"{c.get('reason') or 'Failed'}: {c.get('message') or 'the preparation Job failed'}"
        if tail:
            text += f"; last output: {tail}"
        return PreparationObservation(True, "Failed", message=text)
    if "Complete" in conditions or "SuccessCriteriaMet" in conditions:
        if isinstance(outcome, PreparationReport):
            return PreparationObservation(True, "Succeeded", report=outcome)
        if not own:
            # its pods are gone (deleted by hand, garbage-collected): the prepared files are on the
            # volume all the same; only the report cannot be shown
            return PreparationObservation(True, "Succeeded")
    # running, or complete with its pod's status not read yet (it lags the Job's)
    troubles = [
        t
        for pod in own
        if not (pod.get("metadata") or {}).get("deletionTimestamp")
        for t in _pod_troubles(pod)
    ]
    trouble = (troubles[-1].reason, f"pod {troubles[-1].pod}: {troubles[-1].message}") if troubles else None
    return PreparationObservation(True, "Running", trouble=trouble)


def _owned_by(obj: dict[str, Any], uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return uid is not None and any(r.get("uid") == uid for r in refs)


def _termination_messages(
    pods: list[dict[str, Any]], container: str
) -> tuple[dict[str, Any] | None, str, bool]:
    """The successful pod's result, the last failure's text, and whether a pod skipped registering."""
    result: dict[str, Any] | None = None
    failure = ""
    skipped = False
    for pod in sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or ""):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            term = (cs.get("state") or {}).get("terminated") or {}
            if not term:
                continue
            message = (term.get("message") or "").strip()
            if term.get("exitCode") == 0:
                parsed = parse_registration_result(message)
                if parsed is not None:
                    result = parsed
                skipped = skipped or '"skipped"' in message
            elif message:
                failure = _failure_text(message)
    return result, failure, skipped


def _gate_not_met(pods: list[dict[str, Any]], container: str) -> dict[str, Any] | None:
    """The newest pod's ``{"reason": "GateNotMet", ...}`` termination message, if that is how it ended."""
    newest = sorted(pods, key=lambda p: (p.get("metadata") or {}).get("creationTimestamp") or "")
    for pod in reversed(newest):
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            term = (cs.get("state") or {}).get("terminated") or {}
            if cs.get("name") != container or not term:
                continue
            try:
                data = json.loads((term.get("message") or "").strip())
            except ValueError:
                return None
            return data if isinstance(data, dict) and data.get("reason") == GATE_NOT_MET else None
    return None


def _failure_text(message: str) -> str:
    """The register step writes ``{"error", "reason"}`` when it fails; a crash leaves a log tail."""
    try:
        data = json.loads(message)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("error"):
        return f"{data.get('reason') or 'Error'}: {data['error']}"[-1000:]
    return message[-500:]


def parse_registration_result(message: str) -> dict[str, Any] | None:
    """The JSON object the register step wrote (its last line, so a log tail still parses)."""
    for line in reversed(message.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and data.get("name") and data.get("version") is not None:
            return data
    return None


def shown_trouble(
    pods: PodsObservation,
    training: TrainingObservation,
    *,
    now: str,
    namespace: str,
    pytorchjob_name: str,
    kind: str = str(Engine.PYTORCHJOB),
) -> tuple[str, str] | None:
    """The pods' trouble as (reason, message) for the conditions; None when there is none to show
    (yet: a pod waits for a node ``SHOW_UNSCHEDULABLE_AFTER`` seconds before that is news)."""
    t = pods.trouble
    # no condition at all: the Training Operator writes none while it fails to create a pod
    if t is None or not training.exists or training.condition not in POD_CONDITIONS:
        return None
    pod = f"pod {t.pod}" + (f" (and {t.others} more)" if t.others else "")
    describe = f"kubectl describe pod -n {namespace} {t.pod}"
    if t.reason == Reason.UNSCHEDULABLE:
        began, seen = parse_time(t.since), parse_time(now)
        if (
            began is not None
            and seen is not None
            and (seen - began).total_seconds() < SHOW_UNSCHEDULABLE_AFTER
        ):
            return None
        return Reason.UNSCHEDULABLE, (
            f"the scheduler cannot place {pod}: {t.message}. Check spec.resources (gpusPerNode, gpuProduct: "
            "the nodes' nvidia.com/gpu.product label, cpu, memory, nodeSelector, tolerations) against the "
            "nodes and their free GPUs (kubectl get nodes -L nvidia.com/gpu.product); the pod starts by "
            "itself once a node fits"
        )
    if t.reason == Reason.PODS_NOT_CREATED:
        creator = (
            f"the Job controller cannot create {pod} of TrainJob {pytorchjob_name}"
            if kind == str(Engine.TRAINJOB)
            else f"the Training Operator cannot create {pod} of PyTorchJob {pytorchjob_name}"
        )
        retries = "the Job controller" if kind == str(Engine.TRAINJOB) else "the Training Operator"
        return Reason.PODS_NOT_CREATED, (
            f"{creator}: {t.message}. "
            "Fix what it names (spec.resources.priorityClassName must name an existing PriorityClass; a "
            f"ResourceQuota or an admission policy may refuse the pod); {retries} keeps retrying, "
            "with a growing backoff"
        )
    if t.reason == Reason.MOUNT_FAILED:
        return Reason.MOUNT_FAILED, (
            f"{pod} cannot mount its volumes: {t.message}. Check the checkpoint claim (status.children) and any "
            "model/dataset volume claims or Secrets (kubectl describe pvc), and the access mode (ReadWriteOnce "
            f"attaches to one node at a time); {describe}"
        )
    return Reason.IMAGE_PULL_FAILED, (
        f"{pod} cannot pull its image: {t.message}. Check that the image (spec.image, else the operator's "
        f"trainer image) exists and that the nodes can pull it (registry reachable, credentials); {describe}"
    )
