"""Preference data (spec.objective dpo or orpo): pairs of a chosen and a rejected answer to one prompt,
checked row by row before any model is loaded, as :mod:`.data_check` checks SFT data.

A pair is three columns, as TRL's preference trainers read them: ``prompt``, ``chosen`` and
``rejected``, either three strings (the answers continue the prompt's text) or three lists of chat
messages (the prompt's turns, then each answer's assistant turn). The layouts of :mod:`.layout`
(ShareGPT, Alpaca, renamed columns and roles) are SFT conversations and are not read here: the API
refuses them with a preference objective. What is refused, each with its row and what to change:

- a column missing (named, with the columns the data has, and a hint when the rows look like SFT
  data or hold the prompt inside the answers);
- a value that is neither a string nor a list of messages, or kinds mixed within a row;
- a pair whose chosen and rejected answers are the same: it carries no preference, and DPO's loss
  on it is a constant.

A prompt so long that ``spec.training.maxLength`` leaves no room for the answers is counted by the
preparation step, which has the tokenizer (:func:`pair_lengths`); TRL would drop such pairs silently.

>>> pair_problem({"prompt": "2+2?", "chosen": "4", "rejected": "4"})
"'chosen' and 'rejected' are the same; expected two different answers to the prompt"
>>> columns_problem(["prompt", "completion"])
"preference tuning (spec.objective dpo or orpo) needs the columns 'prompt', 'chosen' and 'rejected'; the data lacks 'chosen', 'rejected' (it has ['prompt', 'completion']): the rows look like SFT data (prompt/completion): set spec.objective sft, or give each prompt a chosen and a rejected answer"
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubetune_api.spec import DatasetSource

from .data_check import (
    DataCheck,
    DataError,
    _check_eval_fraction,
    content_hash,
    file_rows,
    splits_of,
    value_problem,
)

# The row format of preference data (beside data_check.COLUMNS' SFT formats; never a spec value)
PAIR_FORMAT = "preference"
PAIR_COLUMNS = ("prompt", "chosen", "rejected")
_EXPECTED = "a string, or a list of messages"
# What each refusal's message says (kubetune_trainer.preparation.prepare maps them onto the refusals)
MISSING_COLUMNS = "needs the columns 'prompt', 'chosen' and 'rejected'"
SAME_ANSWERS = "'chosen' and 'rejected' are the same"


def columns_problem(columns: list[str]) -> str | None:
    """What the data's columns lack for pairs (None: all three are there)."""
    missing = [c for c in PAIR_COLUMNS if c not in columns]
    if not missing:
        return None
    lacks = ", ".join(repr(c) for c in missing)
    message = (
        f"preference tuning (spec.objective dpo or orpo) {MISSING_COLUMNS}; the data lacks {lacks} "
        f"(it has {columns})"
    )
    if "prompt" not in columns and "chosen" in columns and "rejected" in columns:
        message += (
            ": a prompt inside the chosen and rejected conversations is not split off; put the turns "
            "before the answers into a 'prompt' column"
        )
    elif "messages" in columns or "completion" in columns or "text" in columns:
        what = (
            "messages"
            if "messages" in columns
            else "prompt/completion"
            if "completion" in columns
            else "text"
        )
        message += (
            f": the rows look like SFT data ({what}): set spec.objective sft, or give each prompt a "
            "chosen and a rejected answer"
        )
    return message


def pair_problem(row: dict[str, Any]) -> str | None:
    """What is wrong with one pair (None: TRL can train on it)."""
    conversational = None
    for column in PAIR_COLUMNS:
        value = row.get(column)
        problem = value_problem(column, value, _EXPECTED)
        if problem:
            return problem
        if isinstance(value, str) and column != "prompt" and not value.strip():
            return f"column {column!r} is an empty string; expected an answer to the prompt"
        kind = isinstance(value, list)
        if conversational is not None and kind != conversational:
            return "'prompt', 'chosen' and 'rejected' differ in kind; expected three strings or three lists of messages"
        conversational = kind
    if row["chosen"] == row["rejected"]:
        return f"{SAME_ANSWERS}; expected two different answers to the prompt"
    return None


def _first_problem(rows: Any, label: str) -> str | None:
    for where, row in rows:
        problem = pair_problem(row)
        if problem:
            return f"{label} {where}: {problem} (format {PAIR_FORMAT})"
    return None


def check_files(src: DatasetSource) -> DataCheck:
    """Every local row of the splits that train or evaluate, read once; :class:`DataError` at the first
    problem."""
    assert src.path is not None
    path = Path(src.path)
    splits = splits_of(path)
    used = [src.split] + ([src.eval_split] if src.eval_split else [])
    for split in used:
        if split not in splits:
            which = "eval split" if split == src.eval_split and split != src.split else "split"
            raise DataError(f"{path}: dataset has no {which} {split!r} (it has {sorted(splits)})")
    rows: dict[str, int] = {}
    for split in used:
        columns: list[str] = []
        count = 0
        problem: str | None = None
        for file in splits[split]:
            for where, row in file_rows(file):
                count += 1
                columns.extend(c for c in row if c not in columns)
                if problem is None and all(c in row for c in PAIR_COLUMNS):
                    problem = _first_problem([(where, row)], str(file))
        missing = columns_problem(columns)
        if missing:
            raise DataError(f"{path}: split {split!r}: {missing}")
        if problem:
            raise DataError(problem)
        rows[split] = count
    _check_eval_fraction(src, str(path), rows[src.split])
    return DataCheck(format=PAIR_FORMAT, data_hash=content_hash(path), rows=rows)


def check_loaded(train: Any, evaluation: Any, src: DatasetSource) -> str:
    """Loaded pairs (a Hub data set), every row checked; the format, or :class:`DataError`."""
    label = f"{src.name or src.path}"
    for split, data in ((src.split, train), (src.eval_split or "eval", evaluation)):
        if data is None:
            continue
        missing = columns_problem(list(data.column_names))
        if missing:
            raise DataError(f"{label} split {split!r}: {missing}")
        numbered = ((f"row {n}", row) for n, row in enumerate(data.select_columns(list(PAIR_COLUMNS)), 1))
        problem = _first_problem(numbered, f"{label} split {split!r}")
        if problem:
            raise DataError(problem)
    return PAIR_FORMAT


def keep_pair_columns(dataset: Any) -> Any:
    """Only the pair's columns: TRL reads the others as hints of another format."""
    if dataset is None:
        return None
    extra = [c for c in dataset.column_names if c not in PAIR_COLUMNS]
    return dataset.remove_columns(extra) if extra else dataset


def is_conversational(row: dict[str, Any]) -> bool:
    return isinstance(row.get("prompt"), list)


def pair_lengths(tokenizer: Any, row: dict[str, Any]) -> tuple[int, int, int]:
    """Tokens of the prompt (as TRL renders it: the chat template with the assistant's turn opened) and
    of each answer after it."""

    def ids(messages_or_text: Any, *, opened: bool) -> list[int]:
        if isinstance(messages_or_text, list):
            out = tokenizer.apply_chat_template(
                messages_or_text, tokenize=True, add_generation_prompt=opened, return_dict=False
            )
            return list(out)
        return list(tokenizer(messages_or_text, add_special_tokens=False)["input_ids"])

    prompt = row["prompt"]
    prompt_n = len(ids(prompt, opened=True))
    answers = []
    for column in ("chosen", "rejected"):
        answer = row[column]
        whole = ids(prompt + answer, opened=False)  # two lists of turns, or two strings
        answers.append(max(1, len(whole) - prompt_n))
    return prompt_n, answers[0], answers[1]
