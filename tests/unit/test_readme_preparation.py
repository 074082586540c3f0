"""The docs' table of preparation refusals (docs/preparation.md, moved there from the README) is the enum
and its remedies, row for row: a reason added, renamed or given another remedy in kubetune_api.preparation
fails here until the page says so."""

from __future__ import annotations

import re

from tests.support.controlplane import REPO

from kubetune_api.preparation import HINTS, Refusal


def refusal_rows() -> dict[str, tuple[str, str]]:
    # the page is the README's former "## Preparation" section, whole
    section = (REPO / "docs" / "preparation.md").read_text()
    assert section.startswith("# Preparation"), "docs/preparation.md is the preparation page"
    rows = {}
    for line in section.splitlines():
        m = re.match(r"^\| `(\w+)` \| (.+) \| (.+) \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_every_refusal_has_its_row_with_the_remedy_the_operator_shows() -> None:
    rows = refusal_rows()
    assert set(rows) == {r.value for r in Refusal}
    for reason in Refusal:
        means, remedy = rows[reason.value]
        assert means.strip(), reason
        assert remedy == HINTS[reason], reason


def test_every_refusal_has_a_remedy() -> None:
    assert set(HINTS) == set(Refusal)
    assert all(len(h) > 30 for h in HINTS.values())
