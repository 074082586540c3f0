"""docs/api.md, rendered as the documentation site renders it, keeps every word of what it documents.

The page is Markdown generated from the typed models; a description such as
`models:/<name>@<alias>` written as it is would lose `<name>` and `<alias>` in the renderer (read
as HTML tags). This renders docs/api.md with the Markdown library and extensions of mkdocs.yml and
compares, row by row, the words of every field's description and every rule's message with the
words of the rendered table cell.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from typing import Any

import markdown  # type: ignore[import-untyped]
import yaml
from tests.support.controlplane import REPO

from kubetune_api import admission
from kubetune_api.crd import openapi_schema
from kubetune_api.docs import markdown_cell


class Tables(HTMLParser):
    """The text of every cell of every table row, and the page's whole text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.rows: list[list[str]] = []
        self.cell: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self.cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append("".join(self.cell))
            self.cell = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self.cell is not None:
            self.cell.append(data)


def render(text: str) -> Tables:
    """HTML of a page as mkdocs renders it (its Markdown library, mkdocs.yml's extensions), parsed."""
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    names: list[str] = []
    configs: dict[str, Any] = {}
    for entry in config["markdown_extensions"]:
        name = entry if isinstance(entry, str) else next(iter(entry))
        names.append(name)
        if isinstance(entry, dict):
            configs[name] = entry[name]
    tables = Tables()
    tables.feed(markdown.markdown(text, extensions=names, extension_configs=configs))
    return tables


def words(text: str) -> list[str]:
    return re.findall(r"\w+", text)


def descriptions(node: dict[str, Any], path: str) -> dict[str, str]:
    out = {}
    for name, sub in node.get("properties", {}).items():
        p = f"{path}.{name}"
        out[p] = sub.get("description", "")
        out |= descriptions(sub, p)
        out |= descriptions(sub.get("items", {}), p + "[]")
    return out


def test_every_field_description_and_rule_message_keeps_its_words_once_rendered() -> None:
    page = render((REPO / "docs" / "api.md").read_text())
    fields = {row[0]: row[5] for row in page.rows if len(row) == 6 and row[0].startswith("spec")}
    rules = [(row[0], row[2]) for row in page.rows if len(row) == 3 and row[0] != "where"]

    documented = descriptions(openapi_schema()["properties"]["spec"], "spec")
    assert set(fields) == set(documented)
    lost = {
        path: description
        for path, description in documented.items()
        if words(fields[path])[: len(words(description))] != words(description)
    }
    assert not lost, lost

    messages = [rule.message for rule in admission.all_rules() for _ in rule.places]
    assert [words(cell) for _, cell in rules[: len(messages)]] == [words(m) for m in messages]
    # the placeholders that went missing before: models:/<name>@<alias> or /<version>
    assert "models:/<name>@<alias> or models:/<name>/<version>" in fields["spec.model.registered"]
    assert "v<number>" in dict(rules)["spec.registration.alias"]


def test_the_check_fails_for_text_a_renderer_reads_as_html() -> None:
    description = "Start from models:/<name>@<alias> (default: kubetune/<namespace>) & more"
    raw = render(f"| field | description |\n| --- | --- |\n| `spec.x` | {description} |\n")
    assert words(raw.rows[1][1]) != words(description)  # the renderer drops <name>, <alias>, <namespace>
    escaped = render(f"| field | description |\n| --- | --- |\n| `spec.x` | {markdown_cell(description)} |\n")
    assert escaped.rows[1][1] == description
    assert markdown_cell("a `<b>` c <d> | e") == "a `<b>` c &lt;d&gt; \\| e"  # code spans stay as they are
