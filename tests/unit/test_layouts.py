"""Data sets as users have them (issue 34 item 3): ShareGPT and Alpaca layouts, renamed columns and
roles, and a system prompt, converted into kubetune's own columns by the data check and the loading
(``kubetune_trainer.sources.layout``), and each row that cannot be converted refused naming the
data's column and the spec field. The preparation step's report and tokens: tests/unit/test_prepare.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.spec import DatasetColumns, DatasetSource
from kubetune_trainer.sources.data_check import DataError, check_files
from kubetune_trainer.sources.layout import LayoutError, convert_row, layout_of

ROLES = "'system', 'user', 'assistant', 'tool'"
SHAREGPT_ROW = {
    "id": "x1",
    "conversations": [
        {"from": "human", "value": "What is 2 plus 3?"},
        {"from": "gpt", "value": "5."},
        {"from": "human", "value": "And 3 plus 4?"},
        {"from": "gpt", "value": "7."},
    ],
}
ALPACA_ROW = {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"}


def _jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _refusal(src: DatasetSource) -> str:
    with pytest.raises(DataError) as e:
        check_files(src)
    return str(e.value)


# --- rows, converted ----------------------------------------------------------------------------------


def test_a_sharegpt_row_becomes_messages_with_the_roles_mapped() -> None:
    out = convert_row(layout_of(DatasetSource(path="/d.jsonl", layout="sharegpt")), SHAREGPT_ROW)
    assert out == {
        "messages": [
            {"role": "user", "content": "What is 2 plus 3?"},
            {"role": "assistant", "content": "5."},
            {"role": "user", "content": "And 3 plus 4?"},
            {"role": "assistant", "content": "7."},
        ]
    }


def test_sharegpt_keeps_a_rows_own_system_turn_or_column_before_the_spec_s_prompt() -> None:
    layout = layout_of(DatasetSource(path="/d.jsonl", layout="sharegpt", systemPrompt="Be brief."))
    own_turn = {
        "conversations": [{"from": "system", "value": "Be exact."}, *SHAREGPT_ROW["conversations"][:2]]
    }
    assert convert_row(layout, own_turn)["messages"][0] == {"role": "system", "content": "Be exact."}
    own_column = {"system": "Be kind.", "conversations": SHAREGPT_ROW["conversations"][:2]}
    assert convert_row(layout, own_column)["messages"][0] == {"role": "system", "content": "Be kind."}
    neither = {"conversations": SHAREGPT_ROW["conversations"][:2], "system": ""}
    assert convert_row(layout, neither)["messages"][0] == {"role": "system", "content": "Be brief."}
    assert len(convert_row(layout, neither)["messages"]) == 3


def test_sharegpt_with_its_own_column_names_and_role_names() -> None:
    src = DatasetSource(
        path="/d.jsonl",
        layout="sharegpt",
        columns={"messages": "dialog", "role": "speaker", "content": "text"},
        roles={"bot": "assistant", "person": "user"},
    )
    row = {"dialog": [{"speaker": "person", "text": "hi"}, {"speaker": "bot", "text": "hello", "weight": 1}]}
    assert convert_row(layout_of(src), row) == {
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "weight": 1},
        ]
    }


def test_an_alpaca_row_becomes_a_user_and_an_assistant_turn() -> None:
    layout = layout_of(DatasetSource(path="/d.jsonl", layout="alpaca"))
    assert convert_row(layout, ALPACA_ROW) == {
        "messages": [
            {"role": "user", "content": "Add the numbers.\n\n2 and 3"},
            {"role": "assistant", "content": "5"},
        ]
    }
    no_input = convert_row(layout, {"instruction": "Say hi.", "input": "", "output": "hi"})
    assert no_input["messages"][0] == {"role": "user", "content": "Say hi."}
    assert convert_row(layout, {"instruction": "Say hi.", "output": "hi"}) == no_input


def test_alpaca_with_renamed_columns_a_system_column_and_a_system_prompt() -> None:
    src = DatasetSource(
        path="/d.jsonl",
        layout="alpaca",
        columns={"instruction": "question", "input": "context", "output": "answer"},
        systemPrompt="You are a calculator.",
    )
    layout = layout_of(src)
    row = {"question": "Add.", "context": "1, 1", "answer": "2"}
    assert convert_row(layout, row)["messages"] == [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "Add.\n\n1, 1"},
        {"role": "assistant", "content": "2"},
    ]
    assert convert_row(layout, {**row, "system": "Be terse."})["messages"][0]["content"] == "Be terse."


def test_native_rows_renamed_with_roles_mapped_and_a_system_prompt() -> None:
    src = DatasetSource(
        path="/d.jsonl",
        columns={"messages": "chat", "role": "who", "content": "says"},
        roles={"human": "user", "gpt": "assistant"},
        systemPrompt="Hi.",
    )
    row = {"chat": [{"who": "human", "says": "a"}, {"who": "gpt", "says": "b"}], "id": 3}
    assert convert_row(layout_of(src), row) == {
        "id": 3,
        "messages": [
            {"role": "system", "content": "Hi."},
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": "b"},
        ],
    }
    pairs = DatasetSource(path="/d.jsonl", columns={"prompt": "question", "completion": "answer"})
    assert convert_row(layout_of(pairs), {"question": "q", "answer": "a"}) == {
        "prompt": "q",
        "completion": "a",
    }


def test_native_without_any_mapping_converts_nothing() -> None:
    layout = layout_of(DatasetSource(path="/d.jsonl"))
    assert not layout.converts and layout.identity() is None
    assert layout_of(DatasetSource(path="/d.jsonl", roles={"bot": "assistant"})).converts


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (
            {"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "yo"}]},
            "conversations[1] has role 'bot', which layout sharegpt does not know ('human', 'gpt', 'system', "
            "'user', 'assistant', 'tool'); map it in spec.dataset.roles (e.g. bot: assistant)",
        ),
        (
            {"conversations": []},
            "column 'conversations' is an empty list; expected a conversation, a list of turns each "
            '{"from": ..., "value": "..."} (spec.dataset.layout sharegpt)',
        ),
        (
            {"conversations": [{"from": "system", "value": "Be brief."}]},
            "column 'conversations' holds only system turns: an empty conversation after conversion "
            "(spec.dataset.layout sharegpt)",
        ),
        (
            {"conversations": [{"value": "hi"}]},
            "conversations[0] has no 'from' (spec.dataset.layout sharegpt: the key of a turn's role)",
        ),
        (
            {"conversations": [{"from": "human", "text": "hi"}]},
            "conversations[0] has no 'value' (spec.dataset.layout sharegpt: the key of a turn's text)",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}]},
            "column 'conversations' is missing; expected a conversation, a list of turns each "
            '{"from": ..., "value": "..."} (spec.dataset.layout sharegpt)',
        ),
        (
            {**SHAREGPT_ROW, "system": 3},
            "column 'system' is a number; expected a string (spec.dataset.layout sharegpt)",
        ),
    ],
    ids=[
        "unknown role",
        "empty",
        "only system",
        "no role key",
        "no content key",
        "no conversation",
        "system 3",
    ],
)
def test_a_sharegpt_row_that_cannot_be_converted_names_the_column_and_the_field(
    row: dict[str, Any], problem: str
) -> None:
    with pytest.raises(LayoutError) as e:
        convert_row(layout_of(DatasetSource(path="/d.jsonl", layout="sharegpt")), row)
    assert str(e.value) == problem


@pytest.mark.parametrize(
    ("row", "problem"),
    [
        (
            {"instruction": " ", "input": "", "output": "5"},
            "instruction and input are empty: an empty conversation after conversion (spec.dataset.layout alpaca)",
        ),
        (
            {"instruction": "Add.", "output": ""},
            "output is empty: an empty conversation after conversion (spec.dataset.layout alpaca)",
        ),
        (
            {"instruction": "Add.", "output": 5},
            "column 'output' is a number; expected a string (spec.dataset.layout alpaca)",
        ),
        ({"output": "5"}, "column 'instruction' is missing; expected a string (spec.dataset.layout alpaca)"),
        (
            {"instruction": "Add.", "output": "5", "system": ["x"]},
            "column 'system' is a list; expected a string (spec.dataset.layout alpaca)",
        ),
    ],
    ids=["empty instruction", "empty output", "output a number", "no instruction", "system a list"],
)
def test_an_alpaca_row_that_cannot_be_converted_names_the_column_and_the_field(
    row: dict[str, Any], problem: str
) -> None:
    with pytest.raises(LayoutError) as e:
        convert_row(layout_of(DatasetSource(path="/d.jsonl", layout="alpaca")), row)
    assert str(e.value) == problem


def test_a_renamed_column_s_problem_names_spec_dataset_columns() -> None:
    src = DatasetSource(path="/d.jsonl", layout="alpaca", columns={"output": "answer"})
    with pytest.raises(
        LayoutError, match=r"^column 'answer' is missing; expected a string \(spec.dataset.columns.output\)$"
    ):
        convert_row(layout_of(src), {"instruction": "Add."})


# --- files, checked ------------------------------------------------------------------------------------


def test_a_sharegpt_file_is_checked_as_messages_and_counted(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW] * 5)
    checked = check_files(DatasetSource(path=str(data), layout="sharegpt", evalFraction=0.2))
    assert (checked.format, checked.layout, checked.converted, checked.rows) == (
        "messages",
        "sharegpt",
        5,
        {"train": 5},
    )


def test_an_alpaca_folder_converts_the_training_and_the_eval_split(tmp_path: Path) -> None:
    folder = tmp_path / "alpaca"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", [ALPACA_ROW] * 4)
    _jsonl(folder / "test.jsonl", [ALPACA_ROW] * 2)
    checked = check_files(DatasetSource(path=str(folder), layout="alpaca", evalSplit="test"))
    assert (checked.format, checked.layout, checked.converted) == ("messages", "alpaca", 6)
    assert checked.rows == {"train": 4, "test": 2}


def test_a_native_file_is_read_as_before(tmp_path: Path) -> None:
    row = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    checked = check_files(DatasetSource(path=str(_jsonl(tmp_path / "chat.jsonl", [row, row]))))
    assert (checked.layout, checked.converted) == ("native", 0)


def test_a_sharegpt_file_without_the_preset_is_refused_and_told_the_preset(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW])
    assert _refusal(DatasetSource(path=str(data))) == (
        f"{data}: cannot tell the dataset format from its columns ['id', 'conversations']: expected "
        "'messages', 'prompt' + 'completion', or 'text' (or set spec.dataset.format); the columns are "
        "ShareGPT's: set spec.dataset.layout: sharegpt"
    )
    assert _refusal(DatasetSource(path=str(data), format="messages")) == (
        f"{data}: dataset format messages needs column(s) ['messages']; the data has ['id', 'conversations']; "
        "the columns are ShareGPT's: set spec.dataset.layout: sharegpt"
    )


def test_an_alpaca_file_without_the_preset_is_told_the_preset(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "alpaca.jsonl", [ALPACA_ROW])
    assert _refusal(DatasetSource(path=str(data))).endswith(
        "; the columns are Alpaca's: set spec.dataset.layout: alpaca"
    )


def test_sharegpt_role_names_in_messages_are_refused_and_told_the_roles_or_the_preset(tmp_path: Path) -> None:
    row = {"messages": [{"role": "human", "content": "hi"}, {"role": "gpt", "content": "yo"}]}
    data = _jsonl(tmp_path / "chat.jsonl", [row])
    assert _refusal(DatasetSource(path=str(data))) == (
        f"{data} line 1: messages[0] has role 'human'; expected one of {ROLES}; these are ShareGPT's role "
        "names: map them in spec.dataset.roles (human: user, gpt: assistant), or set spec.dataset.layout: "
        "sharegpt for ShareGPT's own columns (conversations, from, value) (format messages, detected from "
        "the columns ['messages'])"
    )
    mapped = check_files(DatasetSource(path=str(data), roles={"human": "user", "gpt": "assistant"}))
    assert (mapped.format, mapped.layout, mapped.converted) == ("messages", "native", 1)


def test_a_role_left_unmapped_is_refused_naming_spec_dataset_roles(tmp_path: Path) -> None:
    row = {"messages": [{"role": "human", "content": "hi"}, {"role": "bot", "content": "yo"}]}
    data = _jsonl(tmp_path / "chat.jsonl", [row])
    message = _refusal(DatasetSource(path=str(data), roles={"human": "user"}))
    assert message == (
        f"{data} line 1: messages[1] has role 'bot'; expected one of {ROLES}; map it onto one of them in "
        "spec.dataset.roles (e.g. bot: assistant) (format messages, detected from the columns ['messages'])"
    )


def test_a_sharegpt_file_with_an_unknown_role_names_the_line_and_spec_dataset_roles(tmp_path: Path) -> None:
    bad = {"conversations": [{"from": "human", "value": "hi"}, {"from": "chatbot", "value": "yo"}]}
    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW, bad])
    message = _refusal(DatasetSource(path=str(data), layout="sharegpt"))
    assert message.startswith(f"{data} line 2: conversations[1] has role 'chatbot', which layout sharegpt")
    assert message.endswith("map it in spec.dataset.roles (e.g. chatbot: assistant)")
    assert (
        check_files(
            DatasetSource(path=str(data), layout="sharegpt", roles={"chatbot": "assistant"})
        ).converted
        == 2
    )


def test_a_mapped_column_the_data_lacks_is_refused_naming_the_field(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW])
    src = DatasetSource(path=str(data), layout="sharegpt", columns={"messages": "dialog"})
    assert _refusal(src) == (
        f"{data}: split 'train': spec.dataset.columns.messages names column 'dialog', which the data does not "
        "have (it has ['id', 'conversations'])"
    )
    optional = DatasetSource(path=str(data), layout="sharegpt", columns={"system": "persona"})
    assert "spec.dataset.columns.system names column 'persona'" in _refusal(optional)
    renamed = _jsonl(tmp_path / "pairs.jsonl", [{"question": "q", "answer": "a"}])
    pairs = DatasetSource(path=str(renamed), columns={"prompt": "question", "completion": "reply"})
    assert "spec.dataset.columns.completion names column 'reply'" in _refusal(pairs)


def test_a_layout_s_own_column_the_data_lacks_names_the_field_to_set(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "qa.jsonl", [{"question": "q", "answer": "a"}])
    assert _refusal(DatasetSource(path=str(data), layout="alpaca")) == (
        f"{data}: split 'train': layout alpaca reads the instruction from column 'instruction', which the "
        "data does not have (it has ['question', 'answer']); name the data's column in "
        "spec.dataset.columns.instruction"
    )


def test_an_empty_conversation_after_conversion_is_refused_naming_the_line(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW, SHAREGPT_ROW, {"conversations": []}])
    assert _refusal(DatasetSource(path=str(data), layout="sharegpt")).startswith(
        f"{data} line 3: column 'conversations' is an empty list; expected a conversation"
    )
    alpaca = _jsonl(tmp_path / "alpaca.jsonl", [ALPACA_ROW, {"instruction": "", "output": "x"}])
    assert _refusal(DatasetSource(path=str(alpaca), layout="alpaca")) == (
        f"{alpaca} line 2: instruction and input are empty: an empty conversation after conversion "
        "(spec.dataset.layout alpaca)"
    )


def test_only_the_splits_that_train_or_evaluate_must_convert(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    _jsonl(folder / "train.jsonl", [SHAREGPT_ROW] * 3)
    _jsonl(folder / "validation.jsonl", [{"conversations": []}])
    assert check_files(DatasetSource(path=str(folder), layout="sharegpt")).converted == 3
    message = _refusal(DatasetSource(path=str(folder), layout="sharegpt", evalSplit="validation"))
    assert message.startswith(
        f"{folder / 'validation.jsonl'} line 1: column 'conversations' is an empty list"
    )


def test_a_system_prompt_needs_chat_data(tmp_path: Path) -> None:
    data = _jsonl(tmp_path / "text.jsonl", [{"text": "a"}, {"text": "b"}])
    assert _refusal(DatasetSource(path=str(data), systemPrompt="Be brief.")) == (
        f"{data}: spec.dataset.systemPrompt is put into chat conversations (a 'messages' column); the data "
        "is in format text"
    )


def test_a_converted_row_s_remaining_problem_says_it_was_converted(tmp_path: Path) -> None:
    row = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": 7}]}
    data = _jsonl(tmp_path / "sharegpt.jsonl", [row])
    assert _refusal(DatasetSource(path=str(data), layout="sharegpt")) == (
        f"{data} line 1: messages[1] (role 'assistant') content is a number; expected a string "
        "(format messages, converted from layout sharegpt)"
    )


# --- loaded splits (a Hub data set, or training without preparation) ---------------------------------------


def test_loaded_splits_are_converted_by_the_same_rows_function() -> None:
    from datasets import Dataset

    from kubetune_trainer.sources.data import converted
    from kubetune_trainer.sources.data_check import check_loaded

    src = DatasetSource(name="org/sharegpt", layout="sharegpt", evalSplit="test", systemPrompt="S.")
    train, evaluation = converted(
        src, Dataset.from_list([SHAREGPT_ROW] * 3), Dataset.from_list([SHAREGPT_ROW])
    )
    assert train.column_names == ["messages"] and len(train) == 3 and len(evaluation) == 1
    assert train[0]["messages"][:2] == [
        {"role": "system", "content": "S."},
        {"role": "user", "content": "What is 2 plus 3?"},
    ]
    assert check_loaded(train, evaluation, src) == "messages"
    bad = Dataset.from_list([SHAREGPT_ROW, {"id": "x", "conversations": [{"from": "robot", "value": "x"}]}])
    with pytest.raises(
        DataError, match=r"^org/sharegpt split 'test' row 2: conversations\[0\] has role 'robot'"
    ):
        converted(src, Dataset.from_list([SHAREGPT_ROW]), bad)
    with pytest.raises(DataError, match=r"spec.dataset.columns.messages names column 'dialog'"):
        converted(
            src.model_copy(update={"columns": DatasetColumns(messages="dialog")}),
            Dataset.from_list([SHAREGPT_ROW]),
            None,
        )


def test_the_alpaca_example_converts_alpaca_rows_with_its_system_prompt(tmp_path: Path) -> None:
    """examples/alpaca-lora.yaml's data set section, pointed at a file of rows in yahma/alpaca-cleaned's
    columns (the Hub is not reached here)."""
    from kubetune_api.trainer_config import load_manifest

    spec = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "alpaca-lora.yaml").spec
    assert (spec.dataset.name, spec.dataset.layout) == ("yahma/alpaca-cleaned", "alpaca")
    data = _jsonl(tmp_path / "alpaca.jsonl", [ALPACA_ROW, {**ALPACA_ROW, "input": ""}] * 25)
    local = spec.dataset.model_copy(update={"name": None, "path": str(data)})
    checked = check_files(local)
    assert (checked.format, checked.layout, checked.converted) == ("messages", "alpaca", 50)
    first = convert_row(layout_of(local), ALPACA_ROW)["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == spec.dataset.system_prompt


def test_training_without_preparation_loads_the_converted_rows(tmp_path: Path) -> None:
    """The trainer where the platform turned preparation off reads the raw data itself: the same
    conversion, through the datasets library, with only kubetune's columns left."""
    from tests.e2e.conftest import trainer_config

    from kubetune_api.trainer_config import TrainerConfig
    from kubetune_trainer.sources.data import check_raw_data, raw_datasets

    data = _jsonl(tmp_path / "sharegpt.jsonl", [SHAREGPT_ROW, {**SHAREGPT_ROW, "system": "Be exact."}] * 5)
    dataset = {"path": str(data), "layout": "sharegpt", "evalFraction": 0.2}
    cfg = TrainerConfig.load(trainer_config(tmp_path / "out", tmp_path / "no-model", dataset=dataset))
    checked = check_raw_data(cfg)
    train, evaluation, fmt = raw_datasets(cfg, checked)
    assert (fmt, checked.converted, len(train), len(evaluation)) == ("messages", 10, 8, 2)
    assert train.column_names == evaluation.column_names == ["messages"]
    systems = {row["messages"][0]["content"] for row in train if row["messages"][0]["role"] == "system"}
    assert systems == {"Be exact."}
    assert all([m["role"] for m in row["messages"]][-2:] == ["user", "assistant"] for row in train)
