"""Every data format and source the spec offers trains: text, prompt/completion, chat with
assistant-only loss; JSONL or Parquet; a file, or a folder whose files name the splits."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, trainer_config

from kubetune_api.trainer_config import TRAIN_RESULT_FILE, TrainerConfig

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _chat_rows() -> list[dict[str, Any]]:
    return [json.loads(line) for line in TINY_DATA.read_text().splitlines()[:64]]


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _text_rows() -> list[dict[str, Any]]:
    return [
        {"text": " ".join(m["content"] for m in r["messages"]), "id": i} for i, r in enumerate(_chat_rows())
    ]


def _prompt_completion_rows() -> list[dict[str, Any]]:
    rows = []
    for r in _chat_rows():
        user = next(m["content"] for m in r["messages"] if m["role"] == "user")
        answer = next(m["content"] for m in r["messages"] if m["role"] == "assistant")
        rows.append({"prompt": user, "completion": " " + answer})
    return rows


def _dataset(kind: str, root: Path) -> dict[str, Any]:
    if kind == "text-auto-jsonl":
        return {"path": str(_write_jsonl(root / "text.jsonl", _text_rows()))}
    if kind == "prompt-completion-parquet-folder-splits":
        from datasets import Dataset

        rows = _prompt_completion_rows()
        (root / "pc").mkdir(parents=True)
        Dataset.from_list(rows[:56]).to_parquet(str(root / "pc" / "train.parquet"))
        Dataset.from_list(rows[56:]).to_parquet(str(root / "pc" / "test.parquet"))
        return {"path": str(root / "pc"), "format": "promptCompletion", "evalSplit": "test"}
    assert kind == "messages-assistant-only"
    return {"path": str(_write_jsonl(root / "chat.jsonl", _chat_rows())), "format": "messages"}


@pytest.mark.parametrize(
    ("kind", "expected_format"),
    [
        ("text-auto-jsonl", "text"),
        ("prompt-completion-parquet-folder-splits", "promptCompletion"),
        ("messages-assistant-only", "messages"),
    ],
)
def test_format_trains(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any, kind: str, expected_format: str
) -> None:
    from kubetune_trainer.training import train

    extra: dict[str, Any] = {"assistantOnlyLoss": True} if kind == "messages-assistant-only" else {}
    out = tmp_path / "run"
    config = trainer_config(
        out,
        tiny_model,
        tracking_uri=mlflow_server.uri,
        dataset=_dataset(kind, tmp_path / "data"),
        maxSteps=3,
        saveSteps=3,
        **extra,
    )
    outcome = train.run(TrainerConfig.load(config), progress_bar=False)
    assert outcome.exit_code == 0
    result = json.loads((out / TRAIN_RESULT_FILE).read_text())
    assert result["data_format"] == expected_format and result["global_step"] == 3
    assert all(loss == loss and loss > 0 for _step, loss in result["losses"])  # finite, non-zero
    if kind.startswith("prompt-completion"):
        assert result["eval_losses"], "evalSplit: test must be evaluated"
