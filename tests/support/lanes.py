"""The suite's lanes: what the fast lane leaves out, and how the whole suite is split over workers.

The whole suite runs in parallel processes (pytest-xdist, ``--dist loadgroup``, started by
``hack/test.sh``). Each worker is its own pytest session, so each owns its session fixtures: its own
API server, MLflow server and tiny model, on free ports and in its own temporary folders. A test is
sent to any worker, except where :func:`group_for_workers` keeps tests together:

- every test under ``tests/cluster`` goes to one worker. Those tests share one cluster of real
  controllers, and their training pods share the machine's network (the pod runner gives pods no
  network of their own, and the Training Operator's master port is fixed), so two clusters may not
  train at once;
- the tests of a module with a module-scoped fixture (a trained model, a Hub stand-in, a Helm
  cluster) stay together, so that fixture is made once.

The fast lane (``pytest --fast``) keeps the tests that need nothing but this process: importing a
heavy library skips the module or the test that asked (:func:`block_heavy_imports`), tests whose
fixtures start a server are left out, and so are the tests marked ``slow``.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Sequence

import pytest

# Libraries that cost seconds to import, or that only the trainer's runs need: never in the fast lane.
HEAVY_LIBRARIES = frozenset(
    {"torch", "transformers", "trl", "peft", "mlflow", "datasets", "accelerate", "liger_kernel", "torchao"}
)
# Fixtures that start a server or a cluster (directly or through the fixtures they use).
SERVER_FIXTURES = frozenset({"control_plane", "cluster", "mlflow_server", "tiny_model", "hub"})
CLUSTER_GROUP = "cluster"


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


def needs_server(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return any(name in SERVER_FIXTURES for name in names)


def fast_lane(items: Sequence[pytest.Item]) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """The items the fast lane keeps, and the ones it leaves out."""
    kept: list[pytest.Item] = []
    left: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker("slow") is not None
        (left if slow or needs_server(item) else kept).append(item)
    return kept, left


def _module_scoped(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(
        defs and defs[-1].scope == "module"
        for name, defs in info.name2fixturedefs.items()
        if name != "request"
    )


def group_for_workers(items: Sequence[pytest.Item]) -> None:
    """Mark the tests that must run on one worker together (see the module's text)."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        path = item.nodeid.split("::", 1)[0]
        if path.startswith("tests/cluster/"):
            item.add_marker(pytest.mark.xdist_group(CLUSTER_GROUP))
        elif _module_scoped(item):
            item.add_marker(pytest.mark.xdist_group(path))
