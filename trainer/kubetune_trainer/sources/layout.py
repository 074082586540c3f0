"""Data sets as users have them, converted into kubetune's own columns: the one place it happens.

``spec.dataset.layout`` says how the rows hold their examples; ``columns``, ``roles`` and
``systemPrompt`` adjust it (:class:`kubetune_api.spec.DatasetSource`):

- ``native`` (the default): kubetune's columns (``messages``, ``prompt`` + ``completion``, ``text``)
  as they are. ``columns`` renames the data's own columns and turn keys to them, ``roles`` maps role
  names, ``systemPrompt`` is put first in each conversation without a system turn. Without any of
  the three nothing is converted (:attr:`Layout.converts` is false): the rows are read as before.
- ``sharegpt``: a ``conversations`` column of turns ``{"from": ..., "value": ...}`` with roles
  ``human``, ``gpt`` and ``system`` (and an optional ``system`` column), into ``messages``.
- ``alpaca``: ``instruction``, an optional ``input`` (appended to the instruction after a blank line),
  ``output`` and an optional ``system``, into a ``messages`` conversation: the user's turn, then the
  assistant's.

The data check (:mod:`.data_check`) converts each row before it checks it, so a problem names the
data's own column and the spec field to change; loading (:mod:`.data`) converts the loaded splits
with the same function, so the preparation step tokenizes, and training sees, only native rows.

>>> from kubetune_api.spec import DatasetSource
>>> sharegpt = layout_of(DatasetSource(path="/d.jsonl", layout="sharegpt", systemPrompt="Be brief."))
>>> convert_row(sharegpt, {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]})
{'messages': [{'role': 'system', 'content': 'Be brief.'}, {'role': 'user', 'content': 'hi'}, {'role': 'assistant', 'content': 'hello'}]}
>>> alpaca = layout_of(DatasetSource(path="/d.jsonl", layout="alpaca"))
>>> convert_row(alpaca, {"instruction": "Add.", "input": "2 and 3", "output": "5"})["messages"][0]
{'role': 'user', 'content': 'Add.\\n\\n2 and 3'}
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubetune_api.spec import DatasetLayout, DatasetSource

# The roles chat templates render (data_check.KNOWN_ROLES, which imports them from here)
KNOWN_ROLES = ("system", "user", "assistant", "tool")
# Each layout's names for its fields (spec.dataset.columns overrides them one by one)
DEFAULT_COLUMNS: dict[str, dict[str, str]] = {
    DatasetLayout.NATIVE: {
        "messages": "messages",
        "role": "role",
        "content": "content",
        "prompt": "prompt",
        "completion": "completion",
        "text": "text",
    },
    DatasetLayout.SHAREGPT: {
        "messages": "conversations",
        "role": "from",
        "content": "value",
        "system": "system",
    },
    DatasetLayout.ALPACA: {
        "instruction": "instruction",
        "input": "input",
        "output": "output",
        "system": "system",
    },
}
# ShareGPT's role names (FastChat's human/gpt, and the native ones some files use)
SHAREGPT_ROLES = {"human": "user", "gpt": "assistant", "system": "system"} | {r: r for r in KNOWN_ROLES}
# The columns a row of each layout must have (the others are optional: input, system)
REQUIRED = {
    DatasetLayout.SHAREGPT: ("messages",),
    DatasetLayout.ALPACA: ("instruction", "output"),
}


class LayoutError(ValueError):
    """A row that cannot be converted; the message names the column and the spec field."""


@dataclass(frozen=True)
class Layout:
    """The spec's layout, resolved: the data's name for each field, the role map, the system prompt."""

    name: str
    columns: dict[str, str]
    named: frozenset[str]  # the fields spec.dataset.columns names (the rest are the layout's defaults)
    roles: dict[str, str]
    given_roles: frozenset[str]  # the role names spec.dataset.roles maps
    system_prompt: str | None

    @property
    def converts(self) -> bool:
        """Whether rows change at all: a layout other than native, or native with a mapping."""
        return self.name != DatasetLayout.NATIVE or bool(self.named or self.given_roles or self.system_prompt)

    def where(self, key: str) -> str:
        """The spec field that says where ``key`` is: spec.dataset.columns.<key>, or the layout."""
        if key in self.named:
            return f"spec.dataset.columns.{key}"
        return f"spec.dataset.layout {self.name}"

    def identity(self) -> dict[str, Any] | None:
        """What of the conversion changes the rows (for the tokenization key); None when nothing does."""
        if not self.converts:
            return None
        return {
            "layout": self.name,
            "columns": self.columns,
            "roles": self.roles,
            "systemPrompt": self.system_prompt,
        }


def layout_of(src: DatasetSource) -> Layout:
    name = str(src.layout)
    given = {k: v for k, v in (src.columns.wire() if src.columns else {}).items() if v is not None}
    roles = dict(SHAREGPT_ROLES) if name == DatasetLayout.SHAREGPT else {}
    roles.update(src.roles or {})
    return Layout(
        name=name,
        columns=DEFAULT_COLUMNS[name] | given,
        named=frozenset(given),
        roles=roles,
        given_roles=frozenset(src.roles or {}),
        system_prompt=src.system_prompt,
    )


# --- the data's columns ------------------------------------------------------------------------------------


def columns_problem(layout: Layout, columns: list[str]) -> str | None:
    """What is wrong with the columns a split has for ``layout`` (None: the rows can be converted):
    a column spec.dataset.columns names that the data does not have, or one the layout needs."""
    if not layout.converts:
        return None
    rows_columns = ("messages", "prompt", "completion", "text", "instruction", "input", "output", "system")
    for key in sorted(layout.named):
        column = layout.columns[key]
        if key in rows_columns and column not in columns:
            return (
                f"spec.dataset.columns.{key} names column {column!r}, which the data does not have "
                f"(it has {columns})"
            )
    for key in REQUIRED.get(DatasetLayout(layout.name), ()):
        column = layout.columns[key]
        if column not in columns:
            return (
                f"layout {layout.name} reads the {key} from column {column!r}, which the data does not have "
                f"(it has {columns}); name the data's column in spec.dataset.columns.{key}"
            )
    return None


def layout_hint(columns: list[str]) -> str:
    """What to set when the columns are a known layout's (for a refusal of native rows), or ''.

    >>> layout_hint(["conversations", "id"])
    "; the columns are ShareGPT's: set spec.dataset.layout: sharegpt"
    """
    if "conversations" in columns:
        return "; the columns are ShareGPT's: set spec.dataset.layout: sharegpt"
    if "instruction" in columns and "output" in columns:
        return "; the columns are Alpaca's: set spec.dataset.layout: alpaca"
    return "; or name the data's columns in spec.dataset.columns"


def role_hint(role: Any) -> str:
    """What to set for a role none of the known ones (native rows), appended to its refusal."""
    if role in ("human", "gpt"):
        return (
            "; these are ShareGPT's role names: map them in spec.dataset.roles (human: user, gpt: "
            "assistant), or set spec.dataset.layout: sharegpt for ShareGPT's own columns "
            "(conversations, from, value)"
        )
    return f"; map it onto one of them in spec.dataset.roles (e.g. {role}: assistant)"


# --- rows --------------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if value is None:
        return "missing"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, list):
        return "an empty list" if not value else "a list"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else f"a {type(value).__name__}"


def _role(layout: Layout, role: Any, label: str) -> Any:
    mapped = layout.roles.get(role, role) if isinstance(role, str) else role
    if mapped in KNOWN_ROLES or layout.name != DatasetLayout.SHAREGPT:
        return mapped  # native: the data check names an unknown one
    known = ", ".join(repr(r) for r in layout.roles)
    raise LayoutError(
        f"{label} has role {role!r}, which layout sharegpt does not know ({known}); map it in "
        f"spec.dataset.roles (e.g. {role}: assistant)"
    )


def _turns(layout: Layout, value: Any, column: str) -> list[dict[str, Any]]:
    """The turns of a conversation column, with the layout's keys renamed and roles mapped."""
    role_key, content_key = layout.columns["role"], layout.columns["content"]
    if not isinstance(value, list):
        return value  # native: the data check names what it is
    out = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            out.append(turn)
            continue
        label = f"{column}[{i}]"
        if role_key not in turn and layout.name == DatasetLayout.SHAREGPT:
            raise LayoutError(
                f"{label} has no {role_key!r} ({layout.where('role')}: the key of a turn's role)"
            )
        rest = {k: v for k, v in turn.items() if k not in (role_key, content_key)}
        converted = {
            "role": _role(layout, turn.get(role_key), label),
            "content": turn.get(content_key),
            **rest,
        }
        if converted["content"] is None and content_key not in turn and layout.name == DatasetLayout.SHAREGPT:
            raise LayoutError(
                f"{label} has no {content_key!r} ({layout.where('content')}: the key of a turn's text)"
            )
        out.append(converted)
    return out


def _with_system(layout: Layout, messages: list[dict[str, Any]], own: Any) -> list[dict[str, Any]]:
    """``messages`` with a system turn first: the row's own (a system column), else the spec's."""
    if any(isinstance(m, dict) and m.get("role") == "system" for m in messages):
        return messages
    text = own if isinstance(own, str) and own.strip() else layout.system_prompt
    return [{"role": "system", "content": text}, *messages] if text else messages


def _own_system(layout: Layout, row: dict[str, Any]) -> str | None:
    """A row's own system prompt (its system column; null or absent: none)."""
    column = layout.columns["system"]
    own = row.get(column)
    if own is not None and not isinstance(own, str):
        raise LayoutError(f"column {column!r} is {_kind(own)}; expected a string ({layout.where('system')})")
    return own


def _sharegpt(layout: Layout, row: dict[str, Any]) -> dict[str, Any]:
    column = layout.columns["messages"]
    value = row.get(column)
    if not isinstance(value, list) or not value:
        raise LayoutError(
            f"column {column!r} is {_kind(value)}; expected a conversation, a list of turns each "
            f'{{"{layout.columns["role"]}": ..., "{layout.columns["content"]}": "..."}} ({layout.where("messages")})'
        )
    messages = _with_system(layout, _turns(layout, value, column), _own_system(layout, row))
    if not any(m.get("role") != "system" for m in messages):
        raise LayoutError(
            f"column {column!r} holds only system turns: an empty conversation after conversion "
            f"({layout.where('messages')})"
        )
    return {"messages": messages}


def _text(layout: Layout, row: dict[str, Any], key: str, *, optional: bool = False) -> str:
    column = layout.columns[key]
    value = row.get(column)
    if value is None and optional:
        return ""
    if not isinstance(value, str):
        raise LayoutError(f"column {column!r} is {_kind(value)}; expected a string ({layout.where(key)})")
    return value


def _alpaca(layout: Layout, row: dict[str, Any]) -> dict[str, Any]:
    instruction = _text(layout, row, "instruction")
    extra = _text(layout, row, "input", optional=True)
    output = _text(layout, row, "output")
    asked = "\n\n".join(part for part in (instruction, extra) if part.strip())
    for text, key in ((asked, "instruction"), (output, "output")):
        if not text.strip():
            what = "instruction and input are" if key == "instruction" else "output is"
            raise LayoutError(f"{what} empty: an empty conversation after conversion ({layout.where(key)})")
    messages = [{"role": "user", "content": asked}, {"role": "assistant", "content": output}]
    return {"messages": _with_system(layout, messages, _own_system(layout, row))}


def _native(layout: Layout, row: dict[str, Any]) -> dict[str, Any]:
    out = dict(row)
    for key in ("messages", "prompt", "completion", "text"):
        column = layout.columns[key]
        if key in layout.named and column in out:
            out[key] = out.pop(column)
    for key in ("messages", "prompt", "completion"):
        if key in out:
            out[key] = _turns(layout, out[key], key)
    if layout.system_prompt and isinstance(out.get("messages"), list) and out["messages"]:
        out["messages"] = _with_system(layout, out["messages"], None)
    return out


def convert_row(layout: Layout, row: dict[str, Any]) -> dict[str, Any]:
    """``row`` in kubetune's own columns; :class:`LayoutError` for a row that cannot be."""
    if layout.name == DatasetLayout.SHAREGPT:
        return _sharegpt(layout, row)
    if layout.name == DatasetLayout.ALPACA:
        return _alpaca(layout, row)
    return _native(layout, row)


# --- loaded splits -----------------------------------------------------------------------------------------


def convert_dataset(layout: Layout, dataset: Any, label: str) -> Any:
    """A loaded split (``datasets.Dataset``) converted row by row (None stays None); a row that
    cannot be converted raises :class:`LayoutError` naming ``label`` and the row."""
    if dataset is None or not layout.converts:
        return dataset
    problem = columns_problem(layout, list(dataset.column_names))
    if problem:
        raise LayoutError(f"{label}: {problem}")

    def one(row: dict[str, Any], index: int) -> dict[str, Any]:
        try:
            return convert_row(layout, row)
        except LayoutError as e:
            raise LayoutError(f"{label} row {index + 1}: {e}") from None

    return dataset.map(one, with_indices=True, remove_columns=list(dataset.column_names))
