"""The operator at scale: N FineTuneJobs applied at once, through Kueue, on the test cluster's fake nodes.

    .venv/bin/python hack/bench_operator_scale.py                 # N=500, as the Helm chart runs it
    .venv/bin/python hack/bench_operator_scale.py --jobs 100 --label smoke
    .venv/bin/python hack/bench_operator_scale.py --py-spy /tmp/pyspy/bin/py-spy   # and a profile

The cluster is tests/support/cluster.py's (API server, kube-controller-manager, kube-scheduler,
KWOK with 4 fake 8-GPU nodes, the Training Operator, Kueue). Nothing runs in the pods: the pod
runner is left off for the benchmark's namespace, so KWOK keeps every bound pod Running.

The operator runs as the chart's Deployment runs it: ``python -m kubetune_operator --all-namespaces
--log-format=json`` (not verbose), with the chart's defaults for the settings.

Every FineTuneJob is examples/tiny-local.yaml with ``resources.gpusPerNode: 1`` and
``resources.queueName`` set to a LocalQueue of the ClusterQueue ``gpu-cluster``, whose GPU quota is
set to the fake nodes' GPUs (``--quota-gpus``, 32): Kueue admits as many 1-GPU jobs as the nodes can
run and holds the rest suspended. So "first pod Running" exists only for admitted jobs; it is
measured for those and their number is reported.

What is measured, per job, from watch events received by a separate watcher process and stamped
with the machine's monotonic clock (creationTimestamp has a resolution of one second):

* ``ptj_s``: the FineTuneJob's ADDED event -> its PyTorchJob's ADDED event;
* ``admitted_s``: -> the PyTorchJob's first event with ``runPolicy.suspend`` false (Kueue admitted it);
* ``running_s``: -> the first event of its master pod with ``status.phase`` Running.

And the operator process's CPU seconds (utime + stime from /proc/<pid>/stat, from when it was idle
and ready to when the run ends) and peak RSS (VmHWM of /proc/<pid>/status); the time from the
first FineTuneJob's ADDED event until every PyTorchJob existed; the load average at start and end.
The result goes to ``--out`` (JSON, one entry per run label, merged into what is there).
"""

from __future__ import annotations

import argparse
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
    ready = threading.Barrier(4)

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
        else:
            row["ptj"] = labels.get("training.kubeflow.org/job-name")
            row["role"] = labels.get("training.kubeflow.org/replica-type")
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


def analyse(rows: list[dict[str, Any]], names: set[str]) -> dict[str, Any]:
    ftj: dict[str, float] = {}
    ptj: dict[str, float] = {}
    admitted: dict[str, float] = {}
    running: dict[str, float] = {}
    for row in rows:
        t, name = row["t"], row["name"]
        if row["kind"] == "FineTuneJob" and name in names:
            ftj.setdefault(name, t)
        elif row["kind"] == "PyTorchJob" and row.get("job") in names:
            job = row["job"]
            ptj.setdefault(job, t)
            if not row["suspend"]:
                admitted.setdefault(job, t)
        elif row["kind"] == "Pod" and row.get("phase") == "Running" and row.get("role") == "master":
            job = (row.get("ptj") or "").removesuffix("-train")
            if job in names:
                running.setdefault(job, t)
    start = min(ftj.values()) if ftj else None
    result: dict[str, Any] = {
        "finetunejobs_seen": len(ftj),
        "pytorchjobs_created": len(ptj),
        "admitted_by_kueue": len(admitted),
        "master_pods_running": len(running),
        "ptj_s": summary([ptj[n] - ftj[n] for n in ptj if n in ftj]),
        "admitted_s": summary([admitted[n] - ftj[n] for n in admitted if n in ftj]),
        "running_s": summary([running[n] - ftj[n] for n in running if n in ftj]),
        # the same admitted jobs, split: Kueue's part, then the Training Operator's, scheduler's, KWOK's
        "ptj_to_admitted_s": summary([admitted[n] - ptj[n] for n in admitted if n in ptj]),
        "admitted_to_running_s": summary([running[n] - admitted[n] for n in running if n in admitted]),
        "apply_spread_s": _r(max(ftj.values()) - start) if start is not None else None,
        "all_pytorchjobs_after_s": _r(max(ptj.values()) - start) if start is not None and ptj else None,
    }
    return result


# --- the run --------------------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    _default_assets()
    from tests.support.cluster import CLUSTER_QUEUE, running_cluster
    from tests.support.controlplane import free_port

    load_start = os.getloadavg()
    wall_start = time.time()
    work = Path(tempfile.mkdtemp(prefix="kubetune-bench-", dir="/var/tmp"))
    events = work / "events.jsonl"
    operator_log = work / "operator.log"
    watcher: subprocess.Popen[str] | None = None
    operator: subprocess.Popen[bytes] | None = None
    spy: subprocess.Popen[bytes] | None = None
    samples: list[dict[str, float]] = []
    t_cluster = time.monotonic()
    with running_cluster({}) as cluster:
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
            # until every PyTorchJob exists and every job Kueue admitted has its master Running
            deadline = time.monotonic() + args.timeout
            wanted = set(names)
            done_at: float | None = None
            while time.monotonic() < deadline:
                cluster.check_alive()
                if operator.poll() is not None:
                    raise RuntimeError(f"the operator exited ({operator.returncode})")
                rows = [json.loads(line) for line in events.read_text().splitlines() if line]
                a = analyse(rows, wanted)
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
            sampler_stop.set()
            sampler.join(timeout=5)
            after = proc_usage(operator.pid)
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
                    "timed_out": done_at is None,
                    "operator": {
                        "cpu_s_during_run": _r(after["cpu_s"] - before["cpu_s"]),
                        "cpu_s_total": _r(after["cpu_s"]),
                        "run_s": _r(time.monotonic() - t_apply),
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
                    "goals": {"p50_ptj_s": 1.0, "p95_ptj_s": 3.0, "peak_rss_mib": 250},
                }
            )
            result["goals_met"] = {
                "p50": (result["ptj_s"]["p50"] or 1e9) <= 1.0,
                "p95": (result["ptj_s"]["p95"] or 1e9) <= 3.0,
                "rss": result["operator"]["peak_rss_mib"] <= 250,
            }
            if spy is not None:
                result["profile"] = top_frames(work / "profile.txt")
            errors = [
                line
                for line in operator_log.read_text(errors="replace").splitlines()
                if '"levelname": "ERROR"' in line or "Traceback" in line
            ]
            result["operator_errors"] = len(errors)
            result["operator_error_sample"] = errors[:3]
            result["operator_temporary_errors"] = operator_log.read_text(errors="replace").count("will retry")
            if args.keep:
                result["workdir"] = str(work)
            return result
        finally:
            stop(spy, signal.SIGINT)
            stop(operator)
            stop(watcher)
            if not args.keep:
                import shutil

                shutil.rmtree(work, ignore_errors=True)


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
    return 0


if __name__ == "__main__":
    sys.exit(main())
