"""spec.registration.gate through the operator against the real API server, with the test playing the
Training Operator and the Job controller (the registration Job's pod ends with the register step's
termination message, as tests/integration/test_operator_flow.py does it):

GateNotMet (exit code 5) → the job Succeeded with Registered=False GateNotMet, both numbers in the
message, status.evaluation, a Warning event, Argo CD Healthy with that message; then the
kubetune.io/retry-registration annotation → a registration Job created anew with ``--force`` in
its command (never an environment variable) → Registered, with the version's and the run's UI links.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.integration.conftest import (
    API_VERSION,
    condition,
    events_for,
    finish_registration_job,
    get_job,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import REPO
from tests.support.lua import run_health

from kubetune_api.registration import EXIT_GATE_NOT_MET, FORCE_ENV, FORCE_FLAG
from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION as RETRY

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

HEALTH = REPO / "deploy" / "argocd" / "health" / "finetunejob.lua"
EVALUATION = {
    "selected": "final",
    "evalLoss": 1.4321,
    "baseEvalLoss": 1.5,
    "threshold": 1.2,
    "gatePassed": False,
}
GATE_NOT_MET = {
    "reason": "GateNotMet",
    "error": "eval loss 1.4321 of final (spec.registration.select) does not meet the threshold 1.2000 "
    "(at most; spec.registration.gate.maxEvalLoss 1.2); nothing registered, the model stays on the volume",
    "evaluation": EVALUATION,
}
UI = "http://mlflow.mlflow.svc:5000"
FORCED = {
    "name": "qwen3_4b_assistant",
    "version": "4",
    "uri": "models:/qwen3_4b_assistant/4",
    "run_id": "0a1b2c3d4e5f",
    "alias": "champion",
    "selected": "final",
    "evaluation": {**EVALUATION, "forced": True},
    "url": f"{UI}/#/models/qwen3_4b_assistant/versions/4",
    "run_url": f"{UI}/#/experiments/7/runs/0a1b2c3d4e5f",
}


def _env(job: dict[str, Any]) -> dict[str, str]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container.get("env") or []}


def _command(job: dict[str, Any]) -> list[str]:
    return list(job["spec"]["template"]["spec"]["containers"][0]["command"])


def test_gate_not_met_succeeds_then_the_retry_registers_it_forced(
    kube: Any, namespace: str, operator: Any
) -> None:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["spec"]["registration"]["gate"] = {"maxEvalLoss": 1.2}
    kube.create(doc)
    name = doc["metadata"]["name"]
    ptj, reg = f"{name}-train", f"{name}-register"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what="the PyTorchJob")
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    first = wait_for(lambda: kube.get("batch/v1", "Job", namespace, reg), what="the registration Job")
    assert FORCE_ENV not in _env(first) and FORCE_FLAG not in _command(first)
    (rule,) = first["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [EXIT_GATE_NOT_MET]

    finish_registration_job(
        kube, namespace, reg, exit_code=EXIT_GATE_NOT_MET, message=json.dumps(GATE_NOT_MET)
    )
    obj = wait_phase(kube, namespace, name, "Succeeded")
    registered, ready = condition(obj, "Registered"), condition(obj, "Ready")
    assert registered["status"] == "False" and registered["reason"] == "GateNotMet"
    assert "1.4321" in registered["message"] and "1.2000" in registered["message"]
    assert f"{RETRY}=" in registered["message"]
    assert ready["status"] == "True" and "1.4321" in ready["message"]
    assert obj["status"]["evaluation"] == EVALUATION
    assert "registeredModel" not in obj["status"]
    gate_events = wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "GateNotMet"],
        what="a GateNotMet event",
    )
    assert gate_events[0]["type"] == "Warning" and "1.2000" in gate_events[0]["message"]
    for open_libs in (False, True):
        assert run_health(HEALTH, obj, open_libs=open_libs) == {
            "status": "Healthy",
            "message": ready["message"],
        }

    # Registered anyway, on purpose: the failed Job goes, a forced one comes; training is not redone
    training_uid = kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["metadata"]["uid"]
    kube.patch(API_VERSION, "FineTuneJob", namespace, name, {"metadata": {"annotations": {RETRY: "1"}}})
    forced = wait_for(
        lambda: (
            (j := kube.get("batch/v1", "Job", namespace, reg))
            and j["metadata"]["uid"] != first["metadata"]["uid"]
            and j
        ),
        what="the registration Job created anew",
    )
    assert _command(forced)[-1] == FORCE_FLAG and FORCE_ENV not in _env(forced)  # where the trainer reads it
    wait_phase(kube, namespace, name, "Registering")
    wait_for(
        lambda: [e for e in events_for(kube, namespace, name) if e["reason"] == "RegistrationRetried"],
        what="a RegistrationRetried event",
    )
    finish_registration_job(kube, namespace, reg, message=json.dumps(FORCED))
    obj = wait_phase(kube, namespace, name, "Succeeded")
    status = obj["status"]
    assert status["registeredModel"] == {
        "name": "qwen3_4b_assistant",
        "version": "4",
        "uri": "models:/qwen3_4b_assistant/4",
        "alias": "champion",
        "url": FORCED["url"],
        "runId": FORCED["run_id"],  # the run it was logged from, with its link
        "runUrl": FORCED["run_url"],
    }
    assert "mlflow" not in status  # the trainer's (kubetune_api.ownership); no trainer ran here
    assert status["evaluation"] == {**EVALUATION, "forced": True}
    assert status["registrationRetry"] == "1"
    registered = condition(obj, "Registered")
    assert registered["status"] == "True" and "not met" in registered["message"]
    assert kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj)["metadata"]["uid"] == training_uid
    assert run_health(HEALTH, obj) == {
        "status": "Healthy",
        "message": "Registered model qwen3_4b_assistant version 4",
    }
    # nothing more happens: the retry was acted on once
    assert get_job(kube, namespace, name)["status"]["phase"] == "Succeeded"
