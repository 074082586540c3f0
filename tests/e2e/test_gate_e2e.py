"""spec.registration.select and spec.registration.gate against a real ``mlflow server``, on what the
trainer really wrote: the tiny model trained once (its own process, eval data, checkpoints every 2
steps, the base model evaluated before training for minImprovement), then registered under several
registrations, each on its own copy of the output folder with its own model name and job identity.

- Gate met: exactly one version, tagged kubetune.selected and kubetune.gate.* (and the numbers
  logged as metrics in the run); a second run of the step registers nothing new.
- select bestEval: the checkpoint with the lowest eval loss is registered (the checkpoint folder as
  the trainer saved it, tokenizer included) and loads back.
- Gate not met: no version, GateNotMet (exit code 5) with both numbers in register-result.json and
  the termination message; then forced (--force, as the operator writes it): exactly one version, tagged
  kubetune.gate.forced=true; the step again, unforced (as an alias move runs it): still that one.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, TINY_DATA, run_trainer, trainer_config, trainer_env
from tests.support.mlflow_server import MlflowServer

from kubetune_api.registration import EXIT_GATE_NOT_MET, FORCE_ENV, FORCE_FLAG
from kubetune_api.trainer_config import COMPLETE_MARKER, FINAL_DIR
from kubetune_trainer.volume import catalog

pytestmark = [pytest.mark.e2e, pytest.mark.training]

WITH_EVAL = {"path": str(TINY_DATA), "format": "messages", "evalFraction": 0.2}
TRAINING = {"maxSteps": 6, "saveSteps": 2, "evalSteps": 2, "saveTotalLimit": 4}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, mlflow_server: MlflowServer) -> Path:
    """One real training with eval data and a minImprovement gate (so the base model is evaluated)."""
    out = tmp_path_factory.mktemp("gate") / "run"
    config = trainer_config(
        out,
        tiny_model,
        name="gate-train",
        tracking_uri=mlflow_server.uri,
        dataset=WITH_EVAL,
        extra_spec={"registration": {"gate": {"minImprovement": 0.0}}},
        **TRAINING,
    )
    log = out.parent / "train.log"
    code = run_trainer(config, log, timeout=600)
    assert code == 0, log.read_text()[-4000:]
    assert catalog.base_eval_loss(out) is not None
    assert catalog.final_eval_loss(out) is not None
    return out


def _job(
    tmp: Path, trained: Path, tiny_model: Path, uri: str, name: str, registration: dict[str, Any]
) -> tuple[Path, Path]:
    """A copy of the trained folder and a config of a new job (name, uid) registering it as ``registration``."""
    out = tmp / name
    shutil.copytree(trained, out)
    (out / "mlflow-run.json").unlink(missing_ok=True)  # its own run: the job has its own identity
    config = trainer_config(
        out,
        tiny_model,
        name=name,
        uid=str(uuid.uuid4()),
        tracking_uri=uri,
        dataset=WITH_EVAL,
        extra_spec={"registration": {"modelName": name, **registration}},
        **TRAINING,
    )
    return out, config


def _register(config: Path, term: Path, *flags: str, **env: str) -> subprocess.CompletedProcess[str]:
    """The registration Job's container, as its own process (``flags``: what the operator adds)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetune_trainer.register",
            "--config",
            str(config),
            "--termination-message-path",
            str(term),
            *flags,
        ],
        env={**trainer_env(), **env},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
    )


def _client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _versions(uri: str, name: str) -> list[Any]:
    return list(_client(uri).search_model_versions(f"name = '{name}'"))


def _run_metrics(uri: str, run_id: str) -> dict[str, float]:
    return dict(_client(uri).get_run(run_id).data.metrics)


def test_gate_met_with_best_eval_registers_that_checkpoint_once(
    tmp_path: Path, trained: Path, tiny_model: Path, mlflow_server: MlflowServer
) -> None:
    uri = mlflow_server.uri
    name = "gate-best"
    final_step = catalog.final_step(trained)
    earlier = [e for e in catalog.catalog(trained) if e.step != final_step and e.eval_loss is not None]
    assert earlier, catalog.status_of(trained)
    best = min(earlier, key=lambda e: e.eval_loss or 0.0)
    assert best.eval_loss is not None
    threshold = best.eval_loss + 0.5
    gate = {"maxEvalLoss": threshold}
    out, config = _job(tmp_path, trained, tiny_model, uri, name, {"select": "bestEval", "gate": gate})
    # The run went past its best (the final model and the last checkpoint, its weights, evaluated
    # worse): bestEval must pick the earlier checkpoint. Training wrote these markers; only their
    # eval loss is raised here.
    for folder in (out / FINAL_DIR, out / "checkpoints" / f"checkpoint-{final_step}"):
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
        marker["eval_loss"] = best.eval_loss + 1.0
        (folder / COMPLETE_MARKER).write_text(json.dumps(marker))
    best_path = out / "checkpoints" / f"checkpoint-{best.step}"
    # the trainer saves the tokenizer into every checkpoint: it loads as final/ does
    assert (best_path / "tokenizer_config.json").exists()
    term = tmp_path / "term"

    first = _register(config, term)
    assert first.returncode == 0, first.stderr[-4000:]
    result = json.loads(term.read_text())
    label = f"checkpoint-{best.step}"
    assert result["selected"] == label
    assert result["evaluation"] == {
        "selected": label,
        "evalLoss": best.eval_loss,
        "baseEvalLoss": catalog.base_eval_loss(trained),
        "threshold": threshold,
        "gatePassed": True,
    }
    assert result["url"] == f"{uri}/#/models/{name}/versions/1"
    run = _client(uri).get_run(result["run_id"])
    assert result["run_url"] == f"{uri}/#/experiments/{run.info.experiment_id}/runs/{result['run_id']}"

    (version,) = _versions(uri, name)
    tags = version.tags
    assert tags["kubetune.selected"] == label
    assert tags["kubetune.gate.passed"] == "true"
    assert float(tags["kubetune.gate.threshold"]) == threshold
    assert float(tags["kubetune.gate.eval_loss"]) == best.eval_loss
    assert "kubetune.gate.forced" not in tags
    metrics = _run_metrics(uri, result["run_id"])
    assert metrics["kubetune.gate.passed"] == 1.0
    assert metrics["kubetune.gate.eval_loss"] == pytest.approx(best.eval_loss)
    assert metrics["kubetune.gate.threshold"] == pytest.approx(threshold)

    # idempotent: the step again registers nothing new
    again = _register(config, term)
    assert again.returncode == 0, again.stderr[-4000:]
    assert json.loads(term.read_text())["version"] == "1"
    assert len(_versions(uri, name)) == 1

    # what was registered is that checkpoint's weights (not final/'s), and it loads back
    import mlflow
    import torch
    from transformers import AutoModelForCausalLM

    mlflow.set_tracking_uri(uri)
    loaded = mlflow.transformers.load_model(f"models:/{name}/1", return_type="components")
    # compared in the dtype the version was logged in (the training's precision), whatever the
    # process's default: a worker of the parallel run read bfloat16 against a float32 copy
    dtype = loaded["model"].dtype
    expected = AutoModelForCausalLM.from_pretrained(best_path, dtype=dtype)
    other = AutoModelForCausalLM.from_pretrained(out / FINAL_DIR, dtype=dtype)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        got = loaded["model"](tokens).logits
        assert torch.allclose(got, expected(tokens).logits, atol=1e-4)
        assert not torch.allclose(got, other(tokens).logits, atol=1e-4)


def test_gate_not_met_registers_nothing_until_forced_then_exactly_one_version(
    tmp_path: Path, trained: Path, tiny_model: Path, mlflow_server: MlflowServer
) -> None:
    uri = mlflow_server.uri
    name = "gate-refused"
    # minImprovement 0.99: the eval loss must fall below 1% of the base model's: never, here
    out, config = _job(tmp_path, trained, tiny_model, uri, name, {"gate": {"minImprovement": 0.99}})
    base = catalog.base_eval_loss(out)
    final_loss = catalog.final_eval_loss(out)
    assert base is not None and final_loss is not None
    threshold = base * (1 - 0.99)
    term = tmp_path / "term"

    # the variable earlier versions read forces nothing (the second wall): refused all the same
    refused = _register(config, term, **{FORCE_ENV: "1"})
    assert refused.returncode == EXIT_GATE_NOT_MET, refused.stderr[-4000:]
    assert _versions(uri, name) == []
    said = json.loads(term.read_text())
    assert said == json.loads((out / "register-result.json").read_text())
    assert said["reason"] == "GateNotMet"
    assert f"{final_loss:.4f}" in said["error"] and f"{threshold:.4f}" in said["error"]
    assert said["evaluation"]["gatePassed"] is False and "forced" not in said["evaluation"]
    assert said["evaluation"]["threshold"] == pytest.approx(threshold)
    assert "GateNotMet" in refused.stderr
    # the numbers are in the job's run all the same
    run_id = json.loads((out / "mlflow-run.json").read_text())["run_id"]
    metrics = _run_metrics(uri, run_id)
    assert metrics["kubetune.gate.passed"] == 0.0
    assert metrics["kubetune.gate.base_eval_loss"] == pytest.approx(base)

    forced = _register(config, term, FORCE_FLAG)
    assert forced.returncode == 0, forced.stderr[-4000:]
    result = json.loads(term.read_text())
    assert result["version"] == "1"
    assert result["evaluation"]["forced"] is True and result["evaluation"]["gatePassed"] is False
    (version,) = _versions(uri, name)
    assert version.tags["kubetune.gate.forced"] == "true"
    assert version.tags["kubetune.gate.passed"] == "false"
    assert version.tags["kubetune.selected"] == "final"

    # again, forced and not (an alias move runs the step without the flag): still that one version
    assert _register(config, term, FORCE_FLAG).returncode == 0
    unforced = _register(config, term)
    assert unforced.returncode == 0, unforced.stderr[-4000:]
    assert json.loads(term.read_text())["evaluation"]["forced"] is True
    assert len(_versions(uri, name)) == 1


def test_an_unknown_eval_loss_does_not_meet_the_gate(
    tmp_path: Path, trained: Path, tiny_model: Path, mlflow_server: MlflowServer
) -> None:
    """No eval loss of the final model (an evaluation that never ran): the gate is not met."""
    uri = mlflow_server.uri
    name = "gate-unknown"
    out, config = _job(tmp_path, trained, tiny_model, uri, name, {"gate": {"maxEvalLoss": 100.0}})
    marker = json.loads((out / FINAL_DIR / COMPLETE_MARKER).read_text())
    marker.pop("eval_loss")
    (out / FINAL_DIR / COMPLETE_MARKER).write_text(json.dumps(marker))
    term = tmp_path / "term"
    refused = _register(config, term)
    assert refused.returncode == EXIT_GATE_NOT_MET, refused.stderr[-4000:]
    said = json.loads(term.read_text())
    assert "not known" in said["error"] and "evalLoss" not in said["evaluation"]
    assert _versions(uri, name) == []
