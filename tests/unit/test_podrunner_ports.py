"""The pod runner's stand-in for pod networking: each training job gets its own rendezvous port.

Every pod the runner starts shares this machine's network, so two jobs whose engine sets the same
rendezvous port (the Training Operator's MASTER_PORT 23456 for every PyTorchJob) would collide if
they trained at once. The runner replaces that port, in the process's environment only, by one of
the job's own: the same for every pod of the job, another for another job.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.support import podrunner
from tests.support.podrunner import PodRunner


def _pod(name: str, namespace: str, labels: dict[str, str] | None, **env: str) -> tuple[Any, Any]:
    container = SimpleNamespace(
        env=[SimpleNamespace(name=k, value=v, value_from=None) for k, v in env.items()]
    )
    pod = SimpleNamespace(
        metadata=SimpleNamespace(name=name, namespace=namespace, uid=f"uid-{name}", labels=labels),
        spec=SimpleNamespace(hostname=None, containers=[container]),
    )
    return pod, container


def _runner(tmp_path: Path) -> PodRunner:
    return PodRunner(api=None, api_host="127.0.0.1", api_port=6443, ca_file=tmp_path / "ca", workdir=tmp_path)


PYTORCHJOB = "training.kubeflow.org/job-name"
JOBSET = "jobset.sigs.k8s.io/jobset-name"


def test_the_pods_of_one_job_share_a_port_of_their_own_and_another_job_gets_another(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    env = {"MASTER_PORT": "23456", "PET_MASTER_PORT": "23456", "MASTER_ADDR": "a-train-master-0"}
    master = runner._env(*_pod("a-train-master-0", "ns1", {PYTORCHJOB: "a-train"}, **env))
    worker = runner._env(*_pod("a-train-worker-0", "ns1", {PYTORCHJOB: "a-train"}, **env))
    other = runner._env(*_pod("a-train-master-0", "ns2", {PYTORCHJOB: "a-train"}, **env))
    port = master["MASTER_PORT"]
    assert port != "23456"
    assert worker["MASTER_PORT"] == port
    assert master["PET_MASTER_PORT"] == worker["PET_MASTER_PORT"] == port  # one port, two names
    assert other["MASTER_PORT"] != port  # the same job name in another namespace is another job
    assert master["MASTER_ADDR"] == "a-train-master-0"  # the rest of the environment is the pod's
    low, high = podrunner.JOB_PORTS
    assert all(low <= int(p) < high for p in (port, other["MASTER_PORT"]))
    # a replacement pod of the job (a restart) meets its peers on the same port
    again = runner._env(*_pod("a-train-master-0", "ns1", {PYTORCHJOB: "a-train"}, **env))
    assert again["MASTER_PORT"] == port
    # and nothing listens there: the job's rank 0 can bind it
    with socket.socket() as s:
        s.bind(("0.0.0.0", int(port)))


def test_a_jobset_pod_gets_its_jobs_port_and_a_pod_of_no_job_keeps_its_own(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    node0 = runner._env(*_pod("t-node-0-0", "ns", {JOBSET: "t"}, PET_MASTER_PORT="29400"))
    node1 = runner._env(*_pod("t-node-0-1", "ns", {JOBSET: "t"}, PET_MASTER_PORT="29400"))
    assert node0["PET_MASTER_PORT"] == node1["PET_MASTER_PORT"] != "29400"
    plain = runner._env(*_pod("register-x", "ns", {"app": "x"}, MASTER_PORT="23456"))
    assert plain["MASTER_PORT"] == "23456"
    unlabelled = runner._env(*_pod("y", "ns", None, MASTER_PORT="23456"))
    assert unlabelled["MASTER_PORT"] == "23456"


def test_a_port_something_listens_on_is_passed_over(tmp_path: Path) -> None:
    seed = "ns/job/23456"
    first = podrunner._free_port(seed, set())
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", first))
        busy.listen()
        assert podrunner._free_port(seed, set()) != first
    assert podrunner._free_port(seed, {first}) != first  # nor one given to another job already


def test_a_pods_host_name_is_the_kubelets() -> None:
    def pod(name: str, hostname: str | None = None) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(name=name), spec=SimpleNamespace(hostname=hostname))

    assert podrunner.pod_hostname(pod("kubetune-operator-7d9f-abcde")) == "kubetune-operator-7d9f-abcde"
    assert podrunner.pod_hostname(pod("job-node-0-0-x", hostname="job-node-0-0")) == "job-node-0-0"
    # cut to a label's 63 characters, and a name cut at a hyphen loses it
    long = "a" * 62 + "-b" + "c" * 10
    assert podrunner.pod_hostname(pod(long)) == "a" * 62
    assert podrunner.pod_hostname(pod("x" * 80)) == "x" * 63
