"""docs/benchmarks.md is one page of current results; every dated run is in docs/benchmarks-history.md.

The current results table is copied from the run it names, so each of its rows must be in the history
as it is there; neither page (nor the performance page that quotes them) may cite a file of the
repository that does not exist.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import PurePosixPath

from tests.support.controlplane import REPO

DOCS = REPO / "docs"
PAGES = ("benchmarks.md", "benchmarks-history.md", "performance.md")
# the Hub stand-in's repository names in the startup benchmark, not files
NOT_PATHS = {"bench/qwen3-4b-random", "bench/capybara-like"}
TOP = (
    "api",
    "bench",
    "charts",
    "cli",
    "crds",
    "deploy",
    "docs",
    "examples",
    "hack",
    "images",
    "operator",
    "trainer",
    "tests",
)


def section(text: str, heading: str) -> str:
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def test_the_benchmarks_page_is_the_current_results_the_command_and_the_date() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    assert len(page.split()) < 2000, "docs/benchmarks.md is one page: dated runs go in benchmarks-history.md"
    headings = re.findall(r"(?m)^## (.+)$", page)
    assert headings[0].startswith("Current results (one H200, 2026-")
    dated = [h for h in headings[1:] if re.search(r"20\d\d-\d\d-\d\d", h)]
    assert not dated, dated
    assert re.search(r"(?m)^Current as of 20\d\d-\d\d-\d\d\.", page)
    assert "(benchmarks-history.md)" in page
    reproduce = section(page, "Reproduce")
    assert reproduce.count(".venv/bin/kubetune bench --out bench-out") == 4
    assert "bash hack/gpu/run.sh nbmem" in reproduce


def test_every_row_of_the_current_table_is_the_dated_run_s_row_in_the_history() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    history = (DOCS / "benchmarks-history.md").read_text()
    table = section(page, "Current results").split("\n\nChart:")[0]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| ---")]
    assert len(rows) == 6  # the header and five cases
    missing = [row for row in rows if row not in history]
    assert not missing, missing
    # and every dated run once was on the benchmarks page: the history keeps them, newest first
    dates = re.findall(r"(?m)^## .*?(20\d\d-\d\d-\d\d)", history)
    assert len(dates) >= 8 and dates[0] >= dates[-1]


def cited_paths(text: str) -> set[str]:
    """Repository paths a page names: in code spans, or as link targets outside docs/."""
    spans = re.findall(r"`([^`\s]+)`", text)
    found = {
        s.rstrip(".,:;") for s in spans if "/" in s and (s.split("/")[0] in TOP or s.startswith("kubetune_"))
    }
    links = re.findall(r"\]\(([^)#\s]+)", text)
    found |= {f"docs/{target}" for target in links if "://" not in target}
    return found - NOT_PATHS


def test_the_benchmark_pages_cite_only_files_that_exist() -> None:
    tracked = set(
        subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    folders = {str(parent) for path in tracked for parent in PurePosixPath(path).parents}
    for name in PAGES:
        text = (DOCS / name).read_text()
        cited = cited_paths(text)
        assert cited, name
        missing = sorted(
            p for p in cited if p.rstrip("/") not in tracked | folders and not (REPO / p).exists()
        )
        assert not missing, f"docs/{name} cites {missing}"
        assert "PRODUCT.md" not in text and "/tmp/" not in text, name


def test_the_citation_check_catches_a_missing_file() -> None:
    text = "see `hack/gpu/no-such-probe.py` and [raw](benchmarks-nope.json) and `trainer/kubetune_trainer/tiny.py`"
    cited = cited_paths(text)
    assert cited == {
        "hack/gpu/no-such-probe.py",
        "docs/benchmarks-nope.json",
        "trainer/kubetune_trainer/tiny.py",
    }
    assert sorted(p for p in cited if not (REPO / p).exists()) == [
        "docs/benchmarks-nope.json",
        "hack/gpu/no-such-probe.py",
    ]
