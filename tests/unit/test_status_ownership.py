"""kubetune_api.ownership: every status field has exactly one writer, and each writer's patches, built
by its own code, name only its fields."""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic.alias_generators import to_camel

from kubetune_api.ownership import OWNERS, StatusOwnershipError, Writer, check_patch, owned_by
from kubetune_api.status import FineTuneJobStatus
from kubetune_operator import state
from kubetune_operator.observations import RegistrationObservation
from kubetune_operator.registration_status import registration_report
from kubetune_trainer.training.progress import ProgressState

# The operator's table tests (tests/unit): each of their transitions is a status patch the operator writes.
OPERATOR_TABLE_TESTS = (
    "test_state",
    "test_state_advance",
    "test_state_children",
    "test_state_exits",
    "test_state_failures",
    "test_state_pods",
    "test_state_preparation",
    "test_state_refusals",
    "test_state_preemption",
    "test_gate",
    "test_parent",
)


def test_every_status_field_has_exactly_one_writer() -> None:
    fields = {info.alias or to_camel(name) for name, info in FineTuneJobStatus.model_fields.items()}
    assert set(OWNERS) == fields, set(OWNERS) ^ fields
    assert owned_by(Writer.OPERATOR) | owned_by(Writer.TRAINER) == fields
    assert not owned_by(Writer.OPERATOR) & owned_by(Writer.TRAINER)


def test_a_patch_naming_another_writers_field_is_refused() -> None:
    check_patch({"progress": {}, "mlflow": {}}, Writer.TRAINER)
    with pytest.raises(StatusOwnershipError, match=r"status\.evaluation \(the operator's\)"):
        check_patch({"progress": {}, "evaluation": {"baseEvalLoss": 1.0}}, Writer.TRAINER)
    with pytest.raises(StatusOwnershipError, match=r"status\.mlflow \(the trainer's\)"):
        check_patch({"phase": "Succeeded", "mlflow": {"runId": "r"}}, Writer.OPERATOR)
    with pytest.raises(StatusOwnershipError, match=r"status\.surprise \(undeclared\)"):
        check_patch({"surprise": 1}, Writer.OPERATOR)


# --- the trainer ------------------------------------------------------------------------------------


def _everything_the_trainer_reports() -> ProgressState:
    """A progress state with every report filled: losses, the base eval loss, checkpoints and their
    catalog, the MLflow run, and the trainer-owned fields beside the progress (as train.py sets them)."""
    p = ProgressState(total_steps=100)
    p.update(step=40, epoch=0.4, now=80.0, start=0.0)
    p.loss, p.eval_loss, p.base_eval_loss, p.tokens_per_second = 1.2, 1.3, 2.0, 900.0
    p.checkpoint_latest, p.checkpoint_step, p.checkpoint_count = "/var/lib/kubetune/checkpoints/c-40", 40, 2
    p.checkpoint_catalog = {"bestStep": 40, "items": [{"step": 40, "evalLoss": 1.3}]}
    p.mlflow = {"trackingUri": "http://mlflow", "experimentId": "3", "runId": "r1", "runUrl": "http://x"}
    p.extra = {
        "memoryRetries": [{"attempt": 1, "step": 3, "before": "8x1", "after": "4x2"}],
        "goodput": {"heldGpuSeconds": 10.0, "productiveGpuSeconds": 8.0, "restarts": 0},
        "budget": {"reached": True, "limit": "maxDuration 1h", "step": 40, "totalSteps": 100},
    }
    return p


def test_the_trainers_reports_name_only_its_fields() -> None:
    sent = _everything_the_trainer_reports().as_status()
    assert set(sent) == owned_by(Writer.TRAINER)  # every trainer field, and nothing else
    FineTuneJobStatus.model_validate(sent)  # the API's field names
    assert sent["progress"]["baseEvalLoss"] == 2.0  # the base model's eval loss: with the progress


def test_a_trainer_report_of_an_operator_field_is_refused_before_it_goes_out() -> None:
    p = _everything_the_trainer_reports()
    p.extra["evaluation"] = {"baseEvalLoss": 2.0}  # where it went before: the operator's field
    with pytest.raises(StatusOwnershipError):
        p.as_status()


# --- the operator -----------------------------------------------------------------------------------


def _zero_argument_tests(module_name: str) -> Iterator[Any]:
    module = importlib.import_module(module_name)
    for name, fn in sorted(vars(module).items()):
        # not the parametrized ones (pytest runs them with their cases) nor those taking fixtures
        takes_nothing = callable(fn) and not inspect.signature(fn).parameters
        if name.startswith("test_") and takes_nothing and not hasattr(fn, "pytestmark"):
            yield fn


@pytest.fixture(scope="module")
def operator_patches() -> list[dict[str, Any]]:
    """Every status patch of the operator's table tests, run here once more with the state machine's
    entry points recorded: the status decision (``state.transition``) and the pass's plan
    (``state.advance``, whose Commit action carries the status the pass writes, alias moves and the
    other exits of a finished job included)."""
    recorded: list[dict[str, Any]] = []
    transition, advance = state.transition, state.advance

    def recording_transition(*args: Any, **kwargs: Any) -> state.Transition:
        t = transition(*args, **kwargs)
        recorded.append(t.status)
        return t

    def recording_advance(*args: Any, **kwargs: Any) -> state.Plan:
        plan = advance(*args, **kwargs)
        recorded.extend(
            a.transition.status
            for a in plan.actions
            if isinstance(a, state.Commit) and a.transition is not None
        )
        return plan

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(state, "transition", recording_transition)
        mp.setattr(state, "advance", recording_advance)
        for module_name in OPERATOR_TABLE_TESTS:
            for test in _zero_argument_tests(module_name):
                test()
    return recorded


def test_the_operators_transitions_name_only_its_fields(operator_patches: list[dict[str, Any]]) -> None:
    assert len(operator_patches) > 50  # the table tests ran
    for patch in operator_patches:
        check_patch(patch, Writer.OPERATOR)
    written = {name for patch in operator_patches for name in patch}
    # the table tests reach every field the operator owns: the check above saw each of them
    assert written == owned_by(Writer.OPERATOR), owned_by(Writer.OPERATOR) - written


def test_a_registration_result_goes_into_operator_fields_only() -> None:
    result = {
        "name": "m",
        "version": "2",
        "uri": "models:/m/2",
        "run_id": "r1",
        "alias": "champion",
        "selected": "final",
        "evaluation": {"baseEvalLoss": 2.0, "evalLoss": 1.5, "selected": "final", "gatePassed": True},
        "url": "http://x/#/models/m/versions/2",
        "run_url": "http://x/#/experiments/3/runs/r1",
    }
    out = registration_report(RegistrationObservation(True, "Complete", "", result))
    check_patch(out, Writer.OPERATOR)
    assert set(out) == {"registeredModel", "evaluation"}
    assert out["registeredModel"]["runId"] == "r1" and out["registeredModel"]["runUrl"] == result["run_url"]
    gate = registration_report(
        RegistrationObservation(True, "GateNotMet", "", {"evaluation": result["evaluation"]})
    )
    assert set(gate) == {"evaluation"}
