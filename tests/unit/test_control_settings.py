"""The second wall (issue 33 item 1): the trainer's and the registration's control settings come from
what the operator wrote (the command it builds, the config it mounts), never from the pod's
environment.

Each test sets the variables earlier versions read, to hostile values, in the real process
environment, runs the step's own entry point as the pod runs it (the operator's command), and
checks that the decision is the one the command says: the gate is not skipped, the report goes
where the kubelet reads it, the retry budget, the claim wait and the shutdown grace are the
command's. The first wall (spec.env may not set these names) is tests/unit/test_pod_env.py.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.registration import EXIT_GATE_NOT_MET, FORCE_ENV, FORCE_FLAG
from kubetune_api.spec import FineTuneJob
from kubetune_api.trainer_config import CONFIG_PATH, TrainerConfig, resolve
from kubetune_operator import builders
from kubetune_operator.pod_env import shutdown_grace_seconds
from kubetune_operator.settings import Settings
from kubetune_trainer import settings
from kubetune_trainer.preparation import prepare
from kubetune_trainer.registration import register
from kubetune_trainer.registration.claim import DEFAULT_CLAIM_WAIT_S
from kubetune_trainer.registration.gate import GateNotMetError, Verdict
from kubetune_trainer.training import failures, launch, train

HOSTILE = "hostile-value-7731"


@pytest.fixture
def hostile_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Every former control variable set as an attacker would; the path they point reports to."""
    elsewhere = tmp_path / "elsewhere"
    monkeypatch.setenv(FORCE_ENV, "1")
    monkeypatch.setenv(settings.TERMINATION_LOG_ENV, str(elsewhere))
    monkeypatch.setenv(settings.TERMINATION_MESSAGE_ENV, str(elsewhere))
    monkeypatch.setenv(settings.RETRY_BUDGET_ENV, "0")
    monkeypatch.setenv(settings.CLAIM_WAIT_ENV, "0")
    monkeypatch.setenv(settings.GRACE_ENV, "1")
    return elsewhere


@pytest.fixture
def kubelet_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The file the kubelet reads (terminationMessagePath), as it exists in a container."""
    path = tmp_path / "termination-log"
    path.write_text("")
    monkeypatch.setattr(register, "DEFAULT_TERMINATION_MESSAGE_PATH", str(path))
    monkeypatch.setattr(failures, "DEFAULT_TERMINATION_LOG", str(path))
    monkeypatch.setattr(failures, "_explicit_termination_log", [])
    monkeypatch.setattr(prepare, "TERMINATION_MESSAGE_PATH", str(path))
    return path


def test_every_former_control_variable_is_only_named(hostile_env: Path) -> None:
    assert set(settings.current().ignored_control) == set(settings.IGNORED_CONTROL_ENV)


# --- registration: the gate, the report, the retries --------------------------------------------------


class _Recorder:
    """Stands in for MLflow (the rest of the registration step is real): what the step decided."""

    seen: dict[str, Any] = {}

    def __init__(self, cfg: TrainerConfig, tracking_uri: str, retrier: Any, claim: Any = None) -> None:
        _Recorder.seen = {"budget": retrier.budget_s, "claim_wait": claim.wait_s}

    def run(self, folders: Any, verdict: Verdict) -> dict[str, Any]:
        _Recorder.seen["verdict"] = verdict
        if verdict.blocks:
            raise GateNotMetError(verdict)
        return {"name": "m", "version": "1", "uri": "models:/m/1", "run_id": "r"}


def _gated_job() -> FineTuneJob:
    """A job whose gate its model will not meet (its final model's eval loss was never measured)."""
    return FineTuneJob.model_validate(
        {
            "metadata": {"name": "gated", "namespace": "ns", "uid": "uid-gated"},
            "spec": {
                "model": {"name": "Qwen/Qwen2-0.5B"},
                "dataset": {"name": "trl-lib/Capybara", "evalSplit": "test"},
                "training": {"maxSteps": 1},
                "registration": {"gate": {"maxEvalLoss": 1.0}},
            },
        }
    )


def _gated_config(tmp_path: Path) -> Path:
    """The gated job, finished: its trainer config."""
    cfg = resolve(_gated_job(), default_tracking_uri="http://127.0.0.1:9", output_dir=str(tmp_path / "out"))
    final = Path(cfg.output_dir) / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text("{}")
    (final / "COMPLETE").write_text("{}")
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    return path


def _pod_args(command: list[str], config: Path) -> list[str]:
    """The registration container's arguments as the operator wrote them, with this test's config."""
    assert command[:3] == ["python", "-m", "kubetune_trainer.register"]
    return [str(config) if a == CONFIG_PATH else a for a in command[3:]]


def test_the_environment_never_forces_the_gate_nor_moves_the_report(
    tmp_path: Path,
    hostile_env: Path,
    kubelet_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(register, "Registration", _Recorder)
    monkeypatch.setenv(FORCE_ENV, HOSTILE)
    args = _pod_args(builders.register_command(), _gated_config(tmp_path))  # a plain registration
    with caplog.at_level(logging.WARNING):
        assert register.main(args) == EXIT_GATE_NOT_MET
    verdict = _Recorder.seen["verdict"]
    assert verdict.blocks and not verdict.forced  # the gate held
    assert json.loads(kubelet_file.read_text())["reason"] == "GateNotMet"  # where the operator reads
    assert not hostile_env.exists()
    # the retries are the command's (its defaults here), not the environment's zeros
    assert _Recorder.seen["budget"] == register.DEFAULT_RETRY_BUDGET_S
    assert _Recorder.seen["claim_wait"] == DEFAULT_CLAIM_WAIT_S
    # said, by name, never by value
    assert f"{FORCE_ENV} is set in the environment and ignored" in caplog.text
    assert HOSTILE not in caplog.text


def test_the_operators_forced_command_is_what_forces(
    tmp_path: Path, hostile_env: Path, kubelet_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(register, "Registration", _Recorder)
    monkeypatch.delenv(FORCE_ENV)
    manifest = builders.build_registration_job(_gated_job(), Settings(), force=True)
    (container,) = manifest["spec"]["template"]["spec"]["containers"]
    assert FORCE_FLAG in container["command"]
    assert register.main(_pod_args(container["command"], _gated_config(tmp_path))) == 0
    assert _Recorder.seen["verdict"].forced
    assert json.loads(kubelet_file.read_text())["version"] == "1"
    assert not hostile_env.exists()


# --- training and preparation: the report, the shutdown grace ------------------------------------------


def test_training_reports_where_the_kubelet_reads_whatever_the_environment(
    hostile_env: Path, kubelet_file: Path
) -> None:
    args = train.build_parser().parse_args(["--config", CONFIG_PATH])  # the operator's train command
    failures.use_termination_log(args.termination_log)
    failures.report(TrainingFailure.of(Failure.UNKNOWN, "boom"))
    assert "boom" in kubelet_file.read_text()
    assert not hostile_env.exists()
    # and the launcher reads it back from there
    torchrun_args = launch.split_args(builders.train_command(Settings())[3:])[1]
    failures.use_termination_log(launch.termination_log_of(torchrun_args))
    assert "boom" in failures.read_termination_log()


def test_the_shutdown_grace_is_the_operators_command(hostile_env: Path) -> None:
    operator = Settings(termination_grace_seconds=900)
    command = builders.train_command(operator)
    assert command[:3] == ["python", "-m", "kubetune_trainer.launch"]
    grace, torchrun_args = launch.split_args(command[3:])
    assert grace == shutdown_grace_seconds(operator) == 840  # not the environment's 1
    assert torchrun_args[:2] == ["--module", "kubetune_trainer.train"]


def test_preparation_reports_where_the_kubelet_reads_whatever_the_environment(
    hostile_env: Path, kubelet_file: Path, tmp_path: Path
) -> None:
    command = builders.prepare_command()
    assert command[:3] == ["python", "-m", "kubetune_trainer.prepare"]
    args = [str(tmp_path / "missing.yaml") if a == CONFIG_PATH else a for a in command[3:]]
    assert prepare.main(args) == 2  # refused: no config
    assert "missing.yaml" in json.loads(kubelet_file.read_text())["refusal"]["message"]
    assert not hostile_env.exists()
