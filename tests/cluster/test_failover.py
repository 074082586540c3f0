"""High availability through the real controllers: two operator processes with leader election, the
leader killed (``kill -9``) mid-training; the other takes over within the stated time, and the job
ends with one PyTorchJob, one registration Job and one model version, its status kept current.

The replicas are the operator as tests/cluster/conftest.py runs it (a process per replica, the
cluster's admin kubeconfig), with short election timings (tests/support/operator.py); the Lease is in
the test's namespace. The chart's RBAC on the Lease is proven by tests/integration/test_helm.py, the
election's rules by tests/integration/test_leader_election.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from kubetune_operator import leader
from tests.cluster.conftest import operator_env, tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    apply_job,
    get,
    job_status,
    registered_once_with_its_final_checkpoint,
    wait_phase,
)
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import (
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    ReplicaProcess,
    leader_election_env,
    one_leader,
)

TIMING = leader.Timing(LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S)
# a replica's polls of its Lease and this test's of the metrics, on a shared two-core machine
SLACK_S = 3.0


@pytest.fixture
def replicas(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, tmp_path: Path
) -> Iterator[list[ReplicaProcess]]:
    env = {**operator_env(cluster, mlflow_server), **leader_election_env(ns)}
    started = [ReplicaProcess(n, ns, env, tmp_path / f"operator-{n}.log") for n in ("a", "b")]
    for r in started:
        r.start()
    try:
        yield started
    finally:
        for r in started:
            r.kill()


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_the_leader_killed_mid_training_is_replaced_and_nothing_is_duplicated(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, replicas: list[ReplicaProcess]
) -> None:
    first, second = wait_for(lambda: one_leader(replicas), 120, "one leader and one candidate", cluster)
    name = "failover"
    doc = tiny_job(name, ns)
    doc["spec"]["training"].update(maxSteps=24)
    apply_job(cluster, doc)
    wait_for(lambda: job_status(cluster, ns, name).get("phase") == "Training", 300, "Training", cluster)
    assert second.passes() == 0, second.output()

    first.kill()
    killed, killed_at = time.monotonic(), datetime.now(UTC)
    wait_for(second.leading, TIMING.takeover_bound + 60, "the candidate to lead", cluster)
    takeover = time.monotonic() - killed
    phase_then = job_status(cluster, ns, name).get("phase")
    print(
        f"takeover after kill -9 mid-training: {takeover:.1f} s (bound {TIMING.takeover_bound} s); job {phase_then}"
    )
    assert takeover <= TIMING.takeover_bound + SLACK_S, takeover

    status = wait_phase(cluster, ns, name, "Succeeded")
    # the new leader wrote what came after the takeover: the end of training, registration, success
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert _time(ready["lastTransitionTime"]) >= killed_at.replace(microsecond=0), (ready, killed_at)
    assert second.passes() > 0
    # nothing twice: one training object, one preparation and one registration Job, one version
    assert [p["metadata"]["name"] for p in (get(cluster, "pytorchjob", ns) or {}).get("items", [])] == [
        f"{name}-train"
    ]
    jobs = sorted(j["metadata"]["name"] for j in (get(cluster, "job", ns) or {}).get("items", []))
    assert jobs == [f"{name}-prepare", f"{name}-register"]
    registered_once_with_its_final_checkpoint(cluster, mlflow_server, ns, name, status)
    lease: dict[str, Any] = get(cluster, "lease", ns, "kubetune-operator")
    assert lease["spec"]["leaseTransitions"] == 1
