"""Preference data (issue 34 item 1): the pair checks of :mod:`kubetune_trainer.sources.preference` and
the preparation step's named refusals from real bad files on the tiny model (PreferenceColumns,
IdenticalAnswers, PromptTruncated), and the report of pairs that pass."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, trainer_config

from kubetune_api.preparation import HINTS, Refusal
from kubetune_api.trainer_config import TrainerConfig

REPO = Path(__file__).resolve().parents[2]
TINY_PAIRS = REPO / "examples" / "data" / "tiny-preference.jsonl"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubetune_trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_DATA)


def config(tmp_path: Path, model: Path, data: Path, objective: str = "dpo", **training: Any) -> TrainerConfig:
    path = trainer_config(
        tmp_path / "out", model, dataset={"path": str(data)}, extra_spec={"objective": objective}, **training
    )
    return TrainerConfig.load(path)


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def refused(cfg: TrainerConfig) -> Any:
    from kubetune_trainer.preparation.prepare import Refused, prepare

    with pytest.raises(Refused) as info:
        prepare(cfg)
    assert info.value.refusal.hint == HINTS[info.value.refusal.reason]
    return info.value.refusal


def _turns(role: str, text: str) -> list[dict[str, str]]:
    return [{"role": role, "content": text}]


def test_the_shipped_pairs_are_the_generators_own_and_every_pair_differs() -> None:
    from kubetune_trainer.sources.preference import pair_problem
    from kubetune_trainer.tiny_data import preference_pairs

    rows = [json.loads(line) for line in TINY_PAIRS.read_text().splitlines()]
    assert rows == preference_pairs(), (
        "regenerate: python -m kubetune_trainer.tiny_data --preference --out ..."
    )
    assert all(pair_problem(r) is None for r in rows)
    assert all(pair_problem(r) is None for r in preference_pairs(20, conversational=False))


@pytest.mark.parametrize(
    ("row", "words"),
    [
        ({"prompt": "q", "chosen": "a", "rejected": 3}, "column 'rejected' is a number"),
        ({"prompt": "q", "chosen": " ", "rejected": "b"}, "column 'chosen' is an empty string"),
        (
            {"prompt": _turns("user", "q"), "chosen": "a", "rejected": "b"},
            "differ in kind; expected three strings or three lists of messages",
        ),
        (
            {
                "prompt": _turns("human", "q"),
                "chosen": _turns("assistant", "a"),
                "rejected": _turns("assistant", "b"),
            },
            "prompt[0] has role 'human'",
        ),
        (
            {
                "prompt": _turns("user", "q"),
                "chosen": _turns("assistant", "a"),
                "rejected": _turns("assistant", "a"),
            },
            "'chosen' and 'rejected' are the same",
        ),
    ],
)
def test_a_bad_pair_is_named(row: dict[str, Any], words: str) -> None:
    from kubetune_trainer.sources.preference import pair_problem

    assert words in (pair_problem(row) or "")


def test_sft_rows_for_a_preference_objective_are_refused_naming_the_columns(
    tmp_path: Path, tiny_model: Path
) -> None:
    r = refused(config(tmp_path, tiny_model, TINY_DATA))
    assert r.reason == Refusal.PREFERENCE_COLUMNS
    assert "'prompt', 'chosen', 'rejected'" in r.message and "set spec.objective sft" in r.message


def test_a_missing_rejected_column_is_named(tmp_path: Path, tiny_model: Path) -> None:
    data = write(tmp_path / "half.jsonl", [{"prompt": "q", "chosen": "a", "answer": "b"}] * 4)
    r = refused(config(tmp_path, tiny_model, data, "orpo"))
    assert (
        r.reason == Refusal.PREFERENCE_COLUMNS and "lacks 'rejected'" in r.message and "'answer'" in r.message
    )


def test_identical_answers_are_refused_with_their_row(tmp_path: Path, tiny_model: Path) -> None:
    rows = [{"prompt": "q", "chosen": "a", "rejected": "b"}] * 3 + [
        {"prompt": "q", "chosen": "a", "rejected": "a"}
    ]
    r = refused(config(tmp_path, tiny_model, write(tmp_path / "same.jsonl", rows)))
    assert r.reason == Refusal.IDENTICAL_ANSWERS and "line 4" in r.message


def test_a_prompt_that_fills_max_length_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    long = " ".join(["What is the capital of France?"] * 40)
    rows = [{"prompt": "Hi.", "chosen": "Hello!", "rejected": "Go away."}] * 3
    rows.append({"prompt": long, "chosen": "Paris.", "rejected": "Rome."})
    r = refused(config(tmp_path, tiny_model, write(tmp_path / "long.jsonl", rows), maxLength=64))
    assert r.reason == Refusal.PROMPT_TRUNCATED
    assert "1 of 4 training pairs" in r.message and "row(s) 4" in r.message and "maxLength 64" in r.message


def test_the_shipped_pairs_are_prepared_and_reported(tmp_path: Path, tiny_model: Path) -> None:
    from datasets import load_from_disk

    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.prepared import prepared

    cfg = config(tmp_path, tiny_model, TINY_PAIRS, maxLength=128)
    report = prepare(cfg)
    assert report.data.train_examples == 160 and report.data.truncated_fraction == 0
    assert 0 < report.data.loss_token_fraction < 1
    found = prepared(cfg)
    assert found is not None and found.format == "preference"
    kept = load_from_disk(str(found.train_dir))
    assert kept.column_names == ["prompt", "chosen", "rejected"] and len(kept) == 160


def test_the_rewards_reach_status_progress_and_a_non_finite_one_is_removed() -> None:
    from kubetune_api.status import FineTuneJobStatus
    from kubetune_trainer.training.progress import ProgressReporter

    sent: list[dict[str, Any]] = []
    reporter = ProgressReporter(sent.append, total_steps=10)
    reporter.on_log({"loss": 0.69, "rewards/margins": 0.01234567, "rewards/accuracies": 0.75}, None)
    reporter.on_log({"eval_loss": 0.5, "eval_rewards/margins": 1.5, "eval_rewards/accuracies": 1.0}, None)
    reporter.on_step(2, 0.1)
    progress = sent[-1]["status"]["progress"] if "status" in sent[-1] else sent[-1]["progress"]
    assert progress["rewardMargin"] == 0.01235 and progress["rewardAccuracy"] == 0.75
    assert progress["evalRewardMargin"] == 1.5 and progress["evalRewardAccuracy"] == 1.0
    FineTuneJobStatus.model_validate({"progress": progress})  # the status schema has the fields
    reporter.on_log({"rewards/margins": float("nan")}, None)
    reporter.report(force=True)
    progress = sent[-1]["status"]["progress"] if "status" in sent[-1] else sent[-1]["progress"]
    assert progress["rewardMargin"] is None


def test_the_plan_reads_a_preference_job_without_packing_liger_or_compilation() -> None:
    from kubetune_api.spec import FineTuneJobSpec, Toggle
    from kubetune_trainer.plan.plan import training_of

    base = {"model": {"name": "Qwen/Qwen2-0.5B"}, "dataset": {"name": "d"}, "training": {"maxSteps": 5}}
    sft = FineTuneJobSpec.model_validate(base)
    assert training_of(sft) is sft.training and sft.training.packing and sft.training.liger
    for objective in ("dpo", "orpo"):
        planned = training_of(FineTuneJobSpec.model_validate({**base, "objective": objective}))
        assert (planned.packing, planned.liger, planned.torch_compile) == (False, False, Toggle.NEVER)
