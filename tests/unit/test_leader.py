"""Leader election's parts that need no API server: its timings, settings, identity, the liveness
endpoint a waiting replica serves. The election itself, on a real API server with operator processes,
is tests/integration/test_leader_election.py."""

from __future__ import annotations

import socket
import urllib.error
import urllib.request

import pytest
from tests.support.controlplane import free_port

from kubetune_operator import leader
from kubetune_operator.settings import Settings


def test_timings_must_let_a_leader_stop_before_anyone_may_take_over() -> None:
    assert leader.Timing().takeover_bound == 15 + 2 * 2
    assert leader.Timing(4, 3.0, 0.5).takeover_bound == 5.0
    for bad in [(10, 10.0, 2.0), (10, 12.0, 2.0), (10, 5.0, 5.0), (10, 5.0, 0.0)]:
        with pytest.raises(ValueError, match="lease duration > renew deadline > retry period > 0"):
            leader.Timing(*bad)


def test_leader_election_settings() -> None:
    off = Settings.from_env({})
    assert off.leader_election is False  # a plain `python -m kubetune_operator` reconciles alone
    assert (off.lease_duration_seconds, off.renew_deadline_seconds, off.retry_period_seconds) == (
        15,
        10.0,
        2.0,
    )
    assert off.leader_election_lease == "kubetune-operator"
    on = Settings.from_env(
        {
            "KUBETUNE_LEADER_ELECTION": "true",
            "KUBETUNE_LEADER_ELECTION_NAMESPACE": "ops",
            "KUBETUNE_LEADER_ELECTION_LEASE": "kt",
            "KUBETUNE_LEASE_DURATION_SECONDS": "4",
            "KUBETUNE_RENEW_DEADLINE_SECONDS": "3",
            "KUBETUNE_RETRY_PERIOD_SECONDS": "0.5",
        }
    )
    assert (on.leader_election, on.leader_election_namespace, on.leader_election_lease) == (True, "ops", "kt")
    assert (on.lease_duration_seconds, on.renew_deadline_seconds, on.retry_period_seconds) == (4, 3.0, 0.5)
    with pytest.raises(ValueError, match="KUBETUNE_LEADER_ELECTION"):
        Settings.from_env({"KUBETUNE_LEADER_ELECTION": "maybe"})


def test_each_process_has_an_identity_of_its_own_named_after_its_host() -> None:
    a, b = leader.identity(), leader.identity()
    assert a != b
    assert a.startswith(socket.gethostname() + "_") and b.startswith(socket.gethostname() + "_")


def test_outside_a_pod_the_lease_namespace_must_be_given() -> None:
    if leader.namespace_of_this_pod() is not None:
        pytest.skip("runs in a pod: its namespace is the default")
    with pytest.raises(ValueError, match="needs KUBETUNE_LEADER_ELECTION_NAMESPACE"):
        leader.run_elected(Settings(leader_election=True), None, lambda memo, loop, stop: None)


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as e:
        return int(e.code)


def test_a_waiting_replica_answers_its_liveness_probe_until_kopf_takes_the_port_over() -> None:
    port = free_port()
    with leader._standby_liveness(f"http://127.0.0.1:{port}/healthz"):
        assert _get(f"http://127.0.0.1:{port}/healthz") == 200
        assert _get(f"http://127.0.0.1:{port}/other") == 404
    # closed: the port is free for kopf's own liveness endpoint
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
