"""The operator at scale: N FineTuneJobs applied at once, through Kueue, on the test cluster's fake nodes.

    .venv/bin/python hack/bench_operator_scale.py                 # N=500, as the Helm chart runs it
    .venv/bin/python hack/bench_operator_scale.py --jobs 20 --label smoke
    .venv/bin/python hack/bench_operator_scale.py --py-spy /tmp/pyspy/bin/py-spy   # and a profile

The cluster is tests/support/cluster.py's (API server, kube-controller-manager, kube-scheduler,
KWOK with 4 fake 8-GPU nodes of 96 CPUs each, the Training Operator, Kueue). The operator runs as
the chart's Deployment runs it: ``python -m kubetune_operator --all-namespaces --log-format=json``
(not verbose), with the chart's defaults for the settings (preparation on).

Every FineTuneJob is examples/tiny-local.yaml with ``resources.gpusPerNode: 1`` and
``resources.queueName`` set to a LocalQueue of the ClusterQueue ``gpu-cluster``, whose GPU quota is
set to the fake nodes' GPUs (``--quota-gpus``, 32): Kueue admits as many 1-GPU jobs as the nodes can
run and holds the rest suspended. So "first pod Running" exists only for admitted jobs; it is
measured for those and their number is reported.

Each job goes the whole way the operator takes it: its preparation Job (created by the operator, its
pod by the Job controller, scheduled by the scheduler, started by KWOK), then its PyTorchJob once the
Job is Complete and its pod's termination message holds a preparation report.

**What is real and what is stood in.** One preparation runs for real, before the burst and before
the operator's CPU is counted: the same manifest in namespace ``bench-reference``, where the pod
runner (tests/support/podrunner.py) runs pods, so ``python -m kubetune_trainer.prepare`` runs on the
tiny model and data as the cluster tests run it (the trainer image stood in as there), and the
operator folds its report into the job's status (condition Prepared True, checked). That namespace
has no LocalQueue of the benchmark's queue, so Kueue keeps its PyTorchJob suspended and nothing
trains; the job is then deleted. In the benchmark's own namespace the pod runner is off (N
processes of torch on two cores would measure the machine, not the operator), so KWOK keeps pods
Running and nothing would end a preparation pod. **Stood in**: each benchmark job's preparation
pod is ended by ``PreparationStandIn`` as the pod runner ends a pod whose process exited
(``podrunner.exit_status``: phase Succeeded, exit code 0, the termination message), with the real
report's message, as long after KWOK started it as the real pod ran (``--prepare-seconds``
overrides). The operator checks a report only against its schema
(``kubetune_api.preparation.parse_termination_message``, read in ``observations.preparation_observation``):
no hash, path or key is compared with the job, and every job here has the same model, data and
settings, hence the same tokenized key; the hashes are checked by the trainer against the volume's
manifest, and no trainer runs here. What the stand-in leaves out: the files a preparation writes on
each job's volume, and its CPU and memory on the nodes (a burst of real preparations would also
load the machine).

What is measured, per job, from watch events received by a separate watcher process and stamped
with the machine's monotonic clock (creationTimestamp has a resolution of one second), each from the
FineTuneJob's ADDED event:

* ``ptj_s``: until its PyTorchJob's ADDED event: the preparation's time included;
* ``prepared_to_ptj_s``: from its preparation Job's Complete (the Job controller's) to its
  PyTorchJob: the operator's part after preparation;
* ``to_preparation_pod_s``, ``to_preparation_running_s``, ``to_preparation_complete_s``: until its
  preparation pod exists, is Running, its Job is Complete;
* ``admitted_s``: -> the PyTorchJob's first event with ``runPolicy.suspend`` false (Kueue admitted it);
* ``running_s``: -> the first event of its master pod with ``status.phase`` Running.

And how many jobs reached each stage (``stages``), the most preparation pods on a node and waiting
for one at once (``preparation_pods_at_once``), the operator process's CPU seconds (utime + stime
from /proc/<pid>/stat, from when it was idle and ready to when the run ends) and peak RSS (VmHWM of
/proc/<pid>/status); the time from the first FineTuneJob's ADDED event until every PyTorchJob
existed; the load average at start and end. The result goes to ``--out`` (JSON, one entry per run
label, merged into what is there).

**It fails loudly** (exit code 1, ``FAILED: ...`` on stderr, ``problems`` in the JSON) when no job
has its training child ``--first-child-within`` seconds after the last apply, when no job reaches a
further stage for ``--stall-after`` seconds, or at the end when fewer than all jobs reached their
training child (nothing but the preparation holds a job before it) or fewer than all the jobs Kueue
admitted had their master pod Running. The pod runner needs root and ``unshare`` (mount
namespaces), as the cluster tests do.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import yaml  # noqa: E402

API_VERSION = "kubetune.io/v1alpha1"
QUEUE = "bench-queue"
# The operator's labels on children (kubetune_operator.builders: LABEL_JOB, LABEL_COMPONENT, COMPONENT_PREPARATION)
LABEL_JOB = "kubetune.io/job"
LABEL_COMPONENT = "app.kubernetes.io/component"
PREPARATION = "preparation"
# where the one real preparation runs (the pod runner runs pods here, and only here)
REFERENCE_NAMESPACE = "bench-reference"
REFERENCE_JOB = "reference"


def _default_assets() -> None:
    """Use the built binaries in the cache (never start a build from a benchmark)."""
    cache = Path.home() / ".cache" / "kubetune" / "assets"
    if not os.environ.get("KUBEBUILDER_ASSETS"):
        found = sorted(cache.glob("k8s-*"))
        if found:
            os.environ["KUBEBUILDER_ASSETS"] = str(found[-1])
    if not os.environ.get("KUBETUNE_CLUSTER_ASSETS"):
        found = sorted(cache.glob("cluster-*"))
        if found:
            os.environ["KUBETUNE_CLUSTER_ASSETS"] = str(found[-1])


# --- the watcher (a process of its own, so the benchmark's other threads never delay a stamp) ----------


def watch_main(kubeconfig: str, namespace: str, out: str) -> None:
    from kubernetes import client, config, watch

    api = config.new_client_from_config(kubeconfig)
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)
    lock = threading.Lock()
    sink = Path(out).open("a", buffering=1)  # noqa: SIM115  (closed when the process ends)
    batch = client.BatchV1Api(api)
    ready = threading.Barrier(5)

    def record(kind: str, kind_type: str, obj: dict[str, Any]) -> None:
        t = time.monotonic()
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        row: dict[str, Any] = {"t": t, "kind": kind, "type": kind_type, "name": meta.get("name")}
        if kind == "FineTuneJob":
            row["phase"] = (obj.get("status") or {}).get("phase")
        elif kind == "PyTorchJob":
            row["job"] = labels.get("kubetune.io/job")
            row["suspend"] = bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))
        elif kind == "Job":
            row["job"] = labels.get(LABEL_JOB)
            row["component"] = labels.get(LABEL_COMPONENT)
            conditions = ((obj.get("status") or {}).get("conditions")) or []
            row["complete"] = any(
                c.get("type") == "Complete" and c.get("status") == "True" for c in conditions
            )
            row["failed"] = any(c.get("type") == "Failed" and c.get("status") == "True" for c in conditions)
        else:
            row["ptj"] = labels.get("training.kubeflow.org/job-name")
            row["role"] = labels.get("training.kubeflow.org/replica-type")
            row["job"] = labels.get(LABEL_JOB)
            row["component"] = labels.get(LABEL_COMPONENT)
            row["phase"] = (obj.get("status") or {}).get("phase")
            row["node"] = (obj.get("spec") or {}).get("nodeName")
        with lock:
            sink.write(json.dumps(row) + "\n")

    def follow(kind: str, lister: Any, *args: Any) -> None:
        first = True
        while True:
            listed = lister(*args, _preload_content=False)
            body = json.loads(listed.data)
            for item in body.get("items") or []:
                record(kind, "LISTED", item)
            rv = body["metadata"]["resourceVersion"]
            if first:
                ready.wait(timeout=300)
                first = False
            w = watch.Watch()
            try:
                stream = w.stream(lister, *args, resource_version=rv, timeout_seconds=3600, deserialize=False)
                for event in stream:  # plain JSON: no model classes to build
                    record(kind, event["type"], event["object"])
            except client.ApiException as e:
                if e.status != 410:
                    raise

    threads = [
        (
            "FineTuneJob",
            custom.list_namespaced_custom_object,
            "kubetune.io",
            "v1alpha1",
            namespace,
            "finetunejobs",
        ),
        ("PyTorchJob", custom.list_namespaced_custom_object, "kubeflow.org", "v1", namespace, "pytorchjobs"),
        ("Pod", core.list_namespaced_pod, namespace),
        ("Job", batch.list_namespaced_job, namespace),
    ]
    for kind, lister, *args in threads:
        threading.Thread(target=follow, args=(kind, lister, *args), daemon=True).start()
    ready.wait(timeout=300)
    print("ready", flush=True)
    while True:
        time.sleep(3600)


# --- the operator process -------------------------------------------------------------------------------


def proc_usage(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) and memory of a live process, from /proc."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    tick = os.sysconf("SC_CLK_TCK")
    cpu = (int(fields[11]) + int(fields[12])) / tick  # utime, stime (fields 14 and 15)
    mem: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            mem[key] = int(value.split()[0]) / 1024  # kB -> MiB
        elif key == "Threads":
            mem[key] = int(value)
    return {"cpu_s": cpu, "rss_mib": mem.get("VmRSS", 0.0), "hwm_mib": mem.get("VmHWM", 0.0),
            "threads": mem.get("Threads", 0)}  # fmt: skip


def start_operator(kubeconfig: Path, log: Path, port: int, source: Path | None) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        # the chart's defaults for everything else (resync 300 s, retry 15 s)
        "KUBETUNE_TRAINER_IMAGE": "ghcr.io/kubetune/trainer:bench",
        # never called: registration starts only after training, and nothing trains here
        "KUBETUNE_MLFLOW_TRACKING_URI": "http://127.0.0.1:9/",
    }
    env.pop("KUBETUNE_NAMESPACES", None)
    if source is not None:  # another copy of the operator (and the API package), e.g. a git archive
        paths = [str(source / "operator"), str(source / "api"), env.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubetune_operator",
            "--all-namespaces",
            "--log-format=json",
            f"--liveness=http://127.0.0.1:{port}/healthz",
        ],
        env=env,
        cwd=REPO,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def wait_healthy(proc: subprocess.Popen[bytes], port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the operator exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError("the operator's liveness endpoint never answered")


def stop(proc: subprocess.Popen[Any] | None, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


# --- preparation: one real, the others stood in -------------------------------------------------------


def tiny_image(folder: Path) -> Path:
    """What the trainer image carries under /opt/kubetune/tiny (tests/cluster/conftest.py's
    ``tiny_image``), built by a process of its own: this one stays free of torch."""
    subprocess.run(
        [sys.executable, "-m", "kubetune_trainer.tiny", "--assets", str(folder)],
        check=True,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
    )
    for p in [folder, *folder.rglob("*")]:
        p.chmod(p.stat().st_mode | 0o055)  # readable by the pods' non-root user
    return folder


def real_preparation(cluster: Any, timeout: float) -> dict[str, Any]:
    """Run one job's preparation for real and return what its pod reported.

    The job is the benchmark's own manifest (``job_manifest``) in REFERENCE_NAMESPACE, where the
    pod runner runs pods: the operator creates its preparation Job, the Job controller its pod, the
    pod runner runs ``python -m kubetune_trainer.prepare`` on the tiny model and data. There is no
    LocalQueue of QUEUE in that namespace, so Kueue keeps its PyTorchJob suspended: nothing trains.
    Once the operator has folded the report into the job's status (condition Prepared True), the
    job is deleted."""
    from kubernetes import client, config

    from kubetune_api.preparation import PreparationReport, parse_termination_message

    ns = REFERENCE_NAMESPACE
    cluster.kubectl("create", "namespace", ns)
    assert cluster.runner is not None
    cluster.runner.namespaces = {ns}
    cluster.apply(job_manifest(REFERENCE_JOB, ns))
    core = client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig)))
    selector = f"{LABEL_JOB}={REFERENCE_JOB},{LABEL_COMPONENT}={PREPARATION}"
    deadline = time.monotonic() + timeout
    terminated: dict[str, Any] | None = None
    while terminated is None:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"the reference preparation did not end in {timeout:.0f} s; {cluster.runner.errors}"
            )
        cluster.check_alive()
        for pod in core.list_namespaced_pod(ns, label_selector=selector).items:
            for cs in (pod.status.container_statuses or []) if pod.status else []:
                if cs.state and cs.state.terminated:
                    t = cs.state.terminated
                    terminated = {"exit_code": t.exit_code, "message": t.message or "",
                                  "started": t.started_at, "finished": t.finished_at}  # fmt: skip
        time.sleep(1)
    report = parse_termination_message(terminated["message"])
    if terminated["exit_code"] != 0 or not isinstance(report, PreparationReport):
        raise RuntimeError(
            f"the reference preparation failed (exit code {terminated['exit_code']}): {terminated['message'][-2000:]}"
        )
    while True:  # the operator accepted the report: Prepared True on the job
        job = json.loads(cluster.kubectl("get", "finetunejob", REFERENCE_JOB, "-n", ns, "-o", "json").stdout)
        conditions = (job.get("status") or {}).get("conditions") or []
        if any(c.get("type") == "Prepared" and c.get("status") == "True" for c in conditions):
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"the operator never marked the reference job Prepared: {conditions}")
        time.sleep(1)
    cluster.kubectl("delete", "finetunejob", REFERENCE_JOB, "-n", ns, "--wait", "--timeout=120s", check=False)
    return {
        "message": terminated["message"],
        "pod_seconds": (terminated["finished"] - terminated["started"]).total_seconds(),
        "report_seconds": report.seconds,
        "tokenized_key": report.tokenized_key,
        "summary": report.summary(),
    }


class PreparationStandIn:
    """Ends each benchmark job's preparation pod as the pod runner ends one whose process exited:
    the status a kubelet writes (``podrunner.exit_status``), exit code 0 and ``message`` (the
    reference's real report) as the termination message, ``hold`` seconds after the node (KWOK)
    reported its container running: as long as the real one ran."""

    def __init__(self, kubeconfig: Path, namespace: str, message: str, hold: float) -> None:
        from kubernetes import client, config

        self.core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
        self.namespace, self.message, self.hold = namespace, message, hold
        self.errors: list[str] = []
        self.ended = 0
        self._due: list[tuple[float, str, str, list[tuple[str, str]], str]] = []
        self._seen: set[str] = set()
        self._ready = threading.Condition()
        self._stop = threading.Event()

    def start(self) -> None:
        for target in (self._watch, self._end_due):
            threading.Thread(target=self._guard(target), daemon=True, name=target.__name__).start()

    def stop(self) -> None:
        self._stop.set()
        with self._ready:
            self._ready.notify_all()

    def _guard(self, fn: Any) -> Any:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    fn()
                except Exception as e:  # reported with the result; the run goes on
                    self.errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                    time.sleep(0.5)

        return run

    def _watch(self) -> None:
        from kubernetes import watch
        from tests.support.podrunner import node_started, now

        w = watch.Watch()
        selector = f"{LABEL_COMPONENT}={PREPARATION}"
        for event in w.stream(
            self.core.list_namespaced_pod, self.namespace, label_selector=selector, timeout_seconds=60
        ):
            pod = event["object"]
            if self._stop.is_set():
                return
            if pod.metadata.uid in self._seen or pod.metadata.deletion_timestamp or not node_started(pod):
                continue
            self._seen.add(pod.metadata.uid)
            running = [cs.state.running.started_at for cs in pod.status.container_statuses or []]
            started = running[0].strftime("%Y-%m-%dT%H:%M:%SZ") if running and running[0] else now()
            containers = [(c.name, c.image) for c in pod.spec.containers]
            item = (time.monotonic() + self.hold, pod.metadata.name, pod.metadata.uid, containers, started)
            with self._ready:
                heapq.heappush(self._due, item)
                self._ready.notify()

    def _end_due(self) -> None:
        from tests.support.podrunner import exit_status

        with self._ready:
            while not self._stop.is_set() and (not self._due or self._due[0][0] > time.monotonic()):
                self._ready.wait(timeout=(self._due[0][0] - time.monotonic()) if self._due else 1.0)
            if self._stop.is_set():
                return
            _, name, _uid, containers, started = heapq.heappop(self._due)
        body = exit_status(containers, 0, self.message, started=started)
        self.core.patch_namespaced_pod_status(name, self.namespace, body)
        self.ended += 1


# --- the jobs -------------------------------------------------------------------------------------------


def job_manifest(name: str, namespace: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "tiny-local.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["resources"] = {"gpusPerNode": 1, "queueName": QUEUE}
    doc["spec"]["registration"]["modelName"] = f"{namespace}-{name}"
    doc["spec"]["registration"]["experiment"] = f"kubetune/{namespace}"
    return doc


def apply_jobs(kubectl: list[str], folder: Path, docs: list[dict[str, Any]], parallel: int) -> float:
    """kubectl apply -f of multi-document files (``parallel`` of them at once); seconds it took."""
    files = []
    for i in range(parallel):
        part = docs[i::parallel]
        if part:
            path = folder / f"jobs-{i}.yaml"
            path.write_text(yaml.safe_dump_all(part))
            files.append(path)
    t0 = time.monotonic()
    procs = [
        subprocess.Popen([*kubectl, "apply", "-f", str(f)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        for f in files
    ]
    for p in procs:
        _, err = p.communicate(timeout=1800)
        if p.returncode != 0:
            raise RuntimeError(f"kubectl apply failed ({p.returncode}): {err.decode()[-2000:]}")
    return time.monotonic() - t0


# --- analysis -------------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))  # ceil
    return ordered[int(rank) - 1]


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "count": len(values),
        "p50": _r(percentile(values, 50)),
        "p95": _r(percentile(values, 95)),
        "max": _r(max(values) if values else None),
        "mean": _r(statistics.fmean(values) if values else None),
    }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


# The stages a job goes through, in order: what ``analyse`` counts and ``verdict`` checks.
STAGES = (
    "applied",  # its FineTuneJob seen
    "preparation_pod_created",  # the operator's preparation Job, the Job controller's pod
    "preparation_pod_running",  # scheduled, and KWOK reports it running
    "preparation_pod_succeeded",  # ended with the real report (the stand-in)
    "preparation_complete",  # the Job controller marked the Job Complete
    "training_child_created",  # the operator created its PyTorchJob
    "admitted_by_kueue",
    "master_pod_running",
)


def stage_times(rows: list[dict[str, Any]], names: set[str]) -> dict[str, dict[str, float]]:
    """For each stage, the time each job first reached it (watch events, in the order received)."""
    at: dict[str, dict[str, float]] = {stage: {} for stage in STAGES}

    def reach(stage: str, job: str | None, t: float) -> None:
        if job in names:
            at[stage].setdefault(job, t)

    for row in rows:
        t, kind = row["t"], row["kind"]
        if kind == "FineTuneJob":
            reach("applied", row["name"], t)
        elif kind == "PyTorchJob":
            reach("training_child_created", row.get("job"), t)
            if not row["suspend"]:
                reach("admitted_by_kueue", row.get("job"), t)
        elif kind == "Job" and row.get("component") == PREPARATION and row.get("complete"):
            reach("preparation_complete", row.get("job"), t)
        elif kind == "Pod" and row.get("component") == PREPARATION:
            reach("preparation_pod_created", row.get("job"), t)
            if row.get("phase") == "Running":
                reach("preparation_pod_running", row.get("job"), t)
            elif row.get("phase") == "Succeeded":
                reach("preparation_pod_succeeded", row.get("job"), t)
        elif kind == "Pod" and row.get("phase") == "Running" and row.get("role") == "master":
            reach("master_pod_running", (row.get("ptj") or "").removesuffix("-train"), t)
    return at


def preparation_pods_at_once(rows: list[dict[str, Any]]) -> dict[str, int]:
    """The most preparation pods at once that were on a node and not ended, and that waited for one."""
    state: dict[str, str] = {}
    most = {"bound": 0, "unscheduled": 0}
    for row in sorted(rows, key=lambda r: r["t"]):  # the watcher's threads interleave
        if row["kind"] != "Pod" or row.get("component") != PREPARATION:
            continue
        if row["type"] == "DELETED" or row.get("phase") in ("Succeeded", "Failed"):
            state.pop(row["name"], None)
        else:
            state[row["name"]] = "bound" if row.get("node") else "unscheduled"
        for key, highest in most.items():
            most[key] = max(highest, sum(1 for v in state.values() if v == key))
    return most


def analyse(rows: list[dict[str, Any]], names: set[str]) -> dict[str, Any]:
    at = stage_times(rows, names)
    ftj, ptj = at["applied"], at["training_child_created"]
    admitted, running, prepared = (
        at["admitted_by_kueue"],
        at["master_pod_running"],
        at["preparation_complete"],
    )

    def between(a: dict[str, float], b: dict[str, float]) -> dict[str, Any]:
        return summary([b[n] - a[n] for n in b if n in a])

    start = min(ftj.values()) if ftj else None
    result: dict[str, Any] = {
        "stages": {stage: len(at[stage]) for stage in STAGES},
        "finetunejobs_seen": len(ftj),
        "pytorchjobs_created": len(ptj),
        "admitted_by_kueue": len(admitted),
        "master_pods_running": len(running),
        "ptj_s": between(ftj, ptj),
        "admitted_s": between(ftj, admitted),
        "running_s": between(ftj, running),
        # the path in parts: the operator and the Job controller's, the scheduler's and KWOK's, the
        # preparation's (stood in), the Job controller's, then the operator's again
        "to_preparation_pod_s": between(ftj, at["preparation_pod_created"]),
        "to_preparation_running_s": between(ftj, at["preparation_pod_running"]),
        "to_preparation_complete_s": between(ftj, prepared),
        "prepared_to_ptj_s": between(prepared, ptj),
        # the same admitted jobs, split: Kueue's part, then the Training Operator's, scheduler's, KWOK's
        "ptj_to_admitted_s": between(ptj, admitted),
        "admitted_to_running_s": between(admitted, running),
        "preparation_pods_at_once": preparation_pods_at_once(rows),
        "apply_spread_s": _r(max(ftj.values()) - start) if start is not None else None,
        "all_pytorchjobs_after_s": _r(max(ptj.values()) - start) if start is not None and ptj else None,
    }
    return result


# --- did it progress ------------------------------------------------------------------------------------


def stalled(
    now: float,
    applied_at: float,
    stages: dict[str, int],
    last_progress_at: float,
    *,
    first_child_within: float,
    stall_after: float,
) -> str | None:
    """Why to stop waiting before the timeout, or None: no job reached its training child within
    ``first_child_within`` seconds of the last apply, or no stage count grew for ``stall_after``."""
    if not stages.get("training_child_created") and now - applied_at > first_child_within:
        return (
            f"no job reached its training child within {first_child_within:.0f} s after the last apply "
            f"(stages: {_stages_text(stages)})"
        )
    if now - last_progress_at > stall_after:
        return f"no job reached a further stage for {stall_after:.0f} s (stages: {_stages_text(stages)})"
    return None


def verdict(stages: dict[str, int], jobs: int) -> list[str]:
    """What did not happen that should have: every job through its preparation to its training child
    (none is held before that: Kueue admits only the training object), and every job Kueue admitted
    to its master pod Running. Empty: all did."""
    problems = []
    for stage in STAGES[: STAGES.index("training_child_created") + 1]:
        if stages.get(stage, 0) < jobs:
            problems.append(f"only {stages.get(stage, 0)} of {jobs} jobs reached {stage}")
            break  # the first stage short says where they stopped
    admitted, running = stages.get("admitted_by_kueue", 0), stages.get("master_pod_running", 0)
    if not admitted:
        problems.append("Kueue admitted no job")
    elif running < admitted:
        problems.append(f"only {running} of the {admitted} jobs Kueue admitted had their master pod Running")
    return problems


def _stages_text(stages: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in stages.items())


# --- the run --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    _default_assets()
    from tests.support.cluster import CLUSTER_QUEUE, running_cluster
    from tests.support.controlplane import free_port

    from kubetune_trainer.tiny import TINY_ROOT

    load_start = os.getloadavg()
    wall_start = time.time()
    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-", dir="/var/tmp"))
    events = work / "events.jsonl"
    operator_log = work / "operator.log"
    watcher: subprocess.Popen[str] | None = None
    operator: subprocess.Popen[bytes] | None = None
    spy: subprocess.Popen[bytes] | None = None
    stand_in: PreparationStandIn | None = None
    samples: list[dict[str, float]] = []
    tiny = tiny_image(work / "tiny")
    t_cluster = time.monotonic()
    with running_cluster({TINY_ROOT: tiny}) as cluster:
        try:
            cluster_start_s = time.monotonic() - t_cluster
            ns = args.namespace
            cluster.kubectl("create", "namespace", ns)
            cluster.local_queue(ns, QUEUE)
            if args.quota_gpus is not None:
                patch = [
                    {
                        "op": "replace",
                        "path": "/spec/resourceGroups/0/flavors/0/resources/2/nominalQuota",
                        "value": str(args.quota_gpus),
                    }
                ]
                cluster.kubectl(
                    "patch", "clusterqueue", CLUSTER_QUEUE, "--type=json", "-p", json.dumps(patch)
                )
            watcher = subprocess.Popen(
                [sys.executable, __file__, "--watch", str(cluster.kubeconfig), ns, str(events)],
                stdout=subprocess.PIPE,
                text=True,
                cwd=REPO,
            )
            assert watcher.stdout is not None
            if watcher.stdout.readline().strip() != "ready":
                raise RuntimeError("the watcher did not start")
            port = free_port()
            operator = start_operator(cluster.kubeconfig, operator_log, port, args.operator_source)
            wait_healthy(operator, port, 120)
            t_reference = time.monotonic()
            reference = real_preparation(cluster, args.reference_timeout)
            reference["took_s"] = _r(time.monotonic() - t_reference)
            hold = reference["pod_seconds"] if args.prepare_seconds is None else args.prepare_seconds
            stand_in = PreparationStandIn(cluster.kubeconfig, ns, reference["message"], hold)
            stand_in.start()
            time.sleep(args.settle)  # its watches established, start-up work done
            before = proc_usage(operator.pid)
            if args.py_spy:
                spy = subprocess.Popen(
                    [args.py_spy, "record", "--pid", str(operator.pid), "--rate", "20", "--format", "raw",
                     "--output", str(work / "profile.txt"), "--nonblocking"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )  # fmt: skip
            names = [f"bench-{i:04d}" for i in range(args.jobs)]
            docs = [job_manifest(n, ns) for n in names]
            kubectl = [str(cluster.cp.assets / "kubectl"), "--kubeconfig", str(cluster.kubeconfig)]
            load_apply = os.getloadavg()
            sampler_stop = threading.Event()

            def sample() -> None:
                while not sampler_stop.is_set():
                    if operator is not None and operator.poll() is None:
                        samples.append({"t": time.monotonic(), **proc_usage(operator.pid)})
                    sampler_stop.wait(1.0)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            t_apply = time.monotonic()
            apply_s = apply_jobs(kubectl, work, docs, args.apply_parallel)
            # until every PyTorchJob exists and every job Kueue admitted has its master Running; or
            # until nothing progresses (stalled)
            applied_at = time.monotonic()
            deadline = applied_at + args.timeout
            wanted = set(names)
            done_at: float | None = None
            stall: str | None = None
            last_stages: dict[str, int] = {}
            last_progress_at = applied_at
            while time.monotonic() < deadline:
                cluster.check_alive()
                if operator.poll() is not None:
                    raise RuntimeError(f"the operator exited ({operator.returncode})")
                rows = [json.loads(line) for line in events.read_text().splitlines() if line]
                a = analyse(rows, wanted)
                if a["stages"] != last_stages:
                    last_stages, last_progress_at = a["stages"], time.monotonic()
                stall = stalled(
                    time.monotonic(),
                    applied_at,
                    a["stages"],
                    last_progress_at,
                    first_child_within=args.first_child_within,
                    stall_after=args.stall_after,
                )
                if stall:
                    break
                if (
                    a["pytorchjobs_created"] == len(wanted)
                    and a["master_pods_running"] >= a["admitted_by_kueue"]
                ):
                    done_at = done_at or time.monotonic()
                    if time.monotonic() - done_at >= args.settle:  # nothing more to come
                        break
                else:
                    done_at = None
                time.sleep(2)
            after, t_after = proc_usage(operator.pid), time.monotonic()
            steady = None
            if args.steady_seconds and done_at is not None:
                steady = steady_state(operator.pid, events, wanted, args.steady_seconds)
            sampler_stop.set()
            sampler.join(timeout=5)
            load_end = os.getloadavg()
            if spy is not None:
                spy.send_signal(signal.SIGINT)  # py-spy writes its profile on SIGINT
                spy.wait(timeout=60)
            rows = [json.loads(line) for line in events.read_text().splitlines() if line]
            result = analyse(rows, wanted)
            phases: dict[str, int] = {}
            last_phase: dict[str, str | None] = {}
            for row in rows:
                if row["kind"] == "FineTuneJob" and row["name"] in wanted:
                    last_phase[row["name"]] = row.get("phase")
            for p in last_phase.values():
                phases[str(p)] = phases.get(str(p), 0) + 1
            busy = [s for s in samples if s["t"] >= t_apply]
            result.update(
                {
                    "label": args.label,
                    "jobs": args.jobs,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %z", time.localtime(wall_start)),
                    "scope": "--all-namespaces (the chart's default)",
                    "operator_source": _source(args.operator_source),
                    "apply": f"kubectl apply -f, {args.apply_parallel} file(s) at once",
                    "apply_s": _r(apply_s),
                    "quota_gpus": args.quota_gpus,
                    "finetunejob_phases_at_end": phases,
                    "timed_out": done_at is None and stall is None,
                    "preparation": {
                        "real": "one job's, run by the pod runner in namespace "
                        f"{REFERENCE_NAMESPACE} (the tiny model and data, as tests/cluster run it)",
                        "real_pod_seconds": reference["pod_seconds"],
                        "real_report_seconds": reference["report_seconds"],
                        "real_report": reference["summary"],
                        "tokenized_key": reference["tokenized_key"],
                        "reference_took_s": reference["took_s"],
                        "stood_in": "each benchmark job's pod ended by the stand-in with that report, "
                        f"{hold:.0f} s after KWOK ran it",
                        "stood_in_pods_ended": stand_in.ended,
                        "stand_in_errors": stand_in.errors[:5],
                    },
                    "operator": {
                        "cpu_s_during_run": _r(after["cpu_s"] - before["cpu_s"]),
                        "cpu_s_total": _r(after["cpu_s"]),
                        "run_s": _r(t_after - t_apply),  # the steady window not included
                        "peak_rss_mib": _r(after["hwm_mib"]),
                        "rss_mib_idle_before": _r(before["rss_mib"]),
                        "rss_mib_at_end": _r(after["rss_mib"]),
                        "threads_max": max((s["threads"] for s in busy), default=after["threads"]),
                        "cpu_busiest_10s": _busiest(busy, 10),
                    },
                    "machine": {
                        "cpus": os.cpu_count(),
                        "loadavg_start": [round(x, 2) for x in load_start],
                        "loadavg_at_apply": [round(x, 2) for x in load_apply],
                        "loadavg_end": [round(x, 2) for x in load_end],
                        "cluster_start_s": _r(cluster_start_s),
                    },
                    "steady_state": steady,
                    "goals": {"p50_ptj_s": 1.0, "p95_ptj_s": 3.0, "peak_rss_mib": 250},
                }
            )
            problems = verdict(result["stages"], args.jobs)
            if stall:
                problems.insert(0, f"stopped waiting: {stall}")
            elif done_at is None:
                problems.insert(0, f"timed out after {args.timeout:.0f} s")
            result["problems"] = problems
            result["goals_met"] = {
                "p50": (result["ptj_s"]["p50"] or 1e9) <= 1.0,
                "p95": (result["ptj_s"]["p95"] or 1e9) <= 3.0,
                "rss": result["operator"]["peak_rss_mib"] <= 250,
            }
            if spy is not None:
                result["profile"] = top_frames(work / "profile.txt")
            errors, temporary = log_errors(operator_log.read_text(errors="replace"))
            result["operator_errors"] = len(errors)
            result["operator_error_sample"] = errors[:3]
            result["operator_temporary_errors"] = temporary
            if args.keep:
                result["workdir"] = str(work)
            return result
        finally:
            if stand_in is not None:
                stand_in.stop()
            stop(spy, signal.SIGINT)
            stop(operator)
            stop(watcher)
            if not args.keep:
                import shutil

                shutil.rmtree(work, ignore_errors=True)


def steady_state(pid: int, events: Path, names: set[str], seconds: float) -> dict[str, Any]:
    """The operator's CPU over ``seconds`` once every job is where it stays (its PyTorchJob made, held
    by Kueue or its master Running, nothing more coming): what N existing jobs cost when nothing
    changes. Over the re-sync interval (300 s by default) the window holds every job's re-sync once;
    the watch events of the jobs and their children in the window say whether anything changed."""
    rows_before = sum(1 for _ in events.open())
    before, t0 = proc_usage(pid), time.monotonic()
    time.sleep(seconds)
    after, elapsed = proc_usage(pid), time.monotonic() - t0
    rows = [json.loads(line) for line in events.read_text().splitlines()[rows_before:] if line]
    kinds: dict[str, int] = {}
    for row in rows:
        kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
    cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "jobs": len(names),
        "window_s": _r(elapsed),
        "cpu_s": _r(cpu),
        "cpu_s_per_minute": _r(cpu * 60 / elapsed),
        "cores": _r(cpu / elapsed),
        "rss_mib_at_end": _r(after["rss_mib"]),
        "watch_events_in_window": kinds,
    }


def log_errors(text: str) -> tuple[list[str], int]:
    """The operator's errors in its JSON log (kopf's ``severity``), and apart from them how many
    were a handler's temporary error (kopf logs ``failed temporarily`` at error level: a retry)."""
    errors: list[str] = []
    temporary = 0
    for line in text.splitlines():
        if "failed temporarily" in line or "will retry" in line:
            temporary += 1
        elif '"severity": "error"' in line or '"severity": "critical"' in line or "Traceback" in line:
            errors.append(line)
    return errors, temporary


def _source(source: Path | None) -> str:
    if source is None:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], check=False, cwd=REPO, capture_output=True, text=True
        )
        return f"the working tree (HEAD {head.stdout.strip()})"
    note = source / "SOURCE"
    return f"{source}: {note.read_text().strip()}" if note.exists() else str(source)


def _busiest(samples: list[dict[str, float]], window: float) -> float | None:
    """The operator's highest CPU use over any ``window`` seconds, in cores."""
    best = None
    j = 0
    for i, s in enumerate(samples):
        while j < i and s["t"] - samples[j]["t"] > window:
            j += 1
        if s["t"] - samples[j]["t"] >= window * 0.8:
            rate = (s["cpu_s"] - samples[j]["cpu_s"]) / (s["t"] - samples[j]["t"])
            best = rate if best is None else max(best, rate)
    return _r(best)


def top_frames(path: Path, limit: int = 15) -> dict[str, Any]:
    """py-spy's raw (collapsed) stacks: the share of samples each function is on the stack (inclusive),
    and the leaf functions where the samples land (exclusive)."""
    if not path.exists():
        return {}
    inclusive: dict[str, int] = {}
    exclusive: dict[str, int] = {}
    total = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        total += count
        frames = [f.split(" (")[0] + " " + f.split(" (")[-1].split(":")[0].rsplit("/", 1)[-1] if " (" in f else f
                  for f in stack.split(";")]  # fmt: skip
        frames = [f.rstrip(")") for f in frames]
        for f in set(frames[1:]):  # the first frame is the thread
            inclusive[f] = inclusive.get(f, 0) + count
        exclusive[frames[-1]] = exclusive.get(frames[-1], 0) + count

    def top(d: dict[str, int]) -> list[list[Any]]:
        return [[k, round(100 * v / total, 1)] for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:limit]]

    return {"samples": total, "inclusive_pct": top(inclusive), "exclusive_pct": top(exclusive)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=500, help="FineTuneJobs applied at once (500)")
    parser.add_argument("--namespace", default="bench")
    parser.add_argument(
        "--quota-gpus", type=int, default=32, help="the ClusterQueue's GPU quota (32: the nodes')"
    )
    parser.add_argument("--apply-parallel", type=int, default=1, help="kubectl apply processes at once (1)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds to wait after the apply")
    parser.add_argument(
        "--first-child-within",
        type=float,
        default=300,
        help="fail when no job has its training child this many seconds after the last apply (300)",
    )
    parser.add_argument(
        "--stall-after",
        type=float,
        default=300,
        help="fail when no job reaches a further stage for this many seconds (300)",
    )
    parser.add_argument(
        "--prepare-seconds",
        type=float,
        default=None,
        help="how long each stood-in preparation pod runs (default: as long as the real one ran)",
    )
    parser.add_argument(
        "--reference-timeout", type=float, default=600, help="seconds for the one real preparation (600)"
    )
    parser.add_argument(
        "--steady-seconds",
        type=float,
        default=0,
        help="then measure the operator's CPU this long with nothing changing (0: not; 300: one re-sync)",
    )
    parser.add_argument("--settle", type=float, default=5, help="quiet seconds before and after")
    parser.add_argument("--py-spy", metavar="PATH", help="profile the operator with this py-spy binary")
    parser.add_argument(
        "--operator-source",
        type=Path,
        metavar="DIR",
        help="run the operator from DIR/operator and DIR/api (e.g. `git archive HEAD operator api`)",
    )
    parser.add_argument("--label", default="run", help="the name of this run in the JSON result")
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks-operator-scale.json")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (events, operator log)")
    parser.add_argument(
        "--watch", nargs=3, metavar=("KUBECONFIG", "NAMESPACE", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.watch:
        watch_main(*args.watch)
        return 0
    result = run(args)
    previous: dict[str, Any] = {}
    if args.out.exists():
        previous = json.loads(args.out.read_text())
    previous.setdefault("runs", {})[args.label] = result
    args.out.write_text(json.dumps(previous, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    if result["problems"]:
        print(f"FAILED ({args.label}): " + "; ".join(result["problems"]), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
