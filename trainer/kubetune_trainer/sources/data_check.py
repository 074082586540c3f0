"""Bad data caught before any model is loaded, with one message that says where and what.

``kubetune run --local`` and the trainer (``python -m kubetune_trainer.train``) run :func:`check`
before they load a model: every local data file is read once, row by row (JSON lines, a JSON array,
or Parquet), the row format is found as the trainer finds it (:func:`detect_format`: declared, or
from the columns of the training split), and every row of the splits that train or evaluate must
hold what that format needs. The first problem ends the run with a :class:`DataError` whose message
names the file, the line (or row), the column or message role, and what was expected::

    data/chat.jsonl line 7: messages[0] has role 'bot'; expected one of 'system', 'user', 'assistant', 'tool'; map it onto one of them in spec.dataset.roles (e.g. bot: assistant)

Data in another layout (``spec.dataset.layout``: ShareGPT, Alpaca, or renamed columns and roles) is
converted row by row first (:mod:`.layout`), so its problems name the data's own columns and the
spec field to change; a refusal of rows in kubetune's own layout says which layout the columns or
role names look like.

Such errors exit with code 2 (:data:`EXIT_BAD_INPUT`; the operator treats 1-127 as permanent) and
print no traceback. Hub data sets are checked the same way once loaded, still before the model.

The same pass gives the data's identity (:attr:`DataCheck.data_hash`): a streamed SHA-256 of the
files' contents (and, for a folder, their names in it), or the resolved commit of a Hub data set.
It is written into every COMPLETE marker next to the training hash, so that a checkpoint is
resumed only by the same training on the same data.

>>> problem_in_row({"messages": [{"role": "bot", "content": "hi"}]}, "messages")
"messages[0] has role 'bot'; expected one of 'system', 'user', 'assistant', 'tool'; map it onto one of them in spec.dataset.roles (e.g. bot: assistant)"
>>> problem_in_row({"text": 3}, "text")
"column 'text' is a number; expected a string"
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.spec import DatasetFormat, DatasetLayout, DatasetSource

from ..mlflow.run import redact
from .layout import (
    KNOWN_ROLES,
    Layout,
    LayoutError,
    columns_problem,
    convert_row,
    layout_hint,
    layout_of,
    role_hint,
)

log = logging.getLogger(__name__)

# Input the user has to fix (data, manifest, trainer config): a message, exit code 2, no traceback.
EXIT_BAD_INPUT = 2
DATA_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
# The roles chat templates render (ChatML, Qwen, Llama; layout.KNOWN_ROLES): anything else is a mistake
# in the data (ShareGPT's human/gpt unconverted, a bot, a typo) that would train silently as text
# nobody asked for.
COLUMNS = {
    DatasetFormat.MESSAGES: ("messages",),
    DatasetFormat.PROMPT_COMPLETION: ("prompt", "completion"),
    DatasetFormat.TEXT: ("text",),
}
MESSAGES_EXPECTED = 'a list of messages, each {"role": ..., "content": "..."}'
_CHUNK = 4 << 20


class BadInputError(ValueError):
    """Input the user must fix; the message says what and where (exit code 2, no traceback)."""


class DataError(BadInputError):
    """The training data cannot be trained on as it is."""


@dataclass(frozen=True)
class DataCheck:
    """What the check found: the row format (None for a Hub data set: known once loaded), the
    data's identity for the COMPLETE markers, and the Hub commit to load."""

    format: str | None
    data_hash: str | None
    revision: str | None = None
    rows: dict[str, int] = field(default_factory=dict)
    layout: str = DatasetLayout.NATIVE
    converted: int = 0  # rows of the training and eval splits converted into kubetune's columns


def validation_lines(error: Any) -> list[str]:
    """One short line per field a pydantic ``ValidationError`` names: the field, what is wrong
    (an unknown field is called so), and the value when it is short and not credential-shaped.

    >>> from kubetune_api.spec import FineTuneJobSpec
    >>> try:
    ...     FineTuneJobSpec.model_validate({"model": {"name": "m"}, "dataset": {"name": "d"},
    ...                                     "training": {"maxSteps": "ten", "learningRat": 0.1}})
    ... except ValueError as e:
    ...     print("\\n".join(validation_lines(e)))
    training.maxSteps: Input should be a valid integer, unable to parse string as an integer (got 'ten')
    training.learningRat: unknown field
    """
    from kubetune_api.schema import field_path

    lines: dict[str, str] = {}
    for err in error.errors(include_url=False):
        where = field_path(tuple(err.get("loc") or ())) or "(the document)"
        if where in lines:
            continue  # a union tried several branches: its first verdict is enough
        kind, value = err.get("type"), err.get("input")
        if kind == "extra_forbidden":
            text = "unknown field"
        elif kind == "missing":
            text = "required field is missing"
        else:
            # a model validator's message ("Value error, spec.x.y: ...") may name a deeper field itself
            text = str(err.get("msg", "invalid")).removeprefix("Value error, ")
            if text.startswith((f"{where}.", f"{where}[")):
                lines[where] = text
                continue
            if isinstance(value, bool | int | float) or (isinstance(value, str) and len(value) <= 80):
                shown = redact(repr(value))
                if shown == repr(value):
                    text += f" (got {shown})"
        lines[where] = f"{where}: {text}"
    return list(lines.values())


# --- files -----------------------------------------------------------------------------------------


def data_files(path: Path) -> tuple[str, dict[str, list[str]] | list[str]]:
    """The datasets builder and data_files for a file, or a folder of files (named by split or not)."""
    if path.is_file():
        builder = DATA_SUFFIXES.get(path.suffix)
        if builder is None:
            raise DataError(f"{path}: unsupported file type (use .jsonl, .json or .parquet)")
        return builder, [str(path)]
    if not path.is_dir():
        raise DataError(f"dataset path {path} does not exist")
    # hidden folders are not data: .git, .cache (huggingface_hub's download metadata)
    files = sorted(
        p
        for p in path.rglob("*")
        if p.suffix in DATA_SUFFIXES
        and p.is_file()
        and not any(x.startswith(".") for x in p.relative_to(path).parts)
    )
    if not files:
        raise DataError(f"{path}: no .jsonl, .json or .parquet files in this folder")
    builders = {DATA_SUFFIXES[p.suffix] for p in files}
    if len(builders) > 1:
        raise DataError(f"{path}: mixes JSON and Parquet files; keep one kind per folder")
    # Files named after splits (train.jsonl, test.jsonl) become those splits; otherwise all is "train".
    by_split: dict[str, list[str]] = {}
    for p in files:
        by_split.setdefault(p.stem.split("-")[0], []).append(str(p))
    if "train" in by_split:
        return builders.pop(), by_split
    return builders.pop(), {"train": [str(p) for p in files]}


def splits_of(path: Path) -> dict[str, list[Path]]:
    """The files of each split, as :func:`data_files` hands them to ``datasets``."""
    _builder, files = data_files(path)
    if isinstance(files, list):
        return {"train": [Path(f) for f in files]}
    return {split: [Path(f) for f in paths] for split, paths in files.items()}


def content_hash(path: Path) -> str:
    """SHA-256 of the data's content, streamed (files can be large): a file's bytes, or every data
    file of a folder with its name relative to the folder. The folder's own name and place do not
    count (the training hash has the name; a moved folder is the same data)."""
    digest = hashlib.sha256()
    files = [path] if path.is_file() else [f for fs in splits_of(path).values() for f in fs]
    for file in sorted(files):
        name = "" if file == path else file.relative_to(path).as_posix()
        digest.update(f"{name}\0{file.stat().st_size}\0".encode())
        with file.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()[:16]


# JSON's kinds of value, as a row's problem names them (bool before int: a bool is an int in Python)
_KINDS: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (type(None), "null"),
    (bool, "true/false"),
    ((int, float), "a number"),
    (str, "a string"),
    (list, "a list"),
    (dict, "an object"),
)


def _kind(value: Any) -> str:
    return next((name for kind, name in _KINDS if isinstance(value, kind)), f"a {type(value).__name__}")


def _json_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each row of a JSON file: one value per line, or one array of values."""
    with file.open("rb") as f:
        head = f.read(64).lstrip()
    if file.suffix == ".json" and head.startswith((b"[", b"\xef\xbb\xbf[")):
        text = file.read_text(encoding="utf-8-sig")
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(
                f"{file} line {e.lineno} column {e.colno}: not valid JSON ({e.msg}); "
                "expected a JSON array of objects"
            ) from None
        for n, row in enumerate(rows, 1):
            yield f"row {n}", row
        return
    with file.open("rb") as f:
        for n, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(
                    f"{file} line {n}: not UTF-8 text (byte {e.start + 1}); expected one JSON object per line"
                ) from None
            if n == 1:
                line = line.removeprefix("\ufeff")
            if not line.strip():
                continue  # datasets skips blank lines too
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(
                    f"{file} line {n} column {e.colno}: not valid JSON ({e.msg}); "
                    "expected one JSON object per line"
                ) from None
            yield f"line {n}", row


def _parquet_rows(file: Path) -> Iterator[tuple[str, Any]]:
    import pyarrow as pa  # type: ignore[import-untyped]
    import pyarrow.parquet as pq  # type: ignore[import-untyped]

    try:
        table = pq.ParquetFile(file)
    except (OSError, pa.ArrowException) as e:
        raise DataError(f"{file}: not a readable Parquet file ({e}); expected a Parquet table") from None
    n = 0
    for batch in table.iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            n += 1
            yield f"row {n}", row


def file_rows(file: Path) -> Iterator[tuple[str, Any]]:
    """(where, row) for each row of a data file; :class:`DataError` for what cannot be a row."""
    rows = _parquet_rows(file) if file.suffix == ".parquet" else _json_rows(file)
    expected = "a Parquet table with rows" if file.suffix == ".parquet" else "one JSON object per line"
    empty = True
    for where, row in rows:
        empty = False
        if not isinstance(row, dict):
            raise DataError(f"{file} {where}: {_kind(row)}, not an object; expected {expected}")
        yield where, row
    if empty:
        raise DataError(f"{file}: the file has no rows; expected {expected}")


# --- rows ------------------------------------------------------------------------------------------


def _message_problem(message: Any, label: str) -> str | None:
    if not isinstance(message, dict):
        return f'{label} is {_kind(message)}; expected an object {{"role": ..., "content": "..."}}'
    role = message.get("role")
    roles = ", ".join(repr(r) for r in KNOWN_ROLES)
    if role is None:
        return f"{label} has no 'role'; expected one of {roles}"
    if role not in KNOWN_ROLES:
        hint = role_hint(role) if isinstance(role, str) else ""
        return f"{label} has role {role!r}; expected one of {roles}{hint}"
    content = message.get("content")
    if content is None and role == "assistant" and message.get("tool_calls"):
        return None  # a tool call: no text
    if not isinstance(content, str):
        what = "has no 'content'" if content is None else f"content is {_kind(content)}"
        return f"{label} (role {role!r}) {what}; expected a string"
    return None


def _messages_problem(value: Any, column: str, *, assistant_needed: bool) -> str | None:
    if value is None:
        return f"column {column!r} is missing; expected {MESSAGES_EXPECTED}"
    if not isinstance(value, list) or not value:
        what = "an empty list" if isinstance(value, list) else _kind(value)
        return f"column {column!r} is {what}; expected {MESSAGES_EXPECTED}"
    for i, message in enumerate(value):
        problem = _message_problem(message, f"{column}[{i}]")
        if problem:
            return problem
    if assistant_needed and not any(m.get("role") == "assistant" for m in value):
        return (
            f"column {column!r} has no 'assistant' message; expected at least one "
            "(spec.training.assistantOnlyLoss trains on assistant messages only)"
        )
    return None


def problem_in_row(row: dict[str, Any], fmt: str, *, assistant_only_loss: bool = False) -> str | None:
    """What is wrong with ``row`` for the row format ``fmt``; None when TRL can train on it."""
    if fmt == DatasetFormat.MESSAGES:
        return _messages_problem(row.get("messages"), "messages", assistant_needed=assistant_only_loss)
    if fmt == DatasetFormat.TEXT:
        text = row.get("text")
        if not isinstance(text, str):
            what = "missing" if text is None else _kind(text)
            return f"column 'text' is {what}; expected a string"
        return None
    return _pair_problem(row.get("prompt"), row.get("completion"))


def value_problem(column: str, value: Any, expected: str) -> str | None:
    """What is wrong with one column's value where a string or a list of messages (no assistant turn
    needed) is expected: None where it is one."""
    if isinstance(value, list):
        return _messages_problem(value, column, assistant_needed=False)
    if not isinstance(value, str):
        what = "missing" if value is None else _kind(value)
        return f"column {column!r} is {what}; expected {expected}"
    return None


def _pair_problem(prompt: Any, completion: Any) -> str | None:
    """What is wrong with a prompt/completion row's two values (None: both strings or both messages)."""
    for column, value in (("prompt", prompt), ("completion", completion)):
        problem = value_problem(column, value, "a string (or a list of messages)")
        if problem:
            return problem
    if isinstance(prompt, list) != isinstance(completion, list):
        return "'prompt' and 'completion' differ in kind; expected both strings or both lists of messages"
    return None


def detect_format(columns: list[str], declared: str) -> str:
    """The row format: as declared, or from the columns (messages > prompt/completion > text)."""
    if declared != DatasetFormat.AUTO:
        needed = COLUMNS[DatasetFormat(declared)]
        missing = [c for c in needed if c not in columns]
        if missing:
            raise DataError(
                f"dataset format {declared} needs column(s) {missing}; the data has {columns}"
                + layout_hint(columns)
            )
        return declared
    if "messages" in columns:
        return DatasetFormat.MESSAGES
    if "prompt" in columns and "completion" in columns:
        return DatasetFormat.PROMPT_COMPLETION
    if "text" in columns:
        return DatasetFormat.TEXT
    raise DataError(
        f"cannot tell the dataset format from its columns {columns}: expected 'messages', "
        "'prompt' + 'completion', or 'text' (or set spec.dataset.format)" + layout_hint(columns)
    )


@dataclass
class _Scan:
    """One split's rows, read once: its columns, and the first problem for each format (the format
    is known only when every row's columns are)."""

    assistant_only_loss: bool
    layout: Layout
    columns: list[str] = field(default_factory=list)
    rows: int = 0
    first_problem: dict[str, str] = field(default_factory=dict)
    raw_columns: list[str] = field(default_factory=list)  # the data's own, before conversion
    conversion_problem: str | None = None

    def add(self, label: str, where: str, row: dict[str, Any]) -> None:
        self.rows += 1
        if self.layout.converts:
            for column in row:
                if column not in self.raw_columns:
                    self.raw_columns.append(column)
            try:
                row = convert_row(self.layout, row)
            except LayoutError as e:
                self.conversion_problem = self.conversion_problem or f"{label} {where}: {e}"
                return
        for column in row:
            if column not in self.columns:
                self.columns.append(column)
        for fmt in COLUMNS:
            if fmt not in self.first_problem:
                problem = problem_in_row(row, fmt, assistant_only_loss=self.assistant_only_loss)
                if problem:
                    self.first_problem[fmt] = f"{label} {where}: {problem}"

    def raise_conversion_problem(self, path: Path, split: str) -> None:
        """A column the layout reads that the split lacks, else the first row that did not convert."""
        problem = columns_problem(self.layout, self.raw_columns)
        if problem:
            raise DataError(f"{path}: split {split!r}: {problem}")
        if self.conversion_problem:
            raise DataError(self.conversion_problem)

    def raise_problem(self, fmt: str, how: str) -> None:
        problem = self.first_problem.get(fmt)
        if problem:
            raise DataError(f"{problem} (format {fmt}, {how})")


def _how(declared: str, columns: list[str], layout: Layout | None = None) -> str:
    if layout is not None and layout.name != DatasetLayout.NATIVE:
        return f"converted from layout {layout.name}"
    if declared != DatasetFormat.AUTO:
        return "as spec.dataset.format says"
    return f"detected from the columns {columns}"


def _check_system_prompt(layout: Layout, where: str, fmt: str) -> None:
    if layout.system_prompt and fmt != DatasetFormat.MESSAGES:
        raise DataError(
            f"{where}: spec.dataset.systemPrompt is put into chat conversations (a 'messages' column); "
            f"the data is in format {fmt}"
        )


def _check_eval_fraction(src: DatasetSource, where: str, rows: int) -> None:
    # datasets' train_test_split needs a row on each side
    if src.eval_fraction and rows - math.ceil(src.eval_fraction * rows) < 1:
        raise DataError(
            f"{where}: {rows} row(s) in split {src.split!r}; spec.dataset.evalFraction {src.eval_fraction} "
            "holds out all of them; expected enough rows to train on and to evaluate"
        )


def check_files(src: DatasetSource, *, assistant_only_loss: bool = False) -> DataCheck:
    """Read every local data file once; :class:`DataError` at the first problem."""
    assert src.path is not None
    path = Path(src.path)
    splits = splits_of(path)
    if src.split not in splits:
        raise DataError(f"{path}: dataset has no split {src.split!r} (it has {sorted(splits)})")
    if src.eval_split and src.eval_split not in splits:
        raise DataError(f"{path}: dataset has no eval split {src.eval_split!r} (it has {sorted(splits)})")
    layout = layout_of(src)
    used = [src.split] + ([src.eval_split] if src.eval_split else [])
    scans: dict[str, _Scan] = {}
    for split, files in splits.items():
        scan = scans[split] = _Scan(assistant_only_loss=assistant_only_loss, layout=layout)
        for file in files:
            for where, row in file_rows(file):
                scan.add(str(file), where, row)
    for split in used:
        scans[split].raise_conversion_problem(path, split)
    train = scans[src.split]
    declared = str(src.format)
    try:
        fmt = detect_format(train.columns, declared)
    except DataError as e:
        raise DataError(f"{path}: {e}") from None
    if assistant_only_loss and fmt != DatasetFormat.MESSAGES:
        raise DataError(
            f"{path}: spec.training.assistantOnlyLoss needs chat data (a 'messages' column); "
            f"the data is in format {fmt}"
        )
    _check_system_prompt(layout, str(path), fmt)
    for split in used:
        scans[split].raise_problem(fmt, _how(declared, train.columns, layout))
    _check_eval_fraction(src, str(path), train.rows)
    rows = {split: scans[split].rows for split in used}
    return DataCheck(
        format=fmt,
        data_hash=content_hash(path),
        rows=rows,
        layout=layout.name,
        converted=sum(rows.values()) if layout.converts else 0,
    )


def check_loaded(
    train: Any, evaluation: Any, src: DatasetSource, *, assistant_only_loss: bool = False
) -> str:
    """The format of loaded data (a Hub data set), every row checked; :class:`DataError` at the first problem."""
    label = f"{src.name or src.path}"
    columns = list(train.column_names)
    declared = str(src.format)
    layout = layout_of(src)
    try:
        fmt = detect_format(columns, declared)
    except DataError as e:
        raise DataError(f"{label}: {e}") from None
    if assistant_only_loss and fmt != DatasetFormat.MESSAGES:
        raise DataError(
            f"{label}: spec.training.assistantOnlyLoss needs chat data (a 'messages' column); "
            f"the data is in format {fmt}"
        )
    _check_system_prompt(layout, label, fmt)
    for split, data in ((src.split, train), (src.eval_split or "eval", evaluation)):
        if data is None:
            continue
        present = [c for c in COLUMNS[DatasetFormat(fmt)] if c in data.column_names]
        for n, row in enumerate(data.select_columns(present), 1):
            problem = problem_in_row(row, fmt, assistant_only_loss=assistant_only_loss)
            if problem:
                raise DataError(
                    f"{label} split {split!r} row {n}: {problem} (format {fmt}, {_how(declared, columns, layout)})"
                )
    return fmt


# --- Hub data sets ---------------------------------------------------------------------------------

_COMMIT = re.compile(r"[0-9a-f]{40}")


def hub_revision(src: DatasetSource, token: str | None) -> str | None:
    """The commit a Hub data set's revision points at now (loaded as such: what is hashed is what
    trains); None when the Hub cannot be asked (offline): then data changes are not detected."""
    assert src.name is not None
    if _COMMIT.fullmatch(src.revision):
        return src.revision
    try:
        from huggingface_hub import HfApi

        sha = HfApi().dataset_info(src.name, revision=src.revision, token=token).sha
    except Exception as e:  # offline, a proxy, a gated set: loading reports what matters
        log.warning(
            "data set %s: could not resolve revision %r to a commit (%s); a change of its data "
            "under that revision will not be noticed on resume",
            src.name,
            src.revision,
            type(e).__name__,
        )
        return None
    return str(sha) if sha else None


def check(src: DatasetSource, *, assistant_only_loss: bool = False, token: str | None = None) -> DataCheck:
    """The pre-check of a job's data: local files read and checked, or a Hub data set's commit."""
    if src.path:
        return check_files(src, assistant_only_loss=assistant_only_loss)
    revision = hub_revision(src, token)
    data_hash = None
    if revision is not None:
        identity = json.dumps([src.name, src.subset, revision])
        data_hash = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return DataCheck(format=None, data_hash=data_hash, revision=revision)
