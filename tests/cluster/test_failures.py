"""Training failures that explain themselves, through the real controllers.

The failures are real, not simulated: the pod runner enforces the trainer container's memory limit
in a memory cgroup and reports the kernel's OOM kill as the kubelet does (``OOMKilled``, 137); the
checkpoint volume of the sized StorageClass is a file system of the claim's size, so a save past it
fails with ENOSPC; a learning rate of 1.0 makes the tiny model's loss diverge. Each job must end
``Failed`` with the failure's reason on its ``Training`` and ``Ready`` conditions, a message with what
happened and what to do, a Warning event, no registration, and Argo CD's health check Degraded. Each training scenario runs on
both engines (``engine``): the Training Operator's PyTorchJob, and Trainer v2's TrainJob on JobSet.

The first two tests check the pod runner's part alone (a bare pod, no kubetune): the memory limit and
the volume's size are enforced.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.failures import HINTS, Failure
from tests.cluster.conftest import tiny_job, wait_for
from tests.cluster.test_real_controllers import (
    CHILD_KINDS,
    ENGINES,
    apply_job,
    checkpoint_folder,
    child_suspended,
    explained,
    get,
    on,
    training_child,
    training_pods,
    versions,
    wait_phase,
    warnings,
)
from tests.support.cluster import SIZED_STORAGE_CLASS, UNPULLABLE_IMAGE, Cluster
from tests.support.controlplane import REPO
from tests.support.lua import run_health
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess

ARGOCD_HEALTH = REPO / "deploy" / "argocd" / "health" / "finetunejob.lua"
FAIL_TIMEOUT = 480  # preparation, then training on one core to the failure (with retries)
IMAGE = "ghcr.io/kubetune/trainer:test"  # any name: the pod runner runs the command from this machine


def bare_pod(name: str, ns: str, script: str, **container: Any) -> dict[str, Any]:
    """A pod of one container running a Python script, for the pod runner alone."""
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {"name": "main", "image": IMAGE, "command": ["python", "-c", script], **container}
            ],
        },
    }
    return pod


def terminated(cluster: Cluster, ns: str, name: str) -> dict[str, Any] | None:
    pod = get(cluster, "pod", ns, name) or {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "terminated" in state:
            return {"phase": pod["status"]["phase"], **state["terminated"]}
    return None


def recent_logs(cluster: Cluster, ns: str, last: int = 4) -> str:
    """The newest pods' log tails (a pod restarted a hundred times need not show them all), and how many
    pods of each name the runner ran."""
    assert cluster.runner is not None
    folders = sorted(
        (cluster.runner.workdir / "pods").glob(f"{ns}_*"),
        key=lambda f: float((f / "started").read_text() or 0),
    )
    counts: dict[str, int] = {}
    for f in folders:
        pod = f.name[len(ns) + 1 :].rsplit("_", 1)[0]
        counts[pod] = counts.get(pod, 0) + 1
    out = [f"pods run: {counts}"]
    for f in folders[-last:]:
        log = (f / "container.log").read_text(errors="replace") if (f / "container.log").exists() else ""
        out.append(f"--- {f.name}\n" + "\n".join(log.splitlines()[-30:]))
    return "\n".join(out)


# --- the pod runner's part ----------------------------------------------------------------------------

HOG = """
import sys
chunks = []
for _ in range(int(sys.argv[1])):
    chunks.append(b"\\1" * (16 << 20))  # written, so resident
print("allocated", len(chunks) * 16, "MiB", flush=True)
"""


def test_the_pod_runner_enforces_the_memory_limit_as_the_kubelet_does(cluster: Cluster, ns: str) -> None:
    """A container past its limits.memory is OOM-killed by the kernel and reported OOMKilled with exit
    code 137 (the whole container: here the hog is a child of a shell that would sleep on, as a
    torchrun worker is a child of the launcher); one under its limit completes; the cgroups go."""
    runner = cluster.runner
    assert runner is not None
    if runner.memory_cgroups is None:
        pytest.skip("no writable memory cgroup on this machine: the pod runner does not enforce limits")
    over = bare_pod("over", ns, "", resources={"limits": {"memory": "128Mi"}})
    over["spec"]["containers"][0]["command"] = ["sh", "-c", f"python -c '{HOG}' 64; sleep 600"]
    under = bare_pod("under", ns, HOG, args=["4"], resources={"limits": {"memory": "256Mi"}})
    cluster.apply(over, under)
    ended: dict[str, dict[str, Any]] = {}
    for name in ("over", "under"):
        ended[name] = wait_for(lambda: terminated(cluster, ns, name), 120, f"pod {name} to end", cluster)  # noqa: B023
    assert (ended["over"]["phase"], ended["over"]["reason"], ended["over"]["exitCode"]) == (
        "Failed",
        "OOMKilled",
        137,
    ), ended
    assert (ended["under"]["phase"], ended["under"]["reason"], ended["under"]["exitCode"]) == (
        "Succeeded",
        "Completed",
        0,
    ), ended
    assert "allocated 64 MiB" in runner.log_of(ns, "under")
    uids = [get(cluster, "pod", ns, n)["metadata"]["uid"] for n in ("over", "under")]
    parent = runner.memory_cgroups.parent
    wait_for(lambda: not any((parent / uid).exists() for uid in uids), 30, "the cgroups to be removed")


MOUNTS = """
import json, os, sys
paths = sys.argv[1:]
seen = {p: os.path.isdir(p) for p in paths}
token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
seen[token] = os.path.isfile(token) and os.path.getsize(token) > 0
open(os.environ["LOG"], "w").write(json.dumps(seen))
"""


def test_the_pod_runner_leaves_the_machines_folders_as_they_were(cluster: Cluster, ns: str) -> None:
    """A pod's mount points that this machine lacks (its service account token's folder, a folder
    under /etc, /opt and /var/lib, its termination log in /dev) are there for the pod, and not on the
    machine, during the run or after it: a Kubernetes client here must not believe it runs in a pod.
    A mount at a new top-level folder leaves that folder, empty, until the runner stops."""
    tag = ns[-12:]
    top = f"/kubetune-{tag}"
    folders = [
        f"/etc/kubetune-{tag}/conf",
        f"/opt/kubetune-{tag}/x",
        f"/var/lib/kubetune-{tag}",
        f"{top}/deep",
    ]
    log = f"/dev/kubetune-{tag}-log"
    before = {p: Path(p).exists() for p in ("/var/run/secrets", "/run/secrets")}
    pod = bare_pod(
        "mounts", ns, MOUNTS, args=folders, env=[{"name": "LOG", "value": log}], terminationMessagePath=log
    )
    pod["spec"]["automountServiceAccountToken"] = True
    pod["spec"]["volumes"] = [{"name": f"v{i}", "emptyDir": {}} for i in range(len(folders))]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": f"v{i}", "mountPath": path} for i, path in enumerate(folders)
    ]
    # the token's admission needs the namespace's default ServiceAccount, which kube-controller-manager makes
    wait_for(lambda: get(cluster, "serviceaccount", ns, "default"), 60, "the default ServiceAccount", cluster)
    cluster.apply(pod)
    ended = wait_for(lambda: terminated(cluster, ns, "mounts"), 120, "the pod to end", cluster)
    assert ended["exitCode"] == 0, (ended, recent_logs(cluster, ns))
    seen = json.loads(ended["message"])
    assert all(seen.values()), seen  # the pod had every mount point, and its token
    for path in [*folders, log]:
        first = next(
            f"/{'/'.join(path.split('/')[1 : i + 1])}"
            for i, part in enumerate(path.split("/"))
            if tag in part
        )
        assert first == top or not Path(first).exists(), f"{first} was left on this machine"
    assert {p: Path(p).exists() for p in before} == before
    assert Path(top).is_dir() and not any(Path(top).iterdir())  # removed when the runner stops (tests/unit)


FILL = """
import errno, json, os
st = os.statvfs("/data")
written, error = 0, None
try:
    with open("/data/fill", "wb") as f:
        while written < (64 << 20):
            f.write(b"\\1" * (256 << 10))
            f.flush()
            written += 256 << 10
        os.fsync(f.fileno())
except OSError as e:
    error = errno.errorcode.get(e.errno, str(e.errno))
with open("/dev/termination-log", "w") as t:
    json.dump({"error": error, "written": written, "size": st.f_blocks * st.f_frsize}, t)
"""


def test_a_sized_volume_is_full_at_the_claims_size(cluster: Cluster, ns: str) -> None:
    """A claim of the sized StorageClass is a disk of that size: writing past it fails with ENOSPC.
    Deleting the claim unmounts and deletes the volume."""
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "small", "namespace": ns},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": SIZED_STORAGE_CLASS,
            "resources": {"requests": {"storage": "4Mi"}},
        },
    }
    pod = bare_pod("fill", ns, FILL, volumeMounts=[{"name": "data", "mountPath": "/data"}])
    pod["spec"]["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "small"}}]
    cluster.apply(claim, pod)
    wait_for(lambda: (get(cluster, "pvc", ns, "small") or {}).get("status", {}).get("phase") == "Bound",
             60, "the claim bound", cluster)  # fmt: skip
    folder = checkpoint_folder(cluster, ns, "small")
    assert os.path.ismount(folder), folder
    ended = wait_for(lambda: terminated(cluster, ns, "fill"), 120, "the writer to end", cluster)
    assert ended["exitCode"] == 0, (ended, recent_logs(cluster, ns))
    result = json.loads(ended["message"])
    assert result["error"] == "ENOSPC", result
    assert 2 << 20 < result["written"] <= 4 << 20, result
    assert result["size"] <= 4 << 20, result
    assert (folder / "fill").stat().st_size == result["written"]  # what a pod wrote is on the volume

    cluster.kubectl("-n", ns, "delete", "pod", "fill", "--wait=false")
    wait_for(lambda: get(cluster, "pod", ns, "fill") is None, 60, "the pod to go", cluster)
    cluster.kubectl("-n", ns, "delete", "pvc", "small", "--wait=false")
    wait_for(lambda: not folder.exists(), 60, "the released volume to be unmounted and deleted", cluster)
    assert not folder.with_name(folder.name + ".img").exists()


# --- training failures through the real controllers ---------------------------------------------------


def condition(status: dict[str, Any], ctype: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == ctype), {})


def assert_failed_with(cluster: Cluster, ns: str, name: str, failure: Failure) -> dict[str, Any]:
    """Failed with ``failure`` on Training and Ready (status False), its hint in the message, one
    Warning event with the reason, no registration Job, and Argo CD's health Degraded naming it.
    Returns the Ready condition."""
    try:
        status = wait_phase(cluster, ns, name, "Failed", timeout=FAIL_TIMEOUT)
    except AssertionError as e:
        raise AssertionError(f"{e}\n{recent_logs(cluster, ns)}") from None
    training, ready = condition(status, "Training"), condition(status, "Ready")
    seen = {c: (x.get("status"), x.get("reason")) for c, x in (("Training", training), ("Ready", ready))}
    assert seen == dict.fromkeys(seen, ("False", failure.value)), (status, recent_logs(cluster, ns))
    assert HINTS[failure] in ready["message"], ready
    assert HINTS[failure] in training["message"], training
    events = warnings(cluster, ns, name, failure.value)
    assert events, (get(cluster, "events", ns) or {}).get("items")
    assert get(cluster, "job", ns, f"{name}-register") is None
    obj = get(cluster, "finetunejobs", ns, name)
    verdict = run_health(ARGOCD_HEALTH, obj)
    assert verdict["status"] == "Degraded" and failure.value in verdict["message"], verdict
    return ready


@pytest.mark.parametrize("engine", ENGINES)
def test_a_trainer_over_its_memory_limit_fails_with_host_out_of_memory(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """spec.resources.memory too small for the trainer: the kernel kills it (OOMKilled, 137) in every
    attempt; once the operator's restart limit is used up the job fails HostOutOfMemory and says to raise
    spec.resources.memory. Only the trainer pod has that limit:
    the preparation runs under the operator's own setting and succeeds."""
    assert cluster.runner is not None
    if cluster.runner.memory_cgroups is None:
        pytest.skip("no writable memory cgroup on this machine: the pod runner does not enforce limits")
    name, limit = "oom", "400Mi"
    apply_job(cluster, tiny_job(name, ns, **on(engine), **{"resources.memory": limit}))
    with explained(cluster, ns, engine):
        ready = assert_failed_with(cluster, ns, name, Failure.HOST_OUT_OF_MEMORY)
    assert "memory" in ready["message"] and "spec.resources.memory" in ready["message"], ready
    # neither engine fails a job for exit 137 (the Training Operator restarts by exit code,
    # kubeflow/trainer#2045; kubetune's JobSet failure policy restarts the JobSet with no limit of its
    # own): the operator counted the restarts, failed the job and suspended the child so its pods stop
    assert child_suspended(training_child(cluster, ns, name, engine), engine) is True
    restarts = get(cluster, "finetunejobs", ns, name)["status"]["trainingRestarts"]
    assert restarts["sinceProgress"] > 6 and restarts["lastReason"] == "HostOutOfMemory", restarts
    # each restart counted once (the Training Operator writes two Restarting events for each): the
    # first attempt and the six restarts the limit allows ran and were killed; the seventh restart's
    # pod failed the job, and the suspension may stop it before it runs
    assert "restarted 7 times without a new checkpoint (limit 6" in ready["message"], ready
    # the pods the runner ran: the Training Operator's under one name, the JobSet's each its own
    attempts = [
        f for f in (cluster.runner.workdir / "pods").glob(f"{ns}_{name}-train-*") if (f / "started").exists()
    ]
    assert len(attempts) >= 7, recent_logs(cluster, ns)
    wait_for(lambda: not training_pods(cluster, ns, name), 60, "the pods to stop", cluster)
    if engine == "PyTorchJob":
        child = training_child(cluster, ns, name, engine)
        template = child["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        # the kubelet's (here the pod runner's) verdict, as the Training Operator saw it
        events = (get(cluster, "events", ns) or {}).get("items") or []
        assert any("exited with code 137" in e.get("message", "") for e in events), [
            e["message"] for e in events
        ]
    else:
        runtime = get(cluster, "trainingruntime", ns, f"{name}-train")
        (node,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        template = node["template"]["spec"]["template"]["spec"]["containers"][0]
        # JobSet restarted its Jobs for each attempt the kernel killed, none counted against a limit
        jobset = get(cluster, "jobset", ns, f"{name}-train")
        assert jobset["status"]["restarts"] >= 6, jobset["status"]
    assert template["resources"]["limits"]["memory"] == limit
    prep = get(cluster, "job", ns, f"{name}-prepare")
    assert prep["status"].get("succeeded") == 1
    prep_limit = prep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"]
    assert prep_limit != limit


@pytest.mark.parametrize("engine", ENGINES)
def test_a_checkpoint_volume_that_fills_up_fails_with_disk_full(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """A 6 MiB checkpoint disk: the preparation's data and the first full checkpoint (about 2.5 MB)
    fit, the second does not. The job fails DiskFull, the message says No space left (or the
    volume's bytes), and the first checkpoint stays complete on the volume."""
    name = "disk"
    doc = tiny_job(
        name,
        ns,
        **on(engine),
        **{"storage.storageClassName": SIZED_STORAGE_CLASS, "storage.size": "6Mi", "method": "full"},
    )
    doc["spec"].pop("lora", None)
    doc["spec"]["registration"].pop("mergeLora", None)
    doc["spec"]["training"].update(maxSteps=12, saveSteps=2, evalSteps=2, saveTotalLimit=2)
    apply_job(cluster, doc)
    with explained(cluster, ns, engine):
        ready = assert_failed_with(cluster, ns, name, Failure.DISK_FULL)
    message = ready["message"]
    assert "No space left" in message or ("free" in message and "used" in message), message
    folder = checkpoint_folder(cluster, ns, f"{name}-ckpt")
    assert os.path.ismount(folder)
    complete = sorted(p.parent.name for p in folder.glob("checkpoints/checkpoint-*/COMPLETE"))
    assert complete, sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("engine", ENGINES)
def test_a_diverging_loss_fails_with_loss_diverged(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """learningRate 1.0 (the most the spec allows), a full fine-tune of the tiny model, a loss logged
    every step: the loss jumps from ~7 to 18, 31, 49, 59 from step 4 on (checked with kubetune run
    --local); the watchdog stops the run and the job fails LossDiverged. (LoRA at this rate only
    sometimes diverges on the CPU: CI saw it train smoothly once.)"""
    name = "diverge"
    doc = tiny_job(name, ns, method="full", **on(engine))
    doc["spec"].pop("lora", None)
    doc["spec"]["training"].update(learningRate=1.0, loggingSteps=1, maxSteps=30, saveSteps=10, evalSteps=10)
    apply_job(cluster, doc)
    with explained(cluster, ns, engine):
        ready = assert_failed_with(cluster, ns, name, Failure.LOSS_DIVERGED)
    assert "loss" in ready["message"].lower(), ready


@pytest.mark.parametrize("engine", ENGINES)
def test_a_budget_of_seconds_ends_succeeded_registered_with_its_checkpoint(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """spec.budget.maxDuration 25s on a run planned for thousands of steps: the trainer saves and
    stops at the budget, the job Succeeds with BudgetReached, the model of the step it reached is
    registered (one version, tagged with the step, its checkpoint and the limit), the hard deadline
    sits on the running PyTorchJob (on a TrainJob: on its training Job), and the trainer's goodput
    is in the status."""
    name = "budget"
    doc = tiny_job(name, ns, **on(engine), **{"budget.maxDuration": "25s"})
    doc["spec"]["training"].update(maxSteps=100000, saveSteps=100000, evalSteps=100000)
    apply_job(cluster, doc)
    with explained(cluster, ns, engine):
        assert hard_deadline(cluster, ns, name, engine) >= 25 + 900
    with explained(cluster, ns, engine):
        status = wait_phase(cluster, ns, name, "Succeeded", timeout=FAIL_TIMEOUT)
    budget = condition(status, "BudgetReached")
    assert (budget.get("status"), budget.get("reason")) == ("True", "BudgetReached"), status
    reached = status["budget"]
    assert reached["reached"] is True and reached["limit"] == "maxDuration 25s"
    assert 0 < reached["step"] < reached["totalSteps"]
    assert f"step {reached['step']} of {reached['totalSteps']}" in budget["message"]
    model = f"{ns}-{name}"
    found = versions(mlflow_server, model)
    assert [v.version for v in found] == ["1"]
    tags = found[0].tags
    assert tags["kubetune.budget_reached"] == "maxDuration 25s"
    assert tags["kubetune.final.step"] == str(reached["step"])
    assert tags["kubetune.final.checkpoint"].endswith(f"checkpoint-{reached['step']}")
    goodput = status["goodput"]
    assert goodput["heldGpuSeconds"] >= 25 and 0 < goodput["productiveGpuSeconds"] < goodput["heldGpuSeconds"]
    assert goodput["restarts"] == 0
    assert run_health(ARGOCD_HEALTH, get(cluster, "finetunejobs", ns, name))["status"] == "Healthy"


def deadline_holder(name: str, engine: str) -> tuple[str, str, tuple[str, ...]]:
    """Where the operator sets a job's hard deadline: the PyTorchJob's runPolicy, a TrainJob's
    training Job's spec (made by its JobSet)."""
    if engine == "PyTorchJob":
        return "pytorchjob", f"{name}-train", ("spec", "runPolicy", "activeDeadlineSeconds")
    return "job", f"{name}-train-node-0", ("spec", "activeDeadlineSeconds")


def hard_deadline(cluster: Cluster, ns: str, name: str, engine: str) -> int:
    """The hard deadline the operator set once the pods ran (waited for)."""
    kind, holder, path = deadline_holder(name, engine)

    def deadline() -> int | None:
        value: Any = get(cluster, kind, ns, holder) or {}
        for key in path:
            value = (value or {}).get(key)
        return int(value) if value else None

    found: int = wait_for(deadline, 300, f"the hard deadline on {kind} {holder}", cluster)
    return found


# On PyTorchJob this passed once (10.6 s) and failed once (the cold .ci/run of 2026-12-07: the
# Training Operator v1.9.3 logged no reconcile of the PyTorchJob after the deadline was brought to
# now, and the job trained on for 480 s). Whether the Training Operator acts on a deadline set on a
# running PyTorchJob before anything else about it changes is open (the operator sets it only once
# the pods run): a possible product bug, to be found in its code, not hidden; until then the case
# runs and reports, and its failure does not fail the suite.
DEADLINE_ENGINES = [
    pytest.param(
        e,
        marks=pytest.mark.xfail(
            reason="the Training Operator may not act on a deadline set on a running PyTorchJob (open)",
            strict=False,
        ),
    )
    if e == "PyTorchJob"
    else e
    for e in ENGINES
]


@pytest.mark.parametrize("engine", DEADLINE_ENGINES)
def test_a_training_past_its_hard_deadline_fails_deadline_exceeded(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """spec.budget.maxDuration 1h on a run planned for thousands of steps: once the pods run the
    operator sets the hard deadline (1h + 15 min + the wait). The test then brings it to now, as if
    the trainer had hung that long, and the engine's real controllers end it: the Training Operator
    fails the PyTorchJob; on a TrainJob the Job controller fails its training Job (DeadlineExceeded),
    JobSet fails the JobSet at once by kubetune's rule (no restart: its catch-all would restart it)
    and Trainer the TrainJob. The job fails DeadlineExceeded, the message in the same shape on both
    engines, with its hint, a Warning event, no registration, Argo CD Degraded."""
    name = "deadline"
    doc = tiny_job(name, ns, **on(engine), **{"budget.maxDuration": "1h"})
    doc["spec"]["training"].update(maxSteps=100000, saveSteps=100000, evalSteps=100000)
    apply_job(cluster, doc)
    with explained(cluster, ns, engine):
        assert hard_deadline(cluster, ns, name, engine) >= 3600 + 900
        kind, holder, path = deadline_holder(name, engine)
        patch: dict[str, Any] = {path[-1]: 1}
        for key in reversed(path[:-1]):
            patch = {key: patch}
        cluster.kubectl("-n", ns, "patch", kind, holder, "--type=merge", "-p", json.dumps(patch))
        ready = assert_failed_with(cluster, ns, name, Failure.DEADLINE_EXCEEDED)
    assert "active longer than specified deadline" in ready["message"], ready
    if engine == "TrainJob":
        assert f"TrainJob {name}-train has failed because its Job {name}-train-node-0" in ready["message"]
        jobset = get(cluster, "jobset", ns, f"{name}-train")
        failed = [c for c in jobset["status"].get("conditions") or [] if c["type"] == "Failed"]
        assert [c["reason"] for c in failed] == ["FailJobSetFailurePolicyAction"], jobset["status"]
        assert not jobset["status"].get("restarts"), jobset["status"]
    else:
        assert f"Job {name}-train has failed" in ready["message"], ready


@pytest.mark.parametrize("engine", ENGINES)
def test_cuda_out_of_memory_is_retried_by_the_engine_with_a_leaner_layout(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """The CUDA out-of-memory error is the trainer's test hook (no GPU here); the rest is real: the
    trainer exits 142, the engine makes a new pod (the Training Operator by restartPolicy ExitCode;
    JobSet restarts its Jobs by kubetune's failure policy), the new attempt plans 4 rows x 2
    micro-steps and resumes from the checkpoint, and the job Succeeds; status.memoryRetries shows the
    retry, status.trainingRestarts the restart."""
    name = "oom-retry"
    doc = tiny_job(name, ns, **on(engine), env=[{"name": "KUBETUNE_FAULT_INJECT", "value": "cuda-oom:6:4"}])
    apply_job(cluster, doc)
    with explained(cluster, ns, engine):
        status = wait_phase(cluster, ns, name, "Succeeded", timeout=FAIL_TIMEOUT)
    retries = status.get("memoryRetries")
    assert retries == [
        {
            "attempt": 1,
            "step": 6,
            "before": "8 rows x 1 micro-steps, no recomputation",
            "after": "4 rows x 2 micro-steps, no recomputation",
        }
    ], status
    assert status["goodput"]["restarts"] == 1
    assert status["trainingRestarts"]["total"] == 1, status["trainingRestarts"]
    assert status["progress"]["step"] == 12
    if engine == "PyTorchJob":
        events = (get(cluster, "events", ns) or {}).get("items") or []
        assert any("exited with code 142" in e.get("message", "") for e in events)
    else:
        assert get(cluster, "jobset", ns, f"{name}-train")["status"]["restarts"] == 1
    assert [v.version for v in versions(mlflow_server, f"{ns}-{name}")] == ["1"]


@pytest.mark.parametrize("engine", ENGINES)
def test_an_image_no_node_can_pull_shows_while_the_job_waits(
    cluster: Cluster, ns: str, operator: OperatorProcess, engine: str
) -> None:
    """spec.image on a registry that does not resolve: the first pod (the preparation's) waits in
    ErrImagePull, as KWOK reports it for the kubelet; the job shows ImagePullFailed with the
    kubelet's words while it waits (Argo CD Degraded), and nothing GPU-sized is created."""
    name = "pull"
    apply_job(cluster, tiny_job(name, ns, **on(engine), image=UNPULLABLE_IMAGE))
    status = wait_for(
        lambda: (
            (s := (get(cluster, "finetunejobs", ns, name) or {}).get("status") or {})
            and condition(s, "Ready").get("reason") == "ImagePullFailed"
            and s
        ),
        180,
        "Ready=False ImagePullFailed",
        cluster,
    )
    assert status["phase"] == "Preparing"
    prepared = condition(status, "Prepared")
    assert (prepared["status"], prepared["reason"]) == ("False", "ImagePullFailed")
    assert "lookup registry.invalid: no such host" in prepared["message"]
    assert f"{name}-prepare" in prepared["message"]
    assert get(cluster, CHILD_KINDS[engine], ns, f"{name}-train") is None
    verdict = run_health(ARGOCD_HEALTH, get(cluster, "finetunejobs", ns, name))
    assert verdict["status"] == "Degraded" and "no such host" in verdict["message"], verdict
