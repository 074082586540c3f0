"""The examples in the packages' docstrings run and say what they show (CI runs them here)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest
from tests.support import lanes

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {
    "api": "kubetune_api",
    "operator": "kubetune_operator",
    "trainer": "kubetune_trainer",
    "cli": "kubetune_cli",
    "bench": "kubetune_bench",
}


def _modules_with_examples() -> list[str]:
    found = []
    for folder, package in PACKAGES.items():
        root = REPO / folder / package
        for path in sorted(root.rglob("*.py")):
            if path.stem != "__main__" and ">>>" in path.read_text():
                parts = [package, *path.relative_to(root).with_suffix("").parts]
                found.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return found


MODULES = _modules_with_examples()
PACKAGE_FOLDERS = {package: f"{folder}/{package}" for folder, package in PACKAGES.items()}


def test_examples_are_found() -> None:
    assert "kubetune_trainer.plan.plan" in MODULES and "kubetune_trainer.training.varlen" in MODULES


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    source = (REPO / PACKAGE_FOLDERS[name.partition(".")[0]]).joinpath(*name.split(".")[1:])
    path = source.with_suffix(".py") if source.with_suffix(".py").exists() else source / "__init__.py"
    lanes.skip_if_it_imports_heavy(path.read_text(), name)
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0, (
        f"{result.failed} of {result.attempted} failed in {name}"
    )
