"""A FineTuneJob on Kubeflow Trainer v2 (``spec.engine: TrainJob``) through the real controllers
(issue 31 item 4).

The cluster of tests/support/cluster.py with Trainer v2.2.0's controller manager and the JobSet
v0.11.1 controller running too (``trainer_v2=True``), their real CRDs installed and their webhooks
called by the API server, and Kueue's TrainJob integration on. Nothing here plays a controller:
kubetune makes the job's TrainingRuntime and TrainJob, Trainer v2 makes the JobSet (and the torch
environment), JobSet makes the Job and the headless Service, the Job controller the pod, the
scheduler places it, and the pod runner runs the trainer's own command: it trains the tiny model,
the registration Job registers it in MLflow, and the job succeeds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import cluster_for_tests, tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    env_of,
    get,
    preempted_and_resumed,
    preempting_queue,
    queued_until_quota_frees,
    registered_once_with_its_final_checkpoint,
    suspended_until_resumed,
    wait_phase,
)
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess
from tests.support.render_check import dry_run, not_kept, render_example

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


@pytest.fixture(scope="module")
def cluster(tiny_image: Path) -> Iterator[Cluster]:
    """This module's cluster: both engines' controllers (the Training Operator and Trainer v2)."""
    with cluster_for_tests(tiny_image, trainer_v2=True) as c:
        yield c


def diagnostics(cluster: Cluster, ns: str) -> str:
    out = [f"--- {name}.log\n{cluster.log(name, 40)}" for name in ("trainer", "jobset", "kueue")]
    events = cluster.kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp", check=False)
    out.append(f"--- events\n{events.stdout}{events.stderr}")
    for kind in ("trainjob", "jobset"):
        objs = cluster.kubectl("-n", ns, "get", kind, "-o", "yaml", check=False)
        out.append(f"--- {kind}\n{objs.stdout[-6000:]}{objs.stderr}")
    return "\n".join(out)


def owner_kind(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["ownerReferences"][0]["kind"])


def true_condition(obj: dict[str, Any] | None, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in ((obj or {}).get("status") or {}).get("conditions") or []
    )


def test_a_tiny_job_on_trainjob_trains_and_registers_through_the_real_controllers(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    try:
        train_and_register(cluster, mlflow_server, ns)
    except AssertionError as e:  # what the controllers said (the cluster's folder goes at the end)
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e


def train_and_register(cluster: Cluster, mlflow_server: MlflowServer, ns: str) -> None:
    name = "tiny"
    tj = f"{name}-train"
    cluster.apply(tiny_job(name, ns, engine="TrainJob"))

    # kubetune's children: the job's own TrainingRuntime and the TrainJob on it
    trainjob = wait_for(lambda: get(cluster, "trainjob", ns, tj), 120, "kubetune's TrainJob", cluster)
    assert owner_kind(trainjob) == "FineTuneJob"
    assert trainjob["spec"]["runtimeRef"] == {
        "name": tj,
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
    }
    assert owner_kind(get(cluster, "trainingruntime", ns, tj)) == "FineTuneJob"

    # what the real controllers made of them: Trainer v2 the JobSet, JobSet the Job and the
    # headless Service, the Job controller the pod
    jobset = wait_for(lambda: get(cluster, "jobset", ns, tj), 60, "Trainer v2's JobSet", cluster)
    assert owner_kind(jobset) == "TrainJob"
    # JobSet's webhook defaults (and kubetune's runtime) made DNS hostnames on
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    job = wait_for(lambda: get(cluster, "job", ns, f"{tj}-node-0"), 60, "JobSet's Job", cluster)
    assert owner_kind(job) == "JobSet"
    assert job["spec"]["completionMode"] == "Indexed"
    service = wait_for(lambda: get(cluster, "service", ns, tj), 60, "JobSet's headless Service", cluster)
    assert service["spec"]["clusterIP"] == "None"

    def the_pod() -> dict[str, Any] | None:
        items = (get(cluster, "pod", ns, selector=f"{JOBSET_NAME_LABEL}={tj}") or {}).get("items") or []
        return items[0] if items else None

    pod = wait_for(the_pod, 60, "the Job controller's pod", cluster)
    assert owner_kind(pod) == "Job"
    assert pod["metadata"]["name"].startswith(f"{tj}-node-0-0-")
    assert pod["spec"]["hostname"] == f"{tj}-node-0-0"
    assert pod["spec"]["subdomain"] == tj
    assert [c["name"] for c in pod["spec"]["containers"]] == ["node"]
    # Trainer v2's torch plugin set the rendezvous of torchrun (no MASTER_ADDR/WORLD_SIZE as v1's)
    env = env_of(pod)
    assert env["PET_NNODES"] == "1"
    assert env["PET_NPROC_PER_NODE"] == "1"
    assert env["PET_MASTER_ADDR"] == f"{tj}-node-0-0.{tj}"
    assert env["PET_MASTER_PORT"] == "29500"
    assert "MASTER_ADDR" not in env
    names = [e["name"] for e in pod["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)), f"an env variable is defined twice: {names}"
    scheduled = wait_for(
        lambda: ((the_pod() or {}).get("spec") or {}).get("nodeName"), 60, "the scheduler's binding"
    )
    assert scheduled.startswith("gpu-node-")

    status = wait_phase(cluster, ns, name, "Succeeded")

    assert status["engine"] == "TrainJob"
    assert status["children"]["trainJob"] == tj
    # JobSet completed its Jobs, Trainer v2 copied it into the TrainJob's Complete
    assert true_condition(get(cluster, "jobset", ns, tj), "Completed")
    assert true_condition(get(cluster, "trainjob", ns, tj), "Complete")
    registered_once_with_its_final_checkpoint(cluster, mlflow_server, ns, name, status)

    # deleting the FineTuneJob: the garbage collector removes the TrainJob and all it made
    cluster.kubectl("-n", ns, "delete", "finetunejob", name, "--wait=false")

    def gone() -> list[str]:
        return [
            kind
            for kind in ("trainjob", "trainingruntime", "jobset", "job", "pod", "service", "pvc")
            if (get(cluster, kind, ns) or {}).get("items")
        ]

    wait_for(lambda: not gone(), 120, "the garbage collector to remove the children", cluster)


# The scenarios of tests/cluster/test_real_controllers.py on TrainJob (issue 31 item 4): the same
# steps and assertions, the engine's child and its suspend field read where Trainer v2 keeps them


def test_a_queued_trainjob_waits_for_quota_and_runs_when_it_frees(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    """Kueue's TrainJob integration: the second job beyond the quota is suspended by Kueue, the
    FineTuneJob says it is queued, and it runs once the first ends."""
    try:
        queued_until_quota_frees(cluster, ns, "TrainJob")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e


def test_spec_suspend_holds_a_trainjobs_pods_until_it_is_turned_off(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    """spec.suspend through Trainer v2 and JobSet: a suspended TrainJob gets no pods; set to false,
    the JobSet's Job makes them and the job trains to the end."""
    try:
        suspended_until_resumed(cluster, mlflow_server, ns, "TrainJob")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e


@pytest.mark.parametrize("example", ["qwen3-4b-full.yaml", "multinode-lora.yaml"])
def test_render_on_trainjob_passes_trainer_v2s_and_jobsets_webhooks(
    cluster: Cluster, ns: str, tmp_path: Path, example: str
) -> None:
    """What ``kubetune render`` prints for an example on TrainJob is accepted by the real engine, its
    webhooks included (issue 31 item 5; tests/integration checks the CRDs alone): the TrainingRuntime
    is created, the TrainJob passes Trainer v2's webhooks in a server-side dry run (the runtime must
    exist, ``trainer.env`` may not set the torch environment) with every rendered field kept, and,
    created suspended, Trainer v2 makes its JobSet, which JobSet's webhooks admit (pod names within 63
    characters, DNS hostnames). No FineTuneJob and no operator: the render alone."""
    rendered = render_example(tmp_path, example, ns, "TrainJob")
    runtime, trainjob = (next(d for d in rendered if d["kind"] == k) for k in ("TrainingRuntime", "TrainJob"))
    tj = trainjob["metadata"]["name"]
    cluster.kubectl("-n", ns, "create", "-f", "-", input=yaml.safe_dump(runtime))

    out = dry_run(cluster.kubectl, ns, [trainjob])
    assert out.returncode == 0, out.stderr
    kept = json.loads(out.stdout)
    # a job that names a Kueue queue (multinode-lora does) is suspended by Kueue's webhook until
    # Kueue admits it; everything else is kept as rendered
    expected = json.loads(json.dumps(trainjob))
    if "kueue.x-k8s.io/queue-name" in (trainjob["metadata"].get("labels") or {}):
        assert trainjob["spec"]["suspend"] is False
        expected["spec"]["suspend"] = True
    assert not_kept(kept, expected) == []

    # the check has teeth: Trainer v2's webhook, not the CRD, refuses a TrainJob whose runtime does
    # not exist and one whose trainer env sets the torch environment
    missing = json.loads(json.dumps(trainjob))
    missing["spec"]["runtimeRef"]["name"] = "no-such-runtime"
    out = dry_run(cluster.kubectl, ns, [missing])
    assert out.returncode != 0 and "denied the request" in out.stderr and "no-such-runtime" in out.stderr, (
        out.stderr
    )
    torch_env = json.loads(json.dumps(trainjob))
    torch_env["spec"].setdefault("trainer", {}).setdefault("env", []).append(
        {"name": "PET_NNODES", "value": "3"}
    )
    out = dry_run(cluster.kubectl, ns, [torch_env])
    assert out.returncode != 0 and "denied the request" in out.stderr and "PET_NNODES" in out.stderr, (
        out.stderr
    )

    # created (suspended: no pod), Trainer v2 builds the JobSet and JobSet's webhooks admit it
    trainjob["spec"]["suspend"] = True
    cluster.kubectl("-n", ns, "create", "-f", "-", input=yaml.safe_dump(trainjob))
    try:
        jobset = wait_for(lambda: get(cluster, "jobset", ns, tj), 60, "Trainer v2's JobSet", cluster)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e
    assert owner_kind(jobset) == "TrainJob"
    assert jobset["spec"]["suspend"] is True
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True
    nodes = trainjob["spec"]["trainer"].get("numNodes", 1)
    assert [r["replicas"] for r in jobset["spec"]["replicatedJobs"] if r["name"] == "node"] == [1]
    node = next(r for r in jobset["spec"]["replicatedJobs"] if r["name"] == "node")
    assert node["template"]["spec"]["parallelism"] == nodes
    assert not (get(cluster, "pod", ns) or {}).get("items"), "a suspended TrainJob made a pod"


def test_a_trainjob_kueue_preempts_says_so_and_resumes_from_its_checkpoint(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    """The preemption scenario of tests/cluster/test_real_controllers.py on the TrainJob engine:
    Kueue sets the TrainJob's ``spec.suspend``, Trainer v2 suspends the JobSet, the Job controller
    deletes the pod; the same state machine says PreemptedByKueue, then the job resumes and succeeds."""
    try:
        with preempting_queue(cluster, ns) as queue:
            preempted_and_resumed(cluster, ns, queue, "TrainJob")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e
