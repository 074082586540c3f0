"""The stand-in for what a test machine cannot run: container runtimes and a volume provisioner.

Everything else in the test cluster is the real component (API server, controller manager,
scheduler, KWOK, Training Operator, Kueue). KWOK keeps the fake nodes alive and marks pods that
the scheduler bound to them ``Running``. This module then does, for those pods, the part of a
kubelet that needs a container runtime:

* **runs the pod's container** as a local process: the container's ``command``/``args`` with the
  pod's own environment (what the Training Operator injected included, ``valueFrom`` resolved as
  the kubelet does, plus ``KUBERNETES_SERVICE_HOST``/``PORT``), in its ``workingDir``, as the pod's
  ``runAsUser``/``runAsGroup`` with ``fsGroup`` as a supplementary group;
* **gives it its volumes at their mount paths**, in a private mount namespace (``unshare``; root
  only): ConfigMap and Secret keys as files, a projected service-account token from the real
  TokenRequest API, a folder per PersistentVolume, a folder per emptyDir, and the "image"'s own
  files (``image_files``: container path -> local folder, e.g. the tiny model the trainer image
  carries). ``/etc/hosts`` maps every pod hostname and Service name to 127.0.0.1;
* **reports the outcome** as the kubelet does: the process's real exit code, and the termination
  message from ``terminationMessagePath`` (or the log's tail with ``FallbackToLogsOnError``), in
  the pod's status; ``restartPolicy: Never`` pods only (the Training Operator and the Job
  controller restart by making new pods);
* **stops it on deletion**: SIGTERM to the process group, SIGKILL after the pod's grace period,
  and only then removes the pod object (grace 0), as the kubelet does;
* **provisions volumes** for StorageClasses with ``PROVISIONER``: a PersistentVolume with a
  ``claimRef`` and a local folder, which kube-controller-manager binds; Released volumes of
  ``Delete`` policy are deleted with their folder.

What it does not do: images (the command runs from this machine's Python environment), the pod's
user (processes run as the test's own user, root: the interpreter of this machine lives under
/root, which other users cannot read; so ``runAsUser``/``fsGroup`` are not exercised), init
containers (KWOK reports them completed), resource limits, probes, networking (every pod shares
this machine's network: two pods listening on one port at once would collide), container restarts.

Mount points: a container path that does not exist on this machine is created (an empty folder
or file) before the bind mount, since there is no image filesystem to hold it.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROVISIONER = "kubetune.test/local-folder"
CONTAINER_MARK = "PODRUNNER_CONTAINER_UID"
TERMINATION_LOG_MAX = 4096  # the kubelet's limit on a termination message
LOG_TAIL_LINES = 80


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class RunningPod:
    uid: str
    namespace: str
    name: str
    root: Path
    proc: subprocess.Popen[bytes]
    log: Path
    termination_file: Path | None
    fallback_to_logs: bool
    started: str
    deleting: bool = False


@dataclass
class PodRunner:
    """Watches pods bound to the fake nodes and runs them; provisions volumes. One per cluster."""

    api: Any  # kubernetes.client.ApiClient of an admin
    api_host: str  # "127.0.0.1"
    api_port: int
    ca_file: Path
    workdir: Path
    image_files: dict[str, Path] = field(default_factory=dict)
    python_bin: Path | None = None  # put first on PATH: what `python` in a command runs
    namespaces: set[str] | None = None  # run pods only in these (None: all but kube-*)
    keep_visible: tuple[Path, ...] = ()  # folders the commands run from: never hidden by a volume
    _pods: dict[str, RunningPod] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)
    _hosts_at: float = 0.0

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(self.api)
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        (self.workdir / "volumes").mkdir(parents=True, exist_ok=True)
        for target in (self._pod_loop, self._volume_loop):
            t = threading.Thread(target=self._guard(target), daemon=True, name=target.__name__)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            pods = list(self._pods.values())
        for p in pods:
            _kill_container(p.uid, signal.SIGKILL)
        for t in self._threads:
            t.join(timeout=10)

    def _guard(self, fn: Any) -> Any:
        def run() -> None:
            while not self._stop.is_set():
                try:
                    fn()
                except Exception as e:  # keep serving; the test sees it in .errors
                    self.errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
                    time.sleep(0.5)

        return run

    def wanted(self, pod: Any) -> bool:
        ns = pod.metadata.namespace
        if self.namespaces is not None:
            return ns in self.namespaces
        return not ns.startswith("kube-")

    # --- pods --------------------------------------------------------------------------------------

    def _pod_loop(self) -> None:
        while not self._stop.is_set():
            pods = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=").items
            live = set()
            for pod in pods:
                uid = pod.metadata.uid
                live.add(uid)
                if not self.wanted(pod):
                    continue
                with self._lock:
                    running = self._pods.get(uid)
                if pod.metadata.deletion_timestamp is not None:
                    self._terminate(pod, running)
                elif running is None and _should_start(pod):
                    self._start_pod(pod)
            self._reap(live)
            self._refresh_hosts()
            self._stop.wait(0.3)

    def _refresh_hosts(self) -> None:
        """Names that appeared since a pod started (the master's Service for a Worker that started
        first) resolve too: each running pod's /etc/hosts is rewritten in place (same inode, so the
        bind mount sees it)."""
        if time.monotonic() - self._hosts_at < 1.0:
            return
        self._hosts_at = time.monotonic()
        content = self._hosts()
        with self._lock:
            pods = list(self._pods.values())
        for p in pods:
            hosts = p.root / "hosts"
            if hosts.exists() and hosts.read_text() != content:
                with hosts.open("r+") as f:
                    f.truncate(0)
                    f.write(content)

    def _start_pod(self, pod: Any) -> None:
        meta, spec = pod.metadata, pod.spec
        container = spec.containers[0]
        root = self.workdir / "pods" / f"{meta.namespace}_{meta.name}_{meta.uid[:8]}"
        root.mkdir(parents=True, exist_ok=True)
        (root / "started").write_text(repr(time.time()))
        mounts = self._mounts(pod, container, root)
        hosts = root / "hosts"
        hosts.write_text(self._hosts())
        mounts.append(("/etc/hosts", hosts))
        term_path = container.termination_message_path or "/dev/termination-log"
        term_file = root / "termination-log"
        term_file.write_text("")
        term_file.chmod(0o666)  # the container's user writes it, whoever that is
        mounts.append((term_path, term_file))
        # A volume mounted over a folder that holds the "image" (this repository and its Python
        # environment: a clone under /tmp, where the pod's /tmp emptyDir goes) would hide it: such a
        # volume is left out, and the container uses the machine's folder there.
        mounts = [(t, src) for t, src in mounts if not any(k.is_relative_to(t) for k in self.keep_visible)]
        env = self._env(pod, container)
        command = [*(container.command or []), *(container.args or [])]
        binds = []
        # parents before what is mounted inside them
        for target, source in sorted(mounts, key=lambda m: len(Path(m[0]).parts)):
            kind = "-d" if source.is_dir() else "-f"
            make = f"mkdir -p {shlex.quote(target)}" if source.is_dir() else f"touch {shlex.quote(target)}"
            binds.append(
                f"[ {kind} {shlex.quote(target)} ] || {make}; "
                f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}"
            )
        cd = f"cd {shlex.quote(container.working_dir)} && " if container.working_dir else ""
        inner = "set -e; " + "; ".join(binds) + f" && {cd}exec " + shlex.join(command)
        log = root / "container.log"
        out = log.open("ab")
        proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", inner],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        fallback = (container.termination_message_policy or "File") == "FallbackToLogsOnError"
        with self._lock:
            self._pods[meta.uid] = RunningPod(
                meta.uid, meta.namespace, meta.name, root, proc, log, term_file, fallback, now()
            )

    def _reap(self, live: set[str]) -> None:
        with self._lock:
            pods = list(self._pods.values())
        for p in pods:
            code = p.proc.poll()
            if code is None:
                continue
            if code < 0:  # killed by a signal: the container runtime reports 128 + signal
                code = 128 - code
            _kill_container(p.uid, signal.SIGKILL)  # the main process ended: so does the container
            if not p.deleting:
                self._report_exit(p, code)
            with self._lock:
                self._pods.pop(p.uid, None)
            if p.deleting:
                self._remove(p.namespace, p.name, p.uid)
            if p.uid not in live:
                continue

    def _report_exit(self, p: RunningPod, code: int) -> None:
        message = p.termination_file.read_text(errors="replace") if p.termination_file else ""
        if not message.strip() and code != 0 and p.fallback_to_logs:
            lines = p.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            message = "\n".join(lines)
        message = message[-TERMINATION_LOG_MAX:]
        pod = self.core.read_namespaced_pod(p.name, p.namespace)
        if pod.metadata.uid != p.uid:
            return
        finished = now()
        statuses = []
        for c in pod.spec.containers:
            terminated = {
                "exitCode": code,
                "reason": "Completed" if code == 0 else "Error",
                "startedAt": p.started,
                "finishedAt": finished,
            }
            if message:
                terminated["message"] = message
            statuses.append(
                {
                    "name": c.name,
                    "image": c.image,
                    "imageID": "",
                    "ready": False,
                    "restartCount": 0,
                    "started": False,
                    "state": {"terminated": terminated},
                }
            )
        phase = "Succeeded" if code == 0 else "Failed"
        body = {
            "status": {
                "phase": phase,
                "containerStatuses": statuses,
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "False",
                        "reason": "PodCompleted",
                        "lastTransitionTime": finished,
                    },
                    {
                        "type": "ContainersReady",
                        "status": "False",
                        "reason": "PodCompleted",
                        "lastTransitionTime": finished,
                    },
                ],
            }
        }
        self.core.patch_namespaced_pod_status(p.name, p.namespace, body)

    def _terminate(self, pod: Any, running: RunningPod | None) -> None:
        """A pod being deleted: SIGTERM, SIGKILL after its grace period, then remove the object."""
        meta = pod.metadata
        if running is None:
            self._remove(meta.namespace, meta.name, meta.uid)
            return
        if running.deleting:
            grace = pod.spec.termination_grace_period_seconds
            grace = 30 if grace is None else grace
            deleted_at = meta.deletion_timestamp.timestamp() - (meta.deletion_grace_period_seconds or 0)
            if time.time() > deleted_at + grace:
                _kill_container(running.uid, signal.SIGKILL)
            return
        running.deleting = True
        # as the kubelet: SIGTERM to the container's main process only, which passes it on
        with contextlib.suppress(ProcessLookupError):
            os.kill(running.proc.pid, signal.SIGTERM)

    def _remove(self, namespace: str, name: str, uid: str) -> None:
        from kubernetes.client.rest import ApiException

        body = {"gracePeriodSeconds": 0, "preconditions": {"uid": uid}}
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(name, namespace, body=body)

    def kill(self, namespace: str, name: str, sig: int = signal.SIGKILL) -> None:
        """What a node failure or the kernel's OOM killer does: a signal to every process of the running
        container (torchrun's workers run in sessions of their own: a process group is not enough)."""
        with self._lock:
            pods = [p for p in self._pods.values() if (p.namespace, p.name) == (namespace, name)]
        if not pods:
            raise LookupError(f"no running container for pod {namespace}/{name}")
        for p in pods:
            _kill_container(p.uid, sig)

    def log_of(self, namespace: str, name: str, *, last: bool = False) -> str:
        """Every container log of pods with this name (all attempts, oldest first), or the newest's."""
        folders = sorted(
            (self.workdir / "pods").glob(f"{namespace}_{name}_*"),
            key=lambda p: float((p / "started").read_text() or 0),
        )
        if last:
            folders = folders[-1:]
        return "\n".join(
            (f / "container.log").read_text(errors="replace")
            for f in folders
            if (f / "container.log").exists()
        )

    # --- what the kubelet puts into a container ----------------------------------------------------

    def _hosts(self) -> str:
        lines = ["127.0.0.1 localhost"]
        names: set[str] = set()
        for pod in self.core.list_pod_for_all_namespaces().items:
            names.add(pod.spec.hostname or pod.metadata.name)
            names.add(pod.metadata.name)
        for svc in self.core.list_service_for_all_namespaces().items:
            ns = svc.metadata.namespace
            names.update({svc.metadata.name, f"{svc.metadata.name}.{ns}", f"{svc.metadata.name}.{ns}.svc"})
        lines += [f"127.0.0.1 {n}" for n in sorted(names)]
        return "\n".join(lines) + "\n"

    def _env(self, pod: Any, container: Any) -> dict[str, str]:
        path = os.environ.get("PATH", "/usr/bin:/bin")
        if self.python_bin is not None:
            path = f"{self.python_bin.parent}:{path}"
        env: dict[str, str] = {
            "PATH": path,
            "HOSTNAME": pod.spec.hostname or pod.metadata.name,
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            # every process of the container inherits it: the stand-in for its cgroup (_container_pids)
            CONTAINER_MARK: pod.metadata.uid,
        }
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = _expand(var.value or "", env)
                continue
            value = self._value_from(pod, container, var.value_from)
            if value is not None:
                env[var.name] = value
        return env

    def _value_from(self, pod: Any, container: Any, source: Any) -> str | None:
        ns = pod.metadata.namespace
        if source.secret_key_ref is not None:
            ref = source.secret_key_ref
            secret = self.core.read_namespaced_secret(ref.name, ns)
            data = (secret.data or {}).get(ref.key)
            return base64.b64decode(data).decode() if data is not None else None
        if source.config_map_key_ref is not None:
            ref = source.config_map_key_ref
            return (self.core.read_namespaced_config_map(ref.name, ns).data or {}).get(ref.key)
        if source.field_ref is not None:
            return _field(pod, source.field_ref.field_path)
        if source.resource_field_ref is not None:
            ref = source.resource_field_ref
            target = next(c for c in pod.spec.containers if c.name == (ref.container_name or container.name))
            kind, _, res = ref.resource.partition(".")
            values = getattr(target.resources, kind) or {}
            return _quantity_in(values.get(res, "0"), ref.divisor or "1")
        return None

    def _mounts(self, pod: Any, container: Any, root: Path) -> list[tuple[str, Path]]:
        volumes = {v.name: v for v in pod.spec.volumes or []}
        out: list[tuple[str, Path]] = []
        for m in container.volume_mounts or []:
            source = self._volume(pod, volumes[m.name], root)
            if m.sub_path:
                source = source / m.sub_path
            out.append((m.mount_path, source))
        for target, source in self.image_files.items():
            out.insert(0, (target, source))
        return out

    def _volume(self, pod: Any, vol: Any, root: Path) -> Path:
        ns = pod.metadata.namespace
        folder = root / "volumes" / vol.name
        if vol.persistent_volume_claim is not None:
            claim = self.core.read_namespaced_persistent_volume_claim(
                vol.persistent_volume_claim.claim_name, ns
            )
            pv = self.core.read_persistent_volume(claim.spec.volume_name)
            return Path(pv.spec.host_path.path)
        folder.mkdir(parents=True, exist_ok=True)
        if vol.config_map is not None:
            data = self.core.read_namespaced_config_map(vol.config_map.name, ns).data or {}
            _write_keys(folder, data, vol.config_map.items)
        elif vol.secret is not None:
            raw = self.core.read_namespaced_secret(vol.secret.secret_name, ns).data or {}
            data = {k: base64.b64decode(v).decode() for k, v in raw.items()}
            _write_keys(folder, data, vol.secret.items)
        elif vol.projected is not None:
            for src in vol.projected.sources:
                if src.service_account_token is not None:
                    token = self._token(pod, src.service_account_token)
                    (folder / src.service_account_token.path).write_text(token)
                elif src.config_map is not None:
                    data = self.core.read_namespaced_config_map(src.config_map.name, ns).data or {}
                    _write_keys(folder, data, src.config_map.items)
                elif src.downward_api is not None:
                    for item in src.downward_api.items:
                        (folder / item.path).write_text(_field(pod, item.field_ref.field_path) or "")
        # emptyDir (any medium): the empty folder
        return folder

    def _token(self, pod: Any, projection: Any) -> str:
        from kubernetes import client

        request = client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(
                audiences=[projection.audience] if projection.audience else [],
                expiration_seconds=projection.expiration_seconds or 3607,
                bound_object_ref=client.V1BoundObjectReference(
                    api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid
                ),
            )
        )
        sa = pod.spec.service_account_name or "default"
        out = self.core.create_namespaced_service_account_token(sa, pod.metadata.namespace, request)
        return str(out.status.token)

    # --- volumes -----------------------------------------------------------------------------------

    def _volume_loop(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        storage: Any = client.StorageV1Api(self.api)
        while not self._stop.is_set():
            ours = {
                sc.metadata.name for sc in storage.list_storage_class().items if sc.provisioner == PROVISIONER
            }
            for pvc in self.core.list_persistent_volume_claim_for_all_namespaces().items:
                if pvc.spec.volume_name or pvc.metadata.deletion_timestamp is not None:
                    continue
                if pvc.spec.storage_class_name not in ours:
                    continue
                self._provision(pvc)
            for pv in self.core.list_persistent_volume().items:
                ann = pv.metadata.annotations or {}
                if ann.get("pv.kubernetes.io/provisioned-by") != PROVISIONER:
                    continue
                if pv.status.phase == "Released" and pv.spec.persistent_volume_reclaim_policy == "Delete":
                    with contextlib.suppress(ApiException):
                        self.core.delete_persistent_volume(pv.metadata.name)
                    shutil.rmtree(pv.spec.host_path.path, ignore_errors=True)
            self._stop.wait(0.3)

    def _provision(self, pvc: Any) -> None:
        from kubernetes.client.rest import ApiException

        name = f"pvc-{pvc.metadata.uid}"
        path = self.workdir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        pv = {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": pvc.spec.resources.requests["storage"]},
                "accessModes": pvc.spec.access_modes,
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": pvc.spec.storage_class_name,
                "volumeMode": pvc.spec.volume_mode or "Filesystem",
                "hostPath": {"path": str(path), "type": "Directory"},
                "claimRef": {
                    "apiVersion": "v1",
                    "kind": "PersistentVolumeClaim",
                    "namespace": pvc.metadata.namespace,
                    "name": pvc.metadata.name,
                    "uid": pvc.metadata.uid,
                },
            },
        }
        try:
            self.core.create_persistent_volume(pv)
        except ApiException as e:
            if e.status != 409:
                raise


# --- helpers ----------------------------------------------------------------------------------------


def _should_start(pod: Any) -> bool:
    status = pod.status
    if status is None or status.phase != "Running":
        return False
    # only containers KWOK reports running (never a pod whose exit was already reported)
    return all((cs.state and cs.state.running) for cs in status.container_statuses or [])


def _container_pids(uid: str) -> list[int]:
    """The processes of a pod's container: those whose environment carries its mark."""
    mark = f"{CONTAINER_MARK}={uid}".encode()
    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if mark in (proc / "environ").read_bytes().split(b"\0"):
                out.append(int(proc.name))
    return out


def _kill_container(uid: str, sig: int) -> None:
    for pid in _container_pids(uid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _write_keys(folder: Path, data: dict[str, str], items: Any) -> None:
    if items:
        for item in items:
            if item.key in data:
                (folder / item.path).write_text(data[item.key])
        return
    for key, value in data.items():
        (folder / key).write_text(value)


def _field(pod: Any, path: str) -> str | None:
    simple = {
        "metadata.name": pod.metadata.name,
        "metadata.namespace": pod.metadata.namespace,
        "metadata.uid": pod.metadata.uid,
        "spec.nodeName": pod.spec.node_name,
        "spec.serviceAccountName": pod.spec.service_account_name,
        "status.podIP": pod.status.pod_ip if pod.status else None,
        "status.hostIP": pod.status.host_ip if pod.status else None,
    }
    if path in simple:
        return simple[path]
    for prefix, values in (
        ("metadata.labels", pod.metadata.labels),
        ("metadata.annotations", pod.metadata.annotations),
    ):
        if path.startswith(prefix + "['"):
            return (values or {}).get(path[len(prefix) + 2 : -2])
    return None


_SUFFIX = {
    "m": 1e-3,
    "": 1,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}


def _parse_quantity(q: str) -> float:
    for suffix in sorted(_SUFFIX, key=len, reverse=True):
        if suffix and q.endswith(suffix):
            return float(q[: -len(suffix)]) * _SUFFIX[suffix]
    return float(q)


def _quantity_in(value: str, divisor: str) -> str:
    """A resource as the Downward API gives it: value / divisor, rounded up."""
    import math

    return str(math.ceil(_parse_quantity(str(value)) / _parse_quantity(str(divisor))))


def _expand(value: str, env: dict[str, str]) -> str:
    """$(VAR) references to variables defined earlier, as the kubelet expands them."""
    out = value
    for k, v in env.items():
        out = out.replace(f"$({k})", v)
    return out
