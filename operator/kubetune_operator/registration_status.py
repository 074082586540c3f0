"""What a registration Job's result puts in the status (:mod:`kubetune_operator.state` decides when):
the registered model with its UI link and the run it was logged from (with its link), and
``status.evaluation`` (what was selected, its eval loss, the gate's verdict). Pure.

Only fields the operator owns (:mod:`kubetune_api.ownership`): ``status.mlflow`` is the trainer's (the
run the training logs to, which the registration logs into as well); the registration's run goes
with the version, in ``registeredModel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from kubetune_api.status import Condition, ConditionType, EvaluationStatus, Reason, RegisteredModelStatus

from .observations import RegistrationObservation
from .state_types import Event


def evaluation_of(result: dict[str, Any] | None) -> EvaluationStatus | None:
    """The result's ``evaluation`` (None when absent or not what the register step writes)."""
    raw = (result or {}).get("evaluation")
    if not isinstance(raw, dict):
        return None
    try:
        return EvaluationStatus.model_validate(raw)
    except ValidationError:
        return None


def registration_report(reg: RegistrationObservation) -> dict[str, Any]:
    """``registeredModel`` (with runId, runUrl) and ``evaluation`` of a registration Job that ended
    Complete with its result, or with the gate not met (evaluation only)."""
    result = reg.result
    if result is None or reg.state not in ("Complete", "GateNotMet"):
        return {}
    out: dict[str, Any] = {}
    evaluation = evaluation_of(result)
    if evaluation is not None:
        # every field, the unknown ones null: a merge patch drops what an earlier verdict said
        out["evaluation"] = evaluation.model_dump(by_alias=True, mode="json")
    if reg.state != "Complete":
        return out
    name, version = str(result["name"]), str(result["version"])
    out["registeredModel"] = RegisteredModelStatus(
        name=name,
        version=version,
        uri=str(result["uri"]) if result.get("uri") else f"models:/{name}/{version}",
        alias=str(result["alias"]) if result.get("alias") else None,
        url=str(result["url"]) if result.get("url") else None,
        run_id=str(result["run_id"]) if result.get("run_id") else None,
        run_url=str(result["run_url"]) if result.get("run_id") and result.get("run_url") else None,
    ).wire()
    return out


def _loss(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f}"


def registered_message(result: dict[str, Any]) -> str:
    """``registered model <name> version <n>``, and what was selected and how the gate went."""
    msg = f"registered model {result['name']} version {result['version']}"
    e = evaluation_of(result)
    if e is None:
        return msg
    if e.selected and e.selected != "final":
        msg += f" from {e.selected} (spec.registration.select bestEval, eval loss {_loss(e.eval_loss)})"
    if e.forced:
        msg += (
            f"; registered on request although spec.registration.gate was not met (eval loss "
            f"{_loss(e.eval_loss)}, threshold {_loss(e.threshold)})"
        )
    elif e.gate_passed:
        msg += (
            f"; spec.registration.gate met (eval loss {_loss(e.eval_loss)}, threshold {_loss(e.threshold)})"
        )
    return msg


def gate_not_met_message(reg: RegistrationObservation, retry: str) -> str:
    """Why nothing was registered (the register step's words: both numbers), and how to register
    it anyway."""
    said = reg.message.removeprefix("GateNotMet: ").strip().rstrip(".")
    if not said:
        e = evaluation_of(reg.result)
        said = (
            f"eval loss {_loss(e.eval_loss if e else None)} does not meet spec.registration.gate's "
            f"threshold {_loss(e.threshold if e else None)}"
        )
    return f"not registered: {said}. To register it anyway: {retry}"


def gate_event(reasons: Mapping[ConditionType, Any], prev: dict[str, Condition]) -> list[Event]:
    """Once, when the gate was not met: a Warning with both numbers (the Registered condition's words)."""
    registered = reasons.get(ConditionType.REGISTERED)
    if not registered or registered[1] != Reason.GATE_NOT_MET:
        return []
    old = prev.get(ConditionType.REGISTERED)
    if old is not None and old.reason == Reason.GATE_NOT_MET:
        return []
    return [Event("Warning", Reason.GATE_NOT_MET, registered[2])]
