"""A FineTuneJob on Kubeflow Trainer v2 (``spec.engine: TrainJob``) through the real controllers
(issue 31 item 4).

The session's cluster (tests/cluster/conftest.py) runs Trainer v2.2.0's controller manager and the
JobSet v0.11.1 controller beside the Training Operator, their real CRDs installed and their webhooks
called by the API server, and Kueue's TrainJob integration on. Nothing here plays a controller:
kubetune makes the job's TrainingRuntime and TrainJob, Trainer v2 makes the JobSet (and the torch
environment), JobSet makes the Job and the headless Service, the Job controller the pod, the
scheduler places it, and the pod runner runs the trainer's own command: it trains the tiny model,
the registration Job registers it in MLflow, and the job succeeds.


The scenarios of tests/cluster/test_real_controllers.py (and the other modules of this folder) run on
both engines, parametrized by ``engine``; this module holds what only a TrainJob has: the objects
Trainer v2 and JobSet make of kubetune's TrainJob, and the render checked by their webhooks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    diagnostics,
    env_of,
    get,
    registered_once_with_its_final_checkpoint,
    wait_phase,
)
from tests.support import docs_samples
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess
from tests.support.render_check import dry_run, not_kept, render_example

JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"


def owner_kind(obj: dict[str, Any]) -> str:
    return str(obj["metadata"]["ownerReferences"][0]["kind"])


def true_condition(obj: dict[str, Any] | None, kind: str) -> bool:
    return any(
        c["type"] == kind and c["status"] == "True"
        for c in ((obj or {}).get("status") or {}).get("conditions") or []
    )


def test_a_tiny_job_on_trainjob_trains_registers_and_reads_as_on_pytorchjob(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    """The tiny job on TrainJob, and beside it the same manifest on PyTorchJob (only the name and
    ``spec.engine`` differ): each succeeds, and their statuses, conditions, events and ``kubectl get
    ftj`` rows read the same but for the engine's own names (the README's table of differences)."""
    twin = tiny_job("twin", ns, engine="PyTorchJob")
    cluster.apply(twin)
    try:
        train_and_register(cluster, mlflow_server, ns)
        wait_phase(cluster, ns, "twin", "Succeeded")
    except AssertionError as e:  # what the controllers said (the cluster's folder goes at the end)
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns)}") from e
    _, printed = docs_samples.table(cluster.kubectl("-n", ns, "get", "ftj", "tiny", "twin").stdout)
    rows = {row["NAME"]: row for row in printed}
    on_trainjob, on_pytorchjob = (
        what_a_user_reads(cluster, ns, name, rows[name]) for name in ("tiny", "twin")
    )
    assert on_trainjob == on_pytorchjob
    deleted_with_all_they_made(cluster, ns, "tiny", "twin")


def what_a_user_reads(cluster: Cluster, ns: str, name: str, printed: dict[str, str]) -> dict[str, Any]:
    """A succeeded job as its user sees it, with what names its engine's objects left out: the status's
    fields, each condition's status and reason, the job's events by type and reason (how many of
    each), and its row of ``kubectl get ftj`` but the columns that differ by name or by run (name,
    model, loss, age)."""
    status = get(cluster, "finetunejobs", ns, name)["status"]
    events: dict[str, int] = {}
    created: list[str] = []  # the kinds of the "created <kind> <name>" events
    for e in (get(cluster, "events", ns) or {}).get("items") or []:
        if e["involvedObject"].get("kind") == "FineTuneJob" and e["involvedObject"].get("name") == name:
            key = f"{e['type']} {e['reason']}"
            events[key] = events.get(key, 0) + int(e.get("count") or 1)
            if e["reason"] == "Created":
                created.append(e["message"].split()[1])
    # the engine's objects: the PyTorchJob; the TrainJob and its TrainingRuntime (one event more)
    engine_objects = {"PyTorchJob": ["training"], "TrainJob": ["training"], "TrainingRuntime": []}
    events.pop("Normal Created", None)
    return {
        "fields": sorted(set(status) - {"engine"}),
        # the training object under its engine's key (pytorchJob, trainJob)
        "children": sorted(set(status.get("children") or {}) - {"pytorchJob", "trainJob"}),
        "conditions": sorted((c["type"], c["status"], c.get("reason")) for c in status["conditions"]),
        "events": events,
        "created": sorted(k for kind in created for k in engine_objects.get(kind, [kind])),
        "printed": {k: v for k, v in printed.items() if k not in ("NAME", "MODEL", "LOSS", "AGE")},
        "restarts": (status.get("trainingRestarts") or {}).get("total", 0),
        "progress": {k: v for k, v in (status.get("progress") or {}).items() if k in ("step", "totalSteps")},
    }


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


def deleted_with_all_they_made(cluster: Cluster, ns: str, *names: str) -> None:
    """Deleting the FineTuneJobs: the garbage collector removes the TrainJob and all it made (and
    the PyTorchJob's), nothing of them left in the namespace."""
    cluster.kubectl("-n", ns, "delete", "finetunejob", *names, "--wait=false")

    def gone() -> list[str]:
        return [
            kind
            for kind in (
                "trainjob",
                "trainingruntime",
                "jobset",
                "pytorchjob",
                "job",
                "pod",
                "service",
                "pvc",
            )
            if (get(cluster, kind, ns) or {}).get("items")
        ]

    wait_for(lambda: not gone(), 120, "the garbage collector to remove the children", cluster)


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
