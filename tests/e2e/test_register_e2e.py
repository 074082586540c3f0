"""Registration against a real ``mlflow server``: tiny LoRA and full models, idempotency, outages.

The MLflow server and the tiny model are the session's (``tests/e2e/conftest.py``); the outage
test stops that server and always starts it again on the same port and store. The final models
are made here, as training leaves them (``final/`` + tokenizer + ``COMPLETE``),
from the tiny Qwen2 model kubetune builds, without running the trainer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]
FAKE_TOKEN = "kt-fake-token-7Qz9wX2p"
FAKE_HF_TOKEN = "hf_fakeTokenValue4242"
MODEL_NAME = "tiny-chat"


@pytest.fixture
def tiny_base(tiny_model: Path) -> Path:
    """The tiny Qwen2 base model (built once per session by tests/e2e/conftest.py)."""
    return tiny_model


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fake credentials, as the pod gets them from Secrets; the test server ignores them."""
    env = {"MLFLOW_TRACKING_TOKEN": FAKE_TOKEN, "HF_TOKEN": FAKE_HF_TOKEN}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # register.main sets these defaults in os.environ; monkeypatch restores them afterwards.
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_UV_AUTO_DETECT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    return env


def make_final(output_dir: Path, base: Path, method: str) -> Path:
    """``<output_dir>/final`` as training writes it: adapter or full weights, tokenizer, COMPLETE."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from kubetune_trainer.volume.checkpoints import mark_complete

    final = output_dir / "final"
    model: Any = AutoModelForCausalLM.from_pretrained(base)
    tokenizer = AutoTokenizer.from_pretrained(base)
    torch.manual_seed(1)
    if method == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(
            model,
            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
        )
        # A fresh adapter is a no-op (B = 0); make it change the model, as training would.
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "lora_B" in name:
                    param.normal_(0, 0.2)
    else:
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn_like(param) * 0.01)
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    mark_complete(final, {"step": 1})
    return final


def write_config(
    tmp: Path,
    *,
    base: Path,
    method: str,
    tracking_uri: str,
    name: str,
    uid: str,
    model_name: str,
    merge_lora: bool = True,
    alias: str | None = "champion",
) -> Path:
    from kubetune_api.spec import FineTuneJob
    from kubetune_api.trainer_config import resolve

    spec: dict[str, Any] = {
        "model": {"path": str(base)},
        "dataset": {"path": "/data/tiny-chat.jsonl"},
        "method": method,
        "training": {"maxSteps": 1, "precision": "fp32"},
        "registration": {
            "modelName": model_name,
            "mergeLora": merge_lora,
        },
        "secrets": {"mlflowTrackingToken": {"name": "mlflow", "key": "token"}},
    }
    if alias:
        spec["registration"]["alias"] = alias
    if method == "lora":
        spec["lora"] = {"r": 4, "alpha": 8, "targetModules": ["q_proj", "v_proj"]}
    job = FineTuneJob.model_validate(
        {"metadata": {"name": name, "namespace": "team-a", "uid": uid}, "spec": spec}
    )
    cfg = resolve(job, default_tracking_uri=tracking_uri, output_dir=str(tmp / "out"))
    path = tmp / "config.yaml"
    path.write_text(cfg.to_yaml())
    return path


def run_register_process(config: Path, env: dict[str, str], *extra: str) -> subprocess.CompletedProcess[str]:
    """The registration Job's container: ``python -m kubetune_trainer.register`` in its own process."""
    full_env = {**os.environ, **env}
    return subprocess.run(
        [sys.executable, "-m", "kubetune_trainer.register", "--config", str(config), *extra],
        env=full_env,
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=config.parent,
    )


def client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def chat(model_uri: str, tracking_uri: str) -> str:
    """Load the registered model back through MLflow's pyfunc chat interface and ask it something."""
    import mlflow

    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    model = mlflow.pyfunc.load_model(model_uri)
    out = model.predict({"messages": [{"role": "user", "content": "Hello, who are you?"}], "max_tokens": 12})
    reply = out[0]["choices"][0]["message"]["content"]
    assert isinstance(reply, str)
    return reply


def assert_no_secrets(*texts: str) -> None:
    for text in texts:
        assert FAKE_TOKEN not in text
        assert FAKE_HF_TOKEN not in text


def test_lora_merged_registers_into_the_training_run_once(
    tmp_path: Path, tiny_base: Path, mlflow_server: MlflowServer, secret_env: dict[str, str]
) -> None:
    from kubetune_trainer.registration import register

    uri = mlflow_server.uri
    config = write_config(
        tmp_path,
        base=tiny_base,
        method="lora",
        tracking_uri=uri,
        name="tiny-lora",
        uid="uid-lora-1",
        model_name=MODEL_NAME,
    )
    out = tmp_path / "out"
    make_final(out, tiny_base, "lora")
    # The run training opened (kubetune_trainer.mlflow.tracking keeps its id on the volume).
    mlflow = client(uri)
    experiment = mlflow.get_experiment_by_name("kubetune/team-a")
    exp_id = experiment.experiment_id if experiment else mlflow.create_experiment("kubetune/team-a")
    training_run = mlflow.create_run(exp_id, tags={"kubetune.job.uid": "uid-lora-1"}).info.run_id
    mlflow.log_param(training_run, "training.maxSteps", "1")
    mlflow.set_terminated(training_run)
    (out / "mlflow-run.json").write_text(
        json.dumps({"run_id": training_run, "experiment_id": exp_id, "tracking_uri": uri})
    )
    term = tmp_path / "termination-log"

    first = run_register_process(config, secret_env, "--termination-message-path", str(term))
    assert first.returncode == 0, first.stderr[-4000:]
    assert_no_secrets(first.stdout, first.stderr)

    result = json.loads((out / "register-result.json").read_text())
    assert result == {
        "name": MODEL_NAME,
        "version": "1",
        "uri": f"models:/{MODEL_NAME}/1",
        "run_id": training_run,
        "alias": "champion",
        "selected": "final",
        "evaluation": {"selected": "final"},
        "url": f"{uri}/#/models/{MODEL_NAME}/versions/1",
        "run_url": f"{uri}/#/experiments/{exp_id}/runs/{training_run}",
    }
    assert json.loads(term.read_text()) == result
    assert len(term.read_bytes()) < 4096

    # Second run (in-process this time, the same entry point): no new version, same result.
    term.unlink()
    assert register.main(["--config", str(config), "--termination-message-path", str(term)]) == 0
    assert json.loads(term.read_text()) == result
    versions = mlflow.search_model_versions(f"name = '{MODEL_NAME}'")
    assert [v.version for v in versions] == ["1"]
    version = versions[0]
    assert version.run_id == training_run
    assert mlflow.get_model_version_by_alias(MODEL_NAME, "champion").version == "1"

    lineage = {
        "kubetune.job.name": "tiny-lora",
        "kubetune.job.namespace": "team-a",
        "kubetune.job.uid": "uid-lora-1",
        "kubetune.base_model": str(tiny_base),
        "kubetune.dataset": "/data/tiny-chat.jsonl",
        "kubetune.method": "lora",
        "kubetune.lora_merged": "true",
    }
    assert lineage.items() <= version.tags.items()
    assert len(version.tags["kubetune.config_hash"]) == 16
    run = mlflow.get_run(training_run)
    assert lineage.items() <= run.data.tags.items()
    assert run.data.tags["kubetune.registered_model"] == f"{MODEL_NAME}/1"
    assert run.data.params["training.maxSteps"] == "1"  # the training run, not a new one
    assert_no_secrets(json.dumps(version.tags), json.dumps(run.data.tags), json.dumps(run.data.params))
    # Nor anywhere in the store: database, artifacts (MLmodel, requirements, weights), server log.
    for path in mlflow_server.workdir.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            assert FAKE_TOKEN.encode() not in data and FAKE_HF_TOKEN.encode() not in data, path

    # The merged model is a plain transformers model that loads back and chats.
    import mlflow as mlflow_module

    mlflow_module.set_tracking_uri(uri)
    components = mlflow_module.transformers.load_model(
        f"models:/{MODEL_NAME}@champion", return_type="components"
    )
    assert type(components["model"]).__name__ == "Qwen2ForCausalLM"
    assert chat(f"models:/{MODEL_NAME}/1", uri)


def test_lora_unmerged_logs_the_adapter_and_survives_a_crash_before_registering(
    tmp_path: Path,
    tiny_base: Path,
    mlflow_server: MlflowServer,
    secret_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import mlflow
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from kubetune_trainer.registration import register

    uri = mlflow_server.uri
    name = f"{MODEL_NAME}-adapter"

    def configure(alias: str | None) -> Path:
        return write_config(
            tmp_path,
            base=tiny_base,
            method="lora",
            tracking_uri=uri,
            name="tiny-adapter",
            uid="uid-adapter-1",
            model_name=name,
            merge_lora=False,
            alias=alias,
        )

    config = configure(None)
    final = make_final(tmp_path / "out", tiny_base, "lora")
    args = ["--config", str(config), "--termination-message-path", str(tmp_path / "t")]

    # The pod dies after the model was logged, before it was registered.
    def killed(*_: Any) -> None:
        raise RuntimeError("pod killed")

    monkeypatch.setattr(register.Registration, "register", killed)
    assert register.main(args) == register.EXIT_ERROR
    assert client(uri).search_model_versions(f"name = '{name}'") == []
    monkeypatch.undo()
    for key, value in secret_env.items():
        monkeypatch.setenv(key, value)

    # The next attempt registers the model already logged: no second upload, one version.
    def must_not_load(*_: Any) -> None:
        raise AssertionError("the logged model should have been reused")

    monkeypatch.setattr(register, "load_final_model", must_not_load)
    assert register.main(args) == 0
    result = json.loads((tmp_path / "out" / "register-result.json").read_text())
    assert result["alias"] is None and result["version"] == "1"
    run = client(uri).get_run(result["run_id"])
    logged = client(uri).search_logged_models(
        [run.info.experiment_id], filter_string=f"source_run_id = '{run.info.run_id}'"
    )
    assert len(logged) == 1
    version = client(uri).get_model_version(name, "1")
    assert version.tags["kubetune.lora_merged"] == "false"

    # The adapter is logged as a PEFT model over the base on its volume, and loads back as it was.
    mlflow.set_tracking_uri(uri)
    loaded = mlflow.transformers.load_model(result["uri"], return_type="components")
    assert isinstance(loaded["model"], PeftModel)
    expected = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_base), final)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        assert torch.allclose(loaded["model"](tokens).logits, expected(tokens).logits, atol=1e-5)

    # registration.alias may change after the fact: a re-run points the new alias, same version.
    def rerun_with_alias(alias: str) -> None:
        configure(alias)
        assert register.main(args) == 0
        assert len(client(uri).search_model_versions(f"name = '{name}'")) == 1

    rerun_with_alias("staging")
    assert client(uri).get_model_version_by_alias(name, "staging").version == "1"

    # Changed again: the alias moves; the one kubetune set before goes, one set by hand stays.
    client(uri).set_registered_model_alias(name, "kept-by-hand", "1")
    rerun_with_alias("production")
    version = client(uri).get_model_version(name, "1")
    assert sorted(version.aliases) == ["kept-by-hand", "production"]
    assert version.tags["kubetune.alias"] == "production"
    assert len(client(uri).search_model_versions(f"name = '{name}'")) == 1


def test_full_model_waits_out_an_outage_then_registers(
    tmp_path: Path, tiny_base: Path, mlflow_server: MlflowServer, secret_env: dict[str, str]
) -> None:
    from kubetune_trainer.registration import register

    uri = mlflow_server.uri
    config = write_config(
        tmp_path,
        base=tiny_base,
        method="full",
        tracking_uri=uri,
        name="tiny-full",
        uid="uid-full-1",
        model_name=f"{MODEL_NAME}-full",
    )
    out = tmp_path / "out"
    make_final(out, tiny_base, "full")
    term = tmp_path / "termination-log"

    mlflow_server.stop()
    try:
        budget = 4.0
        started = time.monotonic()
        down = run_register_process(
            config,
            secret_env,
            "--retry-budget",
            str(budget),
            "--termination-message-path",
            str(term),
        )
        elapsed = time.monotonic() - started
        assert down.returncode == register.EXIT_UNAVAILABLE, down.stderr[-3000:]
        assert f"MLflow at {uri} is unreachable" in down.stderr
        assert "retrying in" in down.stderr  # it did back off and retry
        waited = re.search(r"over (\d+)s \(retry budget 4s\)", down.stderr)
        assert waited is not None and int(waited.group(1)) <= budget
        # Start-up (imports) + the budget + one attempt; the budget itself is what must hold.
        assert elapsed < 60 + budget
        assert_no_secrets(down.stdout, down.stderr)
        failure = json.loads(term.read_text())
        assert failure["reason"] == "MlflowUnavailable" and uri in failure["error"]
        assert not (out / "register-result.json").exists()
    finally:
        mlflow_server.start()  # the server is the session's: always bring it back

    assert register.main(["--config", str(config), "--termination-message-path", str(term)]) == 0
    result = json.loads(term.read_text())
    assert (
        result["name"] == f"{MODEL_NAME}-full" and result["version"] == "1" and result["alias"] == "champion"
    )
    # Training never reached MLflow: registration made the job's run and recorded it on the volume.
    assert json.loads((out / "mlflow-run.json").read_text())["run_id"] == result["run_id"]
    version = client(uri).get_model_version(result["name"], "1")
    assert version.run_id == result["run_id"]
    assert version.tags["kubetune.method"] == "full"
    assert "kubetune.lora_merged" not in version.tags
    assert chat(f"models:/{result['name']}@champion", uri)
