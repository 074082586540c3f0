"""The code blocks of the README and the docs pages, read the way the tests that check them need.

The first cluster job (``examples/first-job.yaml``) is shown verbatim on docs/getting-started.md;
every ``$ kubectl get ftj`` sample on the README and the pages is that job's output. The unit tests
(tests/unit/test_first_job.py) hold the page to the file and the samples to the CRD's columns; the
cluster test (tests/cluster/test_first_job.py) applies the page's manifest and holds the samples to
what kubectl printed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.support.controlplane import REPO

FIRST_JOB = REPO / "examples" / "first-job.yaml"
GETTING_STARTED = REPO / "docs" / "getting-started.md"
GET_FTJ = "$ kubectl get ftj"
# kubectl's AGE column: "45s", "2m23s" (under ten minutes), "5m", "3h5m", "2d3h", "4y"
KUBECTL_AGE = r"\d+[smhdy](\d+[smh])?"

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # of the opening fence, 1-based
    info: str  # what follows the opening fence (the language)
    text: str  # the lines between the fences, indentation of the fence removed, ending with "\n"


def pages() -> list[Path]:
    """The README and every page of the site."""
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def code_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file."""
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence = len(m["indent"]), m["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and lines[j].strip() != fence:
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        blocks.append(Block(path, i + 1, m["info"].strip(), "".join(f"{b}\n" for b in body)))
        i = j + 1
    return blocks


def first_job_on_the_page() -> str:
    """The YAML block of docs/getting-started.md that is examples/first-job.yaml (its kind and name)."""
    found = [
        b.text
        for b in code_blocks(GETTING_STARTED)
        if b.info == "yaml" and "kind: FineTuneJob" in b.text and "name: first-job" in b.text
    ]
    assert len(found) == 1, f"{GETTING_STARTED}: {len(found)} YAML blocks of the first job, expected one"
    return found[0]


def get_ftj_samples() -> list[Block]:
    """Every sample of ``kubectl get ftj`` (the table of all jobs) on the README and the pages."""
    return [b for p in pages() for b in code_blocks(p) if b.text.split("\n", 1)[0].strip() == GET_FTJ]


def table(output: str) -> tuple[list[str], list[dict[str, str]]]:
    """kubectl's table output (without the ``$ kubectl ...`` line): the header and each row by column.

    kubectl left-aligns every column at the position of its header, so a row is cut at the header's
    column starts; an empty cell is blank.
    """
    lines = [line for line in output.splitlines() if line.strip() and not line.startswith("$ ")]
    header = lines[0]
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    names = header.split()
    rows = []
    for line in lines[1:]:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return names, rows
