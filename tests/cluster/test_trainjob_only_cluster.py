"""A cluster with Kubeflow Trainer v2 and no Training Operator (as a Kubeflow platform installs it
since 2026; issue 31 item 4): no PyTorchJob CRD is served, so the operator's default engine,
``auto``, picks TrainJob for a FineTuneJob that names none, records it, and the job trains and
registers through Trainer v2, JobSet and the Job controller.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.conftest import cluster_for_tests, tiny_job, wait_for
from tests.cluster.test_real_controllers import get, versions, wait_phase
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess


@pytest.fixture(scope="module")
def cluster(tiny_image: Path) -> Iterator[Cluster]:
    """This module's cluster: Trainer v2 and JobSet, no Training Operator (nor its CRD)."""
    with cluster_for_tests(tiny_image, trainer_v2=True, training_operator=False) as c:
        yield c


def test_auto_picks_trainjob_where_only_trainer_v2_runs(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    assert "pytorchjobs.kubeflow.org" not in cluster.kubectl("get", "crd", "-o", "name").stdout
    assert "training-operator" not in cluster.procs
    name = "tiny"
    doc = tiny_job(name, ns)
    assert "engine" not in doc["spec"]
    cluster.apply(doc)

    engine = wait_for(
        lambda: ((get(cluster, "finetunejob", ns, name) or {}).get("status") or {}).get("engine"),
        60,
        "the engine recorded in the status",
        cluster,
    )
    assert engine == "TrainJob"
    status = wait_phase(cluster, ns, name, "Succeeded")
    assert status["engine"] == "TrainJob"
    assert any(
        c["type"] == "Complete" and c["status"] == "True"
        for c in get(cluster, "trainjob", ns, f"{name}-train")["status"]["conditions"]
    )
    model = f"{ns}-{name}"
    assert status["registeredModel"]["version"] == "1"
    assert [v.version for v in versions(mlflow_server, model)] == ["1"]
