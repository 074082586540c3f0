"""The documentation site (mkdocs.yml, docs/) builds strictly, and a broken link or anchor fails the build.

hack/test.sh builds the real site; this test proves the build would catch a broken link: the same
configuration and pages, copied, once as they are and once with a link to a missing page and a link
to a missing heading of an existing page.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.controlplane import REPO


def build(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(root / "site")],
        cwd=root,
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def copy_of_the_docs(root: Path) -> Path:
    root.mkdir()
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(REPO / "docs", root / "docs")
    return root


def test_every_page_is_in_the_nav_and_every_page_in_the_nav_exists() -> None:
    import yaml

    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def pages(nav: list[object]) -> list[str]:
        out: list[str] = []
        for entry in nav:
            assert isinstance(entry, dict) and len(entry) == 1, entry
            (value,) = entry.values()
            out += pages(value) if isinstance(value, list) else [value]
        return out

    in_nav = pages(config["nav"])
    assert sorted(in_nav) == sorted(p.name for p in (REPO / "docs").glob("*.md"))
    assert config["theme"]["font"] is False  # no Google Fonts: the site builds and reads offline


@pytest.mark.slow  # three mkdocs builds
def test_the_docs_build_strictly_and_a_broken_link_or_anchor_fails(tmp_path: Path) -> None:
    intact = copy_of_the_docs(tmp_path / "intact")
    result = build(intact)
    assert result.returncode == 0, result.stderr
    assert (intact / "site" / "index.html").is_file()

    broken = copy_of_the_docs(tmp_path / "broken")
    with (broken / "docs" / "index.md").open("a") as f:
        f.write(
            "\nSee [a page that is not there](no-such-page.md) and [a heading](install.md#no-such-heading).\n"
        )
    result = build(broken)
    assert result.returncode != 0
    assert "no-such-page.md" in result.stderr and "'#no-such-heading'" in result.stderr, result.stderr
