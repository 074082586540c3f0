"""The data pre-check's verdicts, the data's identity, and the run's history across attempts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.spec import DatasetSource
from kubetune_api.trainer_config import COMPLETE_MARKER, TrainerConfig
from kubetune_trainer.sources.data_check import (
    DataError,
    check,
    check_files,
    content_hash,
    problem_in_row,
    validation_lines,
)
from kubetune_trainer.volume import checkpoints

ROLES = "'system', 'user', 'assistant', 'tool'"
# what a refusal of ShareGPT's role names in kubetune's own layout suggests
SHAREGPT_HINT = (
    "; these are ShareGPT's role names: map them in spec.dataset.roles (human: user, gpt: assistant), "
    "or set spec.dataset.layout: sharegpt for ShareGPT's own columns (conversations, from, value)"
)


@pytest.mark.parametrize(
    ("row", "fmt", "problem"),
    [
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]},
            "messages",
            None,
        ),
        (
            {"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
            "messages",
            None,
        ),
        (
            {"text": "x"},
            "messages",
            "column 'messages' is missing; expected a list of messages, each "
            '{"role": ..., "content": "..."}',
        ),
        (
            {"messages": "hi"},
            "messages",
            "column 'messages' is a string; expected a list of messages, each "
            '{"role": ..., "content": "..."}',
        ),
        (
            {"messages": ["hi"]},
            "messages",
            'messages[0] is a string; expected an object {"role": ..., "content": "..."}',
        ),
        (
            {"messages": [{"content": "hi"}]},
            "messages",
            f"messages[0] has no 'role'; expected one of {ROLES}",
        ),
        (
            {"messages": [{"role": "gpt", "content": "hi"}]},
            "messages",
            f"messages[0] has role 'gpt'; expected one of {ROLES}{SHAREGPT_HINT}",
        ),
        (
            {"messages": [{"role": "user"}]},
            "messages",
            "messages[0] (role 'user') has no 'content'; expected a string",
        ),
        ({"prompt": "q", "completion": "a"}, "promptCompletion", None),
        (
            {
                "prompt": [{"role": "user", "content": "q"}],
                "completion": [{"role": "assistant", "content": "a"}],
            },
            "promptCompletion",
            None,
        ),
        (
            {"prompt": "q"},
            "promptCompletion",
            "column 'completion' is missing; expected a string (or a list of messages)",
        ),
        (
            {"prompt": [{"role": "user", "content": "q"}], "completion": "a"},
            "promptCompletion",
            "'prompt' and 'completion' differ in kind; expected both strings or both lists of messages",
        ),
        ({"text": True}, "text", "column 'text' is true/false; expected a string"),
    ],
)
def test_problem_in_row(row: dict[str, Any], fmt: str, problem: str | None) -> None:
    assert problem_in_row(row, fmt) == problem


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


CHAT = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}


def test_a_json_array_file_and_parquet_are_checked_row_by_row(tmp_path: Path) -> None:
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([CHAT, {"messages": [{"role": "bot", "content": "x"}]}]))
    with pytest.raises(DataError) as e:
        check_files(DatasetSource(path=str(array)))
    assert str(e.value) == (
        f"{array} row 2: messages[0] has role 'bot'; expected one of {ROLES}; map it onto one of them "
        "in spec.dataset.roles (e.g. bot: assistant) (format messages, detected from the columns ['messages'])"
    )

    import pyarrow as pa
    import pyarrow.parquet as pq

    parquet = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"text": "a"}, {"text": None}]), parquet)
    with pytest.raises(DataError) as e:
        check_files(DatasetSource(path=str(parquet)))
    assert str(e.value) == (
        f"{parquet} row 2: column 'text' is missing; expected a string (format text, detected from the "
        "columns ['text'])"
    )


def test_good_data_passes_with_its_format_rows_and_hash(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "chat.jsonl", [CHAT] * 10)
    checked = check_files(DatasetSource(path=str(data), evalFraction=0.2))
    assert checked.format == "messages" and checked.rows == {"train": 10}
    assert checked.data_hash == content_hash(data)


def test_an_eval_fraction_that_leaves_nothing_to_train_on(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "one.jsonl", [CHAT])
    with pytest.raises(DataError) as e:
        check_files(DatasetSource(path=str(data), evalFraction=0.1))
    assert str(e.value) == (
        f"{data}: 1 row(s) in split 'train'; spec.dataset.evalFraction 0.1 holds out all of them; "
        "expected enough rows to train on and to evaluate"
    )


def test_content_hash_is_the_content_not_the_place(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    here = _jsonl(tmp_path / "a" / "chat.jsonl", [CHAT])
    there = _jsonl(tmp_path / "b.jsonl", [CHAT])
    assert content_hash(here) == content_hash(there)
    _jsonl(there, [CHAT, CHAT])
    assert content_hash(here) != content_hash(there)
    # in a folder the files' names count (they name the splits)
    folder = tmp_path / "folder"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", [CHAT])
    before = content_hash(folder)
    (folder / "train.jsonl").rename(folder / "test.jsonl")
    _jsonl(folder / "train.jsonl", [])
    assert content_hash(folder) != before


def test_a_hub_commit_is_the_identity_without_asking_the_hub() -> None:
    one = check(DatasetSource(name="org/data", revision="a" * 40))
    two = check(DatasetSource(name="org/data", revision="b" * 40))
    assert one.revision == "a" * 40 and one.format is None
    assert one.data_hash and two.data_hash and one.data_hash != two.data_hash


def test_an_unresolvable_hub_revision_has_no_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    checked = check(DatasetSource(name="org/data", revision="main"))
    assert checked.revision is None and checked.data_hash is None


class _FakeValidationError:
    def __init__(self, errors: list[dict[str, Any]]) -> None:
        self._errors = errors

    def errors(self, include_url: bool = False) -> list[dict[str, Any]]:
        return self._errors


def test_validation_lines_name_the_field_and_hide_credentials() -> None:
    error = _FakeValidationError(
        [
            {"type": "extra_forbidden", "loc": ("spec", "training", "learningRat"), "msg": "x", "input": 1},
            {
                "type": "string_pattern_mismatch",
                "loc": ("spec", "registration", "trackingUri"),
                "msg": "String should match pattern",
                "input": "ftp://bob:hunter22@h",
            },
            {
                "type": "value_error",
                "loc": ("spec",),
                "msg": "Value error, spec.dataset.path: spec.dataset.path must be absolute",
                "input": {},
            },
            {"type": "int_parsing", "loc": ("spec", "env", 0, "str", "name"), "msg": "bad", "input": 3},
            {"type": "int_parsing", "loc": ("spec", "env", 0, "int", "name"), "msg": "worse", "input": 3},
        ]
    )
    assert validation_lines(error) == [
        "spec.training.learningRat: unknown field",
        "spec.registration.trackingUri: String should match pattern",
        "spec.dataset.path: spec.dataset.path must be absolute",
        "spec.env[0].name: bad (got 3)",
    ]


def _cfg(tmp_path: Path) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": "x"},
            "spec": {
                "model": {"path": "/models/m"},
                "dataset": {"path": "/data/chat.jsonl"},
                "method": "full",
                "training": {"maxSteps": 2},
            },
            "outputDir": str(tmp_path / "out"),
            "experiment": "e",
            "registeredModelName": "x",
        }
    )


def test_another_data_hash_is_another_training_and_old_markers_are_trusted(tmp_path: Path) -> None:
    from kubetune_trainer.training.train import other_training

    cfg = _cfg(tmp_path)
    folder = tmp_path / "out" / "final"
    folder.mkdir(parents=True)
    checkpoints.mark_complete(folder, {"training_hash": cfg.training_hash(), "data_hash": "1111"})
    assert other_training(folder, cfg, "1111") is None
    assert other_training(folder, cfg, None) is None  # the data's identity unknown (an offline Hub)
    message = other_training(folder, cfg, "2222")
    assert message is not None and message.startswith(
        f"{folder} was written by this training on other data: the content of /data/chat.jsonl changed "
        "since (data hash 1111, now 2222)"
    )
    # written before kubetune recorded the data hash: as before
    checkpoints.mark_complete(folder, {"training_hash": cfg.training_hash()})
    assert other_training(folder, cfg, "2222") is None


def test_the_history_of_earlier_attempts_comes_from_the_resumed_checkpoint(tmp_path: Path) -> None:
    from kubetune_trainer.training.train import earlier_history, mean_loss

    ckpt = tmp_path / "checkpoints" / "checkpoint-4"
    ckpt.mkdir(parents=True)
    history = [
        {"step": 1, "loss": 7.0},
        {"step": 2, "loss": 6.0, "grad_norm": 1.0},
        {"step": 2, "eval_loss": 6.5},
        {"step": 4, "loss": 5.0},
        {"step": 4, "train_runtime": 1.0},
    ]
    (ckpt / checkpoints.TRAINER_STATE).write_text(json.dumps({"log_history": history}))
    checkpoints.mark_complete(ckpt, {"step": 4})
    resume = checkpoints.latest_complete(tmp_path / "checkpoints")
    result = tmp_path / "train-result.json"
    assert earlier_history(resume, result) == ([(1, 7.0), (2, 6.0), (4, 5.0)], [(2, 6.5)])
    assert mean_loss([(1, 7.0), (2, 6.0), (4, 5.0)]) == pytest.approx((7 + 6 + 2 * 5) / 4)

    # a checkpoint without the Trainer's state: the last train-result.json, up to the step resumed
    (ckpt / checkpoints.TRAINER_STATE).unlink()
    result.write_text(json.dumps({"losses": [[1, 7.0], [4, 5.0], [6, 4.0]], "eval_losses": []}))
    assert earlier_history(resume, result) == ([(1, 7.0), (4, 5.0)], [])
    assert (ckpt / COMPLETE_MARKER).is_file()


def test_a_hub_data_sets_rows_are_checked_as_loaded() -> None:
    from datasets import Dataset

    from kubetune_trainer.sources.data_check import check_loaded

    good = [CHAT, CHAT]
    src = DatasetSource(name="org/chat", evalSplit="test")
    assert check_loaded(Dataset.from_list(good), Dataset.from_list(good), src) == "messages"
    bad = [CHAT, {"messages": [{"role": "human", "content": "hi"}]}]
    with pytest.raises(DataError) as e:
        check_loaded(Dataset.from_list(good), Dataset.from_list(bad), src)
    assert str(e.value) == (
        f"org/chat split 'test' row 2: messages[0] has role 'human'; expected one of {ROLES}{SHAREGPT_HINT} "
        "(format messages, detected from the columns ['messages'])"
    )
