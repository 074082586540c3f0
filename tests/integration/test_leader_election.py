"""Two operator processes with leader election on a real API server: one reconciles, the other waits;
``kill -9`` the leader mid-job and the other takes over within the stated time, with nothing
duplicated and the status brought up to date; SIGTERM hands the Lease over at once; a leader that
cannot renew exits before its Lease could pass to another.

Both replicas run as a ServiceAccount holding exactly what the operator declares
(:mod:`kubetune_operator.rbac`: the ClusterRole the chart grants, and the leader election's Role on
the Lease), so these rules are proven sufficient too. The test plays the Training Operator and the
Job controller, as the other integration tests do.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.integration.conftest import (
    QWEN3_REGISTRATION_RESULT,
    bind_operator_role,
    denials,
    finish_registration_job,
    kubeconfig_for_service_account,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.integration.test_operator_restart import _exactly_one_of_each
from tests.support.controlplane import ControlPlane
from tests.support.operator import (
    LEASE_DURATION_S,
    RENEW_DEADLINE_S,
    RETRY_PERIOD_S,
    ReplicaProcess,
    leader_election_env,
    one_leader,
)

from kubetune_operator import leader, rbac

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

LEASE = "kubetune-operator"
TIMING = leader.Timing(LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S)
# a replica's start and the polls of this test on a shared two-core machine
SLACK_S = 2.0


@pytest.fixture
def elected_env(
    control_plane: ControlPlane, namespace: str, operator_env: dict[str, str], tmp_path: Path
) -> Iterator[dict[str, str]]:
    """The replicas' environment: the ServiceAccount ``kubetune-operator`` with the operator's
    declared rules only, and leader election on a Lease in the test's namespace."""
    role = f"kubetune-operator-{namespace}"
    bind_operator_role(control_plane, namespace, role)
    control_plane.kubectl(
        "apply", "-f", "-", input=json.dumps(rbac.leader_election_role(namespace, "leader-election", LEASE))
    )
    control_plane.kubectl(
        "create", "rolebinding", "leader-election", "--role=leader-election",
        f"--serviceaccount={namespace}:kubetune-operator", "-n", namespace,
    )  # fmt: skip
    kubeconfig = kubeconfig_for_service_account(
        control_plane, namespace, "kubetune-operator", tmp_path / "kc"
    )
    try:
        yield {**operator_env, "KUBECONFIG": str(kubeconfig), **leader_election_env(namespace, LEASE)}
    finally:
        control_plane.kubectl("delete", "clusterrolebinding", role, check=False)
        control_plane.kubectl("delete", "clusterrole", role, check=False)


@pytest.fixture
def replicas(elected_env: dict[str, str], namespace: str, tmp_path: Path) -> Iterator[list[ReplicaProcess]]:
    started = [ReplicaProcess(n, namespace, elected_env, tmp_path / f"operator-{n}.log") for n in ("a", "b")]
    try:
        yield started
    finally:
        for r in started:
            r.kill()


def _leader_and_candidate(replicas: list[ReplicaProcess]) -> tuple[ReplicaProcess, ReplicaProcess]:
    found: tuple[ReplicaProcess, ReplicaProcess] = wait_for(
        lambda: one_leader(replicas), timeout=60, what="one leader and one candidate"
    )
    return found


def _lease(kube: Any, namespace: str) -> dict[str, Any]:
    lease: dict[str, Any] = kube.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"
    )["spec"]
    return lease


def test_one_replica_reconciles_and_the_other_takes_over_after_kill_9(
    kube: Any, namespace: str, replicas: list[ReplicaProcess]
) -> None:
    for r in replicas:
        r.start()
    first, second = _leader_and_candidate(replicas)
    lease = _lease(kube, namespace)
    assert lease["leaseDurationSeconds"] == TIMING.lease_duration
    assert lease["leaseTransitions"] == 0

    doc = load_example("qwen3-4b-full.yaml", namespace)
    name, ptj = doc["metadata"]["name"], f"{doc['metadata']['name']}-train"
    kube.create(doc)
    wait_for(
        lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), timeout=60, what="the PyTorchJob"
    )
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    wait_phase(kube, namespace, name, "Training", timeout=60)
    # only the leader ran reconcile passes; the candidate runs no kopf at all
    assert first.passes() > 0
    assert second.passes() == 0, second.output()
    assert "waiting to lead" in second.output() and "leading; starting the operator" not in second.output()
    holder = lease["holderIdentity"]

    # the leader dies mid-training without a word; training finishes while no replica leads
    first.kill()
    killed = time.monotonic()
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    wait_for(second.leading, timeout=TIMING.takeover_bound + 30, what="the candidate to lead")
    takeover = time.monotonic() - killed
    print(f"takeover after kill -9: {takeover:.1f} s (bound {TIMING.takeover_bound} s)")
    # not before the dead leader's Lease expired, and within lease duration + 2 retry periods
    assert TIMING.lease_duration - TIMING.retry_period <= takeover <= TIMING.takeover_bound + SLACK_S, (
        takeover
    )
    lease = _lease(kube, namespace)
    assert lease["holderIdentity"] != holder and lease["leaseTransitions"] == 1

    # the status catches up with what happened meanwhile, then the job goes on to the end
    wait_phase(kube, namespace, name, "Registering", timeout=30)
    caught_up = time.monotonic() - killed
    print(f"status current (Registering) {caught_up:.1f} s after the kill")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, f"{name}-register"), what="the registration Job")
    finish_registration_job(
        kube, namespace, f"{name}-register", message=json.dumps(QWEN3_REGISTRATION_RESULT)
    )
    obj = wait_phase(kube, namespace, name, "Succeeded", timeout=30)
    assert obj["status"]["registeredModel"]["version"] == "1"
    # one PyTorchJob, one registration Job, one of every other child
    _exactly_one_of_each(kube, namespace, name, registration=True)
    assert second.passes() > 0
    assert not denials(second.output()), "\n".join(denials(second.output()))


def test_sigterm_hands_the_lease_over_at_once_and_a_restarted_replica_waits(
    kube: Any, namespace: str, replicas: list[ReplicaProcess]
) -> None:
    for r in replicas:
        r.start()
    first, second = _leader_and_candidate(replicas)
    stopping = time.monotonic()
    assert first.terminate() == 0, first.output()
    exited = time.monotonic()
    assert "released the Lease" in first.output(), first.output()
    wait_for(second.leading, timeout=TIMING.takeover_bound + 30, what="the candidate to lead")
    after_exit = time.monotonic() - exited
    print(f"SIGTERM: leader exited in {exited - stopping:.1f} s, the other led {after_exit:.1f} s later")
    # released, not left to expire: one retry period, not a lease duration
    assert after_exit <= TIMING.retry_period + SLACK_S / 2 < TIMING.lease_duration, after_exit

    # the replaced pod comes back and waits: the Lease stays with the one that renews it
    first.start()
    wait_for(lambda: first.leading() is False, timeout=60, what="the restarted replica's metrics")
    time.sleep(TIMING.lease_duration + 2 * TIMING.retry_period)
    assert (first.leading(), second.leading()) == (False, True)
    assert first.passes() == 0


def test_a_leader_that_cannot_renew_exits_before_its_lease_could_pass(
    kube: Any, control_plane: ControlPlane, namespace: str, replicas: list[ReplicaProcess]
) -> None:
    only = replicas[0]
    only.start()
    wait_for(only.leading, timeout=60, what="the replica to lead")
    # its renewals are refused from now on (as when the API server is out of its reach)
    control_plane.kubectl("delete", "rolebinding", "leader-election", "-n", namespace)
    revoked = time.monotonic()
    assert only.proc is not None
    code = only.proc.wait(timeout=TIMING.lease_duration + 30)
    stopped = time.monotonic() - revoked
    print(
        f"renewals refused: the leader exited after {stopped:.1f} s (renew deadline {TIMING.renew_deadline} s)"
    )
    assert code == leader.EXIT_LOST, only.output()
    assert "leadership lost" in only.output()
    # by its renew deadline, counted from its last renewal (before the refusals began): a whole
    # lease duration - renew deadline before any other replica could see its Lease expire
    assert stopped <= TIMING.renew_deadline + 0.5 < TIMING.lease_duration, stopped


def test_a_leader_that_finds_another_holder_stops_at_once(
    kube: Any, namespace: str, replicas: list[ReplicaProcess]
) -> None:
    """Another holder in the Lease (a replica that took it after a stall of this one) ends the leader
    at its next renewal, without waiting for the deadline; it never takes the Lease back."""
    only = replicas[0]
    only.start()
    wait_for(only.leading, timeout=60, what="the replica to lead")
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{LEASE}"
    lease = kube.request("GET", path)
    lease["spec"]["holderIdentity"] = "another-replica"
    kube.request("PUT", path, lease)
    taken = time.monotonic()
    assert only.proc is not None
    code = only.proc.wait(timeout=30)
    stopped = time.monotonic() - taken
    assert code == leader.EXIT_LOST, only.output()
    assert "another replica holds the Lease" in only.output()
    assert stopped <= TIMING.retry_period + 1.0 < TIMING.renew_deadline, stopped
    assert _lease(kube, namespace)["holderIdentity"] == "another-replica"
