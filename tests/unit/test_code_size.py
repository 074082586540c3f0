"""Size limits on the shipped code's functions, so that growth is noticed where it happens.

A function stays under 80 lines, unless the comment line right above it (above its first decorator)
says why the long form is the clearest: ``# long: <reason>``. Ruff's PLR0911/PLR0912/PLR0915 (returns,
branches, statements) run with the lint. Modules have no line limit: a module holds one concern and is
as long as that concern needs (a limit made code move by line budget instead of by concern).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api/kubetune_api", "operator/kubetune_operator", "trainer/kubetune_trainer", "cli/kubetune_cli")
OPTIONAL_PACKAGES = ("bench/kubetune_bench",)
MAX_FUNCTION_LINES = 80
REASON_MARK = "# long:"


def shipped_modules() -> list[Path]:
    found: list[Path] = []
    for package in PACKAGES + OPTIONAL_PACKAGES:
        folder = ROOT / package
        if package in PACKAGES:
            assert folder.is_dir(), f"{package} is gone: update PACKAGES"
        found += sorted(folder.rglob("*.py")) if folder.is_dir() else []
    return found


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int, int]]:
    """(name, first line, length) of each function over ``limit`` lines without a stated reason."""
    lines = source.splitlines()
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        assert node.end_lineno is not None
        length = node.end_lineno - node.lineno + 1
        first = min([d.lineno for d in node.decorator_list] + [node.lineno])
        above = lines[first - 2].strip() if first >= 2 else ""
        if length > limit and not (above.startswith(REASON_MARK) and above[len(REASON_MARK) :].strip()):
            out.append((node.name, node.lineno, length))
    return out


def test_the_check_finds_a_long_function_and_accepts_a_reason() -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(6))
    plain = f"def f():\n{body}"
    assert long_functions(plain, limit=5) == [("f", 1, 7)]
    assert long_functions(f"# long: one table, read top to bottom\n{plain}", limit=5) == []
    assert long_functions(f"# long:\n{plain}", limit=5) == [("f", 2, 7)], "an empty reason is no reason"
    decorated = f"# long: a reason\n@staticmethod\ndef g():\n{body}"
    assert long_functions(decorated, limit=5) == []


@pytest.mark.parametrize("module", shipped_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_shipped_function_sizes(module: Path) -> None:
    source = module.read_text()
    assert long_functions(source) == [], (
        f"{module.relative_to(ROOT)}: functions over {MAX_FUNCTION_LINES} lines without a '{REASON_MARK} <reason>' "
        "comment above them"
    )
