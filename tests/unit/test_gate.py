"""The evaluation gate's arithmetic, the MLflow UI links, and how the operator reads and shows a
registration that ended with the gate not met (or forced past it): observation, state machine,
registration Job, ``kubetune watch``."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO
from tests.support.state_obs import T0, obs

from kubetune_api import spec as api
from kubetune_api.mlflow_links import model_version_url, run_url, ui_base
from kubetune_api.registration import EXIT_GATE_NOT_MET, FORCE_ENV, FORCE_FLAG
from kubetune_api.spec import GateSpec
from kubetune_api.status import ConditionType, FineTuneJobStatus, Phase, Reason
from kubetune_cli import watch
from kubetune_operator import builders, observations, state
from kubetune_operator.settings import Settings
from kubetune_trainer import settings
from kubetune_trainer.registration import gate, register

# --- links ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("uri", "base"),
    [
        ("http://mlflow:5000", "http://mlflow:5000"),
        ("https://mlflow.example.com/", "https://mlflow.example.com"),
        ("HTTPS://Mlflow.Example.com/mlflow/?x=1#frag", "https://mlflow.example.com/mlflow"),
        ("https://bob:hunter2@mlflow.example.com:8443/p", "https://mlflow.example.com:8443/p"),
        ("http://[::1]:5000", "http://[::1]:5000"),
        ("sqlite:///runs/j/mlflow.db", None),
        ("file:///tmp/mlruns", None),
        ("databricks", None),
        ("http://", None),
        ("http://host:notaport", None),
        ("", None),
        (None, None),
    ],
)
def test_only_http_servers_have_a_ui_address(uri: str | None, base: str | None) -> None:
    assert ui_base(uri) == base


def test_the_run_and_version_links() -> None:
    assert run_url("http://m:5000/", "12", "abc") == "http://m:5000/#/experiments/12/runs/abc"
    assert (
        model_version_url("http://m:5000", "org/chat bot", 3)
        == "http://m:5000/#/models/org%2Fchat%20bot/versions/3"
    )
    assert "hunter2" not in (model_version_url("https://u:hunter2@m", "x", "1") or "")
    assert run_url("http://m", None, "abc") is None and run_url("http://m", "1", None) is None
    assert model_version_url("http://m", "x", None) is None and model_version_url("http://m", "", "1") is None
    assert run_url("sqlite:///x.db", "1", "abc") is None and model_version_url("file:///x", "n", "1") is None


# --- the gate's arithmetic ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "loss", "base", "threshold", "passed"),
    [
        ({"max_eval_loss": 1.5}, 1.5, None, 1.5, True),  # at most: equal meets it
        ({"max_eval_loss": 1.5}, 1.5000001, None, 1.5, False),
        ({"max_eval_loss": 1.5}, 0.2, 9.0, 1.5, True),  # the base plays no part
        ({"min_improvement": 0.0}, 1.99, 2.0, 2.0, True),  # 0: any improvement
        ({"min_improvement": 0.0}, 2.0, 2.0, 2.0, False),  # strictly below the base
        ({"min_improvement": 0.25}, 1.49, 2.0, 1.5, True),
        ({"min_improvement": 0.25}, 1.5, 2.0, 1.5, False),  # strictly below base x (1 - m)
        ({"min_improvement": 0.25}, 1.0, None, None, False),  # base not measured
        ({"min_improvement": 0.25}, 1.0, float("nan"), None, False),
        ({"max_eval_loss": 1.5}, None, None, 1.5, False),  # never evaluated
        ({"max_eval_loss": 1.5}, float("inf"), None, 1.5, False),
    ],
)
def test_threshold_and_verdict(
    spec: dict[str, float], loss: float | None, base: float | None, threshold: float | None, passed: bool
) -> None:
    g = GateSpec(**spec)
    assert gate.threshold_of(g, base) == (pytest.approx(threshold) if threshold is not None else None)
    verdict = gate.decide(g, "final", loss, base)
    assert verdict.passed is passed
    assert verdict.blocks is (not passed)


def test_no_gate_registers_and_tags_only_what_was_selected() -> None:
    verdict = gate.decide(None, "checkpoint-40", 1.2, None, forced=True)
    assert verdict.passed is None and not verdict.blocks and not verdict.forced
    assert verdict.tags() == {"kubetune.selected": "checkpoint-40"}
    assert verdict.metrics() == {}
    assert verdict.status() == {"selected": "checkpoint-40", "evalLoss": 1.2}


def test_a_gate_met_is_tagged_and_logged_with_its_numbers() -> None:
    verdict = gate.decide(GateSpec(min_improvement=0.1), "final", 1.7, 2.0, forced=True)
    assert verdict.passed and not verdict.forced  # forcing matters only when the gate is not met
    assert verdict.tags() == {
        "kubetune.selected": "final",
        "kubetune.gate.passed": "true",
        "kubetune.gate.threshold": repr(2.0 * 0.9),
        "kubetune.gate.eval_loss": "1.7",
        "kubetune.gate.base_eval_loss": "2.0",
    }
    assert verdict.metrics() == {
        "kubetune.gate.passed": 1.0,
        "kubetune.gate.threshold": pytest.approx(1.8),
        "kubetune.gate.eval_loss": 1.7,
        "kubetune.gate.base_eval_loss": 2.0,
    }
    assert verdict.status() == {
        "baseEvalLoss": 2.0,
        "evalLoss": 1.7,
        "selected": "final",
        "threshold": pytest.approx(1.8),
        "gatePassed": True,
    }


def test_a_gate_not_met_says_both_numbers_and_forcing_tags_it() -> None:
    refused = gate.decide(GateSpec(max_eval_loss=1.0), "final", 1.2345, None)
    assert refused.blocks and refused.tags() == {"kubetune.selected": "final"}
    message = str(gate.GateNotMetError(refused))
    assert "1.2345" in message and "1.0000" in message and "maxEvalLoss" in message
    assert refused.metrics()["kubetune.gate.passed"] == 0.0
    forced = gate.decide(GateSpec(max_eval_loss=1.0), "final", 1.2345, None, forced=True)
    assert not forced.blocks
    assert (
        forced.tags()["kubetune.gate.forced"] == "true" and forced.tags()["kubetune.gate.passed"] == "false"
    )
    assert forced.status()["forced"] is True and forced.status()["gatePassed"] is False
    unknown = gate.decide(GateSpec(min_improvement=0.0), "final", 1.0, None)
    assert "base model's eval loss was not measured" in unknown.message()


@pytest.mark.parametrize("value", ["1", "true", "yes", "0", ""])
def test_forced_only_by_the_command_line_never_the_environment(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(FORCE_ENV, value)
    assert settings.current().ignored_control == (FORCE_ENV,)  # named in a warning, nothing more
    assert register.build_parser().parse_args(["--config", "c.yaml"]).force is False
    assert register.build_parser().parse_args(["--config", "c.yaml", FORCE_FLAG]).force is True


# --- the operator ------------------------------------------------------------------------------------

EVALUATION = {
    "selected": "final",
    "evalLoss": 2.1,
    "baseEvalLoss": 2.0,
    "threshold": 1.9,
    "gatePassed": False,
}
GATE_MESSAGE = {
    "reason": "GateNotMet",
    "error": "eval loss 2.1000 of final (spec.registration.select) does not meet the threshold 1.9000 "
    "(below; ...); nothing registered, the model stays on the volume",
    "evaluation": EVALUATION,
}


def _job(conditions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "name": "j-register"}, "status": {"conditions": conditions}}


def _pod(exit_code: int, message: str) -> dict[str, Any]:
    term = {"exitCode": exit_code, "message": message, "reason": "Error"}
    return {
        "metadata": {"name": "p", "ownerReferences": [{"uid": "u1"}], "creationTimestamp": T0},
        "status": {"containerStatuses": [{"name": "register", "state": {"terminated": term}}]},
    }


def test_a_job_failed_on_the_gate_is_observed_as_gate_not_met() -> None:
    failed = _job([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy"}])
    seen = observations.registration_observation(
        failed, [_pod(EXIT_GATE_NOT_MET, json.dumps(GATE_MESSAGE))], "register"
    )
    assert seen.state == "GateNotMet" and seen.result == GATE_MESSAGE and "2.1000" in seen.message
    other = observations.registration_observation(
        failed, [_pod(3, json.dumps({"reason": "MlflowRefused", "error": "403"}))], "register"
    )
    assert other.state == "Failed"


def _gate_not_met() -> state.Transition:
    reg = state.RegistrationObservation(True, "GateNotMet", GATE_MESSAGE["error"], GATE_MESSAGE)
    return state.transition(
        FineTuneJobStatus(phase=Phase.REGISTERING),
        obs(training=state.TrainingObservation(True, "Succeeded"), registration=reg),
    )


def test_gate_not_met_succeeds_with_registered_false_and_the_numbers() -> None:
    t = _gate_not_met()
    assert t.phase == Phase.SUCCEEDED
    conditions = {c["type"]: c for c in t.status["conditions"]}
    registered, ready = conditions[ConditionType.REGISTERED], conditions[ConditionType.READY]
    assert registered["status"] == "False" and registered["reason"] == Reason.GATE_NOT_MET
    assert "2.1000" in registered["message"] and "1.9000" in registered["message"]
    assert "kubetune.io/retry-registration" in registered["message"]
    assert ready["status"] == "True" and "2.1000" in ready["message"]
    assert {k: v for k, v in t.status["evaluation"].items() if v is not None} == EVALUATION
    assert t.status["evaluation"]["forced"] is None  # null: a merge patch removes an earlier one
    assert "registeredModel" not in t.status
    warnings = [e for e in t.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [Reason.GATE_NOT_MET] and "1.9000" in warnings[0].message
    done = FineTuneJobStatus.model_validate(t.status)
    assert state.gate_not_met(done) and state.registration_forced(done)
    assert not state.failed_in_registration(done)


def test_a_forced_registration_records_the_links_and_says_it_was_forced() -> None:
    result = {
        "name": "m",
        "version": "1",
        "uri": "models:/m/1",
        "run_id": "r1",
        "alias": None,
        "selected": "final",
        "evaluation": {**EVALUATION, "forced": True},
        "url": "http://mlflow:5000/#/models/m/versions/1",
        "run_url": "http://mlflow:5000/#/experiments/3/runs/r1",
    }
    previous = FineTuneJobStatus.model_validate(_gate_not_met().status)
    t = state.transition(
        previous,
        obs(
            training=state.TrainingObservation(True, "Succeeded"),
            registration=state.RegistrationObservation(True, "Complete", "", result),
            reregister=state.Reregister.RETRY,
            retry_request="1",
        ),
    )
    assert t.phase == Phase.SUCCEEDED
    assert t.status["registeredModel"]["url"] == result["url"]
    model = t.status["registeredModel"]
    assert (model["runId"], model["runUrl"]) == ("r1", result["run_url"])
    assert "mlflow" not in t.status  # the trainer's (kubetune_api.ownership)
    assert t.status["evaluation"]["forced"] is True
    registered = next(c for c in t.status["conditions"] if c["type"] == ConditionType.REGISTERED)
    assert registered["status"] == "True" and "not met" in registered["message"]


def _ftj() -> api.FineTuneJob:
    doc = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    doc["metadata"] = {"name": "j", "namespace": "ml", "uid": "u"}
    return api.FineTuneJob.model_validate(doc)


def test_the_registration_job_fails_at_once_on_the_gate_and_is_forced_on_request() -> None:
    job, settings = _ftj(), Settings()
    plain = builders.build_registration_job(job, settings)
    (rule,) = plain["spec"]["podFailurePolicy"]["rules"]
    assert rule["action"] == "FailJob" and rule["onExitCodes"]["values"] == [EXIT_GATE_NOT_MET]
    container = plain["spec"]["template"]["spec"]["containers"][0]
    assert FORCE_FLAG not in container["command"] and FORCE_ENV not in {e["name"] for e in container["env"]}
    forced = builders.build_registration_job(job, settings, force=True)
    container = forced["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][-1] == FORCE_FLAG  # where the trainer reads it (test_control_settings)
    assert FORCE_ENV not in {e["name"] for e in container["env"]}


# --- kubetune watch ---------------------------------------------------------------------------------------


def test_watch_prints_the_links_and_the_verdict() -> None:
    status = {
        "phase": "Succeeded",
        "registeredModel": {
            "name": "m",
            "version": "1",
            "uri": "models:/m/1",
            "url": "http://x/#/models/m/versions/1",
        },
        "mlflow": {"runId": "r1", "trackingUri": "http://x", "runUrl": "http://x/#/experiments/3/runs/r1"},
        "evaluation": {**EVALUATION, "forced": True},
    }
    text = watch.outcome(status)
    assert "http://x/#/models/m/versions/1" in text and "http://x/#/experiments/3/runs/r1" in text
    assert "gate NOT met, registered on request (forced) (threshold 1.9000, base model 2.0000)" in text
    out = io.StringIO()
    follower = watch.Follower(out)
    training = {"status": {"phase": "Training", "mlflow": {"runUrl": "http://x/#/experiments/3/runs/r1"}}}
    assert follower.show(training) is None and follower.show(training) is None
    assert out.getvalue().count("MLflow run: http://x/#/experiments/3/runs/r1") == 1


# --- what is registered -----------------------------------------------------------------------------------


def _cfg(tmp_path: Any, select: str) -> Any:
    from kubetune_api.trainer_config import resolve

    doc = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    doc["metadata"] = {"name": "j", "namespace": "ml", "uid": "u"}
    doc["spec"]["registration"]["select"] = select
    return resolve(api.FineTuneJob.model_validate(doc), output_dir=str(tmp_path / "out"))


def _folder(path: Any, marker: dict[str, Any], *, tokenizer: bool) -> None:
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    if tokenizer:
        (path / "tokenizer_config.json").write_text("{}")
    (path / "COMPLETE").write_text(json.dumps(marker))


def test_best_eval_picks_the_checkpoint_and_a_checkpoint_without_tokenizer_takes_finals(
    tmp_path: Any,
) -> None:
    from kubetune_trainer.registration.register import final_dir, selected_folders

    cfg = _cfg(tmp_path, "bestEval")
    out = tmp_path / "out"
    _folder(
        out / "final", {"step": 30, "eval_loss": 1.6, "training_hash": cfg.training_hash()}, tokenizer=True
    )
    _folder(out / "checkpoints" / "checkpoint-20", {"step": 20, "eval_loss": 1.4}, tokenizer=False)
    _folder(out / "checkpoints" / "checkpoint-30", {"step": 30, "eval_loss": 1.6}, tokenizer=True)
    folders = selected_folders(cfg, final_dir(cfg))
    assert folders.weights == out / "checkpoints" / "checkpoint-20"
    assert folders.tokenizer == out / "final"
    assert folders.selected.label == "checkpoint-20" and folders.selected.eval_loss == 1.4
    final = selected_folders(_cfg(tmp_path, "final"), final_dir(cfg))
    assert final.weights == final.tokenizer == out / "final" and final.selected.label == "final"
