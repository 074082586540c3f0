"""The preparation step end to end on the tiny model: the trainer on prepared data sees the same
tokens and labels as on raw data (the same losses, step for step), offline, without the raw data;
a spec change that changes the tokens gets new prepared data, one that does not reuses it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, trainer_config

from kubetune_api.preparation import MANIFEST_FILE
from kubetune_api.trainer_config import TRAIN_RESULT_FILE, TrainerConfig

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def _train(config: Path) -> dict[str, Any]:
    from kubetune_trainer.training import train

    cfg = TrainerConfig.load(config)
    outcome = train.run(cfg, progress_bar=False)
    assert outcome.exit_code == 0, outcome
    return dict(json.loads((Path(cfg.output_dir) / TRAIN_RESULT_FILE).read_text()))


def _prompt_completion(path: Path) -> Path:
    rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines() if line.strip()]
    out = path / "pc.jsonl"
    with out.open("w") as f:
        for row in rows:
            msgs = row["messages"]
            user = next(m["content"] for m in msgs if m["role"] == "user")
            answer = next(m["content"] for m in msgs if m["role"] == "assistant")
            f.write(json.dumps({"prompt": user, "completion": answer}) + "\n")
    return out


CASES = {
    "messages-assistant-only-packed": ({"format": "messages"}, {"assistantOnlyLoss": True}),
    "messages-unpacked-truncated": ({"format": "messages"}, {"packing": False, "maxLength": 48}),
    "prompt-completion": (None, {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_prepared_data_trains_exactly_as_raw_data(
    case: str, tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetune_trainer.preparation.prepare import prepare

    dataset_extra, training = CASES[case]
    data = _prompt_completion(tmp_path) if dataset_extra is None else TINY_DATA
    dataset = {"path": str(data), **(dataset_extra or {}), "evalFraction": 0.1}
    common = {"maxSteps": 4, "saveSteps": 4, "evalSteps": 4, **training}
    raw = _train(trainer_config(tmp_path / "raw", tiny_model, dataset=dataset, **common))

    prepared_config = trainer_config(tmp_path / "prepared", tiny_model, dataset=dataset, **common)
    report = prepare(TrainerConfig.load(prepared_config))
    assert report.data.train_examples > 0 and not report.reused
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    after = _train(prepared_config)
    assert [s for s, _ in raw["losses"]] == [s for s, _ in after["losses"]]
    for (_, a), (_, b) in zip(raw["losses"], after["losses"], strict=True):
        assert a == pytest.approx(b, rel=1e-5), (raw["losses"], after["losses"])
    assert [round(v, 5) for _, v in raw["eval_losses"]] == [round(v, 5) for _, v in after["eval_losses"]]


def test_training_reads_the_volume_not_the_raw_data(tmp_path: Path, tiny_model: Path) -> None:
    """Prepared once, the raw data may go: a restarted trainer reads only the volume."""
    from kubetune_trainer.preparation.prepare import prepare

    data = tmp_path / "data.jsonl"
    data.write_text(TINY_DATA.read_text())
    config = trainer_config(tmp_path / "out", tiny_model, dataset={"path": str(data), "format": "messages"})
    prepare(TrainerConfig.load(config))
    data.unlink()
    result = _train(config)
    assert result["global_step"] == 8


def test_a_change_that_changes_the_tokens_gets_new_prepared_data(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.preparation.prepare import prepare

    out = tmp_path / "out"
    dataset = {"path": str(TINY_DATA), "format": "messages", "evalFraction": 0.1}

    def run(**training: Any) -> Any:
        return prepare(TrainerConfig.load(trainer_config(out, tiny_model, dataset=dataset, **training)))

    first = run()
    assert not first.reused
    # the learning rate, the steps and maxLength do not change the tokens (truncation is the
    # trainer's): the same prepared data, with the statistics of the new maxLength
    same = run(learningRate=1e-3, maxSteps=20, maxLength=64)
    assert same.reused and same.tokenized_key == first.tokenized_key
    assert same.data.truncated_fraction > first.data.truncated_fraction
    assert same.data.tokens < first.data.tokens
    # assistant-only loss changes the labels, another seed the held-out rows: new keys
    masked = run(assistantOnlyLoss=True)
    assert not masked.reused and masked.tokenized_key != first.tokenized_key
    assert masked.data.loss_token_fraction < first.data.loss_token_fraction
    dataset["seed"] = 7
    reseeded = run()
    assert not reseeded.reused and reseeded.tokenized_key not in (first.tokenized_key, masked.tokenized_key)
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["data"]["key"] == reseeded.tokenized_key
    assert sorted(p.name for p in (out / "prepared" / "data").iterdir()) == sorted(
        {first.tokenized_key, masked.tokenized_key, reseeded.tokenized_key}
    )
