"""The kubetune operator as a real process, the way its Deployment runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.support import proc_account
from tests.support.controlplane import REPO, free_port


class OperatorProcess:
    """The operator as a real process (``python -m kubetune_operator``), to be killed mid-flight."""

    def __init__(self, namespace: str, env: dict[str, str], log: Path) -> None:
        self.namespace = namespace
        self.env = {**os.environ, **env}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness_port = free_port()

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetune_operator",
                "--namespace",
                self.namespace,
                "--verbose",
                "--liveness",
                self.liveness_url,
            ],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful stop, like a node loss or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            proc_account.record_pid(self.proc.pid, "kubetune_operator")
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


# Leader election for tests: short, so that a takeover takes seconds, not the chart's 19 s; the
# same order (lease duration > renew deadline > retry period) and so the same guarantees.
LEASE_DURATION_S, RENEW_DEADLINE_S, RETRY_PERIOD_S = 4, 3.0, 0.5


def leader_election_env(namespace: str, lease: str = "kubetune-operator") -> dict[str, str]:
    return {
        "KUBETUNE_LEADER_ELECTION": "true",
        "KUBETUNE_LEADER_ELECTION_NAMESPACE": namespace,
        "KUBETUNE_LEADER_ELECTION_LEASE": lease,
        "KUBETUNE_LEASE_DURATION_SECONDS": str(LEASE_DURATION_S),
        "KUBETUNE_RENEW_DEADLINE_SECONDS": str(RENEW_DEADLINE_S),
        "KUBETUNE_RETRY_PERIOD_SECONDS": str(RETRY_PERIOD_S),
    }


class ReplicaProcess(OperatorProcess):
    """One operator process of several with leader election, with its own /metrics to ask who leads."""

    def __init__(self, name: str, namespace: str, env: dict[str, str], log: Path) -> None:
        self.name = name
        self.metrics_port = free_port()
        own = {
            **env,
            "KUBETUNE_METRICS_PORT": str(self.metrics_port),
            "KUBETUNE_METRICS_ADDRESS": "127.0.0.1",
        }
        super().__init__(namespace, own, log)

    def samples(self) -> dict[str, float] | None:
        """Its metrics, each summed over its labels; None while it serves none."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2) as r:
                text = r.read().decode()
        except OSError:
            return None
        out: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def leading(self) -> bool | None:
        """As its ``kubetune_leader`` gauge says; None while it serves no metrics."""
        s = self.samples()
        return None if s is None else s.get("kubetune_leader") == 1.0

    def passes(self) -> float:
        """The reconcile passes it ran."""
        return (self.samples() or {}).get("kubetune_reconcile_duration_seconds_count", 0.0)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def terminate(self) -> int:
        """SIGTERM, as the kubelet stops a pod in a rollout or a drain; its exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code


def one_leader(replicas: list[ReplicaProcess]) -> tuple[ReplicaProcess, ReplicaProcess] | None:
    """The one that leads and another that waits, once every replica serves its metrics and exactly
    one leads; else None (a check for a wait loop)."""
    states = [r.leading() for r in replicas]
    if None in states or states.count(True) != 1:
        return None
    lead = replicas[states.index(True)]
    return lead, next(r for r in replicas if r is not lead)
