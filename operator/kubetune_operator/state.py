"""The FineTuneJob state machine: observations of the children in, the next status out. Pure.

Phases::

    Pending ──> Training ──> Registering ──> Succeeded
       │  ^        │  ^           │
       v  │        v  │           v
      Suspended <──┘  │         Failed  (also from Pending/Training: training failed, bad spec,
                      └─ (unsuspend)          a child the API server refused)

Succeeded and Failed are final. ``advance`` itself leaves Failed only for a job failed because the
API server refused a child (``ChildRejected``) whose spec changed since (``reopens``); registering a
final job again (on request, or once registration is turned on) is decided before it is called.
``advance(previous status, observation)`` returns the status fields the operator owns (never
``progress``/``checkpoints``, which the trainer reports) and the events to emit for the
transitions it made.

Conditions (Kubernetes conventions; ``reason`` is one of the CamelCase constants below):

- ``Ready``: True once the model is trained and registered (phase Succeeded).
- ``ChildrenReady``: the PVC, ConfigMap and PyTorchJob exist and are ours. False: ``ChildConflict``
  (a stranger's object has a child's name), ``ChildRejected`` (the API server refused to create a
  child as built from this spec: the job is Failed), ``ChildForbidden`` (403: quota, RBAC or an
  admission policy; retried), ``ChildApiError`` (no answer, 429, 5xx...: retried, shown after
  ``SHOW_TRANSIENT_AFTER`` attempts in a row).
- ``Training``: True while the PyTorchJob runs. False while it has not started; when its pods
  cannot start it says why (``pods_observation``): ``PodsNotCreated`` (the Training Operator's
  ``FailedCreatePod`` event: a missing PriorityClass, a quota, a policy), ``Unschedulable`` (the
  scheduler's message, once a pod has waited ``SHOW_UNSCHEDULABLE_AFTER`` seconds) or
  ``ImagePullFailed`` (the kubelet's waiting reason), naming the pod; cleared when they start.
- ``Suspended``: True while suspended (``spec.suspend``) or queued by Kueue.
- ``Registered``: True once MLflow has the model version.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION
from kubetune_api.status import (
    Condition,
    ConditionType,
    EventReason,
    FineTuneJobStatus,
    Phase,
    Reason,
    RegisteredModelStatus,
)

CONDITION_TYPES = (
    ConditionType.READY,
    ConditionType.CHILDREN_READY,
    ConditionType.TRAINING,
    ConditionType.SUSPENDED,
    ConditionType.REGISTERED,
)
# the training pods cannot start (Training, and Ready while not trained): most decisive first
POD_TROUBLE = (Reason.PODS_NOT_CREATED, Reason.UNSCHEDULABLE, Reason.IMAGE_PULL_FAILED)

FINAL_PHASES = (Phase.SUCCEEDED.value, Phase.FAILED.value)


def failed_in_registration(status: FineTuneJobStatus) -> bool:
    """Failed after training finished, in registration: the one final phase that can be left.

    The status message tells the user to set the ``kubetune.io/retry-registration`` annotation once
    the tracking URI or credentials are fixed; the operator then registers again (the registration
    is idempotent: a version of this run and config already in MLflow is found, not registered twice).
    """
    if status.phase != Phase.FAILED.value:
        return False
    ready = next((c for c in status.conditions or [] if c.type == ConditionType.READY), None)
    return ready is not None and ready.reason == Reason.REGISTRATION_FAILED


def training_succeeded(status: FineTuneJobStatus) -> bool:
    """The status says training finished (its Training condition is TrainingSucceeded)."""
    training = next((c for c in status.conditions or [] if c.type == ConditionType.TRAINING), None)
    return training is not None and training.reason == Reason.TRAINING_SUCCEEDED


def finished_without_registration(status: FineTuneJobStatus) -> bool:
    """Succeeded with registration off: turning ``registration.enabled`` on registers the model."""
    if status.phase != Phase.SUCCEEDED.value or status.registered_model is not None:
        return False
    registered = next((c for c in status.conditions or [] if c.type == ConditionType.REGISTERED), None)
    return registered is not None and registered.reason == Reason.REGISTRATION_DISABLED


# PyTorchJob condition types, most decisive first: the first one that is True wins.
TRAINING_PRECEDENCE = ("Failed", "Succeeded", "Suspended", "Restarting", "Running", "Created")


# --- observations -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrainingObservation:
    """What the PyTorchJob says: its decisive condition, if any."""

    exists: bool = False
    condition: str | None = None  # one of TRAINING_PRECEDENCE, or None (no status yet)
    reason: str = ""
    message: str = ""


# the states in which a registration or alias Job has ended
JOB_ENDED = ("Complete", "Skipped", "Failed")


@dataclass(frozen=True)
class RegistrationObservation:
    """What the registration Job (and its pod's termination message) says."""

    exists: bool = False
    # Skipped: Complete, but the pod read registration.enabled false (turned off while it ran)
    state: Literal["Running", "Complete", "Skipped", "Failed"] | None = None
    message: str = ""
    result: dict[str, Any] | None = None  # the parsed termination message of the successful pod


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
_POD_IN_ERROR = re.compile(r'\bpods? "([^"]+)"')
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
    """The pods the Training Operator makes for a PyTorchJob: ``<name>-<replica type>-<index>``."""
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
    pytorchjob: dict[str, Any], pods: list[dict[str, Any]], events: list[dict[str, Any]]
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
    unexplained: list[str] = []
    failures = _creation_failures(events, uid) if missing else {}
    for name in missing:
        failure = failures.get(name) or failures.get("")
        if failure is None:
            unexplained.append(name)
        else:
            troubles.append(PodTrouble(Reason.PODS_NOT_CREATED, name, failure[1], since=failure[0]))
    for name in sorted(live):
        troubles.extend(_pod_troubles(live[name]))
    if not troubles:
        return PodsObservation(missing=tuple(unexplained))
    troubles.sort(key=lambda t: (POD_TROUBLE.index(t.reason), t.pod))
    first = troubles[0]
    same = {t.pod for t in troubles if t.reason == first.reason}
    return PodsObservation(
        trouble=PodTrouble(first.reason, first.pod, first.message, first.since, len(same) - 1),
        missing=tuple(unexplained),
    )


def missing_pods(pytorchjob: dict[str, Any], pods: list[dict[str, Any]]) -> list[str]:
    """The PyTorchJob's pods (``replica_pods``) that do not exist, or are being deleted."""
    live = _live_pods(pytorchjob, pods)
    return [name for name in replica_pods(pytorchjob) if name not in live]


def _live_pods(pytorchjob: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    uid = (pytorchjob.get("metadata") or {}).get("uid")
    return {
        p["metadata"]["name"]: p
        for p in pods
        if _owned_by(p, uid) and not (p.get("metadata") or {}).get("deletionTimestamp")
    }


def _pod_troubles(pod: dict[str, Any]) -> list[PodTrouble]:
    name = pod["metadata"]["name"]
    status = pod.get("status") or {}
    out = []
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


def rejected_child(status: FineTuneJobStatus) -> bool:
    """Failed because the API server refused to create a child as this spec builds it."""
    if status.phase != Phase.FAILED.value:
        return False
    ready = next((c for c in status.conditions or [] if c.type == ConditionType.READY), None)
    return ready is not None and ready.reason == Reason.CHILD_REJECTED


def reopens(status: FineTuneJobStatus, generation: int) -> bool:
    """A job Failed with ``ChildRejected`` whose spec changed since: it starts over from Pending.

    The refused object was built from the spec, so only a new spec can be accepted (or the same
    one, once an admission policy was changed: any accepted spec change retries). Children created
    before the refusal are ours and are kept; the pass creates the missing ones.
    """
    if not rejected_child(status):
        return False
    ready = next(c for c in status.conditions or [] if c.type == ConditionType.READY)
    return (ready.observed_generation or 0) < generation


@dataclass(frozen=True)
class Observation:
    generation: int
    now: str  # RFC 3339
    suspend: bool = False
    registration_enabled: bool = True
    queued_by_kueue: bool = False  # spec has a queueName: a suspended PyTorchJob is waiting for quota
    invalid_spec: str | None = None
    conflict: str | None = None  # message naming the foreign object, if any
    child_error: ChildError | None = None  # the pass stopped at a request the API server refused
    training: TrainingObservation = field(default_factory=TrainingObservation)
    registration: RegistrationObservation = field(default_factory=RegistrationObservation)
    pods: PodsObservation = field(default_factory=PodsObservation)
    children: dict[str, str] = field(default_factory=dict)
    # For actionable messages.
    namespace: str = "default"
    job_name: str = ""
    pytorchjob_name: str = ""
    registration_job_name: str = ""
    checkpoint_claim: str = ""


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Transition:
    """The next status (fields the operator owns) and the events for what changed."""

    status: dict[str, Any]
    events: list[Event]
    phase: str
    # True when only time (or the outside world) can move things on: re-check soon.
    waiting: bool = False


def training_observation(pytorchjob: dict[str, Any] | None) -> TrainingObservation:
    """Fold a PyTorchJob's status conditions into its one decisive condition."""
    if pytorchjob is None:
        return TrainingObservation()
    conditions = (pytorchjob.get("status") or {}).get("conditions") or []
    by_type = {c.get("type"): c for c in conditions if c.get("status") == "True"}
    for kind in TRAINING_PRECEDENCE:
        if kind in by_type:
            c = by_type[kind]
            return TrainingObservation(True, kind, c.get("reason") or "", c.get("message") or "")
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
    terminationMessagePolicy FallbackToLogsOnError) and goes into the Failed status message.
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


# --- the machine ----------------------------------------------------------------------------------------


def _condition(
    previous: dict[str, Condition],
    type_: str,
    decided: tuple[bool, str, str],
    *,
    now: str,
    generation: int,
) -> Condition:
    status, reason, message = decided
    value: Literal["True", "False"] = "True" if status else "False"
    old = previous.get(type_)
    # lastTransitionTime moves only when the status flips (Kubernetes convention).
    when = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )


def advance(previous: FineTuneJobStatus | None, obs: Observation) -> Transition:
    prev = previous or FineTuneJobStatus()
    prev_phase = prev.phase or Phase.PENDING.value
    prev_conditions = {c.type: c for c in prev.conditions or []}

    reopened = reopens(prev, obs.generation)
    if prev.phase in FINAL_PHASES and not reopened:
        # Final: nothing more happens. Keep what is there (observedGeneration follows the spec).
        kept = prev.model_dump(by_alias=True, exclude_none=True, mode="json", include={"phase", "conditions"})
        kept["observedGeneration"] = obs.generation
        return Transition(status=kept, events=[], phase=str(prev.phase))
    opening: list[Event] = []
    if reopened:
        # The spec changed since a child was refused: start over, as a new job would (its events too).
        prev_phase = Phase.PENDING.value
        opening.append(
            Event(
                "Normal",
                EventReason.CHILDREN_RETRIED,
                f"spec generation {obs.generation}: creating the children the API server refused again",
            )
        )

    if obs.child_error is not None and obs.child_error.verdict != "rejected":
        transition = _held(prev, prev_phase, obs, prev_conditions)
        transition.events[:0] = opening
        if reopened:
            transition.status["completionTime"] = None  # merge patch: no longer complete
        return transition

    phase, reasons = _decide(obs)
    conditions = _conditions(phase, reasons, obs, prev_conditions)

    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": obs.generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions],
        "children": obs.children,
    }
    if phase == Phase.TRAINING.value and not prev.start_time:
        status["startTime"] = obs.now
    if phase in FINAL_PHASES:
        status["completionTime"] = obs.now
    elif reopened:
        status["completionTime"] = None  # merge patch: no longer complete
    result = obs.registration.result
    if phase == Phase.SUCCEEDED.value and result is not None:
        status["registeredModel"] = RegisteredModelStatus(
            name=str(result["name"]),
            version=str(result["version"]),
            uri=str(result["uri"]) if result.get("uri") else f"models:/{result['name']}/{result['version']}",
            alias=str(result["alias"]) if result.get("alias") else None,
        ).wire()
        if result.get("run_id"):
            status["mlflow"] = {"runId": str(result["run_id"])}

    events = opening + _events(prev_phase, phase, reasons, prev_conditions)
    waiting = reasons.get("waiting", False) is True
    return Transition(status=status, events=events, phase=phase, waiting=waiting)


def _held(
    prev: FineTuneJobStatus, prev_phase: str, obs: Observation, prev_conditions: dict[str, Condition]
) -> Transition:
    """A pass stopped by a refusal that can go away without a spec change (403, transient).

    The phase stays where it was (Pending for a new or reopened job): what the pass could not read
    is not news. ``ChildrenReady`` says what fails, at once for 403 and after
    ``SHOW_TRANSIENT_AFTER`` attempts in a row otherwise (until then the job keeps what it showed),
    and so does ``Ready`` while Pending. The operator retries with backoff (``waiting``).
    """
    err = obs.child_error
    assert err is not None
    phase = (
        prev_phase if prev_phase in (Phase.TRAINING, Phase.SUSPENDED, Phase.REGISTERING) else Phase.PENDING
    )
    reasons: dict[str, Any] = {}
    forbidden = err.verdict == "forbidden"
    if forbidden or err.attempts >= SHOW_TRANSIENT_AFTER:
        if forbidden:
            reason = Reason.CHILD_FORBIDDEN
            msg = (
                f"{err.describe()}. A ResourceQuota, the operator's RBAC or an admission policy forbids it; "
                f"retrying with backoff (attempt {err.attempts}) until it is allowed"
            )
        else:
            reason = Reason.CHILD_API_ERROR
            msg = f"{err.describe()}. Retrying with backoff ({err.attempts} attempts in a row failed)"
            if err.kind == "PyTorchJob" and err.code == 404:
                msg += "; is the Kubeflow Training Operator (its PyTorchJob CRD) installed?"
        reasons["children"] = (False, reason, msg)
        if phase == Phase.PENDING:
            reasons["ready"] = (False, reason, msg)
    elif ConditionType.CHILDREN_READY not in prev_conditions:
        reasons["children"] = (
            False,
            Reason.CREATING_CHILDREN,
            "creating the checkpoint volume, trainer config and PyTorchJob",
        )
        reasons["ready"] = (False, Reason.NOT_READY, "creating the children")
    # Training has not started because of it: say so there too (what `kubectl describe` and Argo CD
    # show first while Pending), unless the Training condition already knows the PyTorchJob.
    training = prev_conditions.get(ConditionType.TRAINING)
    held = (Reason.CREATING_CHILDREN, Reason.CHILD_FORBIDDEN, Reason.CHILD_API_ERROR)
    if phase == Phase.PENDING and "children" in reasons and (training is None or training.reason in held):
        reasons["training"] = reasons["children"]
    conditions = _conditions(str(phase), reasons, obs, prev_conditions)
    status: dict[str, Any] = {
        "phase": str(phase),
        "observedGeneration": obs.generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions],
        "children": obs.children,
    }
    events = _events(prev_phase, str(phase), reasons, prev_conditions)
    return Transition(status=status, events=events, phase=str(phase), waiting=True)


def _decide(obs: Observation) -> tuple[str, dict[str, Any]]:
    """The phase and, per condition, (status, reason, message)."""
    tr = obs.training
    reg = obs.registration
    out: dict[str, Any] = {}

    if obs.invalid_spec:
        out["children"] = (False, Reason.INVALID_SPEC, obs.invalid_spec)
        out["ready"] = (False, Reason.INVALID_SPEC, obs.invalid_spec)
        return Phase.FAILED.value, out

    if obs.child_error is not None:  # rejected (``advance`` holds the others)
        msg = (
            f"the API server refused the object this spec builds: {obs.child_error.describe()}. The same "
            "spec is refused again, so nothing is retried until it changes: fix the manifest and re-create "
            "the FineTuneJob (kubectl replace --force -f FILE; most of the spec cannot change once created). "
            "When an admission policy refused it, any accepted change of the spec makes the operator try "
            "again once the policy allows the object"
        )
        out["children"] = (False, Reason.CHILD_REJECTED, msg)
        out["ready"] = (False, Reason.CHILD_REJECTED, msg)
        return Phase.FAILED.value, out

    if obs.conflict:
        msg = obs.conflict
        out["children"] = (False, Reason.CHILD_CONFLICT, msg)
        out["ready"] = (False, Reason.CHILD_CONFLICT, msg)
        out["waiting"] = True
        return Phase.PENDING.value, out
    out["children"] = (
        True,
        Reason.CHILDREN_CREATED,
        "checkpoint volume, trainer config and PyTorchJob exist",
    )

    logs_hint = (
        f"trainer logs: kubectl logs -n {obs.namespace} -l training.kubeflow.org/job-name={obs.pytorchjob_name} "
        "--all-containers --prefix"
    )

    if tr.condition == "Failed":
        msg = (
            f"PyTorchJob {obs.pytorchjob_name} failed ({tr.reason or 'Failed'}: {tr.message or 'no message'}). "
            f"See the {logs_hint}. Exit codes 1-127 (bad config, a bug, missing data or credentials) fail at "
            "once; fix the spec and re-create the FineTuneJob. Exit codes 128-255 (preemption, OOM kill) were "
            "retried up to the backoff limit; checkpoints stay on PVC "
            f"{obs.checkpoint_claim} when it is kept (storage.keepOnDelete or storage.existingClaim)."
        )
        out["training"] = (False, Reason.TRAINING_FAILED, msg)
        out["ready"] = (False, Reason.TRAINING_FAILED, msg)
        return Phase.FAILED.value, out

    if tr.condition == "Succeeded":
        out["training"] = (False, Reason.TRAINING_SUCCEEDED, tr.message or "training finished")
        job = f"registration Job {obs.registration_job_name}"
        retry = (
            f"kubectl annotate ftj -n {obs.namespace} {obs.job_name} "
            f'{RETRY_REGISTRATION_ANNOTATION}="$(date +%s)" --overwrite'
        )
        kept = "the trained model stays on the checkpoint volume."
        disabled = None  # Succeeded with nothing registered, and why
        if not obs.registration_enabled and not reg.exists:
            disabled = "spec.registration.enabled is false"
        elif reg.state == "Skipped" and not obs.registration_enabled:
            disabled = f"{job} ended without registering: spec.registration.enabled is false"
        if disabled is not None:
            out["registered"] = (False, Reason.REGISTRATION_DISABLED, disabled)
            out["ready"] = (True, Reason.SUCCEEDED, "training finished; registration is disabled")
            return Phase.SUCCEEDED.value, out
        failed = None  # Failed in registration, and the remedy
        if reg.state == "Skipped":
            failed = (
                f"{job} ended without registering: its pod read registration.enabled false (turned off, "
                f"then on again, while it ran). To register: {retry}; {kept}"
            )
        elif reg.state == "Failed" and not obs.registration_enabled:
            failed = (
                f"{job} failed: {reg.message}. spec.registration.enabled is now false: to finish without "
                f"registering: {retry}; {kept}"
            )
        elif reg.state == "Failed":
            failed = (
                f"{job} failed: {reg.message}. Check the MLflow tracking URI and credentials "
                f"(spec.registration, spec.secrets), then retry (the operator deletes the failed Job and "
                f"creates it again): {retry}; {kept}"
            )
        if failed is not None:
            out["registered"] = (False, Reason.REGISTRATION_FAILED, failed)
            out["ready"] = (False, Reason.REGISTRATION_FAILED, failed)
            return Phase.FAILED.value, out
        if reg.state == "Complete" and reg.result is not None:
            r = reg.result
            msg = f"registered model {r['name']} version {r['version']}"
            out["registered"] = (True, Reason.MODEL_REGISTERED, msg)
            out["ready"] = (True, Reason.SUCCEEDED, msg)
            return Phase.SUCCEEDED.value, out
        if reg.state == "Complete":
            msg = f"registration Job {obs.registration_job_name} completed; waiting for its result (pod termination message)"
            out["registered"] = (False, Reason.REGISTRATION_RESULT_PENDING, msg)
            out["waiting"] = True
        elif reg.exists:
            out["registered"] = (
                False,
                Reason.REGISTRATION_RUNNING,
                f"registration Job {obs.registration_job_name} is running"
                + (
                    ""
                    if obs.registration_enabled
                    else " (spec.registration.enabled was turned off after it was created: it runs to its end)"
                ),
            )
        else:
            out["registered"] = (False, Reason.REGISTRATION_PENDING, "creating the registration Job")
        out["ready"] = (False, Reason.REGISTRATION_RUNNING, "training finished; registering the model")
        return Phase.REGISTERING.value, out

    # Training not finished.
    out["registered"] = (
        (False, Reason.REGISTRATION_PENDING, "registers after training")
        if obs.registration_enabled
        else (False, Reason.REGISTRATION_DISABLED, "spec.registration.enabled is false")
    )
    if obs.suspend:
        out["suspended"] = (
            True,
            Reason.SUSPENDED_BY_USER,
            "spec.suspend is true: the PyTorchJob is suspended",
        )
        out["training"] = (False, Reason.SUSPENDED_BY_USER, "suspended; resumes from the newest checkpoint")
        out["ready"] = (False, Reason.SUSPENDED_BY_USER, "suspended")
        return Phase.SUSPENDED.value, out
    if tr.condition == "Suspended":
        if obs.queued_by_kueue:
            msg = "the PyTorchJob waits for Kueue to admit it (spec.resources.queueName)"
            out["suspended"] = (True, Reason.QUEUED, msg)
            out["training"] = (False, Reason.QUEUED, msg)
            out["ready"] = (False, Reason.QUEUED, msg)
            return Phase.PENDING.value, out
        msg = "resuming the PyTorchJob"
        out["suspended"] = (False, Reason.RESUMING, msg)
        out["training"] = (False, Reason.RESUMING, msg)
        out["ready"] = (False, Reason.RESUMING, msg)
        return Phase.PENDING.value, out
    out["suspended"] = (False, Reason.NOT_SUSPENDED, "")
    if tr.condition == "Running":
        phase = Phase.TRAINING.value
        out["training"] = (True, Reason.TRAINING_RUNNING, tr.message or "training")
        out["ready"] = (False, Reason.TRAINING_RUNNING, "training")
    elif tr.condition == "Restarting":
        phase = Phase.TRAINING.value
        msg = (
            f"PyTorchJob {obs.pytorchjob_name} is restarting ({tr.message or tr.reason or 'a pod exited'}); "
            "training resumes from the newest checkpoint"
        )
        out["training"] = (True, Reason.TRAINING_RESTARTING, msg)
        out["ready"] = (False, Reason.TRAINING_RESTARTING, msg)
    else:
        phase = Phase.PENDING.value
        if tr.condition == "Created":
            msg = "PyTorchJob created; waiting for its pods to be scheduled and start"
            out["training"] = (False, Reason.TRAINING_CREATED, msg)
        else:
            msg = f"PyTorchJob {obs.pytorchjob_name} has no status yet: is the Kubeflow Training Operator running?"
            out["training"] = (False, Reason.WAITING_FOR_TRAINING_OPERATOR, msg)
        out["ready"] = (False, Reason.NOT_READY, msg)
    shown = _pod_trouble(obs)
    if shown is not None:
        # the phase stays what the PyTorchJob says; Training and Ready say why its pods do not start
        out["training"] = (False, shown[0], shown[1])
        out["ready"] = (False, shown[0], shown[1])
    return phase, out


def _pod_trouble(obs: Observation) -> tuple[str, str] | None:
    """The pods' trouble as (reason, message) for the conditions; None when there is none to show
    (yet: a pod waits for a node ``SHOW_UNSCHEDULABLE_AFTER`` seconds before that is news)."""
    t = obs.pods.trouble
    # no condition at all: the Training Operator writes none while it fails to create a pod
    if t is None or not obs.training.exists or obs.training.condition not in POD_CONDITIONS:
        return None
    pod = f"pod {t.pod}" + (f" (and {t.others} more)" if t.others else "")
    describe = f"kubectl describe pod -n {obs.namespace} {t.pod}"
    if t.reason == Reason.UNSCHEDULABLE:
        began, now = parse_time(t.since), parse_time(obs.now)
        if began is not None and now is not None and (now - began).total_seconds() < SHOW_UNSCHEDULABLE_AFTER:
            return None
        return Reason.UNSCHEDULABLE, (
            f"the scheduler cannot place {pod}: {t.message}. Check spec.resources (gpusPerNode, gpuProduct: "
            "the nodes' nvidia.com/gpu.product label, cpu, memory, nodeSelector, tolerations) against the "
            "nodes and their free GPUs (kubectl get nodes -L nvidia.com/gpu.product); the pod starts by "
            "itself once a node fits"
        )
    if t.reason == Reason.PODS_NOT_CREATED:
        return Reason.PODS_NOT_CREATED, (
            f"the Training Operator cannot create {pod} of PyTorchJob {obs.pytorchjob_name}: {t.message}. "
            "Fix what it names (spec.resources.priorityClassName must name an existing PriorityClass; a "
            "ResourceQuota or an admission policy may refuse the pod); the Training Operator keeps retrying, "
            "with a growing backoff"
        )
    return Reason.IMAGE_PULL_FAILED, (
        f"{pod} cannot pull its image: {t.message}. Check that the image (spec.image, else the operator's "
        f"trainer image) exists and that the nodes can pull it (registry reachable, credentials); {describe}"
    )


def _conditions(
    phase: str, reasons: dict[str, Any], obs: Observation, prev: dict[str, Condition]
) -> list[Condition]:
    defaults = {
        "ready": (False, Reason.NOT_READY, ""),
        "children": (False, Reason.CHILDREN_CREATED, ""),
        "training": (False, Reason.WAITING_FOR_TRAINING_OPERATOR, ""),
        "suspended": (False, Reason.NOT_SUSPENDED, ""),
        "registered": (False, Reason.REGISTRATION_PENDING, ""),
    }
    keys = {
        "ready": ConditionType.READY,
        "children": ConditionType.CHILDREN_READY,
        "training": ConditionType.TRAINING,
        "suspended": ConditionType.SUSPENDED,
        "registered": ConditionType.REGISTERED,
    }
    out = []
    for key, type_ in keys.items():
        decided: tuple[bool, str, str]
        if key in reasons:
            decided = reasons[key]
        elif type_ in prev:
            # Not decided this time (e.g. Suspended once training finished): keep what it said.
            old = prev[type_]
            if key == "suspended" and old.status == "True":
                decided = (False, Reason.NOT_SUSPENDED, "")
            else:
                out.append(old.model_copy(update={"observed_generation": obs.generation}))
                continue
        else:
            decided = defaults[key]
        out.append(_condition(prev, type_, decided, now=obs.now, generation=obs.generation))
    return out


def _events(prev_phase: str, phase: str, reasons: dict[str, Any], prev: dict[str, Condition]) -> list[Event]:
    events: list[Event] = []
    children = reasons.get("children")
    # a child that cannot be had: once when it starts (ChildRejected is the Failed event below)
    if children and children[1] in (Reason.CHILD_CONFLICT, Reason.CHILD_FORBIDDEN, Reason.CHILD_API_ERROR):
        old = prev.get(ConditionType.CHILDREN_READY)
        if old is None or old.reason != children[1]:
            events.append(Event("Warning", children[1], children[2]))
    training = reasons.get("training")
    # restarting, or pods that cannot start: once when it starts
    if training and training[1] in (Reason.TRAINING_RESTARTING, *POD_TROUBLE):
        old = prev.get(ConditionType.TRAINING)
        if old is None or old.reason != training[1]:
            events.append(Event("Warning", training[1], training[2]))
    if phase == prev_phase:
        return events
    ready = reasons.get("ready", (False, "", ""))
    if phase == Phase.TRAINING.value:
        reason = EventReason.RESUMED if prev_phase == Phase.SUSPENDED.value else EventReason.TRAINING_STARTED
        events.append(Event("Normal", reason, "training is running"))
    elif phase == Phase.SUSPENDED.value:
        events.append(Event("Normal", Reason.SUSPENDED_BY_USER, "suspended the PyTorchJob (spec.suspend)"))
    elif phase == Phase.PENDING.value and prev_phase == Phase.SUSPENDED.value:
        events.append(Event("Normal", EventReason.RESUMED, "resuming the PyTorchJob"))
    elif phase == Phase.REGISTERING.value:
        events.append(
            Event(
                "Normal",
                EventReason.REGISTRATION_STARTED,
                "training succeeded; registering the model in MLflow",
            )
        )
    elif phase == Phase.SUCCEEDED.value:
        events.append(Event("Normal", Reason.SUCCEEDED, ready[2]))
    elif phase == Phase.FAILED.value:
        events.append(Event("Warning", ready[1] or EventReason.FAILED, ready[2]))
    return events


def alias_transition(
    previous: FineTuneJobStatus,
    wanted: str | None,
    job: RegistrationObservation,
    *,
    now: str,
    generation: int,
) -> Transition:
    """A Succeeded job whose ``registration.alias`` changed: the alias Job's progress into the status.

    The phase stays Succeeded (the model is registered either way); the ``AliasSynced`` condition
    says whether the version carries the alias the spec asks for, and ``registeredModel.alias``
    follows once the alias Job reports it.
    """
    model = previous.registered_model
    assert model is not None  # only called for a registered model
    target = f"{model.name} version {model.version}"
    status: dict[str, Any] = {"observedGeneration": generation}
    decided: tuple[bool, str, str]
    if job.state == "Complete" and job.result is not None:
        moved = str(job.result["alias"]) if job.result.get("alias") else None
        status["registeredModel"] = {**model.wire(), "alias": moved}
        text = f"alias {moved!r} points at {target}" if moved else f"{target} has no kubetune alias now"
        decided = (True, Reason.ALIAS_MOVED, text)
        kind: Literal["Normal", "Warning"] = "Normal"
    elif job.state in ("Failed", "Skipped"):
        decided = (False, Reason.ALIAS_FAILED, f"moving the alias to {wanted!r} failed: {job.message}")
        kind = "Warning"
    else:
        decided = (False, Reason.MOVING_ALIAS, f"pointing alias {wanted!r} at {target}")
        kind = "Normal"
    previous_conditions = {c.type: c for c in previous.conditions or []}
    condition = _condition(
        previous_conditions, ConditionType.ALIAS_SYNCED, decided, now=now, generation=generation
    )
    kept = [c for c in previous.conditions or [] if c.type != ConditionType.ALIAS_SYNCED]
    status["conditions"] = [
        c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in [*kept, condition]
    ]
    before = previous_conditions.get(ConditionType.ALIAS_SYNCED)
    events = (
        [] if before is not None and before.reason == decided[1] else [Event(kind, decided[1], decided[2])]
    )
    waiting = job.state not in JOB_ENDED
    return Transition(status=status, events=events, phase=str(previous.phase), waiting=waiting)
