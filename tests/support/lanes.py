"""The suite's lanes: what the fast lane leaves out, and how the whole suite is split over workers.

The whole suite runs in parallel processes (pytest-xdist, started by ``hack/test.sh``). Each worker
is its own pytest session, so each owns its session fixtures: its own API server, MLflow server and
tiny model, on free ports and in its own temporary folders. A test is sent to any worker, except
where :func:`work_units` keeps tests together (the scheduler of :func:`scheduler`, which the controller
runs: it sees test ids only, so it reads which modules share a fixture from their source):

- the tests under ``tests/cluster`` are dealt, in their collection order, into at most
  ``KUBETUNE_CLUSTER_LANES`` (default 2) units, so at most that many workers start a cluster of real
  controllers (each worker that runs a cluster test starts its own: a cluster costs CPU while it
  idles, and two cores run two at most usefully), and their scenarios run side by side. Jobs of two
  clusters may train at once: the pod runner gives each job its own rendezvous port
  (tests/support/podrunner.py);
- the tests of a module with a module-scoped fixture (a trained model, a Hub stand-in, a Helm
  cluster) stay together, so that fixture is made once. Session fixtures are not grouped: each
  worker makes its own.

The fast lane (``pytest --fast``) keeps the unit tests that need nothing but this process: importing
a heavy library skips the module or the test that asked (:func:`block_heavy_imports`), tests whose
fixtures start a server are left out, and so are the tests marked ``slow`` and every folder but
tests/unit (the others are servers, subprocesses and trainings by what they are).
"""

from __future__ import annotations

import ast
import importlib.abc
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

# Libraries that cost seconds to import, or that only the trainer's runs need: never in the fast lane.
HEAVY_LIBRARIES = frozenset(
    {"torch", "transformers", "trl", "peft", "mlflow", "datasets", "accelerate", "liger_kernel", "torchao"}
)
# Fixtures that start a server or a cluster (directly or through the fixtures they use).
SERVER_FIXTURES = frozenset({"control_plane", "cluster", "mlflow_server", "tiny_model", "hub"})
CLUSTER_GROUP = "cluster"  # the units of the cluster tests are CLUSTER_GROUP-0, CLUSTER_GROUP-1, ...
CLUSTER_LANES_ENV = "KUBETUNE_CLUSTER_LANES"
DEFAULT_CLUSTER_LANES = 2
CLUSTER_DIR = "tests/cluster/"
UNIT_DIR = "tests/unit/"
WIDE_SCOPES = frozenset({"module", "package"})  # session fixtures: one per worker, no grouping


class _HeavyImportSkips(importlib.abc.MetaPathFinder):
    """Turns an import of a heavy library into a skip of whatever asked for it."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> None:
        root = name.partition(".")[0]
        if root in HEAVY_LIBRARIES:
            raise pytest.skip.Exception(
                f"imports {root}: left out of the fast lane (runs in the whole suite)",
                allow_module_level=True,
            )


def block_heavy_imports() -> None:
    """From now on, importing a heavy library in this process skips the module or test doing it."""
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in HEAVY_LIBRARIES)
    if loaded:  # something before collection imported one: the lane would not be what it says
        raise pytest.UsageError(f"--fast: {', '.join(loaded[:5])} already imported before collection")
    sys.meta_path.insert(0, _HeavyImportSkips())


def heavy_imports_blocked() -> bool:
    return any(isinstance(finder, _HeavyImportSkips) for finder in sys.meta_path)


def skip_if_it_imports_heavy(source: str, what: str) -> None:
    """In the fast lane, skip a test that runs code importing a heavy library where pytest cannot see
    it (a docstring's examples run by doctest, which reports the skip as a failure of the example)."""
    if not heavy_imports_blocked():
        return
    for line in source.splitlines():
        words = line.replace(">>>", " ").split()
        if (
            len(words) >= 2
            and words[0] in {"import", "from"}
            and words[1].partition(".")[0] in HEAVY_LIBRARIES
        ):
            pytest.skip(f"{what} imports {words[1]}: left out of the fast lane (runs in the whole suite)")


def needs_server(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return any(name in SERVER_FIXTURES for name in names)


def fast_lane(items: Sequence[pytest.Item]) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """The items the fast lane keeps, and the ones it leaves out."""
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        unit = item.nodeid.startswith(UNIT_DIR)  # the other folders are servers and subprocesses
        (left if slow or not unit or needs_server(item) else kept).append(item)
    return kept, left


def module_fixture_modules(root: Path, folder: str = "tests") -> frozenset[str]:
    """The test modules in ``root/folder`` (paths relative to ``root``, as in test ids) that define a
    fixture of module or package scope, or sit below a conftest.py that does: read from their
    source, so the controller of the parallel run can tell without collecting."""
    found: set[str] = set()
    tests = root / folder
    shared_dirs = {p.parent for p in tests.rglob("conftest.py") if _defines_wide_fixture(p)}
    for path in tests.rglob("test_*.py"):
        if _defines_wide_fixture(path) or any(d in path.parents for d in shared_dirs):
            found.add(path.relative_to(root).as_posix())
    return frozenset(found)


def _defines_wide_fixture(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and any(
                    kw.arg == "scope" and isinstance(kw.value, ast.Constant) and kw.value.value in WIDE_SCOPES
                    for kw in deco.keywords
                ):
                    return True
    return False


def cluster_lanes() -> int:
    """How many workers at most run cluster tests (``KUBETUNE_CLUSTER_LANES``, at least 1)."""
    import os

    raw = os.environ.get(CLUSTER_LANES_ENV, "")
    try:
        return max(1, int(raw)) if raw else DEFAULT_CLUSTER_LANES
    except ValueError:
        raise pytest.UsageError(f"{CLUSTER_LANES_ENV}={raw!r}: not a whole number") from None


def work_units(nodeids: Sequence[str], shared_modules: frozenset[str], lanes: int) -> dict[str, str]:
    """The unit of work of each test: the tests of one unit run on one worker, one after another.

    A cluster test's unit is one of ``lanes`` cluster lanes: the tests (a module with a module-wide
    fixture as one piece) dealt in collection order to the lane with the fewest tests so far. Elsewhere
    a module with a module-wide fixture is one unit, and every other test is a unit of its own."""
    units: dict[str, str] = {}
    pieces: dict[str, list[str]] = {}  # cluster pieces in collection order: a module, or one test
    for nodeid in nodeids:
        path = nodeid.split("::", 1)[0]
        if path.startswith(CLUSTER_DIR):
            pieces.setdefault(path if path in shared_modules else nodeid, []).append(nodeid)
        else:
            units[nodeid] = path if path in shared_modules else nodeid
    sizes = [0] * lanes
    for piece in pieces.values():
        lane = sizes.index(min(sizes))
        sizes[lane] += len(piece)
        units.update(dict.fromkeys(piece, f"{CLUSTER_GROUP}-{lane}"))
    return units


def scheduler(config: pytest.Config, log: object) -> object:
    """pytest-xdist's scheduler for this suite: its load-scope scheduling, by :func:`work_units`."""
    from xdist.scheduler import LoadScopeScheduling

    shared = module_fixture_modules(Path(config.rootpath))
    lanes = cluster_lanes()

    class ByWorkUnit(LoadScopeScheduling):  # type: ignore[misc]
        units: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.units is None:  # first called once the collection is complete, with all of it
                self.units = work_units(self.collection, shared, lanes)
            return self.units[nodeid]

    return ByWorkUnit(config, log)
