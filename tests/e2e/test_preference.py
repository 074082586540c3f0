"""Preference tuning end to end on the CPU with the tiny model (issue 34 item 1): DPO with LoRA and
ORPO with full fine-tuning train through the whole trainer (TRL's DPOTrainer and ORPOTrainer), their
reward margin rises and the chosen answer wins on most pairs, the rewards reach MLflow (a real server)
under TRL's names, and a bad pair is refused by the trainer before any model is loaded.

The pairs are 16 of the shipped tiny ones, evaluated on themselves: a tiny random model learns which
answer is preferred on pairs it has seen in a few steps, not on new ones, and that is what is measured.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import trainer_config

from kubetune_api.trainer_config import COMPLETE_MARKER, MLFLOW_RUN_FILE, TRAIN_RESULT_FILE, TrainerConfig
from kubetune_trainer.tiny_data import preference_pairs, write_jsonl

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _pairs(folder: Path, rows: list[dict[str, Any]] | None = None) -> Path:
    rows = rows if rows is not None else preference_pairs(16)
    write_jsonl(rows, folder / "train.jsonl")
    write_jsonl(rows, folder / "test.jsonl")
    return folder


def _config(out: Path, model: Path, data: Path, objective: str, method: str, **extra: Any) -> Path:
    return trainer_config(
        out,
        model,
        method=method,
        dataset={"path": str(data), "evalSplit": "test"},
        extra_spec={"objective": objective},
        maxSteps=16,
        evalSteps=8,
        saveSteps=8,
        loggingSteps=4,
        **extra,
    )


def _train(config: Path) -> tuple[Any, dict[str, Any]]:
    from kubetune_trainer.training import train

    cfg = TrainerConfig.load(config)
    outcome = train.run(cfg, progress_bar=False)
    result = json.loads((Path(cfg.output_dir) / TRAIN_RESULT_FILE).read_text())
    return outcome, result


def _history(client: Any, run_id: str, key: str) -> list[float]:
    return [m.value for m in sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)]


def _rewards(out: Path, uri: str) -> tuple[list[float], list[float], list[float]]:
    """The run's training reward margins, and its eval margins and accuracies, from MLflow."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]
    return (
        _history(client, run_id, "rewards_margins"),
        _history(client, run_id, "eval_rewards_margins"),
        _history(client, run_id, "eval_rewards_accuracies"),
    )


def test_dpo_with_lora_raises_the_reward_margin(tmp_path: Path, tiny_model: Path, mlflow_server: Any) -> None:
    out = tmp_path / "dpo"
    config = _config(
        out,
        tiny_model,
        _pairs(tmp_path / "pairs"),
        "dpo",
        "lora",
        tracking_uri=mlflow_server.uri,
        learningRate=1e-2,
    )
    outcome, result = _train(config)
    assert outcome.exit_code == 0, outcome
    assert (
        result["status"] == "succeeded"
        and result["global_step"] == 16
        and result["data_format"] == "preference"
    )
    # pairs are padded, never packed, and no Liger (SFT's fused loss) under a preference objective
    assert result["plan"]["packing"] is False and result["plan"]["liger"] is False
    # the reference is the base with the adapter off: only the adapter is trained and saved
    final = out / "final"
    assert (final / COMPLETE_MARKER).is_file() and (final / "adapter_model.safetensors").is_file()
    assert not (final / "model.safetensors").exists()

    margins, eval_margins, eval_accuracies = _rewards(out, mlflow_server.uri)
    assert margins[0] == pytest.approx(0.0, abs=1e-6), "the first step's policy is its reference"
    assert eval_margins[-1] > max(0.5, margins[0] + 0.5), (margins, eval_margins)
    assert eval_accuracies[-1] > 0.5, eval_accuracies
    # DPO's loss starts at ln 2 (no preference yet) and the eval loss the gate reads falls below it
    assert result["eval_losses"][-1][1] < 0.69


def test_orpo_with_full_fine_tuning_from_prepared_pairs_raises_the_reward_margin(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.prepared import prepared

    out = tmp_path / "orpo"
    config = _config(
        out,
        tiny_model,
        _pairs(tmp_path / "pairs"),
        "orpo",
        "full",
        tracking_uri=mlflow_server.uri,
        learningRate=3e-3,
    )
    cfg = TrainerConfig.load(config)
    report = prepare(cfg)
    assert report.data.train_examples == 16 and prepared(cfg) is not None
    outcome, result = _train(config)
    assert outcome.exit_code == 0, outcome
    assert result["status"] == "succeeded" and result["data_format"] == "preference"
    assert (out / "final" / "model.safetensors").is_file()

    margins, eval_margins, eval_accuracies = _rewards(out, mlflow_server.uri)
    assert eval_margins[-1] > eval_margins[0] > margins[0], (margins, eval_margins)
    assert eval_accuracies[-1] > 0.5, eval_accuracies


def test_the_trainer_refuses_identical_answers_before_loading_a_model(
    tmp_path: Path, tiny_model: Path
) -> None:
    rows = preference_pairs(4, conversational=False)
    rows[2] = {**rows[2], "rejected": rows[2]["chosen"]}
    config = _config(tmp_path / "same", tiny_model, _pairs(tmp_path / "pairs", rows), "dpo", "lora")
    from kubetune_api.failures import Failure
    from kubetune_trainer.training import train

    outcome = train.run(TrainerConfig.load(config), progress_bar=False)
    assert outcome.status == "refused" and outcome.exit_code == 2, outcome
    assert outcome.failure is not None and outcome.failure.reason == Failure.DATASET_ERROR
    assert "train.jsonl line 3: 'chosen' and 'rejected' are the same" in outcome.failure.message
    assert not (tmp_path / "same" / "final").exists()
