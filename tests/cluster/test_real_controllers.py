"""kubectl apply -f finetunejob.yaml, through the components a cluster runs.

Nothing here plays a controller: the Training Operator makes the pods, the scheduler places them,
the Job controller runs the registration, the garbage collector deletes, Kueue admits. The pod
runner (tests/support/podrunner.py) runs each pod's own command as a process, so the trainer
trains the tiny model on the CPU exactly as the Training Operator started it.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.conftest import API_VERSION, tiny_job, wait_for
from tests.support.cluster import GPU_PRODUCT, Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess

TRAIN_TIMEOUT = 600  # the tiny model's 12 steps take well under a minute on an idle core
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"  # the Job controller's, on each pod


def get(cluster: Cluster, kind: str, namespace: str, name: str | None = None, **flags: str) -> Any:
    args = ["-n", namespace, "get", kind, *([name] if name else []), "-o", "json", "--ignore-not-found"]
    args += [f"--{k.replace('_', '-')}={v}" for k, v in flags.items()]
    out = cluster.kubectl(*args).stdout
    return json.loads(out) if out.strip() else None


def job_status(cluster: Cluster, ns: str, name: str) -> dict[str, Any]:
    obj = get(cluster, "finetunejobs", ns, name) or {}
    return dict(obj.get("status") or {})


def wait_phase(
    cluster: Cluster, ns: str, name: str, phase: str, timeout: float = TRAIN_TIMEOUT
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        status = job_status(cluster, ns, name)
        if status.get("phase") == "Failed" and phase != "Failed":
            raise AssertionError(f"job failed: {status}\n{pod_logs(cluster, ns)}")
        return status if status.get("phase") == phase else None

    result: dict[str, Any] = wait_for(check, timeout, f"{name} {phase}", cluster)
    return result


def pod_logs(cluster: Cluster, ns: str) -> str:
    assert cluster.runner is not None
    out = []
    for folder in sorted((cluster.runner.workdir / "pods").glob(f"{ns}_*")):
        log = folder / "container.log"
        if log.exists():
            out.append(f"--- {folder.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-30:]))
    return "\n".join(out)


def apply_job(cluster: Cluster, doc: dict[str, Any]) -> None:
    cluster.apply(doc)


# The engines every scenario of training runs on (issue 31 item 4), each in the same cluster
ENGINES = ("PyTorchJob", "TrainJob")
# Each engine's training child, as kubetune names it (``<job>-train``), and where it says suspended
CHILD_KINDS = {"PyTorchJob": "pytorchjob", "TrainJob": "trainjob"}
# The controllers that speak for each engine, whose logs a failed scenario shows
ENGINE_CONTROLLERS = {
    "PyTorchJob": ("training-operator", "kueue"),
    "TrainJob": ("trainer", "jobset", "kueue"),
}


def diagnostics(cluster: Cluster, ns: str, engine: str = "TrainJob") -> str:
    """What the engine's controllers, the events and the engine's objects said (for a failure)."""
    out = [f"--- {name}.log\n{cluster.log(name, 40)}" for name in ENGINE_CONTROLLERS[engine]]
    events = cluster.kubectl("-n", ns, "get", "events", "--sort-by=.lastTimestamp", check=False)
    out.append(f"--- events\n{events.stdout}{events.stderr}")
    for kind in ("trainjob", "jobset") if engine == "TrainJob" else ("pytorchjob",):
        objs = cluster.kubectl("-n", ns, "get", kind, "-o", "yaml", check=False)
        out.append(f"--- {kind}\n{objs.stdout[-6000:]}{objs.stderr}")
    return "\n".join(out)


@contextlib.contextmanager
def explained(cluster: Cluster, ns: str, engine: str) -> Iterator[None]:
    """A failed assertion of a scenario carries what the engine's controllers said."""
    try:
        yield
    except AssertionError as e:
        raise AssertionError(f"{e}\n{diagnostics(cluster, ns, engine)}") from e


def on(engine: str) -> dict[str, str]:
    """``spec.engine`` for a scenario on ``engine``: none for PyTorchJob, which ``auto`` picks where
    the Training Operator runs (as the scenarios did before they ran on both engines)."""
    return {} if engine == "PyTorchJob" else {"engine": engine}


def training_child(cluster: Cluster, ns: str, name: str, engine: str) -> Any:
    return get(cluster, CHILD_KINDS[engine], ns, f"{name}-train")


def child_suspended(child: dict[str, Any], engine: str) -> Any:
    spec = child["spec"]
    return (spec.get("runPolicy") or {}).get("suspend") if engine == "PyTorchJob" else spec.get("suspend")


def training_pod_objects(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    """The FineTuneJob ``name``'s training pods, on either engine (kubetune's labels), oldest first."""
    selector = f"kubetune.io/job={name},app.kubernetes.io/component=training"
    pods = (get(cluster, "pod", ns, selector=selector) or {}).get("items") or []
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def training_pods(cluster: Cluster, ns: str, name: str) -> list[str]:
    """The names of the FineTuneJob ``name``'s training pods, on either engine."""
    return [p["metadata"]["name"] for p in training_pod_objects(cluster, ns, name)]


def first_node_pod(cluster: Cluster, ns: str, name: str, engine: str) -> dict[str, Any] | None:
    """The live pod of the job's first node (rank 0): the Training Operator's ``<job>-train-master-0``,
    a name each new pod keeps; the JobSet's Job's pod of completion index 0, ``<job>-train-node-0-0-``
    and a new suffix for each new pod."""
    for pod in reversed(training_pod_objects(cluster, ns, name)):
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        if engine == "PyTorchJob" and meta["name"] == f"{name}-train-master-0":
            return pod
        if engine == "TrainJob" and (meta.get("annotations") or {}).get(COMPLETION_INDEX) == "0":
            return pod
    return None


def versions(mlflow_server: MlflowServer, model: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server.uri, registry_uri=mlflow_server.uri)
    return list(client.search_model_versions(f"name = '{model}'"))


def registered_once_with_its_final_checkpoint(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, name: str, status: dict[str, Any]
) -> None:
    """A succeeded job's end, on either engine: the Job controller completed the registration Job,
    the status names version 1 of the job's model, MLflow holds that one version, and the trainer
    wrote its final checkpoint into the volume kube-controller-manager bound."""
    reg = get(cluster, "job", ns, f"{name}-register")
    assert reg["status"].get("succeeded") == 1
    model = f"{ns}-{name}"
    assert status["registeredModel"]["name"] == model
    assert status["registeredModel"]["version"] == "1"
    assert [v.version for v in versions(mlflow_server, model)] == ["1"]
    folder = checkpoint_folder(cluster, ns, f"{name}-ckpt")
    assert (folder / "final").is_dir(), sorted(p.name for p in folder.iterdir())


def checkpoint_folder(cluster: Cluster, ns: str, claim: str) -> Path:
    pvc = get(cluster, "pvc", ns, claim)
    pv = get(cluster, "pv", "default", pvc["spec"]["volumeName"])
    return Path(pv["spec"]["hostPath"]["path"])


def env_of(pod: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in pod["spec"]["containers"][0].get("env", [])}


def test_a_tiny_job_trains_and_registers_through_the_real_controllers(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    name = "tiny"
    apply_job(cluster, tiny_job(name, ns))

    # kubetune's children, then what the real controllers made of them
    pvc = wait_for(lambda: (get(cluster, "pvc", ns, f"{name}-ckpt") or {}).get("status", {}).get("phase") == "Bound"
                   and get(cluster, "pvc", ns, f"{name}-ckpt"), 60, "the PVC bound by kube-controller-manager", cluster)  # fmt: skip
    assert pvc["spec"]["storageClassName"] == "kubetune-test"
    master = wait_for(
        lambda: get(cluster, "pod", ns, f"{name}-train-master-0"), 60, "the Training Operator's pod"
    )
    assert master["metadata"]["ownerReferences"][0]["kind"] == "PyTorchJob"
    assert get(cluster, "service", ns, f"{name}-train-master-0")["spec"]["clusterIP"] == "None"
    env = env_of(master)
    assert env["MASTER_ADDR"] == f"{name}-train-master-0"
    assert env["MASTER_PORT"] == "23456"
    assert env["WORLD_SIZE"] == "1"
    assert env["PET_NNODES"] == "1"
    names = [e["name"] for e in master["spec"]["containers"][0]["env"]]
    assert len(names) == len(set(names)), f"an env variable is defined twice: {names}"
    scheduled = wait_for(lambda: (get(cluster, "pod", ns, f"{name}-train-master-0") or {}).get("spec", {}).get("nodeName"),
                         60, "the scheduler's binding")  # fmt: skip
    assert scheduled.startswith("gpu-node-")

    status = wait_phase(cluster, ns, name, "Succeeded")

    # the Training Operator said Succeeded, the Job controller completed the registration Job
    ptj = get(cluster, "pytorchjob", ns, f"{name}-train")
    assert any(c["type"] == "Succeeded" and c["status"] == "True" for c in ptj["status"]["conditions"])
    registered_once_with_its_final_checkpoint(cluster, mlflow_server, ns, name, status)
    folder = checkpoint_folder(cluster, ns, f"{name}-ckpt")
    # the trainer reported progress into the status with its own, per-job identity
    assert (
        status.get("progress", {}).get("step") == 12
        or status.get("latestStep") == 12
        or "loss" in json.dumps(status)
    )

    # deleting the FineTuneJob: the garbage collector removes every child, the volume with its claim
    cluster.kubectl("-n", ns, "delete", "finetunejob", name, "--wait=false")

    def gone() -> bool:
        left = [
            kind
            for kind in ("pytorchjob", "job", "pod", "service", "pvc", "configmap", "role", "rolebinding")
            if (get(cluster, kind, ns, selector=f"kubetune.io/job={name}") or {}).get("items")
            or (kind in ("pod", "service") and (get(cluster, kind, ns) or {}).get("items"))
        ]
        return not left

    wait_for(gone, 120, "the garbage collector to remove the children", cluster)
    wait_for(lambda: not folder.exists(), 60, "the released volume to be deleted")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_preempted_pod_resumes_and_a_killed_one_restarts(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """Deleting the training pod: SIGTERM, a checkpoint, a new pod (the Training Operator's under
    the same name; on TrainJob, JobSet restarts its Jobs, whose pods have new names) that resumes;
    SIGKILL during a save: exit 137, restarted by exit code, resumed from the newest complete
    checkpoint. Exactly one model version; keepOnDelete keeps the volume."""
    with explained(cluster, ns, engine):
        preempted_pod_and_killed_pod(cluster, mlflow_server, ns, engine)


def preempted_pod_and_killed_pod(cluster: Cluster, mlflow_server: MlflowServer, ns: str, engine: str) -> None:
    name = "preempt"
    doc = tiny_job(name, ns, **on(engine), **{"storage.keepOnDelete": True})
    doc["spec"]["training"].update(maxSteps=40, saveSteps=5, evalSteps=20)
    apply_job(cluster, doc)
    assert cluster.runner is not None
    folder = wait_for(lambda: get(cluster, "pvc", ns, f"{name}-ckpt", ) and (get(cluster, "pvc", ns, f"{name}-ckpt")["spec"].get("volumeName"))
                      and checkpoint_folder(cluster, ns, f"{name}-ckpt"), 60, "the bound volume")  # fmt: skip

    def complete_checkpoints() -> list[int]:
        root = folder / "checkpoints" if (folder / "checkpoints").is_dir() else folder
        return sorted(
            int(p.name.split("-")[1]) for p in root.glob("checkpoint-*") if (p / "COMPLETE").exists()
        )

    def pod_after(uids: set[str]) -> dict[str, Any] | None:
        """The first node's pod, once it is not one of ``uids`` and it runs (its process started)."""
        pod = first_node_pod(cluster, ns, name, engine)
        if pod is None or pod["metadata"]["uid"] in uids:
            return None
        return pod if (pod.get("status") or {}).get("phase") == "Running" else None

    wait_for(complete_checkpoints, TRAIN_TIMEOUT, "a first checkpoint", cluster)
    first = pod_after(set())
    assert first is not None, training_pods(cluster, ns, name)
    first_pod, first_uid = first["metadata"]["name"], first["metadata"]["uid"]
    cluster.kubectl("-n", ns, "delete", "pod", first_pod, "--wait=false")
    # the engine makes a new pod
    second = wait_for(lambda: pod_after({first_uid}), 180, f"the {engine}'s new pod", cluster)
    second_pod, second_uid = second["metadata"]["name"], second["metadata"]["uid"]
    assert (second_pod == first_pod) == (engine == "PyTorchJob"), (first_pod, second_pod)
    runner = cluster.runner
    log = runner.log_of(ns, first_pod)
    assert "SIGTERM" in log or "preempt" in log.lower(), log[-3000:]
    # the new attempt resumes from a checkpoint (its own log says from which)
    wait_for(lambda: "resum" in runner.log_of(ns, second_pod).lower().split("sigterm")[-1], 300,
             "the second attempt to resume", cluster)  # fmt: skip

    # now a hard kill in the middle of a save: a checkpoint folder written, its COMPLETE marker not yet
    root = folder / "checkpoints"

    def saving() -> int | None:
        """The step of a save in progress: transformers writes tmp-checkpoint-N and renames it, then
        kubetune fsyncs and writes the COMPLETE marker."""
        for p in root.glob("*checkpoint-*"):
            if p.name.startswith("tmp-") or not (p / "COMPLETE").exists():
                return int(p.name.rsplit("-", 1)[1])
        return None

    deadline = time.monotonic() + TRAIN_TIMEOUT
    cut = None
    while cut is None and time.monotonic() < deadline:
        cut = saving()
        if cut is None:
            time.sleep(0.01)
    assert cut is not None, "no save of the second attempt was seen in progress"
    runner.kill(ns, second_pod, signal.SIGKILL)
    third = wait_for(lambda: pod_after({first_uid, second_uid}), 180,
                     "a pod after the kill (restarted by exit code 137)", cluster)  # fmt: skip

    status = wait_phase(cluster, ns, name, "Succeeded")
    # the third attempt ignored the cut save and resumed from the newest complete checkpoint
    third_log = runner.log_of(ns, third["metadata"]["name"], last=True)
    resumed = [line for line in third_log.splitlines() if "resuming from" in line]
    assert len(resumed) == 1, resumed
    assert int(resumed[0].rsplit("(step ", 1)[1].rstrip(")")) < cut, (cut, resumed)
    model = f"{ns}-{name}"
    assert [v.version for v in versions(mlflow_server, model)] == ["1"]
    assert status["registeredModel"]["version"] == "1"
    events = cluster.kubectl("-n", ns, "get", "events", "-o", "json").stdout
    if engine == "PyTorchJob":
        assert "PyTorchJobRestarting" in events or "ExitedWithCode" in events
    else:  # JobSet restarted its Jobs twice, by kubetune's failure policy (no limit of its own)
        jobset = get(cluster, "jobset", ns, f"{name}-train")
        assert jobset["status"]["restarts"] == 2, jobset["status"]
        assert jobset["status"].get("restartsCountTowardsMax", 0) == 0, jobset["status"]
    # two restarts (the deleted pod, the killed one), each counted once
    assert status["trainingRestarts"]["total"] == 2, (status["trainingRestarts"], events[-4000:])

    cluster.kubectl("-n", ns, "delete", "finetunejob", name, "--wait=false")
    wait_for(
        lambda: not (get(cluster, CHILD_KINDS[engine], ns) or {}).get("items"),
        120,
        f"the {engine} to go",
        cluster,
    )
    # keepOnDelete: no owner reference on the claim, so the checkpoints stay
    assert get(cluster, "pvc", ns, f"{name}-ckpt") is not None
    assert complete_checkpoints()


@pytest.mark.parametrize("engine", ENGINES)
def test_two_nodes_rendezvous_with_the_ranks_their_engine_gave(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """Two pods of one GPU each: the Training Operator's Master and Worker (``WORLD_SIZE``, ranks in
    the env), or the two pods of the JobSet's Indexed Job (Trainer v2's torch env, the rank from the
    completion index); both processes join one rendezvous and train to the end together."""
    with explained(cluster, ns, engine):
        two_nodes(cluster, ns, engine)


def two_nodes(cluster: Cluster, ns: str, engine: str) -> None:
    name = "two"
    # one "GPU" a node (the fake nodes have them; the trainer finds no CUDA and uses gloo on the CPU)
    doc = tiny_job(
        name,
        ns,
        **on(engine),
        **{"resources.nodes": 2, "resources.gpusPerNode": 1, "storage.accessMode": "ReadWriteMany"},
    )
    doc["spec"]["training"].update(maxSteps=6, saveSteps=3, evalSteps=3)
    apply_job(cluster, doc)
    tj = f"{name}-train"
    if engine == "PyTorchJob":
        worker = wait_for(lambda: get(cluster, "pod", ns, f"{tj}-worker-0"), 60, "the Worker pod", cluster)
        env = env_of(worker)
        assert env["WORLD_SIZE"] == "2" and env["PET_NNODES"] == "2" and env["PET_NODE_RANK"] == "1"
        assert env["MASTER_ADDR"] == f"{tj}-master-0"
        assert [c["name"] for c in worker["spec"].get("initContainers", [])] == ["init-pytorch"]
    else:

        def second_node() -> dict[str, Any] | None:
            pods = training_pod_objects(cluster, ns, name)
            return next(
                (p for p in pods if (p["metadata"].get("annotations") or {}).get(COMPLETION_INDEX) == "1"),
                None,
            )

        worker = wait_for(second_node, 60, "the pod of completion index 1", cluster)
        assert worker["metadata"]["name"].startswith(f"{tj}-node-0-1-"), worker["metadata"]["name"]
        env = env_of(worker)
        # the torch plugin's rendezvous: the node rank is the pod's completion index (a fieldRef)
        assert env["PET_NNODES"] == "2" and env["PET_MASTER_ADDR"] == f"{tj}-node-0-0.{tj}", env
        rank = next(e for e in worker["spec"]["containers"][0]["env"] if e["name"] == "PET_NODE_RANK")
        assert COMPLETION_INDEX in json.dumps(rank["valueFrom"]), rank
        assert len(training_pods(cluster, ns, name)) == 2
    wait_phase(cluster, ns, name, "Succeeded")
    # both processes trained together: rank 0 wrote the run's result with the world size it joined
    result = json.loads((checkpoint_folder(cluster, ns, f"{name}-ckpt") / "train-result.json").read_text())
    assert result["world_size"] == 2, result
    assert cluster.runner is not None
    worker_log = cluster.runner.log_of(ns, worker["metadata"]["name"])
    assert "train_runtime" in worker_log, worker_log[-2000:]  # the Worker ran to the end, not just started


@pytest.mark.parametrize("engine", ENGINES)
def test_a_queued_job_waits_for_quota_and_runs_when_it_frees(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """Kueue, with its webhooks called by the API server and its integration of each engine: the
    second job beyond the quota is suspended by Kueue, the FineTuneJob says it is queued, and it
    runs once the first ends."""
    with explained(cluster, ns, engine):
        queued_until_quota_frees(cluster, ns, engine)


def queued_until_quota_frees(cluster: Cluster, ns: str, engine: str) -> None:
    assert cluster.has_kueue, f"no kueue binary in {cluster.assets}"
    queue = cluster.local_queue(ns)
    first = tiny_job("first", ns, **on(engine), **{"resources.queueName": queue, "resources.cpu": "60"})
    second = tiny_job("second", ns, **on(engine), **{"resources.queueName": queue, "resources.cpu": "60"})
    apply_job(cluster, first)
    wait_for(lambda: job_status(cluster, ns, "first").get("phase") in ("Training", "Registering", "Succeeded"),
             120, "the first job to run", cluster)  # fmt: skip
    apply_job(cluster, second)

    def queued() -> dict[str, Any] | None:
        status = job_status(cluster, ns, "second")
        conds = {c["type"]: c for c in status.get("conditions") or []}
        s = conds.get("Suspended")
        return s if s and s["status"] == "True" and s.get("reason") == "Queued" else None

    cond = wait_for(queued, 120, "the second job to be queued", cluster)
    assert "quota" in cond["message"].lower() or "queue" in cond["message"].lower(), cond
    # Kueue suspended the engine's child, and no training pod of it exists
    assert child_suspended(training_child(cluster, ns, "second", engine), engine) is True
    assert training_pods(cluster, ns, "second") == []
    wait_phase(cluster, ns, "first", "Succeeded")
    wait_phase(cluster, ns, "second", "Succeeded")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_job_kueue_preempts_says_so_and_resumes_from_its_checkpoint(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """Kueue preempts a low-priority job for a high-priority one (a ClusterQueue that preempts within
    itself, by the pods' PriorityClass): Kueue evicts the low job's Workload and suspends its
    training object (the PyTorchJob, whose Training Operator deletes the pod; the TrainJob, whose
    Trainer v2 suspends the JobSet, whose Job controller deletes the pod: SIGTERM, a checkpoint).
    The low job says it was preempted by Kueue, with Kueue's reason and the checkpoint it resumes
    from; admitted again once the high one ends, it resumes from it and succeeds, the preemption
    counted."""
    with explained(cluster, ns, engine), preempting_queue(cluster, ns) as queue:
        preempted_and_resumed(cluster, ns, queue, engine)


@contextlib.contextmanager
def preempting_queue(cluster: Cluster, ns: str) -> Iterator[str]:
    """A LocalQueue of ``ns`` on a ClusterQueue of its own that preempts lower priorities within
    itself, with room for one job of one CPU, and the two PriorityClasses of the scenario."""
    assert cluster.has_kueue, f"no kueue binary in {cluster.assets}"
    cq, queue = f"preempting-{ns}", "preempting"
    cluster.apply(
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "kubetune-test-low"},
            "value": 100,
        },
        {
            "apiVersion": "scheduling.k8s.io/v1",
            "kind": "PriorityClass",
            "metadata": {"name": "kubetune-test-high"},
            "value": 1000,
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "ClusterQueue",
            "metadata": {"name": cq},
            "spec": {
                "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                "preemption": {"withinClusterQueue": "LowerPriority"},
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                        "flavors": [
                            {
                                "name": "h100",
                                "resources": [
                                    {"name": "cpu", "nominalQuota": "1500m"},  # one job of 1 CPU at a time
                                    {"name": "memory", "nominalQuota": "10Ti"},
                                    {"name": "nvidia.com/gpu", "nominalQuota": "16"},
                                ],
                            }
                        ],
                    }
                ],
            },
        },
        {
            "apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue",
            "metadata": {"name": queue, "namespace": ns},
            "spec": {"clusterQueue": cq},
        },
    )
    try:
        yield queue
    finally:
        cluster.kubectl("delete", "clusterqueue", cq, "--wait=false", check=False)


def preempted_and_resumed(cluster: Cluster, ns: str, queue: str, engine: str) -> None:
    """The scenario on ``engine``'s training object (both suspend it their own way)."""
    on = {"resources.queueName": queue, "engine": engine}
    low = tiny_job("low", ns, **on, **{"resources.priorityClassName": "kubetune-test-low"})
    low["spec"]["training"].update(maxSteps=40, saveSteps=5, evalSteps=20)
    apply_job(cluster, low)

    def checkpointed() -> int | None:
        status = job_status(cluster, ns, "low")
        step = (status.get("checkpoints") or {}).get("latestStep")
        return step if status.get("phase") == "Training" and step else None

    wait_for(checkpointed, TRAIN_TIMEOUT, "the low job to train and report a checkpoint", cluster)
    apply_job(cluster, tiny_job("high", ns, **on, **{"resources.priorityClassName": "kubetune-test-high"}))

    def preempted() -> dict[str, Any] | None:
        status = job_status(cluster, ns, "low")
        conds = {c["type"]: c for c in status.get("conditions") or []}
        held = conds.get("Suspended")
        return status if held and held["status"] == "True" and held["reason"] == "PreemptedByKueue" else None

    status = wait_for(preempted, 180, "the low job to say Kueue preempted it", cluster)
    assert status["phase"] == "Pending", status
    conds = {c["type"]: c for c in status["conditions"]}
    message = conds["Suspended"]["message"]
    record = status["preemptions"]
    # Kueue's own words: the Workload's Evicted (Preempted) and Preempted (InClusterQueue) conditions
    workload = get(cluster, "workloads.kueue.x-k8s.io", ns, record["workload"])
    kueue = {c["type"]: c for c in workload["status"]["conditions"]}
    assert (record["count"], record["lastReason"], record["lastPreemptionReason"]) == (
        1,
        "Preempted",
        "InClusterQueue",
    )
    assert record["lastMessage"] == kueue["Preempted"]["message"] or kueue["Preempted"]["status"] == "False"
    assert message.startswith(
        f"Kueue preempted the {engine} (InClusterQueue: Preempted to accommodate a workload"
    )
    assert f"Workload {record['workload']}" in message
    assert record["resumeStep"] >= 5 and f"step {record['resumeStep']}" in message, (record, message)
    assert (conds["Training"]["reason"], conds["Ready"]["reason"]) == ("PreemptedByKueue", "PreemptedByKueue")
    assert child_suspended(training_child(cluster, ns, "low", engine), engine) is True
    events = [e for e in (get(cluster, "events", ns) or {}).get("items") or []
              if e["involvedObject"].get("name") == "low" and e["reason"] == "PreemptedByKueue"]  # fmt: skip
    assert len(events) == 1 and events[0]["type"] == "Normal", events

    wait_phase(cluster, ns, "high", "Succeeded")
    done = wait_phase(cluster, ns, "low", "Succeeded")
    record = done["preemptions"]
    assert record["count"] == 1 and record["readmittedTime"] and record["preemptedSeconds"] > 0, record
    goodput = done["goodput"]
    assert goodput["preemptions"] >= 1 and goodput["preemptedSeconds"] > 0, goodput
    readmitted = [e for e in (get(cluster, "events", ns) or {}).get("items") or []
                  if e["involvedObject"].get("name") == "low" and e["reason"] == "Readmitted"]  # fmt: skip
    assert len(readmitted) == 1, readmitted


def _time(stamp: str) -> datetime:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def training_condition(cluster: Cluster, ns: str, name: str, reason: str) -> dict[str, Any] | None:
    """The FineTuneJob's status when its Training condition has ``reason``, else None."""
    status = job_status(cluster, ns, name)
    conds = {c["type"]: c for c in status.get("conditions") or []}
    training = conds.get("Training")
    return status if training and training.get("reason") == reason else None


def warnings(cluster: Cluster, ns: str, name: str, reason: str) -> list[dict[str, Any]]:
    """The Warning events of the FineTuneJob ``name`` with ``reason``."""
    items = (get(cluster, "events", ns) or {}).get("items") or []
    return [
        e
        for e in items
        if e["involvedObject"].get("kind") == "FineTuneJob"
        and e["involvedObject"].get("name") == name
        and e["type"] == "Warning"
        and e["reason"] == reason
    ]


@pytest.mark.parametrize("engine", ENGINES)
def test_a_gpu_product_no_node_has_keeps_the_job_pending_with_the_schedulers_reason(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """kube-scheduler cannot place the pod: after the operator's 30 s the FineTuneJob stays Pending
    with Training=False reason Unschedulable, the pod's name and the scheduler's own message, one
    Warning event; a node with that product appears (a fake node relabelled): scheduled, cleared."""
    with explained(cluster, ns, engine):
        unschedulable_until_a_node_fits(cluster, ns, engine, "NVIDIA-B300-SXM6-AC")


def unschedulable_until_a_node_fits(cluster: Cluster, ns: str, engine: str, product: str) -> None:
    assert product != GPU_PRODUCT
    name = "nogpu"
    apply_job(
        cluster,
        tiny_job(name, ns, **on(engine), **{"resources.gpuProduct": product, "resources.gpusPerNode": 1}),
    )

    status = wait_for(
        lambda: training_condition(cluster, ns, name, "Unschedulable"),
        180,
        "the scheduler's reason in the FineTuneJob's status",
        cluster,
    )
    assert status["phase"] == "Pending", status
    conds = {c["type"]: c for c in status["conditions"]}
    message = conds["Training"]["message"]
    # the scheduler's own words, as the pod carries them
    (pod,) = training_pods(cluster, ns, name)
    if engine == "PyTorchJob":
        assert pod == f"{name}-train-master-0"
    else:
        assert pod.startswith(f"{name}-train-node-0-0-"), pod
    scheduled = next(
        c for c in get(cluster, "pod", ns, pod)["status"]["conditions"] if c["type"] == "PodScheduled"
    )
    assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
    assert "didn't match Pod's node affinity/selector" in scheduled["message"], scheduled
    assert message.startswith(f"the scheduler cannot place pod {pod}: 0/4 nodes are available"), message
    assert "didn't match Pod's node affinity/selector" in message and "nvidia.com/gpu.product" in message
    assert (conds["Ready"]["reason"], conds["Ready"]["message"]) == ("Unschedulable", message)
    # shown once, and only after the pod had waited 30 s since the scheduler's first refusal
    (event,) = warnings(cluster, ns, name, "Unschedulable")
    waited = _time(event.get("firstTimestamp") or event["eventTime"]) - _time(scheduled["lastTransitionTime"])
    assert waited.total_seconds() >= 29, (event, scheduled)  # timestamps in whole seconds

    # a node with that GPU: the scheduler places the pod, the FineTuneJob says so
    node = "gpu-node-3"
    cluster.kubectl("label", "node", node, f"nvidia.com/gpu.product={product}", "--overwrite")
    try:
        wait_for(
            lambda: (get(cluster, "pod", ns, pod) or {}).get("spec", {}).get("nodeName") == node,
            120,
            "the pod scheduled on the relabelled node",
            cluster,
        )
        status = wait_for(
            lambda: (
                training_condition(cluster, ns, name, "TrainingRunning")
                or training_condition(cluster, ns, name, "TrainingCreated")
            ),
            120,
            "the Unschedulable reason cleared",
            cluster,
        )
        assert status["phase"] in ("Pending", "Training"), status
        assert len(warnings(cluster, ns, name, "Unschedulable")) == 1
    finally:
        cluster.kubectl("label", "node", node, f"nvidia.com/gpu.product={GPU_PRODUCT}", "--overwrite")
        cluster.kubectl("-n", ns, "delete", "finetunejob", name, "--wait=false")


@pytest.mark.parametrize("engine", ENGINES)
def test_a_missing_priority_class_shows_why_no_pod_is_created_until_it_exists(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """The engine cannot create the pod (the API server's Priority admission refuses it): the
    FineTuneJob shows PodsNotCreated with the creator's message (the Training Operator's
    FailedCreatePod on the PyTorchJob; the Job controller's FailedCreate on the JobSet's Job); once
    the PriorityClass exists, the creator's next try makes the pod and the job trains."""
    with explained(cluster, ns, engine):
        no_pod_until_the_priority_class_exists(cluster, ns, engine)


def no_pod_until_the_priority_class_exists(cluster: Cluster, ns: str, engine: str) -> None:
    name = "prio"
    # one name per engine: the scenario's PriorityClass (cluster-wide) is made and deleted by it
    priority_class = f"does-not-exist-{engine.lower()}"
    tj = f"{name}-train"
    apply_job(cluster, tiny_job(name, ns, **on(engine), **{"resources.priorityClassName": priority_class}))
    try:
        status = wait_for(
            lambda: training_condition(cluster, ns, name, "PodsNotCreated"),
            120,
            "PodsNotCreated in the FineTuneJob's status",
            cluster,
        )
        assert status["phase"] == "Pending", status
        conds = {c["type"]: c for c in status["conditions"]}
        message = conds["Training"]["message"]
        forbidden = f"is forbidden: no PriorityClass with name {priority_class} was found"
        # the creator's own event says the same: on the PyTorchJob, or on the JobSet's Job
        kind, reason = (
            ("PyTorchJob", "FailedCreatePod") if engine == "PyTorchJob" else ("Job", "FailedCreate")
        )
        creator_events = [
            e
            for e in (get(cluster, "events", ns) or {}).get("items") or []
            if e["involvedObject"].get("kind") == kind and e["reason"] == reason
        ]
        assert creator_events and forbidden in creator_events[0]["message"], creator_events
        if engine == "PyTorchJob":
            pod = f"{tj}-master-0"
            refused = f'pods "{pod}" {forbidden}'
            assert message.startswith(
                f"the Training Operator cannot create pod {pod} of PyTorchJob {tj}: Error creating: {refused}"
            ), message
        else:
            assert message.startswith("the Job controller cannot create pod"), message
            assert f"of TrainJob {tj}: Error creating: pods " in message and forbidden in message, message
        assert conds["Ready"]["reason"] == "PodsNotCreated"
        assert training_pods(cluster, ns, name) == []
        assert len(warnings(cluster, ns, name, "PodsNotCreated")) == 1

        cluster.apply(
            {
                "apiVersion": "scheduling.k8s.io/v1",
                "kind": "PriorityClass",
                "metadata": {"name": priority_class},
                "value": 1000,
                "preemptionPolicy": "Never",
            }
        )
        # the creator retries with a growing backoff: its next try creates the pod
        status = wait_phase(cluster, ns, name, "Training", timeout=300)
        conds = {c["type"]: c for c in status["conditions"]}
        assert (conds["Training"]["status"], conds["Training"]["reason"]) == ("True", "TrainingRunning"), (
            conds
        )
        (pod,) = training_pods(cluster, ns, name)
        assert get(cluster, "pod", ns, pod)["spec"]["priorityClassName"] == priority_class
        assert len(warnings(cluster, ns, name, "PodsNotCreated")) == 1
    finally:
        cluster.kubectl("-n", ns, "delete", "finetunejob", name, "--wait=false")
        cluster.kubectl("delete", "priorityclass", priority_class, "--ignore-not-found")


@pytest.mark.parametrize("engine", ENGINES)
def test_the_operator_restarted_mid_training_duplicates_nothing(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    name = "restart"
    doc = tiny_job(name, ns, **on(engine))
    doc["spec"]["training"].update(maxSteps=20)
    with explained(cluster, ns, engine):
        apply_job(cluster, doc)
        wait_for(lambda: job_status(cluster, ns, name).get("phase") == "Training", 180, "Training", cluster)
        operator.kill()
        operator.start()
        wait_phase(cluster, ns, name, "Succeeded")
    assert len((get(cluster, CHILD_KINDS[engine], ns) or {}).get("items", [])) == 1
    jobs = sorted(j["metadata"]["name"] for j in (get(cluster, "job", ns) or {}).get("items", []))
    # a TrainJob's pods are the Job's of its JobSet (one Job per replicated job)
    engines_job = [f"{name}-train-node-0"] if engine == "TrainJob" else []
    assert jobs == sorted([f"{name}-prepare", f"{name}-register", *engines_job])
    assert [v.version for v in versions(mlflow_server, f"{ns}-{name}")] == ["1"]


@pytest.mark.parametrize("engine", ENGINES)
def test_spec_suspend_holds_the_pods_until_it_is_turned_off(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """spec.suspend through the real engine: a suspended PyTorchJob (or TrainJob: Trainer v2
    suspends the JobSet, and JobSet its Jobs) gets no pods; set to false, the engine makes them and
    the job trains to the end."""
    with explained(cluster, ns, engine):
        suspended_until_resumed(cluster, mlflow_server, ns, engine)


def suspended_until_resumed(cluster: Cluster, mlflow_server: MlflowServer, ns: str, engine: str) -> None:
    name = "held"
    doc = tiny_job(name, ns, suspend=True, **on(engine))
    doc["spec"]["training"].update(maxSteps=4, saveSteps=2, evalSteps=2)
    apply_job(cluster, doc)

    def suspended() -> bool:
        conds = {c["type"]: c for c in job_status(cluster, ns, name).get("conditions") or []}
        return conds.get("Suspended", {}).get("status") == "True"

    wait_for(suspended, 120, "the FineTuneJob Suspended", cluster)
    child = wait_for(lambda: training_child(cluster, ns, name, engine), 60, f"the {engine}", cluster)
    assert child_suspended(child, engine) is True
    # the engine's own verdict, and no pod for as long as it lasts
    wait_for(
        lambda: any(
            c["type"] == "Suspended" and c["status"] == "True"
            for c in ((training_child(cluster, ns, name, engine) or {}).get("status") or {}).get("conditions")
            or []
        ),
        60,
        f"the {engine}'s Suspended condition",
        cluster,
    )
    time.sleep(5)
    assert training_pods(cluster, ns, name) == []
    # the preparation ran while suspended (it holds no GPU): training starts as soon as it is resumed
    assert (get(cluster, "job", ns, f"{name}-prepare") or {}).get("status", {}).get("succeeded") == 1
    cluster.kubectl(
        "-n", ns, "patch", "finetunejob", name, "--type=merge", "-p", '{"spec":{"suspend":false}}'
    )
    wait_phase(cluster, ns, name, "Succeeded")
    assert [v.version for v in versions(mlflow_server, f"{ns}-{name}")] == ["1"]


def test_the_finetunejob_api_version_is_served(cluster: Cluster) -> None:
    out = cluster.kubectl("api-resources", "--api-group=kubetune.io", "-o", "name").stdout
    assert "finetunejobs.kubetune.io" in out
    assert API_VERSION.startswith("kubetune.io/")
