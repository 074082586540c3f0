"""The site reads well: no code block wider than the page, table code not broken mid-word, the
repository linked from the header.

A code block's lines stay within ``MAX_LINE`` characters (what Material's content column shows
without scrolling on a laptop screen, both sidebars open): a comment goes above its command, not
beside it, and a long command is continued with ``\\``. Output whose lines are one long message
each (kubetune's errors, as they print) is marked ``{.text .wrap}`` and wraps at the page's edge
(docs/stylesheets/extra.css).
"""

from __future__ import annotations

import re

import yaml
from tests.support import docs_samples
from tests.support.controlplane import REPO

MAX_LINE = 90
CSS = REPO / "docs" / "stylesheets" / "extra.css"


def wraps(info: str) -> bool:
    """A fence like ```{.text .wrap}: the block wraps instead of scrolling."""
    return info.startswith("{") and ".wrap" in re.findall(r"\.[\w-]+", info)


def too_long(blocks: list[docs_samples.Block]) -> list[str]:
    return [
        f"{b.path.name}:{b.line + 1 + i}: {len(line)} characters"
        for b in blocks
        if not wraps(b.info)
        for i, line in enumerate(b.text.splitlines())
        if len(line) > MAX_LINE
    ]


def test_no_code_block_has_a_line_wider_than_the_page() -> None:
    blocks = [b for p in docs_samples.pages() for b in docs_samples.code_blocks(p)]
    assert len(blocks) > 30
    assert too_long(blocks) == []


def test_a_shell_block_has_its_comments_above_the_commands() -> None:
    beside = [
        f"{b.path.name}:{b.line + 1 + i}: {line}"
        for p in docs_samples.pages()
        for b in docs_samples.code_blocks(p)
        if b.info in ("bash", "sh", "shell")
        for i, line in enumerate(b.text.splitlines())
        if re.search(r"\S\s+# ", line) and not line.lstrip().startswith("#")
    ]
    assert beside == []


def test_a_long_line_is_found_and_a_wrapping_block_is_let_through(tmp_path: object) -> None:
    from pathlib import Path

    page = Path(str(tmp_path)) / "page.md"
    long = "x" * (MAX_LINE + 1)
    page.write_text(
        f"text\n\n```bash\nok\n{long}\n```\n\n- item\n\n    ```{{.text .wrap}}\n    {long}\n    ```\n"
    )
    blocks = docs_samples.code_blocks(page)
    assert [b.info for b in blocks] == ["bash", "{.text .wrap}"]
    assert too_long(blocks) == ["page.md:5: 91 characters"]


def test_the_stylesheet_keeps_table_code_whole_and_wraps_marked_output() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    assert config["extra_css"] == ["stylesheets/extra.css"]
    css = re.sub(r"/\*.*?\*/", "", CSS.read_text(), flags=re.S)
    rules = dict(re.findall(r"([^{}]+)\{([^}]*)\}", css))
    by_selector = {sel.strip(): body for sels, body in rules.items() for sel in sels.split(",")}
    assert "white-space: nowrap" in by_selector[".md-typeset td code"]
    assert "white-space: pre-wrap" in by_selector[".md-typeset .wrap pre > code"]
    # the wrap class reaches the block's wrapper: pymdownx.superfences keeps a fence's classes
    assert "pymdownx.superfences" in str(config["markdown_extensions"])


def test_the_header_links_the_repository() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    chart = yaml.safe_load((REPO / "charts" / "kubetune" / "Chart.yaml").read_text())
    assert config["repo_url"] == chart["home"] == "https://github.com/kubetune/kubetune"


def test_the_flow_diagram_is_drawn_from_its_text_and_on_the_home_page() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("flow_diagram", REPO / "hack" / "flow_diagram.py")
    assert spec is not None and spec.loader is not None
    flow = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(flow)
    svg = (REPO / "docs" / "flow.svg").read_text()
    assert svg == flow.render(), "docs/flow.svg is stale: run python hack/flow_diagram.py"
    assert flow.main(["--check"]) == 0
    for title, what, _ in flow.STEPS:
        assert f">{title}<" in svg and what in svg
    assert "](flow.svg)" in (REPO / "docs" / "index.md").read_text()
    assert "](docs/flow.svg)" in (REPO / "README.md").read_text()
