"""Every way out of Succeeded, Failed and Suspended, as the one state machine decides it (table tests),
and the one place the operator writes a status (read from the operator's source)."""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.support.controlplane import REPO
from tests.support.state_obs import T0, T1, obs

from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION
from kubetune_api.status import ConditionType, EventReason, FineTuneJobStatus, Phase, Reason
from kubetune_operator import state
from kubetune_operator.state import Observation, RegistrationObservation, Reregister, TrainingObservation

TRAINED = TrainingObservation(True, "Succeeded")
RUNNING = TrainingObservation(True, "Running")
SUSPENDED = TrainingObservation(True, "Suspended")
REGISTERING = RegistrationObservation(True, "Running")
MODEL = {"name": "m", "version": "2", "uri": "models:/m/2", "run_id": "r1"}
REGISTERED = RegistrationObservation(True, "Complete", "", MODEL)
REG_FAILED = RegistrationObservation(True, "Failed", "BackoffLimitExceeded: MLflow answered 503")


def condition(ctype: str, ok: bool, reason: str, generation: int = 1) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": "",
        "lastTransitionTime": T0,
        "observedGeneration": generation,
    }


def status(phase: Phase, *conditions: dict[str, Any], **extra: Any) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(
        {"phase": phase, "conditions": list(conditions), "completionTime": T0, **extra}
    )


FAILED_REGISTRATION = status(
    Phase.FAILED,
    condition(ConditionType.READY, False, Reason.REGISTRATION_FAILED),
    condition(ConditionType.TRAINING, False, Reason.TRAINING_SUCCEEDED),
    condition(ConditionType.REGISTERED, False, Reason.REGISTRATION_FAILED),
)
FAILED_TRAINING = status(
    Phase.FAILED,
    condition(ConditionType.READY, False, Reason.TRAINING_FAILED),
    condition(ConditionType.TRAINING, False, Reason.TRAINING_FAILED),
)
FAILED_REJECTED = status(
    Phase.FAILED,
    condition(ConditionType.READY, False, Reason.CHILD_REJECTED),
    condition(ConditionType.CHILDREN_READY, False, Reason.CHILD_REJECTED),
)
SUCCEEDED_UNREGISTERED = status(
    Phase.SUCCEEDED,
    condition(ConditionType.READY, True, Reason.SUCCEEDED),
    condition(ConditionType.REGISTERED, False, Reason.REGISTRATION_DISABLED),
)
SUSPENDED_STATUS = FineTuneJobStatus.model_validate(
    {
        "phase": Phase.SUSPENDED,
        "conditions": [
            condition(ConditionType.READY, False, Reason.NOT_READY),
            condition(ConditionType.SUSPENDED, True, Reason.SUSPENDED_BY_USER),
        ],
    }
)


@dataclass(frozen=True)
class Exit:
    previous: FineTuneJobStatus
    observation: Observation
    phase: Phase
    events: tuple[str, ...] = ()
    status: dict[str, Any] = field(default_factory=dict)  # fields the new status must hold


EXITS = {
    # Failed in registration, the retry annotation set anew: register again, training not repeated (the
    # phase it leaves for is Registering: its own event says so, no RegistrationStarted)
    "failed/retry-requested": Exit(
        FAILED_REGISTRATION,
        obs(training=TRAINED, registration=REGISTERING, reregister=Reregister.RETRY, retry_request="1"),
        Phase.REGISTERING,
        (EventReason.REGISTRATION_RETRIED,),
        {"registrationRetry": "1", "completionTime": None},
    ),
    # the retried registration ends in one pass: Succeeded with the model
    "failed/retry-registered-at-once": Exit(
        FAILED_REGISTRATION,
        obs(training=TRAINED, registration=REGISTERED, reregister=Reregister.RETRY, retry_request="2"),
        Phase.SUCCEEDED,
        (EventReason.REGISTRATION_RETRIED, Reason.SUCCEEDED),
        {"registrationRetry": "2", "completionTime": T0, "registeredModel": {"name": "m", "version": "2"}},
    ),
    # and fails again: Failed again, the request recorded (acted on once)
    "failed/retry-fails-again": Exit(
        FAILED_REGISTRATION,
        obs(training=TRAINED, registration=REG_FAILED, reregister=Reregister.RETRY, retry_request="3"),
        Phase.FAILED,
        (EventReason.REGISTRATION_RETRIED, Reason.REGISTRATION_FAILED),
        {"registrationRetry": "3"},
    ),
    # asked while registration is off: training finished, nothing registered
    "failed/retry-with-registration-off": Exit(
        FAILED_REGISTRATION,
        obs(
            training=TRAINED,
            registration_enabled=False,
            reregister=Reregister.RETRY_DISABLED,
            retry_request="4",
        ),
        Phase.SUCCEEDED,
        (Reason.SUCCEEDED,),
        {"registrationRetry": "4"},
    ),
    # a registration Job that has not failed (a retry whose status write was lost): followed, no new event
    "failed/follow-a-running-job": Exit(
        FAILED_REGISTRATION,
        obs(training=TRAINED, registration=REGISTERING, reregister=Reregister.FOLLOW),
        Phase.REGISTERING,
        (),
        {"completionTime": None},
    ),
    # ... and the same with the request not yet recorded: recorded and announced now
    "failed/follow-records-the-request": Exit(
        FAILED_REGISTRATION,
        obs(training=TRAINED, registration=REGISTERING, reregister=Reregister.FOLLOW, retry_request="5"),
        Phase.REGISTERING,
        (EventReason.REGISTRATION_RETRIED,),
        {"registrationRetry": "5"},
    ),
    # nothing asked: Failed stays (observedGeneration follows the spec)
    "failed/stays": Exit(
        FAILED_TRAINING,
        obs(training=TrainingObservation(True, "Failed"), generation=3),
        Phase.FAILED,
        (),
        {"observedGeneration": 3},
    ),
    # a refused child's spec changed: start over as a new job would
    "failed/rejected-child-spec-changed": Exit(
        FAILED_REJECTED,
        obs(training=TrainingObservation(), generation=2),
        Phase.PENDING,
        (EventReason.CHILDREN_RETRIED,),
        {"completionTime": None, "observedGeneration": 2},
    ),
    # the same generation: stays Failed
    "failed/rejected-child-same-spec": Exit(
        FAILED_REJECTED, obs(training=TrainingObservation(), generation=1), Phase.FAILED
    ),
    # Succeeded without registration, registration turned on: register the trained model
    "succeeded/registration-turned-on": Exit(
        SUCCEEDED_UNREGISTERED,
        obs(training=TRAINED, registration=REGISTERING, reregister=Reregister.ENABLED),
        Phase.REGISTERING,
        (EventReason.REGISTRATION_ENABLED,),
        {"completionTime": None},
    ),
    "succeeded/registration-turned-on-registers": Exit(
        SUCCEEDED_UNREGISTERED,
        obs(training=TRAINED, registration=REGISTERED, reregister=Reregister.ENABLED),
        Phase.SUCCEEDED,
        (EventReason.REGISTRATION_ENABLED, Reason.SUCCEEDED),
        {"registeredModel": {"name": "m", "version": "2"}},
    ),
    # nothing asked: Succeeded stays
    "succeeded/stays": Exit(SUCCEEDED_UNREGISTERED, obs(training=TRAINED, generation=4), Phase.SUCCEEDED),
    # Suspended, then spec.suspend false: the PyTorchJob resumes
    "suspended/resumed-running": Exit(
        SUSPENDED_STATUS, obs(training=RUNNING), Phase.TRAINING, (EventReason.RESUMED,)
    ),
    "suspended/resuming": Exit(
        SUSPENDED_STATUS,
        obs(training=TrainingObservation(True, "Created")),
        Phase.PENDING,
        (EventReason.RESUMED,),
    ),
    # still suspended: stays, no event
    "suspended/stays": Exit(SUSPENDED_STATUS, obs(training=SUSPENDED, suspend=True), Phase.SUSPENDED),
    # training ended while suspended (it finished before the suspension reached it)
    "suspended/trained": Exit(
        SUSPENDED_STATUS,
        obs(training=TRAINED, registration=REGISTERING, suspend=True),
        Phase.REGISTERING,
        (EventReason.REGISTRATION_STARTED,),
    ),
}


def _contains(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_contains(actual.get(k), v) for k, v in wanted.items())
    return bool(actual == wanted)


@pytest.mark.parametrize("name", list(EXITS))
def test_every_exit_from_a_final_or_suspended_phase(name: str) -> None:
    case = EXITS[name]
    t = state.transition(case.previous, case.observation)
    assert t.phase == case.phase
    assert tuple(e.reason for e in t.events) == case.events, [(e.reason, e.message) for e in t.events]
    for key, value in case.status.items():
        assert key in t.status and _contains(t.status[key], value), (key, t.status.get(key))
    if case.phase == case.previous.phase and not case.events:
        assert "registrationRetry" not in t.status


def test_a_retry_event_names_the_annotation_and_the_job() -> None:
    t = state.transition(FAILED_REGISTRATION, EXITS["failed/retry-requested"].observation)
    assert t.events[0].message.startswith(
        f"{RETRY_REGISTRATION_ANNOTATION}=1: registering the trained model again"
    )
    assert "j-register" in t.events[0].message


@pytest.mark.parametrize(
    ("job", "synced", "reason"),
    [
        (REGISTERING, "False", Reason.MOVING_ALIAS),
        (
            RegistrationObservation(True, "Complete", "", {**MODEL, "alias": "production"}),
            "True",
            Reason.ALIAS_MOVED,
        ),
        (REG_FAILED, "False", Reason.ALIAS_FAILED),
    ],
)
def test_an_alias_move_keeps_the_job_succeeded(
    job: RegistrationObservation, synced: str, reason: str
) -> None:
    registered = status(
        Phase.SUCCEEDED,
        condition(ConditionType.READY, True, Reason.SUCCEEDED),
        registeredModel={"name": "m", "version": "2", "uri": "models:/m/2", "alias": "champion"},
    )
    t = state.alias_transition(registered, "production", job, now=T1, generation=2)
    assert t.phase == Phase.SUCCEEDED
    alias = next(c for c in t.status["conditions"] if c["type"] == ConditionType.ALIAS_SYNCED)
    assert (alias["status"], alias["reason"]) == (synced, reason)


# --- one status writer ---------------------------------------------------------------------------------


def _calls(tree: ast.AST) -> list[tuple[str, ast.Call]]:
    """(enclosing function, call) for every call in a module."""
    out: list[tuple[str, ast.Call]] = []

    def walk(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            inner = child.name if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else where
            if isinstance(child, ast.Call):
                out.append((where, child))
            walk(child, inner)

    walk(tree, "<module>")
    return out


def _name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


def status_writers(sources: dict[str, str]) -> dict[str, set[str]]:
    """Per module: the functions that patch a status subresource, call _write_status or _commit."""
    found: dict[str, set[str]] = {}
    for module, source in sources.items():
        for where, call in _calls(ast.parse(source)):
            status_patch = any(
                k.arg == "subresource" and isinstance(k.value, ast.Constant) and k.value.value == "status"
                for k in call.keywords
            )
            if status_patch:
                found.setdefault(f"patch:{module}", set()).add(where)
            if _name(call) in ("_write_status", "_commit"):
                found.setdefault(f"{_name(call)}:{module}", set()).add(where)
    return found


def test_the_status_is_written_in_one_place() -> None:
    folder = REPO / "operator" / "kubetune_operator"
    sources = {str(p.relative_to(folder)): p.read_text() for p in folder.rglob("*.py")}
    assert "state/plan.py" in sources  # the state package is read too
    assert status_writers(sources) == {
        "patch:reconcile.py": {"_write_status"},  # the one merge patch of status
        "_write_status:reconcile.py": {"_commit"},  # called from one function
        "_commit:reconcile.py": {"reconcile"},  # once per pass
    }


def test_the_writer_check_sees_a_second_writer() -> None:
    extra = "def sneaky(kube):\n    kube.patch('v', 'K', 'ns', 'n', {}, subresource='status')\n"
    found = status_writers({"x.py": extra})
    assert found == {"patch:x.py": {"sneaky"}}
