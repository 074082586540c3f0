"""The chart's high availability, rendered by the real helm binary: replicas with leader election, a
rollout that keeps one running, a PodDisruptionBudget, anti-affinity, the Lease's RBAC and settings.

The operator's side (two processes, one reconciles, a takeover after ``kill -9``) is
tests/integration/test_leader_election.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.unit.test_chart import CHART, NAMESPACE, by_kind, helm, one, operator_container, render

from kubetune_operator import leader
from kubetune_operator import rbac as operator_rbac
from kubetune_operator.settings import Settings

pytestmark = pytest.mark.helm

POD_SPREAD = {
    "topologyKey": "kubernetes.io/hostname",
    "labelSelector": {
        "matchLabels": {
            "app.kubernetes.io/name": "kubetune",
            "app.kubernetes.io/instance": "kubetune",
            "app.kubernetes.io/component": "operator",
        }
    },
}


def _settings(objs: list[dict[str, Any]]) -> Settings:
    container = one(objs, "Deployment")["spec"]["template"]["spec"]["containers"][0]
    return Settings.from_env({e["name"]: e.get("value") for e in container["env"] if "value" in e})


def _pod(objs: list[dict[str, Any]]) -> dict[str, Any]:
    pod: dict[str, Any] = one(objs, "Deployment", "kubetune")["spec"]["template"]
    return pod


def test_two_replicas_elect_a_leader_on_a_lease_in_the_release_namespace() -> None:
    objs = render()
    deployment = one(objs, "Deployment", "kubetune")
    assert deployment["spec"]["replicas"] == 2
    # a new pod starts (and waits for the Lease) before an old one goes: one always runs
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    settings = _settings(objs)
    assert settings.leader_election is True
    assert settings.leader_election_namespace == NAMESPACE
    assert settings.leader_election_lease == "kubetune"
    timing = leader.Timing(
        settings.lease_duration_seconds, settings.renew_deadline_seconds, settings.retry_period_seconds
    )
    assert timing == leader.Timing(15, 10.0, 2.0)  # controller-runtime's defaults
    assert timing.takeover_bound == 19


def test_the_lease_role_is_the_operators_declared_rules_bound_to_its_service_account() -> None:
    objs = render(
        "--set", "serviceAccount.name=ops", "--set", "operator.leaderElection.leaseDurationSeconds=30"
    )
    role = one(objs, "Role", "kubetune-leader-election")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == operator_rbac.leader_election_rules("kubetune")
    binding = one(objs, "RoleBinding", "kubetune-leader-election")
    assert binding["metadata"]["namespace"] == NAMESPACE
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "ops", "namespace": NAMESPACE}]
    assert _pod(objs)["spec"]["serviceAccountName"] == "ops"
    assert _settings(objs).lease_duration_seconds == 30
    # the lease is named after the release: two releases in one namespace elect apart
    other = render(release="other")
    assert _settings(other).leader_election_lease == "other-kubetune"
    assert one(other, "Role", "other-kubetune-leader-election")[
        "rules"
    ] == operator_rbac.leader_election_rules("other-kubetune")
    # rbac.create=false: the Role is the installer's to grant, like the rest
    assert by_kind(render("--set", "rbac.create=false"), "Role") == []


def test_the_pod_disruption_budget_lets_a_drain_take_one_operator_pod_at_a_time() -> None:
    objs = render()
    pdb = one(objs, "PodDisruptionBudget", "kubetune")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["metadata"]["namespace"] == NAMESPACE
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": POD_SPREAD["labelSelector"]["matchLabels"]},
    }
    assert pdb["spec"]["selector"]["matchLabels"].items() <= _pod(objs)["metadata"]["labels"].items()
    # one replica: a budget would block every drain of its node
    assert by_kind(render("--set", "operator.replicas=1"), "PodDisruptionBudget") == []
    assert by_kind(render("--set", "operator.podDisruptionBudget.enabled=false"), "PodDisruptionBudget") == []
    three = render("--set", "operator.replicas=3", "--set", "operator.podDisruptionBudget.maxUnavailable=2")
    assert one(three, "PodDisruptionBudget", "kubetune")["spec"]["maxUnavailable"] == 2


def test_replicas_spread_over_nodes_by_default_preferred_required_or_none() -> None:
    preferred = _pod(render())["spec"]["affinity"]
    assert preferred == {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": POD_SPREAD}
            ]
        }
    }
    required = _pod(render("--set", "operator.podAntiAffinity=required"))["spec"]["affinity"]
    assert required == {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [POD_SPREAD]}}
    assert "affinity" not in _pod(render("--set", "operator.podAntiAffinity=none"))["spec"]
    assert "affinity" not in _pod(render("--set", "operator.replicas=1"))["spec"]
    # an affinity of one's own replaces the preset
    own = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["system"]}]}]}}}  # fmt: skip
    objs = render("--set-json", f"operator.affinity={json.dumps(own)}")
    assert _pod(objs)["spec"]["affinity"] == own


def test_without_leader_election_one_replica_recreated() -> None:
    objs = render("--set", "operator.leaderElection.enabled=false", "--set", "operator.replicas=1")
    deployment = one(objs, "Deployment", "kubetune")
    assert deployment["spec"]["replicas"] == 1
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert _settings(objs).leader_election is False
    assert by_kind(objs, "Role") == []
    assert by_kind(objs, "PodDisruptionBudget") == []
    names = {e["name"] for e in operator_container(objs)["env"]}
    assert "KUBETUNE_LEADER_ELECTION_NAMESPACE" not in names


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            ["--set", "operator.leaderElection.enabled=false"],  # two replicas (the default), no election
            "operator.replicas > 1 needs operator.leaderElection.enabled",
        ),
        (
            ["--set", "operator.leaderElection.renewDeadlineSeconds=15"],
            "leaseDurationSeconds > renewDeadlineSeconds > retryPeriodSeconds",
        ),
        (
            ["--set", "operator.leaderElection.retryPeriodSeconds=10"],
            "leaseDurationSeconds > renewDeadlineSeconds > retryPeriodSeconds",
        ),
    ],
    ids=["replicas-without-election", "deadline-not-below-duration", "retry-not-below-deadline"],
)
def test_values_that_would_let_two_operators_act_at_once_are_refused(values: list[str], message: str) -> None:
    result = helm("template", "kubetune", str(CHART), *values, check=False)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr


def test_a_release_reusing_values_from_before_leader_election_gets_it() -> None:
    """``helm upgrade --reuse-values`` from a release without these values: two replicas, elected,
    with the default timings, a budget and the spread."""
    objs = render(
        "--set", "operator.leaderElection=null", "--set", "operator.replicas=null",
        "--set", "operator.podDisruptionBudget=null", "--set", "operator.podAntiAffinity=null",
    )  # fmt: skip
    assert one(objs, "Deployment", "kubetune")["spec"]["replicas"] == 2
    settings = _settings(objs)
    assert (settings.leader_election, settings.lease_duration_seconds) == (True, 15)
    assert one(objs, "PodDisruptionBudget", "kubetune")["spec"]["maxUnavailable"] == 1
    assert (
        "preferredDuringSchedulingIgnoredDuringExecution" in _pod(objs)["spec"]["affinity"]["podAntiAffinity"]
    )
