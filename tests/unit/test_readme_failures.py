"""The docs' table of training failures (docs/troubleshooting.md, moved there from the README) is the
enum, its meanings and its remedies, row for row: a reason added, renamed or given other words in
kubetune_api.failures fails here until the page says so (the assertion message holds the table to paste)."""

from __future__ import annotations

import re

from tests.support.controlplane import REPO

from kubetune_api.failures import HINTS, MEANINGS, Failure

PAGE = REPO / "docs" / "troubleshooting.md"
HEADING = "## Why training failed"


def section() -> str:
    text = PAGE.read_text()
    assert HEADING in text, f"docs/troubleshooting.md has no {HEADING!r} section"
    return text.split(HEADING, 1)[1].split("\n## ", 1)[0].split("\n### ", 1)[0]


def failure_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in section().splitlines():
        m = re.match(r"^\| `(\w+)` \| (.+) \| (.+) \|$", line)
        if m:
            assert m.group(1) not in rows, f"{m.group(1)} has two rows"
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def expected_table() -> str:
    lines = ["| reason | what it means | what to do |", "| --- | --- | --- |"]
    lines += [f"| `{reason}` | {MEANINGS[reason]} | {HINTS[reason]} |" for reason in Failure]
    return "\n".join(lines)


def test_every_failure_has_its_row_with_the_words_the_operator_shows() -> None:
    rows = failure_rows()
    hint = f"docs/troubleshooting.md's table should be:\n{expected_table()}"
    assert set(rows) == {r.value for r in Failure}, hint
    for reason in Failure:
        assert rows[reason.value] == (MEANINGS[reason], HINTS[reason]), f"{reason}: {hint}"


def test_the_table_is_in_the_enums_order() -> None:
    assert expected_table() in section()


def test_every_failure_has_a_meaning_and_a_remedy_a_table_cell_can_hold() -> None:
    assert set(MEANINGS) == set(Failure) == set(HINTS)
    for text in [*MEANINGS.values(), *HINTS.values()]:
        assert len(text) > 20 and "|" not in text and "\n" not in text, text
