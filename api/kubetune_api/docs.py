"""Generate the FineTuneJob configuration reference (docs/api.md) from the typed models.

python -m kubetune_api.docs --write docs/api.md
python -m kubetune_api.docs --check docs/api.md    # exit 1 when stale (a test runs this)
"""

from __future__ import annotations

import html
import json
import re
import sys
from typing import Any

from . import admission
from .crd import generated_file_main, openapi_schema
from .spec import MUTABLE_SPEC_PATHS

# A fixed set of values written as a pattern (the CRD generator writes an optional enum so, for an
# explicit null to pass the API server): shown as the values, like an enum.
_CHOICES = re.compile(r"\^\(([A-Za-z0-9_]+(?:\|[A-Za-z0-9_]+)+)\)\$")


def _choices(node: dict[str, Any]) -> list[str] | None:
    if "enum" in node:
        return [str(v) for v in node["enum"]]
    found = _CHOICES.fullmatch(str(node.get("pattern", "")))
    return found.group(1).split("|") if found else None


def _type(node: dict[str, Any]) -> str:
    t = node.get("type", "")
    choices = _choices(node)
    if choices:
        return " \\| ".join(f"`{v}`" for v in choices)
    if t == "array":
        return f"list of {_type(node.get('items', {}))}"
    if t == "object" and "additionalProperties" in node:
        return "map of string"
    return t


def markdown_cell(text: str) -> str:
    """Text as one table cell of Markdown: one line, `|` escaped, and `&`, `<`, `>` written as HTML
    entities outside code spans (else a renderer reads `<name>` as an HTML tag and drops it)."""
    parts = text.replace("\n", " ").split("`")
    parts[::2] = [html.escape(part, quote=False) for part in parts[::2]]  # the text between code spans
    return "`".join(parts).replace("|", "\\|")


def _limits(node: dict[str, Any]) -> str:
    parts = []
    lo, hi = node.get("minimum"), node.get("maximum")
    if lo is not None:
        parts.append(f"{'>' if node.get('exclusiveMinimum') else '≥'} {lo}")
    if hi is not None:
        parts.append(f"{'<' if node.get('exclusiveMaximum') else '≤'} {hi}")
    if "maxItems" in node:
        parts.append(f"≤ {node['maxItems']} items")
    if "maxLength" in node:
        parts.append(f"≤ {node['maxLength']} characters")
    if "pattern" in node and not _choices(node):
        parts.append(f"matches `{node['pattern']}`")
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and "pattern" in extra:
        parts.append(f"values match `{extra['pattern']}`")
    return markdown_cell(", ".join(parts))


def _rows(node: dict[str, Any], path: str, required: set[str]) -> list[str]:
    rows = []
    for name, sub in node.get("properties", {}).items():
        p = f"{path}.{name}" if path else name
        default = json.dumps(sub["default"]) if "default" in sub and sub["default"] != {} else ""
        desc = markdown_cell(sub.get("description", ""))
        rule_notes = [
            v["message"] for v in sub.get("x-kubernetes-validations", []) if "immutable" not in v["message"]
        ]
        if rule_notes:
            desc += " *Rules:* " + markdown_cell("; ".join(rule_notes)) + "."
        req = "yes" if name in required else ""
        rows.append(
            f"| `{p}` | {_type(sub)} | {req} | {default and f'`{default}`'} | {_limits(sub)} | {desc} |"
        )
        if "properties" in sub:
            rows += _rows(sub, p, set(sub.get("required", [])))
        elif sub.get("type") == "array" and "properties" in sub.get("items", {}):
            rows += _rows(sub["items"], p + "[]", set(sub["items"].get("required", [])))
    return rows


def _list_types(node: dict[str, Any], path: str) -> list[str]:
    rows = []
    kind = node.get("x-kubernetes-list-type")
    if kind == "set":
        rows.append(f"| `{path}` | schema (`x-kubernetes-list-type: set`) | each item at most once |")
    elif kind == "map":
        keys = ", ".join(node.get("x-kubernetes-list-map-keys", []))
        rows.append(f"| `{path}` | schema (`x-kubernetes-list-type: map`) | each {keys} at most once |")
    for name, sub in node.get("properties", {}).items():
        rows += _list_types(sub, f"{path}.{name}")
    if "items" in node:
        rows += _list_types(node["items"], f"{path}[]")
    return rows


def rules_table() -> list[str]:
    """The validation rules beyond each field's type: one row per place of each rule in
    :mod:`kubetune_api.rules` (CEL in the CRD, its Python twin in kubetune), then the list types."""
    lines = [
        "| where | checked | refused with |",
        "| --- | --- | --- |",
    ]
    for rule in admission.all_rules():
        for place in rule.places:
            where = f"{place}{rule.field or ''}" or "metadata.name"
            kind = "CEL on update (oldSelf)" if rule.old else "CEL"
            lines.append(f"| `{where}` | {kind} | {markdown_cell(rule.message)} |")
    lines += _list_types(openapi_schema()["properties"]["spec"], "spec")
    return lines


def mutable_sentence() -> str:
    """What may change after creation, in words, from the one list
    (:data:`kubetune_api.spec.MUTABLE_SPEC_PATHS`); docs/api.md says it, and a test finds it in
    docs/guide.md.

    >>> mutable_sentence()
    'After creation only `spec.suspend`, `spec.registration.enabled` and `spec.registration.alias` may change'
    """
    names = [f"`spec.{p}`" for p in MUTABLE_SPEC_PATHS]
    listed = names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]
    return f"After creation only {listed} may change"


def render() -> str:
    spec = openapi_schema()["properties"]["spec"]
    lines = [
        "# FineTuneJob reference (`kubetune.io/v1alpha1`)",
        "",
        "<!-- Generated by `python -m kubetune_api.docs --write docs/api.md`; a test fails when it is stale. -->",
        "",
        "Every field of `spec`, its type, default and limits, as the API server enforces them.",
        f"{mutable_sentence()}; every other field shapes the training or its registration and is",
        "immutable (the API server refuses the update, naming the field).",
        "",
        "## Validation rules",
        "",
        "What each field's type says (type, enum, bounds, length, pattern: the *limits* column of the",
        "field table below) is declared once on the typed models (`api/kubetune_api/spec.py`); every",
        "other rule is declared once in `api/kubetune_api/rules.py`, which gives both the CRD's CEL rule",
        "(`x-kubernetes-validations`, with `fieldPath` and this message) and its Python twin. The API",
        "server applies them on `kubectl apply`; `kubetune render`, `kubetune run --local`, the trainer",
        "and the operator (for a job that has not started yet) apply the same rules in Python and refuse",
        "with the same field and message. The CEL stays within Kubernetes 1.30 (quantity library, RE2",
        "`matches()`, extended strings).",
        "",
    ]
    lines += rules_table()
    lines += [
        "",
        "## Fields",
        "",
        "| field | type | required | default | limits | description |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    lines += _rows(spec, "spec", set(spec.get("required", [])))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return generated_file_main(argv, doc=__doc__, module="kubetune_api.docs", render_text=render())


if __name__ == "__main__":
    sys.exit(main())
