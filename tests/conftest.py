"""Shared fixtures: the real control plane (session-wide) and API clients for it; the suite's lanes.

The fast lane (``make test-fast``, ``pytest --fast``) runs the tests that need no server, no
subprocess and no heavy library: while collecting and running it, importing torch, transformers,
TRL, MLflow or datasets skips the module or test that asked (it runs in the whole suite), tests whose
fixtures start a server are left out, and so are the ones marked ``slow`` (a training run, a
subprocess). How the whole suite is split over parallel workers: :mod:`tests.support.lanes`.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from kubetune_trainer.process import FLOAT8_LIBRARIES, UNUSED_LIBRARIES
from tests.support import lanes
from tests.support.controlplane import REPO, ControlPlane, running_control_plane

# pytester: the tests of the lanes themselves (tests/unit/test_lanes.py) collect suites of their own
pytest_plugins = ["pytester"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        default=False,
        help="the fast lane: no servers, no subprocesses, no heavy imports (see tests/conftest.py)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--fast"):
        lanes.block_heavy_imports()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--fast"):
        kept, left = lanes.fast_lane(items)
        if left:
            config.hook.pytest_deselected(items=left)
        items[:] = kept


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """How the whole suite is split over parallel workers (tests/support/lanes.py)."""
    return lanes.scheduler(config, log)


@pytest.fixture(autouse=True)
def _skipped_libraries_come_back() -> Iterator[None]:
    """A step's entry point run in the test's own process (``register.main``, ``prepare.main``,
    ``kubetune run --local``) makes the libraries no step uses absent from it
    (:func:`kubetune_trainer.process.skip_unused_libraries`); the next test finds them installed
    again, whatever order the tests run in (torchao: tests/unit/test_fp8.py)."""
    names = UNUSED_LIBRARIES + FLOAT8_LIBRARIES
    absent_before = {name for name in names if name in sys.modules and sys.modules[name] is None}
    yield
    for name in names:
        if name not in absent_before and name in sys.modules and sys.modules[name] is None:
            del sys.modules[name]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver on 127.0.0.1 with our CRD and the PyTorchJob CRD installed."""
    if os.environ.get("KUBETUNE_SKIP_CONTROL_PLANE"):
        pytest.skip("KUBETUNE_SKIP_CONTROL_PLANE is set")
    with running_control_plane() as cp:
        yield cp


@pytest.fixture(scope="session")
def api_client(control_plane: ControlPlane):  # type: ignore[no-untyped-def]
    """A kubernetes ApiClient for the test API server, as admin (system:masters)."""
    from kubernetes import client, config

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(control_plane.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield api


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test."""
    import re
    import uuid

    base = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:40].strip("-")
    name = f"{base}-{uuid.uuid4().hex[:5]}"
    control_plane.kubectl("create", "namespace", name)
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="session")
def trainer_crd_dir() -> Path:
    """The folder of Kubeflow Trainer v2's real CRDs (the version kubetune pairs with Kueue), from the
    Go module cache (downloaded once): :mod:`tests.support.trainer_crds`. Skipped only where the Go
    toolchain is missing; a failed download fails the tests that need it."""
    from tests.support.trainer_crds import Unavailable, trainer_crd_dir

    try:
        return trainer_crd_dir()
    except Unavailable as e:
        pytest.skip(str(e))


@pytest.fixture(scope="session")
def real_pytorchjob_crd(control_plane: ControlPlane) -> None:
    if not control_plane.real_pytorchjob_crd:
        pytest.skip("../shared/crds/kubeflow.org_pytorchjobs.yaml is absent: the stand-in CRD is installed")
