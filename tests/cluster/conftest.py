"""Fixtures for end-to-end tests through the real controllers (see tests/support/cluster.py).

One cluster (both engines' controllers) and one MLflow server per test session (a parallel run's
cluster lane); a namespace and a kubetune operator process per test. The pod runner runs pods only
in the namespaces of running tests.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubetune_trainer.tiny import TINY_ROOT
from tests.support import lanes
from tests.support.cluster import Cluster, running_cluster
from tests.support.controlplane import REPO, free_port
from tests.support.mlflow_server import MlflowServer, running_mlflow_server
from tests.support.operator import OperatorProcess

API_VERSION = "kubetune.io/v1alpha1"
# where the trainer image carries the tiny model and data (its Dockerfile builds them there)
TINY_IMAGE_DIR = TINY_ROOT
# a folder of the stood-in image that tests fill with their own (bad) data and models
TESTDATA_DIR = "/opt/kubetune/testdata"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The pod runner needs mount namespaces (root); the image it stands in for needs nothing else.
    if os.geteuid() == 0 and shutil.which("unshare"):
        return
    skip = pytest.mark.skip(reason="the pod runner needs root and unshare (mount namespaces)")
    for item in items:
        if "tests/cluster/" in str(item.fspath):
            item.add_marker(skip)


# Session fixtures this folder's tests share, stopped once a parallel worker's last cluster test ran.
CLUSTER_FIXTURES = ("cluster", "mlflow_server")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """In a parallel run, stop the cluster (and its MLflow server) after the last test of this
    worker's cluster lane (tests/support/lanes.py), not when the worker ends: a cluster left idle
    while the worker goes on with other folders' tests cost a fifth of a core (its API server, etcd
    and controllers, the pod runner's polls): two of them, more than a third of a core. A
    cluster test that comes later after all starts a new one. One process (no workers) keeps the
    cluster to the end: there, a shuffled order mixes the folders."""
    yield
    if not os.environ.get("PYTEST_XDIST_WORKER") or (
        nextitem is not None and nextitem.nodeid.startswith(lanes.CLUSTER_DIR)
    ):
        return
    manager = item.session._fixturemanager
    for name in CLUSTER_FIXTURES:
        for fixturedef in manager.getfixturedefs(name, item) or ():
            # this folder's (the session's, a module's own): not one a worker's other folders use
            if fixturedef.baseid.startswith(lanes.CLUSTER_DIR.rstrip("/")):
                fixturedef.finish(item._request)  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def tiny_image() -> Iterator[Path]:
    """What the trainer image holds under /opt/kubetune/tiny: the tiny model and its data."""
    from kubetune_trainer.tiny import ensure_tiny_assets

    root = Path("/var/tmp") / f"kubetune-tiny-image-{os.getpid()}"
    ensure_tiny_assets(root)
    for p in [root, *root.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o055)  # readable by the pods' non-root user
    yield root
    shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def cluster_for_tests(tiny_image: Path, **options: bool) -> Iterator[Cluster]:
    """The cluster the tests run in (``options``: ``running_cluster``'s: which engines run), its
    pods' image holding the tiny model and a folder for the tests' own data."""
    # a folder of each cluster's own: a module's cluster ends while the session's goes on
    testdata = Path(tempfile.mkdtemp(prefix="kubetune-testdata-", dir="/var/tmp"))
    testdata.chmod(0o755)
    try:
        with running_cluster({TINY_IMAGE_DIR: tiny_image, TESTDATA_DIR: testdata}, **options) as c:
            yield c
    finally:
        shutil.rmtree(testdata, ignore_errors=True)


@pytest.fixture(scope="session")
def cluster(tiny_image: Path) -> Iterator[Cluster]:
    """The cluster of both engines: the Training Operator (PyTorchJob) and Trainer v2 with JobSet
    (TrainJob), Kueue integrating both. One per cluster lane (tests/support/lanes.py), so a scenario
    on each engine runs in whichever lane is free; a module of another kind of cluster (one engine
    only) overrides it."""
    with cluster_for_tests(tiny_image, trainer_v2=True) as c:
        yield c


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    with running_mlflow_server(tmp_path_factory.mktemp("mlflow")) as server:
        yield server


@pytest.fixture
def ns(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    name = (
        "t-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + f"-{int(time.time()) % 100000}"
    )
    cluster.kubectl("create", "namespace", name)
    assert cluster.runner is not None
    cluster.runner.namespaces = {*(cluster.runner.namespaces or set()), name}
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)
    release_finalizers(cluster, name)


def release_finalizers(cluster: Cluster, namespace: str) -> None:
    """Remove kubetune's finalizer from the FineTuneJobs of a deleted test namespace, as a user does for
    the jobs of an operator that is gone (docs/install.md): the test's operator has stopped, and a
    namespace left Terminating is swept again every few seconds by the namespace controller (a
    deletion of every kind in it), which cost the API server more than all the tests' requests once a
    few dozen had piled up in a lane's cluster."""
    names = cluster.kubectl("-n", namespace, "get", "finetunejobs", "-o", "name", check=False).stdout.split()
    for obj in names:
        cluster.kubectl(
            "-n",
            namespace,
            "patch",
            obj,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":null}}',
            check=False,
        )


def operator_env(cluster: Cluster, mlflow_server: MlflowServer) -> dict[str, str]:
    return {
        "KUBECONFIG": str(cluster.kubeconfig),
        "KUBETUNE_TRAINER_IMAGE": "ghcr.io/kubetune/trainer:test",
        "KUBETUNE_MLFLOW_TRACKING_URI": mlflow_server.uri,
        "KUBETUNE_RETRY_SECONDS": "1",
        # the workers' checkpoint time after SIGTERM is this minus 60 s (at least 30 s)
        "KUBETUNE_TERMINATION_GRACE_SECONDS": "90",
        "KUBETUNE_REGISTER_MEMORY": "2Gi",
        # the trainer's test hook in spec.env (tests/cluster/test_failures.py injects a CUDA OOM)
        "KUBETUNE_FAULT_INJECTION": "true",
        # /metrics, as the chart serves it (tests/cluster/test_first_job.py scrapes it)
        "KUBETUNE_METRICS_PORT": str(free_port()),
        "KUBETUNE_METRICS_ADDRESS": "127.0.0.1",
    }


@pytest.fixture
def operator(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, tmp_path: Path
) -> Iterator[OperatorProcess]:
    proc = OperatorProcess(ns, operator_env(cluster, mlflow_server), tmp_path / "operator.log")
    proc.start()
    try:
        yield proc
    finally:
        proc.kill()


def tiny_job(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    """examples/tiny-local.yaml as a cluster job: a few steps, checkpoints often."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny-local.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    training = doc["spec"]["training"]
    training.update(maxSteps=12, saveSteps=4, evalSteps=4, loggingSteps=2, saveTotalLimit=2)
    doc["spec"]["registration"]["modelName"] = f"{namespace}-{name}"
    doc["spec"]["registration"]["experiment"] = f"kubetune/{namespace}"
    # one CPU, as a small job asks: the trainer runs torch on as many threads (KUBETUNE_CPUS, the
    # Downward API's request), and two scenarios' trainings share this machine's two cores
    doc["spec"].setdefault("resources", {})["cpu"] = "1"
    for key, value in spec.items():
        node = doc["spec"]
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return doc


# How often wait_for asks: at first every quarter second, then less often, up to once a second. A
# check is mostly a kubectl process and a request to the API server: four times a second through a
# scenario of minutes is thousands of processes, and a second more to notice a change is nothing.
POLL_FIRST_S, POLL_MAX_S, POLL_GROWTH = 0.25, 1.0, 1.5


def wait_for(check: Callable[[], Any], timeout: float, what: str, cluster: Cluster | None = None) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    pause = POLL_FIRST_S
    while time.monotonic() < deadline:
        if cluster is not None:
            cluster.check_alive()
        last = check()
        if last:
            return last
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(POLL_MAX_S, pause * POLL_GROWTH)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; last: {last!r}")
