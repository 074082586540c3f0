"""hack/import_graph.py: the import graph of a package read from its source (circles, floors, walks)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", REPO / "hack" / "import_graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["import_graph"] = module
    spec.loader.exec_module(module)
    return module


def _package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


def test_a_circle_held_by_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    g = _tool()
    pkg = _package(
        tmp_path,
        {
            "a.py": "from . import b\n",
            "b.py": "def f():\n    from .a import x\n",
            "c.py": "import pkg.a\n",
            "room/__init__.py": "",
            "room/d.py": "from ..c import y\n",
        },
    )
    edges = g.build(pkg)
    assert edges["pkg.a"] == {"pkg.b": "top"}
    assert edges["pkg.b"] == {"pkg.a": "fn"}
    assert edges["pkg.room.d"] == {"pkg.c": "top"}
    assert [c for c in g.circles(edges) if len(c) > 1] == [["pkg.a", "pkg.b"]]
    top_only = {m: {t: k for t, k in ts.items() if k == "top"} for m, ts in edges.items()}
    assert all(len(c) == 1 for c in g.circles(top_only))
    # room.d -> c -> {a, b}: three floors
    assert g.floors(edges, g.circles(edges)) == [["pkg.room.d"], ["pkg.c"], ["pkg.a", "pkg.b"]]
    walk, returns, finished = g.longest_walk(edges, "pkg.room.d")
    assert walk == ["pkg.room.d", "pkg.c", "pkg.a", "pkg.b"] and returns == 1 and finished


def test_the_trainer_has_no_import_circle() -> None:
    g = _tool()
    edges = g.build(REPO / "trainer" / "kubetune_trainer")
    assert [c for c in g.circles(edges) if len(c) > 1] == []
