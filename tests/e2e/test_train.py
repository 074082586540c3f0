"""LoRA and full fine-tuning train end to end on the CPU with the tiny model, and their loss falls.

Each run goes through the whole trainer: data from the shipped JSONL with an eval fraction, the
plan for a CPU, TRL's SFTTrainer with padding-free packing, COMPLETE-marked checkpoints and
retention, the final model with its marker, train-result.json and the MLflow run (a real server).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import trainer_config

from kubetune_api.trainer_config import COMPLETE_MARKER, MLFLOW_RUN_FILE, TRAIN_RESULT_FILE, TrainerConfig
from kubetune_trainer.volume import checkpoints

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _train(config: Path) -> dict[str, Any]:
    from kubetune_trainer.training import train

    outcome = train.run(TrainerConfig.load(config), progress_bar=False)
    assert outcome.exit_code == 0, outcome
    return json.loads((Path(TrainerConfig.load(config).output_dir) / TRAIN_RESULT_FILE).read_text())


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


SECRET = "hf_kubetune_test_secret_value"


def test_lora_trains_and_its_loss_falls(
    tmp_path: Path,
    tiny_model: Path,
    mlflow_server: Any,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    # Credentials reach the trainer as environment variables; they must never come out anywhere.
    monkeypatch.setenv("HF_TOKEN", SECRET)
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    out = tmp_path / "lora"
    config = trainer_config(
        out,
        tiny_model,
        method="lora",
        tracking_uri=mlflow_server.uri,
        maxSteps=12,
        learningRate=1e-2,
        saveSteps=4,
        saveTotalLimit=2,
        dataset={
            "path": str(Path(__file__).parents[2] / "examples/data/tiny-chat.jsonl"),
            "evalFraction": 0.1,
        },
    )
    result = _train(config)

    losses = [loss for _step, loss in result["losses"]]
    assert result["status"] == "succeeded" and result["global_step"] == 12
    assert _mean(losses[-3:]) < _mean(losses[:2]) - 1.0, losses
    assert result["eval_losses"], "evalFraction must give evaluation"
    assert result["plan"]["precision"] in {"fp32", "bf16"} and result["plan"]["liger"] is False

    final = out / "final"
    assert (final / COMPLETE_MARKER).is_file()
    assert (final / "adapter_model.safetensors").is_file() and not (final / "model.safetensors").exists()
    assert (final / "tokenizer.json").is_file() and (final / "chat_template.jinja").is_file()
    # saveTotalLimit 2 of the three saves (4, 8, 12), each complete.
    kept = checkpoints.complete_checkpoints(checkpoints.checkpoints_root(out))
    assert [c.step for c in kept] == [8, 12]
    assert checkpoints.list_checkpoints(checkpoints.checkpoints_root(out)) == kept

    from mlflow.tracking import MlflowClient

    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]
    assert result["mlflow_ok"] is True and result["mlflow_run_id"] == run_id
    client = MlflowClient(mlflow_server.uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["method"] == "lora" and run.data.params["lora.r"] == "16"
    assert "loss" in run.data.metrics and "eval_loss" in run.data.metrics
    assert [a.path for a in client.list_artifacts(run_id, "kubetune")] == ["kubetune/trainer-config.yaml"]
    _assert_system_metrics(client, run)

    written = [p for p in out.rglob("*") if p.is_file() and p.suffix in {".json", ".yaml", ".md", ".txt", ""}]
    assert all(SECRET not in p.read_text(errors="replace") for p in written)
    assert SECRET not in json.dumps({**run.data.params, **run.data.tags})
    captured = capfd.readouterr()
    assert SECRET not in captured.out + captured.err


def test_dora_with_rslora_on_every_linear_layer_trains_and_saves_its_magnitudes(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    """DoRA, rank-stabilised scaling and the all-linear preset (issue 34 item 2): the loss falls, and
    the adapter saved is a DoRA adapter of every linear layer, magnitudes included."""
    from safetensors import safe_open

    out = tmp_path / "dora"
    adapter = {
        "r": 16,
        "alpha": 4,
        "dropout": 0.0,
        "targetModules": ["all-linear"],
        "dora": True,
        "rsLora": True,
    }
    config = trainer_config(
        out,
        tiny_model,
        method="lora",
        tracking_uri=mlflow_server.uri,
        maxSteps=10,
        learningRate=1e-2,
        saveSteps=10,
        extra_spec={"lora": adapter},
    )
    result = _train(config)

    losses = [loss for _step, loss in result["losses"]]
    assert result["status"] == "succeeded" and result["global_step"] == 10
    assert _mean(losses[-3:]) < _mean(losses[:2]) - 1.0, losses
    assert result["plan"]["dora"] is True and result["plan"]["nf4"] is False
    assert "DoRA" in result["plan"]["reasons"]["method"]

    final = out / "final"
    saved = json.loads((final / "adapter_config.json").read_text())
    assert saved["use_dora"] is True and saved["use_rslora"] is True
    with safe_open(str(final / "adapter_model.safetensors"), "pt") as weights:
        names = list(weights.keys())
    magnitudes = [n for n in names if "lora_magnitude_vector" in n]
    adapted = {n.split(".")[-2] for n in magnitudes}  # ...q_proj.lora_magnitude_vector
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}, names
    assert not any("lm_head" in n for n in names)


def _assert_system_metrics(client: Any, run: Any) -> None:
    """MLflow's system metrics (kubetune_trainer.mlflow.system) of this machine, sampled while it
    trained and stopped with the run: host numbers in range, a point per step, none after the run
    ended, no sampling thread left; and no GPU metric where there is no GPU."""
    import torch

    from kubetune_trainer.mlflow.system import THREAD_NAME

    system = {key: value for key, value in run.data.metrics.items() if key.startswith("system/")}
    for key in ("cpu_utilization_percentage", "system_memory_usage_percentage", "disk_usage_percentage"):
        assert 0 <= system[f"system/{key}"] <= 100, system
    assert system["system/system_memory_usage_megabytes"] > 0, system
    history = client.get_metric_history(run.info.run_id, "system/system_memory_usage_megabytes")
    assert [m.step for m in history] == list(range(len(history))) and history, history
    assert run.info.start_time <= min(m.timestamp for m in history)
    assert max(m.timestamp for m in history) <= run.info.end_time
    assert THREAD_NAME not in [t.name for t in threading.enumerate()]
    if not torch.cuda.is_available():
        assert not [key for key in system if key.startswith("system/gpu_")], system


def test_full_fine_tuning_trains_and_its_loss_falls(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetune_trainer.plan import plan

    # The run holds the allocator to KUBETUNE_GPU_MEMORY_GIB before anything reaches the GPU (the
    # cap itself is tested with a faked GPU in tests/unit and on a real one in tests/gpu).
    capped: list[bool] = []
    monkeypatch.setattr(plan, "limit_gpu_memory", lambda tuning=None: capped.append(True) and None)
    out = tmp_path / "full"
    config = trainer_config(out, tiny_model, method="full", tracking_uri=mlflow_server.uri, maxSteps=10)
    result = _train(config)
    assert capped == [True]

    losses = [loss for _step, loss in result["losses"]]
    assert result["global_step"] == 10
    assert _mean(losses[-3:]) < _mean(losses[:2]) - 1.0, losses
    final = out / "final"
    assert (final / COMPLETE_MARKER).is_file() and (final / "model.safetensors").is_file()

    from transformers import AutoModelForCausalLM, AutoTokenizer

    # The final folder is a plain transformers model: it loads and generates.
    model: Any = AutoModelForCausalLM.from_pretrained(final)
    tokenizer: Any = AutoTokenizer.from_pretrained(final)
    assert model.config.use_cache is True
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 plus 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    generated = model.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > prompt["input_ids"].shape[1]


def test_training_survives_a_dead_tracking_server(tmp_path: Path, tiny_model: Path) -> None:
    from tests.support.mlflow_server import free_port

    out = tmp_path / "nomlflow"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    config = trainer_config(out, tiny_model, tracking_uri=dead, maxSteps=4, saveSteps=2)
    result = _train(config)
    assert result["status"] == "succeeded" and result["global_step"] == 4
    assert result["mlflow_ok"] is False
    assert "open run" in result["mlflow_error"] and result["mlflow_run_id"] is None
    assert (out / "final" / COMPLETE_MARKER).is_file()
    assert not (out / MLFLOW_RUN_FILE).exists()
