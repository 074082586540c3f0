"""Each refusal of the preparation step from a real bad input (files on disk, the tiny model), the
command's exit code and termination message, and the report's numbers against the data."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import TINY_DATA, trainer_config

from kubetune_api.preparation import (
    HINTS,
    MANIFEST_FILE,
    REPORT_FILE,
    PreparationRefusal,
    PreparationReport,
    Refusal,
    parse_termination_message,
)
from kubetune_api.trainer_config import TrainerConfig


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kubetune_trainer.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", TINY_DATA)


def config(tmp_path: Path, model: Path, data: Path | None = None, **training: Any) -> TrainerConfig:
    dataset = {"path": str(data or TINY_DATA), "format": "messages"}
    return TrainerConfig.load(trainer_config(tmp_path / "out", model, dataset=dataset, **training))


def refused(cfg: TrainerConfig) -> PreparationRefusal:
    from kubetune_trainer.preparation.prepare import Refused, prepare

    with pytest.raises(Refused) as info:
        prepare(cfg)
    assert not (Path(cfg.output_dir) / "prepared" / "data").exists() or not any(
        (Path(cfg.output_dir) / "prepared" / "data").glob("*/COMPLETE")
    ), "a refused preparation left tokenized data behind"
    return info.value.refusal


def write(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_an_empty_file(tmp_path: Path, tiny_model: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    r = refused(config(tmp_path, tiny_model, tmp_path / "empty.jsonl"))
    assert r.reason == Refusal.DATASET_EMPTY and "empty.jsonl" in r.message and r.hint == HINTS[r.reason]


def test_wrong_columns_name_the_column_and_the_row(tmp_path: Path, tiny_model: Path) -> None:
    data = write(tmp_path / "qa.jsonl", [{"question": "hi", "answer": "hello"}] * 5)
    r = refused(config(tmp_path, tiny_model, data))
    assert r.reason == Refusal.DATASET_SCHEMA
    assert "'messages'" in r.message and "'question'" in r.message


def test_chat_rows_without_an_assistant_turn_under_assistant_only_loss(
    tmp_path: Path, tiny_model: Path
) -> None:
    rows = [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}] * 3
    rows.append({"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
    data = write(tmp_path / "chat.jsonl", rows)
    r = refused(config(tmp_path, tiny_model, data, assistantOnlyLoss=True))
    assert r.reason == Refusal.NO_ASSISTANT_TURNS and "line 4" in r.message


def test_a_model_folder_without_a_chat_template(tmp_path: Path, tiny_model: Path) -> None:
    model = tmp_path / "no-template"
    shutil.copytree(tiny_model, model)
    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    for extra in model.glob("chat_template.*"):
        extra.unlink()
    r = refused(config(tmp_path, model))
    assert r.reason == Refusal.CHAT_TEMPLATE_MISSING and str(model) in r.message


def test_mostly_truncated_with_the_threshold_the_spec_sets(tmp_path: Path, tiny_model: Path) -> None:
    r = refused(config(tmp_path, tiny_model, maxLength=32))
    assert r.reason == Refusal.MOSTLY_TRUNCATED
    assert "maxLength 32" in r.message and "50%" in r.message
    # the user's threshold: allowed
    from kubetune_trainer.preparation.prepare import prepare

    cfg = config(tmp_path, tiny_model, maxLength=32)
    cfg.spec.preparation.max_truncated_fraction = 0.9
    assert prepare(cfg).data.truncated_fraction > 0.5


def test_a_model_path_with_no_model(tmp_path: Path) -> None:
    r = refused(config(tmp_path, tmp_path / "nothing-here"))
    assert r.reason == Refusal.MODEL_NOT_FOUND and "nothing-here" in r.message


def test_a_job_that_does_not_fit_its_gpu(tmp_path: Path, tiny_model: Path) -> None:
    """A full fine-tune of a 70B-shaped config on one L4 (24 GiB): the estimate does not fit."""
    big = tmp_path / "big"
    shutil.copytree(tiny_model, big)
    conf = json.loads((big / "config.json").read_text())
    conf.update(hidden_size=8192, num_hidden_layers=80, intermediate_size=28672)
    conf.pop("layer_types", None)
    (big / "config.json").write_text(json.dumps(conf))
    cfg = config(tmp_path, big)
    spec = cfg.spec.model_copy(
        update={
            "method": "full",
            "resources": cfg.spec.resources.model_copy(
                update={"gpu_product": "NVIDIA-L4", "gpus_per_node": 1}
            ),
        }
    )
    r = refused(cfg.model_copy(update={"spec": spec}))
    assert r.reason == Refusal.DOES_NOT_FIT
    assert "24 GiB" in r.message and "NVIDIA-L4" in r.message and "What would fit" in r.message


def test_the_report_counts_what_training_sees(tmp_path: Path, tiny_model: Path) -> None:
    from kubetune_trainer.preparation.prepare import prepare

    cfg = config(tmp_path, tiny_model, maxLength=64)
    report = prepare(cfg)
    rows = [line for line in TINY_DATA.read_text().splitlines() if line.strip()]
    d = report.data
    assert d.train_examples == len(rows) and d.eval_examples == 0
    assert 0 < d.truncated_fraction < 0.5 and d.length_p50 <= d.length_p95 <= d.length_max
    assert d.length_max > 64 and d.tokens < d.length_max * d.train_examples
    assert 0 < d.loss_token_fraction <= 1
    root = Path(cfg.output_dir)
    assert PreparationReport.model_validate_json((root / REPORT_FILE).read_text()) == report
    manifest = json.loads((root / MANIFEST_FILE).read_text())
    assert manifest["data"]["key"] == report.tokenized_key
    assert manifest["data"]["dataHash"] == report.dataset_hash
    assert manifest["data"]["files"] == {
        TINY_DATA.name: {
            "size": TINY_DATA.stat().st_size,
            "sha256": hashlib.sha256(TINY_DATA.read_bytes()).hexdigest(),
        }
    }


def test_the_command_exit_codes_and_termination_messages(
    tmp_path: Path, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetune_trainer.preparation.prepare import main

    term = tmp_path / "termination-log"
    hostile = tmp_path / "elsewhere"
    monkeypatch.setenv("KUBETUNE_TERMINATION_LOG", str(hostile))  # ignored: never from the environment
    report = ["--termination-log", str(term)]
    good = trainer_config(tmp_path / "good", tiny_model)
    assert main(["--config", str(good), *report]) == 0
    assert isinstance(parse_termination_message(term.read_text()), PreparationReport)
    (tmp_path / "empty.jsonl").write_text("")
    bad = trainer_config(tmp_path / "bad", tiny_model, dataset={"path": str(tmp_path / "empty.jsonl")})
    assert main(["--config", str(bad), *report]) == 2
    refusal = parse_termination_message(term.read_text())
    assert isinstance(refusal, PreparationRefusal) and refusal.reason == Refusal.DATASET_EMPTY
    assert main(["--config", str(tmp_path / "missing.yaml"), *report]) == 2
    assert not hostile.exists()


def _text_rows(path: Path) -> Path:
    rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines() if line.strip()]
    texts = [" ".join(m["content"] for m in r["messages"]) for r in rows]
    return write(path / "text.jsonl", [{"text": t} for t in texts])


def _pc_rows(path: Path) -> Path:
    rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines() if line.strip()]
    out = []
    for r in rows:
        msgs = r["messages"]
        prompt = next(m["content"] for m in msgs if m["role"] == "user")
        out.append(
            {"prompt": prompt, "completion": next(m["content"] for m in msgs if m["role"] == "assistant")}
        )
    return write(path / "pc.jsonl", out)


TOKEN_CASES = {
    "messages-assistant-only": ("messages", True),
    "messages": ("messages", False),
    "prompt-completion": ("promptCompletion", False),
    "text": ("text", False),
}


def _batches(trainer: Any, rows: int) -> list[dict[str, Any]]:
    """What the trainer's collator hands the model: the first ``rows`` examples, in fours."""
    data = trainer.train_dataset
    return [
        trainer.data_collator([data[i] for i in range(start, min(rows, start + 4))])
        for start in range(0, rows, 4)
    ]


@pytest.mark.parametrize("case", list(TOKEN_CASES))
def test_prepared_tokens_and_labels_equal_the_trainers_own(
    case: str, tmp_path: Path, tiny_model: Path
) -> None:
    """Token for token: TRL's SFTTrainer on the raw rows and on the prepared splits gives its
    collator (and so the model) the same input_ids and the same labels (assistant / completion
    masks applied), truncated at maxLength alike."""
    from datasets import load_dataset, load_from_disk
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.chat import ensure_chat_format
    from kubetune_trainer.sources.data import keep_columns
    from kubetune_trainer.sources.prepared import prepared

    fmt, assistant_only = TOKEN_CASES[case]
    data = {"messages": TINY_DATA, "promptCompletion": _pc_rows(tmp_path), "text": _text_rows(tmp_path)}[fmt]
    cfg = TrainerConfig.load(
        trainer_config(
            tmp_path / "out",
            tiny_model,
            dataset={"path": str(data), "format": fmt},
            maxLength=48,
            assistantOnlyLoss=assistant_only,
        )
    )
    prepare(cfg)
    found = prepared(cfg)
    assert found is not None and found.model_dir is None

    def trainer(dataset: Any, aol: bool) -> Any:
        tokenizer = AutoTokenizer.from_pretrained(tiny_model)
        model = AutoModelForCausalLM.from_pretrained(tiny_model)
        ensure_chat_format(model, tokenizer)
        args = SFTConfig(
            output_dir=str(tmp_path / "scratch"),
            max_length=48,
            packing=False,
            assistant_only_loss=aol,
            dataset_text_field="text",
            report_to="none",
            use_cpu=True,
            per_device_train_batch_size=4,
        )
        return SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)

    raw = keep_columns(load_dataset("json", data_files=str(data), split="train"), fmt)
    own = trainer(raw, assistant_only)
    ours = trainer(load_from_disk(str(found.train_dir)), False)
    rows = len(own.train_dataset)
    assert rows == len(ours.train_dataset) > 0
    loss_tokens = 0
    for a, b in zip(_batches(own, rows), _batches(ours, rows), strict=True):
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["labels"].tolist() == b["labels"].tolist()
        loss_tokens += int((a["labels"] != -100).sum())
        # assistant-only and completion-only loss mask the rest; plain chat and text train on all
        masked = int((a["labels"] != -100).sum()) < int(a["attention_mask"].sum())  # padding aside
        assert masked == (assistant_only or fmt == "promptCompletion")
    assert loss_tokens > 0


def test_the_trainer_uses_prepared_data_only_for_what_was_prepared(tmp_path: Path, tiny_model: Path) -> None:
    """Another data path, or a model folder whose tokenizer changed since: not this preparation's data."""
    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.prepared import prepared

    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    cfg = config(tmp_path, model)
    report = prepare(cfg)
    found = prepared(cfg)
    assert found is not None and found.key == report.tokenized_key and found.model_dir is None
    assert (
        prepared(cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"method": "lora"})})) is not None
    )

    other = write(
        tmp_path / "other.jsonl", [json.loads(line) for line in TINY_DATA.read_text().splitlines()[:3]]
    )
    dataset = cfg.spec.dataset.model_copy(update={"path": str(other)})
    assert prepared(cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"dataset": dataset})})) is None

    conf = json.loads((model / "tokenizer_config.json").read_text())
    conf["model_max_length"] = 12345
    (model / "tokenizer_config.json").write_text(json.dumps(conf))
    assert prepared(cfg) is None


def test_a_data_file_changed_in_place_is_prepared_again(tmp_path: Path, tiny_model: Path) -> None:
    """The same path, other rows: the data as it is now is tokenized, never what was recorded."""
    from kubetune_trainer.preparation.prepare import prepare

    rows = [line for line in TINY_DATA.read_text().splitlines() if line.strip()]
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(rows[:100]) + "\n")
    first = prepare(config(tmp_path, tiny_model, data))
    data.write_text("\n".join(rows[:50]) + "\n")
    second = prepare(config(tmp_path, tiny_model, data))
    assert (first.data.train_examples, second.data.train_examples) == (100, 50)
    assert not second.reused and second.tokenized_key != first.tokenized_key
    assert second.dataset_hash != first.dataset_hash


def _sharegpt_rows(path: Path) -> Path:
    """TINY_DATA's conversations in ShareGPT's layout (conversations of {from, value}, human/gpt)."""
    names = {"user": "human", "assistant": "gpt", "system": "system"}
    rows = [json.loads(line) for line in TINY_DATA.read_text().splitlines() if line.strip()]
    return write(
        path / "sharegpt.jsonl",
        [
            {
                "id": n,
                "conversations": [{"from": names[m["role"]], "value": m["content"]} for m in r["messages"]],
            }
            for n, r in enumerate(rows)
        ],
    )


def test_a_sharegpt_data_set_is_converted_once_and_tokenized_as_its_native_twin(
    tmp_path: Path, tiny_model: Path
) -> None:
    """Issue 34 item 3: the same conversations in ShareGPT's layout and in kubetune's give the same
    tokens and labels; the report says the layout and how many rows were converted."""
    from datasets import load_from_disk

    from kubetune_trainer.preparation.prepare import prepare
    from kubetune_trainer.sources.prepared import prepared

    sharegpt_data = {"path": str(_sharegpt_rows(tmp_path)), "layout": "sharegpt", "evalFraction": 0.1}
    sharegpt = TrainerConfig.load(
        trainer_config(tmp_path / "sharegpt" / "out", tiny_model, dataset=sharegpt_data, maxLength=64)
    )
    native = TrainerConfig.load(
        trainer_config(
            tmp_path / "native" / "out",
            tiny_model,
            dataset={"path": str(TINY_DATA), "evalFraction": 0.1},
            maxLength=64,
        )
    )
    ours, theirs = prepare(sharegpt), prepare(native)
    rows = len([line for line in TINY_DATA.read_text().splitlines() if line.strip()])
    assert (ours.dataset_layout, ours.converted_rows) == ("sharegpt", rows)
    assert (theirs.dataset_layout, theirs.converted_rows) == ("native", 0)
    assert f"; {rows:,} rows converted from layout sharegpt" in ours.summary()
    assert ours.tokenized_key != theirs.tokenized_key
    a, b = prepared(sharegpt), prepared(native)
    assert a is not None and b is not None and a.format == b.format == "messages"
    for mine, twin in ((a.train_dir, b.train_dir), (a.eval_dir, b.eval_dir)):
        assert mine is not None and twin is not None
        x, y = load_from_disk(str(mine)), load_from_disk(str(twin))
        assert x["input_ids"] == y["input_ids"] and x["labels"] == y["labels"]
    manifest = json.loads((Path(sharegpt.output_dir) / MANIFEST_FILE).read_text())
    assert (manifest["data"]["layout"], manifest["data"]["convertedRows"]) == ("sharegpt", rows)


def test_an_alpaca_data_set_with_a_system_prompt_is_prepared_and_its_bad_rows_refused(
    tmp_path: Path, tiny_model: Path
) -> None:
    from kubetune_trainer.preparation.prepare import prepare

    rows = [{"instruction": f"Add {i} and 1.", "input": "", "output": f"{i + 1}"} for i in range(12)]
    data = write(tmp_path / "alpaca.jsonl", rows)
    dataset = {"path": str(data), "layout": "alpaca", "systemPrompt": "You add numbers."}
    cfg = TrainerConfig.load(trainer_config(tmp_path / "out", tiny_model, dataset=dataset))
    report = prepare(cfg)
    assert (report.data.train_examples, report.dataset_layout, report.converted_rows) == (12, "alpaca", 12)
    plain = TrainerConfig.load(
        trainer_config(tmp_path / "plain", tiny_model, dataset={**dataset, "systemPrompt": None})
    )
    # the system prompt is in the tokens: another prompt, other tokens (never the stale ones)
    assert prepare(plain).tokenized_key != report.tokenized_key
    assert prepare(plain).data.tokens < report.data.tokens

    write(data, [*rows, {"instruction": "Add.", "output": ""}])
    r = refused(TrainerConfig.load(trainer_config(tmp_path / "again", tiny_model, dataset=dataset)))
    assert r.reason == Refusal.DATASET_SCHEMA and r.hint == HINTS[r.reason]
    assert r.message == (
        f"{data} line 13: output is empty: an empty conversation after conversion (spec.dataset.layout alpaca)"
    )
    missing = {**dataset, "columns": {"output": "answer"}}
    r = refused(TrainerConfig.load(trainer_config(tmp_path / "missing", tiny_model, dataset=missing)))
    assert (
        r.reason == Refusal.DATASET_SCHEMA
        and "spec.dataset.columns.output names column 'answer'" in r.message
    )
