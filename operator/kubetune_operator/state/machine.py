"""The FineTuneJob state machine: observations of the children in, the next status out. Pure.

Phases::

    Pending ──> Preparing ──> Pending ──> Training ──> Registering ──> Succeeded
                    │                      │  ^            │
                    v                      v  │            v
                  Failed             Suspended┘          Failed  (also from Pending/Training:
                                                         training failed, bad spec, a refused child)

Succeeded and Failed are final; ``transition`` leaves them only for a job failed because the API
server refused a child (``ChildRejected``) whose spec changed since (``reopens``), or to register a
final job again (``Reregister``, chosen by :mod:`.exits`). ``transition(previous status,
observation)`` returns the status fields the operator owns (never ``progress``/``checkpoints``,
which the trainer reports) and the events for the transitions it made; :func:`.advance` wraps it in
the actions of a pass.

Conditions (Kubernetes conventions; ``reason`` is one of :class:`~kubetune_api.status.Reason`, or
a :class:`~kubetune_api.preparation.Refusal`):

- ``Ready``: True once the model is trained and registered (phase Succeeded).
- ``ChildrenReady``: the PVC, ConfigMap and training object (PyTorchJob or TrainJob) exist and are
  ours. False: ``ChildConflict``
  (a stranger's object has a child's name), ``ChildRejected`` (the API server refused a child as
  built from this spec: Failed), ``ChildForbidden`` (403: quota, RBAC, an admission policy;
  retried), ``ChildApiError`` (no answer, 429, 5xx: retried, shown after ``SHOW_TRANSIENT_AFTER``).
- ``Prepared``: True once the preparation Job succeeded (its report is ``status.preparation``);
  False while it runs (``Preparing``), or with the refusal's reason (``DatasetEmpty``,
  ``DoesNotFit``...) or ``PreparationFailed``: the job is Failed before any GPU pod existed.
- ``Training``: True while the training object runs. False while it has not started; when its pods
  cannot start it says why (``PodsNotCreated``, ``Unschedulable``, ``ImagePullFailed``).
- ``Suspended``: True while suspended (``spec.suspend``), queued by Kueue (``Queued``), or taken
  back by Kueue after it trained (``PreemptedByKueue``, ``EvictedByKueue``: :mod:`.preemption`,
  with ``status.preemptions``); the phase is Pending while Kueue holds it.
- ``Registered``: True once MLflow has the model version; False ``GateNotMet`` when
  ``spec.registration.gate`` was not met (the job still Succeeds; the retry annotation forces it).
- ``ParentReady`` (``spec.model.fromJob``): False while the parent job runs (Pending, nothing created)
  or when it cannot give a model (Failed); True once it Succeeded. See :mod:`.chaining`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from kubetune_api.engines import Engine
from kubetune_api.failures import Failure
from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION, FineTuneJob
from kubetune_api.status import Condition, ConditionType, EventReason, FineTuneJobStatus, Phase, Reason

from ..observations import (
    POD_TROUBLE,
    SHOW_TRANSIENT_AFTER,
    TRAINING_POD_LABEL,
    PreparationObservation,
    shown_trouble,
)
from ..registration_status import gate_event, gate_not_met_message, registered_message, registration_report
from ..state_types import Decided, Decision, Event, Transition, Verdicts
from ..state_types import condition_of as _condition
from ..training_failures import count_restarts
from . import chaining, preemption
from .observation import Observation
from .status_view import FINAL_PHASES, Reregister, reopens

C = ConditionType
# what runs each engine's training object, as its messages name it
_CONTROLLER = {
    Engine.PYTORCHJOB: "the Kubeflow Training Operator",
    Engine.TRAINJOB: "the Kubeflow Trainer v2 controller",
}


def _engine(obs: Observation) -> Engine:
    """The pass's engine; before one is chosen, messages name the PyTorchJob."""
    return obs.engine or Engine.PYTORCHJOB


def _kind(obs: Observation) -> str:
    """The kind of the job's training object, as messages name it."""
    return str(_engine(obs))


CONDITION_TYPES = (
    C.READY,
    C.CHILDREN_READY,
    C.PREPARED,
    C.TRAINING,
    C.SUSPENDED,
    C.REGISTERED,
    C.BUDGET_REACHED,
    C.PARENT_READY,
)


# --- the machine ----------------------------------------------------------------------------------------


def transition(previous: FineTuneJobStatus | None, obs: Observation) -> Transition:
    """The next status (the fields the operator owns) and the events of what changed, from the
    previous status and what the pass found of the children (``obs``'s folded facts)."""
    prev = previous or FineTuneJobStatus()
    prev_phase = prev.phase or Phase.PENDING
    prev_conditions = {c.type: c for c in prev.conditions or []}

    reopened = reopens(prev, obs.generation)
    reregistering = obs.reregister is not None and prev.phase in FINAL_PHASES
    if prev.phase in FINAL_PHASES and not reopened and not reregistering:
        # Final: nothing more happens. Keep what is there (observedGeneration follows the spec).
        kept = prev.model_dump(by_alias=True, exclude_none=True, mode="json", include={"phase", "conditions"})
        kept["observedGeneration"] = obs.generation
        return Transition(status=kept, events=[], phase=str(prev.phase))
    opening: list[Event] = []
    if reregistering:
        # out of Succeeded or Failed: the pass registers the trained model (training is not repeated)
        prev_phase = Phase.REGISTERING
        opening += _reregister_events(obs)
    elif reopened:
        # The spec changed since a child was refused: start over, as a new job would (its events too).
        prev_phase = Phase.PENDING
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
        if reopened or reregistering:
            transition.status["completionTime"] = None  # merge patch: no longer complete
        return _record_retry(transition, obs)

    obs = _with_restarts(prev, replace(obs, previous=prev))
    decision = decide(obs)
    phase, reasons = decision.phase, decision.conditions
    conditions = _conditions(phase, reasons, obs, prev_conditions)

    status: dict[str, Any] = {
        "phase": phase,
        "observedGeneration": obs.generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions],
        "children": obs.children,
    }
    status.update(_reports(obs))
    # Kueue's evictions (preemption): counted, with the checkpoint it resumes from and the time spent
    preempted, preempted_events = preemption.record(prev, obs, reasons.get(C.SUSPENDED), _kind(obs))
    if preempted is not None:
        status["preemptions"] = preempted
    if obs.engine is not None:  # the training engine, recorded once chosen (state.engine)
        status["engine"] = str(obs.engine)
    if obs.parent is not None and obs.parent.status is not None:
        status["parent"] = obs.parent.status.wire()  # spec.model.fromJob: what it started from
    if phase == Phase.TRAINING and not prev.start_time:
        status["startTime"] = obs.now
    if phase in FINAL_PHASES:
        status["completionTime"] = obs.now
    elif reopened or reregistering:
        status["completionTime"] = None  # merge patch: no longer complete
    if phase == Phase.SUCCEEDED:  # the model registered (with its links), the gate's verdict
        status.update(registration_report(obs.registration))

    events = opening + preempted_events + _events(prev_phase, phase, reasons, prev_conditions, _kind(obs))
    return _record_retry(Transition(status=status, events=events, phase=phase, waiting=decision.waiting), obs)


def _with_restarts(prev: FineTuneJobStatus, obs: Observation) -> Observation:
    """``obs`` with the restarts counted so far (this pass's evidence of them added; a suspended
    training's pods are gone, and its resume is no restart)."""
    counted = count_restarts(
        prev.training_restarts,
        obs.restart_evidence,
        obs.checkpoint_step,
        obs.attempt_failure,
        suspended=obs.training.condition == "Suspended",
    )
    return replace(obs, restarts=counted) if counted is not None else obs


def _reports(obs: Observation) -> dict[str, Any]:
    """What the pass adds beside phase and conditions: the preparation's report, the restarts counted."""
    out: dict[str, Any] = {}
    prep = obs.preparation
    if prep is not None and prep.report is not None:
        out["preparation"] = prep.report.wire()
    if obs.restarts is not None:
        out["trainingRestarts"] = obs.restarts.model_dump(by_alias=True, mode="json", exclude_none=True)
    return out


def _reregister_events(obs: Observation) -> list[Event]:
    if obs.reregister == Reregister.ENABLED:
        message = "spec.registration.enabled was turned on after training: registering the trained model"
        return [Event("Normal", EventReason.REGISTRATION_ENABLED, message)]
    # the pass that records the request says so; also when an earlier pass created the Job but lost
    # its status write (a race): this one finds that Job running and the request not yet recorded
    if obs.retry_request is not None and obs.reregister in (Reregister.RETRY, Reregister.FOLLOW):
        message = (
            f"{RETRY_REGISTRATION_ANNOTATION}={obs.retry_request}: registering the trained model again "
            f"(registration Job {obs.registration_job_name} created anew, training not repeated)"
        )
        return [Event("Normal", EventReason.REGISTRATION_RETRIED, message)]
    return []


def _record_retry(transition: Transition, obs: Observation) -> Transition:
    """A retry request is acted on once, whatever the outcome: its value goes into the status."""
    if obs.retry_request is not None and obs.reregister is not None:
        transition.status["registrationRetry"] = obs.retry_request
    return transition


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
    reasons = Verdicts()
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
            if (
                err.kind in (str(Engine.PYTORCHJOB), str(Engine.TRAINJOB), "TrainingRuntime")
                and err.code == 404
            ):
                msg += f"; is {_CONTROLLER[_engine(obs)]} (its {err.kind} CRD) installed?"
        reasons[C.CHILDREN_READY] = (False, reason, msg)
        if phase == Phase.PENDING:
            reasons[C.READY] = (False, reason, msg)
    elif ConditionType.CHILDREN_READY not in prev_conditions:
        reasons[C.CHILDREN_READY] = (
            False,
            Reason.CREATING_CHILDREN,
            f"creating the checkpoint volume, trainer config and {_kind(obs)}",
        )
        reasons[C.READY] = (False, Reason.NOT_READY, "creating the children")
    # Training has not started because of it: say so there too (what `kubectl describe` and Argo CD
    # show first while Pending), unless the Training condition already knows the PyTorchJob.
    training = prev_conditions.get(ConditionType.TRAINING)
    held = (Reason.CREATING_CHILDREN, Reason.CHILD_FORBIDDEN, Reason.CHILD_API_ERROR)
    if (
        phase == Phase.PENDING
        and C.CHILDREN_READY in reasons
        and (training is None or training.reason in held)
    ):
        reasons[C.TRAINING] = reasons[C.CHILDREN_READY]
    conditions = _conditions(str(phase), reasons.by_type, obs, prev_conditions)
    status: dict[str, Any] = {
        "phase": str(phase),
        "observedGeneration": obs.generation,
        "conditions": [c.model_dump(by_alias=True, exclude_none=True, mode="json") for c in conditions],
        "children": obs.children,
    }
    if obs.engine is not None:
        status["engine"] = str(obs.engine)
    events = _events(prev_phase, str(phase), reasons.by_type, prev_conditions, _kind(obs))
    return Transition(status=status, events=events, phase=str(phase), waiting=True)


def decide(obs: Observation) -> Decision:
    """What the observation means for a job that is not final (or was reopened)."""
    # spec.model.fromJob: the parent job holds this one until it has Succeeded (nothing is created)
    held = obs.parent is not None and obs.parent.state != "ready" and not obs.invalid_spec
    phase: str
    if held and obs.parent is not None:
        phase, reasons = chaining.held(obs.parent, _registration_pending(obs))
    else:
        phase, reasons = _decide(obs)
    return Decision(Phase(phase), reasons.by_type, reasons.waiting)


def _decide(obs: Observation) -> tuple[str, Verdicts]:
    """The phase and, per condition, (status, reason, message)."""
    tr = obs.training
    out = Verdicts()

    if obs.invalid_spec or obs.engine_refusal is not None:
        return _nothing_created(obs, out)

    if obs.parent is not None:  # spec.model.fromJob, the parent Succeeded (``decide`` holds the rest)
        out[C.PARENT_READY] = (True, obs.parent.reason, obs.parent.message)

    if obs.child_error is not None:  # rejected (``advance`` holds the others)
        msg = (
            f"the API server refused the object this spec builds: {obs.child_error.describe()}. The same "
            "spec is refused again, so nothing is retried until it changes: fix the manifest and re-create "
            "the FineTuneJob (kubectl replace --force -f FILE; most of the spec cannot change once created). "
            "When an admission policy refused it, any accepted change of the spec makes the operator try "
            "again once the policy allows the object"
        )
        out[C.CHILDREN_READY] = (False, Reason.CHILD_REJECTED, msg)
        out[C.READY] = (False, Reason.CHILD_REJECTED, msg)
        return Phase.FAILED, out

    if obs.conflict:
        msg = obs.conflict
        out[C.CHILDREN_READY] = (False, Reason.CHILD_CONFLICT, msg)
        out[C.READY] = (False, Reason.CHILD_CONFLICT, msg)
        out.waiting = True
        return Phase.PENDING, out
    out[C.CHILDREN_READY] = (
        True,
        Reason.CHILDREN_CREATED,
        f"checkpoint volume, trainer config and {_kind(obs)} exist",
    )

    logs_hint = (
        f"trainer logs: kubectl logs -n {obs.namespace} -l {TRAINING_POD_LABEL[_engine(obs)]}={obs.pytorchjob_name} "
        "--all-containers --prefix"
    )

    if tr.condition == "Failed":
        return _training_failed(obs, out, logs_hint)
    if tr.condition == "Succeeded":
        return _after_training(obs, out)
    return _before_training_ends(obs, out)


def _nothing_created(obs: Observation, out: Verdicts) -> tuple[str, Verdicts]:
    """A spec that cannot be used fails the job; a job without its training engine (yet) waits
    (:mod:`.engine`). Either way nothing is created."""
    if obs.invalid_spec:
        out[C.CHILDREN_READY] = (False, obs.invalid_reason, obs.invalid_spec)
        out[C.READY] = (False, obs.invalid_reason, obs.invalid_spec)
        return Phase.FAILED, out
    assert obs.engine_refusal is not None
    reason, msg = obs.engine_refusal
    for type_ in (C.CHILDREN_READY, C.TRAINING, C.READY):
        out[type_] = (False, reason, msg)
    out.waiting = True
    return Phase.PENDING, out


def _training_failed(obs: Observation, out: Verdicts, logs_hint: str) -> tuple[str, Verdicts]:
    """The PyTorchJob failed: why (its pods' classified failure, ``obs.failure``), and what to do."""
    if obs.failure is not None:
        f = obs.failure
        msg = f"{f.describe()} See the {logs_hint}."
        if f.reason not in (Failure.DATASET_ERROR, Failure.MODEL_GATED, Failure.MODEL_NOT_FOUND):
            msg += f" Checkpoints stay on PVC {obs.checkpoint_claim} when it is kept (storage.keepOnDelete or storage.existingClaim)."
        out[C.TRAINING] = (False, f.reason, msg)
        out[C.READY] = (False, f.reason, msg)
        return Phase.FAILED, out
    tr = obs.training
    msg = (
        f"{_kind(obs)} {obs.pytorchjob_name} failed ({tr.reason or 'Failed'}: {tr.message or 'no message'}). "
        f"See the {logs_hint}. Exit codes 1-127 (bad config, a bug, missing data or credentials) fail at "
        "once; fix the spec and re-create the FineTuneJob. Exit codes 128-255 (preemption, OOM kill) were "
        "retried up to the backoff limit; checkpoints stay on PVC "
        f"{obs.checkpoint_claim} when it is kept (storage.keepOnDelete or storage.existingClaim)."
    )
    out[C.TRAINING] = (False, Reason.TRAINING_FAILED, msg)
    out[C.READY] = (False, Reason.TRAINING_FAILED, msg)
    return Phase.FAILED, out


def _restart_limit(obs: Observation, out: Verdicts) -> tuple[str, Verdicts]:
    """The training pods restarted too often without a new checkpoint: Failed, with the last
    attempt's reason when it is known (the operator then stops the PyTorchJob)."""
    r = obs.restarts
    assert r is not None
    reason = r.last_reason or Reason.RESTART_LIMIT
    msg = (
        f"the training pods restarted {r.since_progress} times without a new checkpoint (limit "
        f"{obs.restart_limit}: the operator's trainBackoffLimit); the last attempt: {r.last or 'ended without a reason kubetune saw'}"
        f" The {_kind(obs)} {obs.pytorchjob_name} is suspended (its pods stopped); checkpoints stay on PVC "
        f"{obs.checkpoint_claim} when it is kept."
    )
    out[C.TRAINING] = (False, reason, msg)
    out[C.READY] = (False, reason, msg)
    return Phase.FAILED, out


def _preparation(obs: Observation, prep: PreparationObservation, out: Verdicts) -> Phase | None:
    """The preparation Job decides while it has not succeeded: Preparing, or Failed with its named
    reason (a refusal) or with its log tail (a crash). None: prepared, training decides from here."""
    job = f"preparation Job {obs.preparation_job_name}"
    if prep.state == "Succeeded":
        report = prep.report
        text = (
            report.summary() if report is not None else f"{job} succeeded (its report is gone with its pod)"
        )
        out[C.PREPARED] = (True, Reason.PREPARED, text)
        return None
    if prep.state == "Failed":
        if prep.refusal is not None:
            r = prep.refusal
            msg = f"{r.message}. {r.hint}".strip(". ") + ". Nothing was started on a GPU"
            reason: str = r.reason
        else:
            msg = (
                f"{job} failed ({prep.message}). Its logs: kubectl logs -n {obs.namespace} "
                f"job/{obs.preparation_job_name}. Nothing was started on a GPU"
            )
            reason = Reason.PREPARATION_FAILED
        out[C.PREPARED] = (False, reason, msg)
        out[C.READY] = (False, reason, msg)
        return Phase.FAILED
    msg = f"{job} is downloading the model and the data, checking, tokenizing and estimating (CPU only)"
    reason = Reason.PREPARING
    if prep.message:  # running, and its pod cannot be created: the Job controller's words
        reason = Reason.PODS_NOT_CREATED
        msg = f"the Job controller cannot create the pod of {job}: {prep.message}"
    elif prep.trouble is not None:  # its pod cannot start: the scheduler's or the kubelet's words
        reason, msg = prep.trouble[0], f"the pod of {job} cannot start: {prep.trouble[1]}"
    out[C.CHILDREN_READY] = (
        True,
        Reason.CHILDREN_CREATED,
        f"checkpoint volume, trainer config and preparation Job exist; the {_kind(obs)} follows the preparation",
    )
    out[C.PREPARED] = (False, reason, msg)
    out[C.TRAINING] = (False, Reason.PREPARING, "training starts once the preparation has succeeded")
    out[C.READY] = (False, reason, msg)
    out[C.REGISTERED] = _registration_pending(obs)
    out.waiting = True  # a pod that cannot be created sends no event: look again soon
    return Phase.PREPARING


def _registration_pending(obs: Observation) -> Decided:
    if obs.registration_enabled:
        return Decided(False, Reason.REGISTRATION_PENDING, "registers after training")
    return Decided(False, Reason.REGISTRATION_DISABLED, "spec.registration.enabled is false")


def _after_training(obs: Observation, out: Verdicts) -> tuple[str, Verdicts]:
    """Training succeeded: the registration decides (Registering; Succeeded, with the model or with
    registration off; or Failed, with the remedy)."""
    tr, reg = obs.training, obs.registration
    out[C.TRAINING] = (False, Reason.TRAINING_SUCCEEDED, tr.message or "training finished")
    if obs.budget is not None:
        b = obs.budget
        out[C.BUDGET_REACHED] = (
            True,
            Reason.BUDGET_REACHED,
            f"training stopped at spec.budget {b.limit}: step {b.step} of {b.total_steps} planned; the final "
            "model is that step's",
        )
    job = f"registration Job {obs.registration_job_name}"
    retry = (
        f"kubectl annotate ftj -n {obs.namespace} {obs.job_name} "
        f'{RETRY_REGISTRATION_ANNOTATION}="$(date +%s)" --overwrite'
    )
    kept = "the trained model stays on the checkpoint volume."
    disabled = _disabled(obs, job)  # Succeeded with nothing registered, and why
    if disabled is not None:
        unused, ready = registration_fields_set(obs.job), "training finished; registration is disabled"
        out[C.REGISTERED] = (False, Reason.REGISTRATION_DISABLED, disabled)
        out[C.READY] = (True, Reason.SUCCEEDED, f"{ready} ({unused} unused)" if unused else ready)
        return Phase.SUCCEEDED, out
    if obs.registry_refusal and not reg.exists:  # no registration Job was created (wanted._registration)
        refused = (
            f"{job} not created: {obs.registry_refusal}. The trained model stays on the checkpoint volume; "
            "re-create the FineTuneJob with a model name of its namespace to register it"
        )
        out[C.REGISTERED] = (False, Reason.MODEL_NAME_NOT_ALLOWED, refused)
        out[C.READY] = (False, Reason.MODEL_NAME_NOT_ALLOWED, refused)
        return Phase.FAILED, out
    if reg.state == "GateNotMet":  # spec.registration.gate: nothing registered, the job still Succeeds
        return _gate_not_met(gate_not_met_message(reg, retry), out)
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
        out[C.REGISTERED] = (False, Reason.REGISTRATION_FAILED, failed)
        out[C.READY] = (False, Reason.REGISTRATION_FAILED, failed)
        return Phase.FAILED, out
    if reg.state == "Complete" and reg.result is not None:
        msg = registered_message(reg.result)
        out[C.REGISTERED] = (True, Reason.MODEL_REGISTERED, msg)
        out[C.READY] = (True, Reason.SUCCEEDED, msg)
        return Phase.SUCCEEDED, out
    if reg.state == "Complete":
        msg = f"registration Job {obs.registration_job_name} completed; waiting for its result (pod termination message)"
        out[C.REGISTERED] = (False, Reason.REGISTRATION_RESULT_PENDING, msg)
        out.waiting = True
    elif reg.exists:
        out[C.REGISTERED] = (
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
        out[C.REGISTERED] = (False, Reason.REGISTRATION_PENDING, "creating the registration Job")
    out[C.READY] = (False, Reason.REGISTRATION_RUNNING, "training finished; registering the model")
    return Phase.REGISTERING, out


def _disabled(obs: Observation, job: str) -> str | None:
    """Why nothing is registered while training succeeded with registration off (None: it is on,
    or its Job ran), with the registration fields that take effect only once it is turned on."""
    reg = obs.registration
    disabled = None
    if not obs.registration_enabled and not reg.exists:
        disabled = (
            "spec.budget.register is false: the model trained up to the budget stays on the checkpoint volume"
            if obs.budget is not None
            else "spec.registration.enabled is false"
        )
    elif reg.state == "Skipped" and not obs.registration_enabled:
        disabled = f"{job} ended without registering: spec.registration.enabled is false"
    unused = registration_fields_set(obs.job)
    if disabled is not None and unused:  # kept (registration can be turned on later), told here
        disabled += f"; the registration fields set ({unused}) take effect only once it is true"
    return disabled


def registration_fields_set(job: FineTuneJob | None) -> str:
    """The registration fields a job sets that do nothing while ``registration.enabled`` is false
    (they apply once it is turned on, so they are not refused: :mod:`kubetune_api.rules_ignored`),
    as one phrase; empty when none is set."""
    if job is None or job.spec.registration.enabled:
        return ""
    reg = job.spec.registration
    names = [
        f"spec.registration.{wire}"
        for wire, value in (
            ("alias", reg.alias),
            ("gate", reg.gate),
            ("modelName", reg.model_name),
            ("select", None if reg.select == "final" else reg.select),
        )
        if value is not None
    ]
    if job.spec.budget is not None and not job.spec.budget.register_model:
        names.append("spec.budget.register")
    return ", ".join(names)


def _gate_not_met(msg: str, out: Verdicts) -> tuple[str, Verdicts]:
    out[C.REGISTERED] = (False, Reason.GATE_NOT_MET, msg)
    out[C.READY] = (True, Reason.SUCCEEDED, f"training finished; {msg}")
    return Phase.SUCCEEDED, out


def _before_training_ends(obs: Observation, out: Verdicts) -> tuple[str, Verdicts]:
    """Training not finished: preparing (or refused), suspended, queued, resuming, running,
    restarting or not started (and why)."""
    tr = obs.training
    if obs.preparation is not None:
        held = _preparation(obs, obs.preparation, out)
        if held is not None:
            return held, out
    # Training not finished.
    out[C.REGISTERED] = _registration_pending(obs)
    if obs.suspend:
        out[C.SUSPENDED] = (
            True,
            Reason.SUSPENDED_BY_USER,
            f"spec.suspend is true: the {_kind(obs)} is suspended",
        )
        out[C.TRAINING] = (False, Reason.SUSPENDED_BY_USER, "suspended; resumes from the newest checkpoint")
        out[C.READY] = (False, Reason.SUSPENDED_BY_USER, "suspended")
        return Phase.SUSPENDED, out
    if tr.condition == "Suspended":
        return _held_suspended(obs, out), out
    out[C.SUSPENDED] = (False, Reason.NOT_SUSPENDED, "")
    if obs.restarts is not None and obs.restarts.since_progress > obs.restart_limit:
        return _restart_limit(obs, out)
    if tr.condition == "Running":
        phase = Phase.TRAINING
        out[C.TRAINING] = (True, Reason.TRAINING_RUNNING, tr.message or "training")
        out[C.READY] = (False, Reason.TRAINING_RUNNING, "training")
    elif tr.condition == "Restarting":
        phase = Phase.TRAINING
        msg = (
            f"{_kind(obs)} {obs.pytorchjob_name} is restarting ({tr.message or tr.reason or 'a pod exited'}); "
            "training resumes from the newest checkpoint"
        )
        out[C.TRAINING] = (True, Reason.TRAINING_RESTARTING, msg)
        out[C.READY] = (False, Reason.TRAINING_RESTARTING, msg)
    else:
        phase = Phase.PENDING
        if tr.condition == "Created":
            msg = f"{_kind(obs)} created; waiting for its pods to be scheduled and start"
            out[C.TRAINING] = (False, Reason.TRAINING_CREATED, msg)
        else:
            msg = f"{_kind(obs)} {obs.pytorchjob_name} has no status yet: is {_CONTROLLER[_engine(obs)]} running?"
            out[C.TRAINING] = (False, Reason.WAITING_FOR_TRAINING_OPERATOR, msg)
        out[C.READY] = (False, Reason.NOT_READY, msg)
    shown = shown_trouble(
        obs.pods,
        obs.training,
        now=obs.now,
        namespace=obs.namespace,
        pytorchjob_name=obs.pytorchjob_name,
        kind=_kind(obs),
    )
    if shown is not None:
        # the phase stays what the PyTorchJob says; Training and Ready say why its pods do not start
        out[C.TRAINING] = (False, shown[0], shown[1])
        out[C.READY] = (False, shown[0], shown[1])
    return phase, out


def _held_suspended(obs: Observation, out: Verdicts) -> str:
    """The training object is suspended, not by ``spec.suspend``: Kueue took it back after it
    trained (preempted: :mod:`.preemption`), Kueue queues it, or it is being resumed."""
    evicted = preemption.verdict(obs, _kind(obs)) if obs.queued_by_kueue else None
    if evicted is not None:  # it waits to be admitted again, and resumes from its checkpoint
        decided = evicted
    elif obs.queued_by_kueue:
        msg = f"the {_kind(obs)} waits for Kueue to admit it (spec.resources.queueName)"
        decided = Decided(True, Reason.QUEUED, msg)
    else:
        decided = Decided(False, Reason.RESUMING, f"resuming the {_kind(obs)}")
    out[C.SUSPENDED] = decided
    out[C.TRAINING] = (False, decided[1], decided[2])
    out[C.READY] = (False, decided[1], decided[2])
    return Phase.PENDING


# Conditions every status shows, with what they say before anything decided them.
_DEFAULTS = {
    C.READY: Decided(False, Reason.NOT_READY, ""),
    C.CHILDREN_READY: Decided(False, Reason.CHILDREN_CREATED, ""),
    C.TRAINING: Decided(False, Reason.WAITING_FOR_TRAINING_OPERATOR, ""),
    C.SUSPENDED: Decided(False, Reason.NOT_SUSPENDED, ""),
    C.REGISTERED: Decided(False, Reason.REGISTRATION_PENDING, ""),
}


def _conditions(
    phase: str, reasons: Mapping[ConditionType, Decided], obs: Observation, prev: dict[str, Condition]
) -> list[Condition]:
    out = []
    for type_ in CONDITION_TYPES:
        decided: tuple[bool, str, str]
        if type_ in reasons:
            decided = reasons[type_]
        elif type_ not in _DEFAULTS and type_ not in prev:
            continue  # a job that never had a preparation step (turned off, or older than it), or a budget
        elif type_ in prev:
            # Not decided this time (e.g. Suspended once training finished): keep what it said.
            old = prev[type_]
            if type_ == C.SUSPENDED and old.status == "True":
                decided = (False, Reason.NOT_SUSPENDED, "")
            else:
                out.append(old.model_copy(update={"observed_generation": obs.generation}))
                continue
        else:
            decided = _DEFAULTS[type_]
        out.append(_condition(prev, type_, decided, now=obs.now, generation=obs.generation))
    return out


# ChildrenReady=False reasons that a Warning event announces once, when they start
_CHILD_TROUBLE = (
    Reason.CHILD_CONFLICT,
    Reason.CHILD_FORBIDDEN,
    Reason.CHILD_API_ERROR,
    Reason.NO_TRAINING_ENGINE,
    Reason.ENGINE_NOT_SERVED,
    Reason.ENGINE_NOT_IMPLEMENTED,
)


def _events(
    prev_phase: str,
    phase: str,
    reasons: Mapping[ConditionType, Decided],
    prev: dict[str, Condition],
    kind: str = str(Engine.PYTORCHJOB),
) -> list[Event]:
    events: list[Event] = []
    children = reasons.get(C.CHILDREN_READY)
    # a child that cannot be had: once when it starts (ChildRejected is the Failed event below)
    if children and children[1] in _CHILD_TROUBLE:
        old = prev.get(ConditionType.CHILDREN_READY)
        if old is None or old.reason != children[1]:
            events.append(Event("Warning", children[1], children[2]))
    training = reasons.get(C.TRAINING)
    # restarting, or pods that cannot start: once when it starts
    if training and training[1] in (Reason.TRAINING_RESTARTING, *POD_TROUBLE):
        old = prev.get(ConditionType.TRAINING)
        if old is None or old.reason != training[1]:
            events.append(Event("Warning", training[1], training[2]))
    events += _prepared_event(reasons, prev) + _parent_event(reasons, prev) + gate_event(reasons, prev)
    if phase == prev_phase:
        return events
    ready = reasons.get(C.READY) or Decided(False, "", "")
    if phase == Phase.PREPARING:
        events.append(Event("Normal", EventReason.PREPARATION_STARTED, ready[2]))
    elif phase == Phase.TRAINING:
        reason = EventReason.RESUMED if prev_phase == Phase.SUSPENDED else EventReason.TRAINING_STARTED
        events.append(Event("Normal", reason, "training is running"))
    elif phase == Phase.SUSPENDED:
        events.append(Event("Normal", Reason.SUSPENDED_BY_USER, f"suspended the {kind} (spec.suspend)"))
    elif phase == Phase.PENDING and prev_phase == Phase.SUSPENDED:
        events.append(Event("Normal", EventReason.RESUMED, f"resuming the {kind}"))
    elif phase == Phase.REGISTERING:
        events.append(
            Event(
                "Normal",
                EventReason.REGISTRATION_STARTED,
                "training succeeded; registering the model in MLflow",
            )
        )
    elif phase == Phase.SUCCEEDED:
        events.append(Event("Normal", Reason.SUCCEEDED, ready[2]))
    elif phase == Phase.FAILED:
        events.append(Event("Warning", ready[1] or EventReason.FAILED, ready[2]))
    return events


def _parent_event(reasons: Mapping[ConditionType, Decided], prev: dict[str, Condition]) -> list[Event]:
    """Once, when the job starts to wait for its parent job, and when that has Succeeded."""
    old = prev.get(ConditionType.PARENT_READY)
    news = chaining.news(reasons.get(C.PARENT_READY), old.reason if old else None)
    return [Event("Normal", news[1], news[2])] if news else []


def _prepared_event(reasons: Mapping[ConditionType, Decided], prev: dict[str, Condition]) -> list[Event]:
    """Once, when the preparation succeeds: what it found and estimated."""
    prepared = reasons.get(C.PREPARED)
    old = prev.get(ConditionType.PREPARED)
    if prepared and prepared[0] and (old is None or old.status != "True"):
        return [Event("Normal", EventReason.PREPARED, prepared[2])]
    return []
