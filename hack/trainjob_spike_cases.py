"""Spike cases against the cluster of ``hack/trainjob_spike.py up`` (reads its env file).

    python hack/trainjob_spike_cases.py CASE [CASE...]

Each case creates a TrainJob on the spike's runtime and prints a timeline: every change of the
TrainJob's status, the JobSet's status, the Jobs' conditions and the pods' phases/exit codes, with
seconds since creation. Pods run for real through the cluster's pod runner (their command is a
shell command of this machine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
NS = "spike"
ENV: dict[str, str] = {}
for line in Path("/tmp/trainjob-spike.env").read_text().splitlines():
    k, _, v = line.removeprefix("export ").partition("=")
    ENV[k] = v


def kubectl(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run(
        [ENV["KUBECTL"], "--kubeconfig", ENV["KUBECONFIG"], *args],
        check=False,
        input=input,
        capture_output=True,
        text=True,
    )
    if check and out.returncode:
        raise RuntimeError(f"kubectl {' '.join(args)}: {out.stderr}")
    return out


def get(kind: str, name: str | None = None, selector: str | None = None) -> Any:
    args = ["-n", NS, "get", kind, "-o", "json"]
    if name:
        args.insert(4, name)
    if selector:
        args += ["-l", selector]
    out = kubectl(*args, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def conds(obj: Any) -> list[str]:
    return [
        f"{c['type']}={c['status']}/{c.get('reason', '')}: {c.get('message', '')}"
        for c in (obj or {}).get("status", {}).get("conditions", []) or []
    ]


def snapshot(tj: str) -> dict[str, Any]:
    t = get("trainjob", tj)
    js = get("jobset", tj)
    jobs = get("jobs", selector=f"jobset.sigs.k8s.io/jobset-name={tj}") or {"items": []}
    pods = get("pods", selector=f"jobset.sigs.k8s.io/jobset-name={tj}") or {"items": []}
    snap: dict[str, Any] = {
        "trainjob": None
        if t is None
        else {
            "suspend": t["spec"].get("suspend"),
            "conditions": conds(t),
            "jobsStatus": t.get("status", {}).get("jobsStatus"),
        },
        "jobset": None
        if js is None
        else {
            "suspend": js["spec"].get("suspend"),
            "conditions": conds(js),
            "restarts": js.get("status", {}).get("restarts"),
            "restartsCountTowardsMax": js.get("status", {}).get("restartsCountTowardsMax"),
            "terminalState": js.get("status", {}).get("terminalState"),
            "replicatedJobsStatus": js.get("status", {}).get("replicatedJobsStatus"),
        },
        "jobs": {
            j["metadata"]["name"]: {
                "suspend": j["spec"].get("suspend"),
                "restart-attempt": j["metadata"].get("labels", {}).get("jobset.sigs.k8s.io/restart-attempt"),
                "conditions": conds(j),
                "deleting": "deletionTimestamp" in j["metadata"],
            }
            for j in jobs["items"]
        },
        "pods": {
            p["metadata"]["name"]: {
                "phase": p["status"].get("phase"),
                "node": p["spec"].get("nodeName"),
                "exit": [
                    (s["state"].get("terminated") or {}).get("exitCode")
                    for s in p["status"].get("containerStatuses", [])
                ],
                "conditions": [
                    c["type"] for c in p["status"].get("conditions", []) if c.get("status") == "True"
                ],
                "deleting": "deletionTimestamp" in p["metadata"],
            }
            for p in pods["items"]
        },
    }
    return snap


def diff(old: Any, new: Any, path: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for k in sorted(set(old) | set(new)):
            out += diff(old.get(k), new.get(k), f"{path}.{k}" if path else k)
        return out
    return [] if old == new else [f"{path}: {json.dumps(new)}"]


def timeline(
    tj: str, until: Any, timeout: float = 120, actions: dict[float, Any] | None = None
) -> dict[str, Any]:
    t0 = time.monotonic()
    last: dict[str, Any] = {}
    actions = dict(actions or {})
    while True:
        now = time.monotonic() - t0
        snap = snapshot(tj)
        for line in diff(last, snap):
            print(f"  [{now:5.1f}s] {line}", flush=True)
        last = snap
        for at in sorted(actions):
            if now >= at:
                print(f"  [{now:5.1f}s] ACTION {actions[at].__name__}", flush=True)
                actions.pop(at)(tj)
        if until(snap) and not actions:
            return snap
        if now > timeout:
            print(f"  TIMEOUT after {timeout}s", flush=True)
            return snap
        time.sleep(0.5)


def trainjob(
    name: str, command: str, nodes: int = 1, queue: str | None = None, gpus: int = 0, **spec: Any
) -> dict[str, Any]:
    tj: dict[str, Any] = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "runtimeRef": {"name": "kubetune-spike"},
            "trainer": {
                "numNodes": nodes,
                "image": "registry.example/kubetune/trainer:spike",
                "command": ["sh", "-c", command],
                "env": [{"name": "KUBETUNE_RUN", "value": name}],
            },
            **spec,
        },
    }
    if queue:
        tj["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    if gpus:
        tj["spec"]["trainer"]["resourcesPerNode"] = {
            "requests": {"cpu": "4", "nvidia.com/gpu": str(gpus)},
            "limits": {"nvidia.com/gpu": str(gpus)},
        }
    return tj


def create(tj: dict[str, Any]) -> None:
    out = kubectl("create", "-f", "-", input=yaml.safe_dump(tj), check=False)
    print(
        f"create {tj['metadata']['name']}: rc={out.returncode} {out.stdout.strip()} {out.stderr.strip()}",
        flush=True,
    )


def done(snap: dict[str, Any]) -> bool:
    t = snap["trainjob"]
    return t is not None and any(c.startswith(("Complete=True", "Failed=True")) for c in t["conditions"])


def dump_objects(tj: str) -> None:
    js = get("jobset", tj)
    if js:
        print("--- JobSet spec (as the trainer applied it, webhook defaults included):")
        print(yaml.safe_dump(js["spec"], width=140, default_flow_style=None))
        print(
            "--- JobSet metadata:",
            json.dumps(
                {
                    k: js["metadata"].get(k)
                    for k in ("labels", "annotations", "ownerReferences", "managedFields")
                }
            )[:3000],
        )
    svc = get("services")
    print(
        "--- Services:",
        [
            (
                s["metadata"]["name"],
                s["spec"].get("clusterIP"),
                s["spec"].get("publishNotReadyAddresses"),
                s["spec"].get("selector"),
            )
            for s in svc["items"]
        ],
    )
    pods = get("pods", selector=f"jobset.sigs.k8s.io/jobset-name={tj}")
    for p in pods["items"]:
        c = next(c for c in p["spec"]["containers"] if c["name"] == "node")
        print(
            f"--- pod {p['metadata']['name']} hostname={p['spec'].get('hostname')} subdomain={p['spec'].get('subdomain')} restartPolicy={p['spec'].get('restartPolicy')}"
        )
        print("    labels:", p["metadata"].get("labels"))
        print("    annotations:", p["metadata"].get("annotations"))
        print("    env:", json.dumps(c.get("env")))
        print("    ports:", c.get("ports"), "resources:", c.get("resources"), "command:", c.get("command"))
        print("    initContainers:", [i["name"] for i in p["spec"].get("initContainers", [])])
    for f in sorted(Path(ENV["SPIKE_WORKDIR"], "runner", "pods").glob(f"{NS}_{tj}-*/container.log")):
        print(f"--- {f.parent.name} log:\n{f.read_text()}")


def show_trainjob(tj: str) -> None:
    t = get("trainjob", tj)
    print("--- TrainJob status:", json.dumps(t.get("status"), indent=1) if t else None)
    print("--- kubectl get trainjob:\n" + kubectl("-n", NS, "get", "trainjob", tj, check=False).stdout)
    ev = kubectl("-n", NS, "get", "events", "--sort-by=.lastTimestamp", "-o",
                 "custom-columns=TYPE:.type,REASON:.reason,OBJ:.involvedObject.name,MSG:.message",
                 check=False).stdout  # fmt: skip
    print("--- events:\n" + "\n".join(line for line in ev.splitlines() if tj in line or "TYPE" in line))


def run_case(
    name: str,
    tj: dict[str, Any],
    until: Any = done,
    timeout: float = 120,
    actions: dict[float, Any] | None = None,
    objects: bool = False,
) -> None:
    print(f"\n===== {name}", flush=True)
    create(tj)
    timeline(tj["metadata"]["name"], until, timeout, actions)
    if objects:
        dump_objects(tj["metadata"]["name"])
    show_trainjob(tj["metadata"]["name"])


def patch_suspend(value: bool) -> Any:
    def act(tj: str) -> None:
        out = kubectl(
            "-n",
            NS,
            "patch",
            "trainjob",
            tj,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"suspend": value}}),
            check=False,
        )
        print("    ->", out.stdout.strip(), out.stderr.strip(), flush=True)

    act.__name__ = f"suspend={value}"
    return act


def evict(tj: str) -> None:
    pods = get("pods", selector=f"jobset.sigs.k8s.io/jobset-name={tj}")
    for p in pods["items"]:
        name = p["metadata"]["name"]
        body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name, "namespace": NS}}
        out = kubectl("create", "--raw", f"/api/v1/namespaces/{NS}/pods/{name}/eviction", "-f", "-",
                      input=json.dumps(body), check=False)  # fmt: skip
        print("    -> evict", name, out.returncode, out.stdout.strip()[:200], out.stderr.strip(), flush=True)
        return


def kubelet_failed(tj: str) -> None:
    """What the kubelet writes for a pod it stopped on deletion (the pod runner does not: it only removes
    the object, which a Job's pod keeps while the Job controller's finalizer waits for a terminal phase)."""
    for p in get("pods", selector=f"jobset.sigs.k8s.io/jobset-name={tj}")["items"]:
        if "deletionTimestamp" not in p["metadata"] or p["status"].get("phase") == "Failed":
            continue
        status = {"phase": "Failed", "containerStatuses": [{
            "name": "node", "image": p["spec"]["containers"][0]["image"], "imageID": "", "ready": False,
            "restartCount": 0, "state": {"terminated": {"exitCode": 143, "reason": "Error"}}}]}  # fmt: skip
        out = kubectl("-n", NS, "patch", "pod", p["metadata"]["name"], "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": status}), check=False)  # fmt: skip
        print("    -> kubelet_failed", out.stdout.strip(), out.stderr.strip(), flush=True)


def workload(active: bool) -> Any:
    def act(tj: str) -> None:
        items = json.loads(kubectl("-n", NS, "get", "workloads", "-o", "json").stdout)["items"]
        for w in items:
            if w["metadata"]["name"].startswith(f"trainjob-{tj}-"):
                out = kubectl("-n", NS, "patch", "workload", w["metadata"]["name"], "--type=merge",
                              "-p", json.dumps({"spec": {"active": active}}), check=False)  # fmt: skip
                print("    ->", out.stdout.strip(), out.stderr.strip(), flush=True)
                conds_ = [
                    (k["type"], k["status"], k.get("reason"))
                    for k in w.get("status", {}).get("conditions", [])
                ]
                print("    workload conditions before:", conds_, flush=True)

    act.__name__ = f"workload.active={active}"
    return act


def with_pod_metadata() -> None:
    """The runtime again as kubetune-spike-meta, its pod template with labels (see the deactivate case)."""
    rt = yaml.safe_load((HERE / "trainjob-spike" / "runtime.yaml").read_text())
    rt["metadata"]["name"] = "kubetune-spike-meta"
    pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    pod["metadata"] = {"labels": {"app.kubernetes.io/managed-by": "kubetune"}}
    print(kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump(rt)).stdout)


def checks() -> None:
    """Admission and immutability (run after ok1)."""
    tj = trainjob("petenv", "exit 0")
    tj["spec"]["trainer"]["env"].append({"name": "PET_NNODES", "value": "3"})
    create(tj)
    create(trainjob("1bad", "exit 0"))
    create(trainjob("b" * 48, "exit 0"))
    bare = trainjob("notrainer", "exit 0")
    del bare["spec"]["trainer"]
    create(bare)
    for patch in ({"trainer": {"numNodes": 2}}, {"runtimeRef": {"name": "kubetune-spike-meta"}}):
        out = kubectl(
            "-n",
            NS,
            "patch",
            "trainjob",
            "ok1",
            "--type=merge",
            "-p",
            json.dumps({"spec": patch}),
            check=False,
        )
        print("patch ok1", patch, out.returncode, out.stderr.strip())
    time.sleep(8)
    for name in ("b" * 48, "notrainer"):
        print(name, conds(get("trainjob", name)))
    js = get("jobset", "notrainer")
    node = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    print("notrainer node container:", json.dumps({k: node.get(k) for k in ("env", "ports", "command")}))


PET = "env | grep -E '^(PET_|KUBETUNE_|JOB_COMPLETION_INDEX)' | sort; "
CASES = {
    "runtime": lambda: print(
        kubectl("apply", "--server-side", "-f", str(HERE / "trainjob-spike" / "runtime.yaml"), check=False)
    ),
    "ok1": lambda: run_case("success, 1 node", trainjob("ok1", PET + "sleep 6; exit 0"), objects=True),
    "ok2": lambda: run_case(
        "success, 2 nodes", trainjob("ok2", PET + "sleep 6; exit 0", nodes=2), objects=True
    ),
    "exit3": lambda: run_case(
        "permanent failure, exit 3 on rank 1",
        trainjob("exit3", 'if [ "$PET_NODE_RANK" = 1 ]; then sleep 2; exit 3; fi; sleep 60', nodes=2),
    ),
    "exit143": lambda: run_case(
        "retryable failure, exit 143 every attempt", trainjob("exit143", "sleep 2; exit 143"), timeout=180
    ),
    "exit137": lambda: run_case(
        "retryable failure, exit 137 once then success",
        trainjob(
            "exit137",
            "f=/tmp/trainjob-spike-exit137; if [ ! -e $f ]; then touch $f; sleep 2; exit 137; fi; sleep 3; exit 0",
        ),
        timeout=180,
    ),
    "suspend": lambda: run_case(
        "suspend while running, then resume",
        trainjob("suspend", "trap 'echo got SIGTERM; exit 143' TERM; " + PET + "sleep 25 & wait; exit 0"),
        timeout=150,
        actions={8: patch_suspend(True), 20: patch_suspend(False)},
    ),
    "evict": lambda: run_case(
        "eviction (DisruptionTarget) of the running pod, then success",
        trainjob(
            "evict",
            "f=/tmp/trainjob-spike-evict; if [ ! -e $f ]; then touch $f; sleep 60; fi; sleep 3; exit 0",
        ),
        timeout=150,
        actions={6: evict, 12: kubelet_failed},
    ),
    "deactivate": lambda: run_case(
        "Kueue stops a running TrainJob (Workload deactivated), then re-admits it",
        trainjob(
            "q3",
            "trap 'echo got SIGTERM; exit 143' TERM; sleep 20 & wait; exit 0",
            nodes=2,
            queue="gpu-training",
            gpus=8,
        ),
        timeout=100,
        actions={5: workload(False), 14: workload(True)},
    ),
    "meta": with_pod_metadata,
    "deactivate-meta": lambda: run_case(
        "as deactivate, on a runtime whose pod template has labels",
        {
            **(t := trainjob("q5", "sleep 20; exit 0", nodes=1, queue="gpu-training", gpus=8)),
            "spec": {**t["spec"], "runtimeRef": {"name": "kubetune-spike-meta"}},
        },
        timeout=100,
        actions={5: workload(False), 14: workload(True)},
    ),
    "checks": checks,
    "long": lambda: run_case(
        "long name (49 chars)", trainjob("a" * 49, "exit 0"), until=lambda s: False, timeout=15
    ),
    "nort": lambda: run_case(
        "missing runtime",
        {
            **trainjob("nort", "exit 0"),
            "spec": {**trainjob("nort", "exit 0")["spec"], "runtimeRef": {"name": "nope"}},
        },
        until=lambda s: True,
        timeout=3,
    ),
    "q1": lambda: run_case(
        "Kueue: 2 nodes x 8 GPUs (fits the 16-GPU queue)",
        trainjob("q1", PET + "sleep 20; exit 0", nodes=2, queue="gpu-training", gpus=8),
        until=lambda s: s["pods"] != {} or done(s),
        timeout=60,
    ),
    "q2": lambda: run_case(
        "Kueue: 1 node x 8 GPUs while q1 runs (waits), then admitted",
        trainjob("q2", "sleep 3; exit 0", nodes=1, queue="gpu-training", gpus=8),
        timeout=90,
    ),
}

if __name__ == "__main__":
    for case in sys.argv[1:]:
        CASES[case]()
