"""The stand-in for what a test machine cannot run: container runtimes and a volume provisioner.

Everything else in the test cluster is the real component (API server, controller manager,
scheduler, KWOK, Training Operator, Kueue). KWOK keeps the fake nodes alive and marks pods that
the scheduler bound to them ``Running``. This module then does, for those pods, the part of a
kubelet that needs a container runtime:

* **runs the pod's container** as a local process: the container's ``command``/``args`` (where the
  container names no ``command``, its image's ENTRYPOINT, and CMD unless it has ``args``, as the
  kubelet takes them from the image: ``entrypoints``, image repository -> the exec-form ENTRYPOINT
  and CMD of its Dockerfile, read by :func:`dockerfile_command`; the image's ENV, WORKDIR and USER
  are not applied) with the pod's own environment (what the Training Operator injected included, ``valueFrom`` resolved as
  the kubelet does, plus ``KUBERNETES_SERVICE_HOST``/``PORT``), in its ``workingDir``, as the pod's
  ``runAsUser``/``runAsGroup`` with ``fsGroup`` as a supplementary group;
* **gives it its host name** (the pod's ``spec.hostname``, else its name cut to 63 characters) in a
  UTS namespace of its own, so ``gethostname()`` in the container answers it as in a pod;
* **gives it its volumes at their mount paths**, in a private mount namespace (``unshare``; root
  only): ConfigMap and Secret keys as files, a projected service-account token from the real
  TokenRequest API, a folder per PersistentVolume, a folder per emptyDir, and the "image"'s own
  files (``image_files``: container path -> local folder, e.g. the tiny model the trainer image
  carries). ``/etc/hosts`` maps every pod hostname (with its subdomain: ``<host>.<subdomain>``, as a
  headless Service's DNS answers) and Service name to 127.0.0.1;
* **reports the outcome** as the kubelet does: the process's real exit code, and the termination
  message from ``terminationMessagePath`` (or the log's tail with ``FallbackToLogsOnError``), in
  the pod's status; ``restartPolicy: Never`` pods only (the Training Operator and the Job
  controller restart by making new pods);
* **limits its memory** as the kubelet does: the container's processes run in a memory cgroup of
  their own with ``resources.limits.memory`` as its limit (cgroup v2 ``memory.max`` with
  ``memory.oom.group``; cgroup v1 ``memory.limit_in_bytes``, where the runner kills the rest of the
  container when the kernel's OOM killer killed one of its processes, as ``memory.oom.group`` does).
  A container the kernel OOM-killed is reported ``terminated`` with reason ``OOMKilled`` and exit
  code 137. The cgroup is removed when the container ends. Without a writable memory cgroup the
  limit is not enforced, and a warning says so (``memory_cgroups`` is then None);
* **stops it on deletion**: SIGTERM to the process group, SIGKILL after the pod's grace period,
  and only then removes the pod object (grace 0), as the kubelet does;
* **provisions volumes** for StorageClasses with ``PROVISIONER``: a PersistentVolume with a
  ``claimRef`` and a local folder, which kube-controller-manager binds; Released volumes of
  ``Delete`` policy are deleted with their folder. A StorageClass with the parameter
  ``CAPACITY_PARAMETER: "enforced"`` gets a volume that is full at the claim's size, as a cloud disk
  is: a file system of exactly that many bytes (an ext4 image, formatted as Kubernetes formats a
  block volume, ``mkfs.ext4 -F -m0 -O ^has_journal``, loop-mounted at the volume's folder; a tmpfs of that size
  where loop devices are missing), unmounted when the volume is deleted or the runner stops.

What it does not do: images (the command runs from this machine's Python environment; of an image,
only the command in ``entrypoints``), the pod's
user (processes run as the test's own user, root: the interpreter of this machine lives under
/root, which other users cannot read; so ``runAsUser``/``fsGroup`` are not exercised), init
containers (KWOK reports them completed), CPU limits, ephemeral-storage limits (``emptyDir``
``sizeLimit`` included), memory-backed ``emptyDir`` (a folder on disk, not charged to the cgroup),
node-pressure eviction, probes, container restarts (a Deployment's pod whose process ends is
reported terminated, not restarted), and pod networking: every pod shares this machine's network
(two pods that listen on one port, two replicas of one Deployment, cannot run at once), and no Service proxy
(a Service's name leads to 127.0.0.1 at the port the client names: right where the Service's port
is its pods' port, never for ``kubernetes.default.svc:443``; in-cluster clients use
``KUBERNETES_SERVICE_HOST``/``PORT``, which name the API server). What a pod network gives a job, its own address for its rendezvous, the runner
gives it as a port: the rendezvous port an engine sets for every job alike (``MASTER_PORT``, the
Training Operator's 23456; ``PET_MASTER_PORT``, the torch runtime's 29400) is replaced, in the
process's environment only (the pod object keeps the engine's value), by a free port of that job's
own, the same for all of its pods and their replacements (the job is its engine's job-name label).
So jobs of several tests, or of several clusters on one machine, can train at once.

Mount points: a container path that does not exist on this machine is made (an empty folder or
file) before the bind mount, since there is no image filesystem to hold it, and made inside the
pod's mount namespace only: the existing folder it would be made in gets a writable layer there (an
overlay on a tmpfs of the pod's own, with that folder's own mounts put back on top), so the
machine's folders stay as they were (an empty ``/var/run/secrets/kubernetes.io`` left on a machine
makes Kubernetes clients there believe they run in a pod). A path whose first missing folder is at
the machine's root (``/data``) cannot be layered (an overlay on ``/`` is not seen from ``/``): that
one folder is made on the machine, empty, and removed when the runner stops.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import logging
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import proc_account
from tests.support.informer import Informer

PROVISIONER = "kubetune.test/local-folder"
# A StorageClass parameter: "enforced" gives volumes that are full at the claim's requested size.
CAPACITY_PARAMETER = "kubetune.test/capacity"
CONTAINER_MARK = "PODRUNNER_CONTAINER_UID"
TERMINATION_LOG_MAX = 4096  # the kubelet's limit on a termination message
LOG_TAIL_LINES = 80
# The variables that carry a job's rendezvous port (replaced per job: the module's docstring), the
# labels that name a pod's job (Training Operator v1; JobSet, under Trainer v2), and where the
# replacement ports come from: below Linux's default ephemeral range (32768-60999).
RENDEZVOUS_PORT_ENV = ("MASTER_PORT", "PET_MASTER_PORT")
JOB_NAME_LABELS = ("training.kubeflow.org/job-name", "jobset.sigs.k8s.io/jobset-name")
JOB_PORTS = (20000, 32000)
OOM_EXIT_CODE = 137  # 128 + SIGKILL: what the runtime reports for a container the OOM killer ended

logger = logging.getLogger(__name__)


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
    cgroup: Path | None = None  # its memory cgroup, when it has a memory limit the runner enforces
    oom_killed: bool = False


@dataclass
class PodRunner:
    """Watches pods bound to the fake nodes and runs them; provisions volumes. One per cluster.

    What it reads (pods, Services, claims, volumes, storage classes) comes from watches
    (:class:`~tests.support.informer.Informer`), as a kubelet's informers: its loops read the caches,
    the pod loop at once when a pod changes and at least every 0.3 s for the containers' own exits."""

    api: Any  # kubernetes.client.ApiClient of an admin
    api_host: str  # "127.0.0.1"
    api_port: int
    ca_file: Path
    workdir: Path
    image_files: dict[str, Path] = field(default_factory=dict)
    python_bin: Path | None = None  # put first on PATH: what `python` in a command runs
    namespaces: set[str] | None = None  # run pods only in these (None: all but kube-*)
    keep_visible: tuple[Path, ...] = ()  # folders the commands run from: never hidden by a volume
    # image repository (no tag, no digest) -> (ENTRYPOINT, CMD): what runs where a container names no command
    entrypoints: dict[str, tuple[list[str], list[str]]] = field(default_factory=dict)
    _pods: dict[str, RunningPod] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)
    _hosts_at: float = 0.0
    # uids of pods whose container this runner started: a pod runs once (restartPolicy Never), even
    # while the cache still shows it Running after its exit was reported
    _ran: set[str] = field(default_factory=set)
    _provisioned: set[str] = field(default_factory=set)  # claims' uids given a volume
    _informers: dict[str, Informer] = field(default_factory=dict)
    # where containers' memory limits are enforced (None: nowhere; a warning said why)
    memory_cgroups: MemoryCgroups | None = None
    _stale_cgroups: list[Path] = field(default_factory=list)
    # top-level folders made on this machine for mount points (_mount_point_layers), removed at stop
    _made_on_host: list[Path] = field(default_factory=list)
    # (namespace, job, the engine's port) -> the job's own port (_job_port)
    _job_ports: dict[tuple[str, str, int], int] = field(default_factory=dict)

    # --- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        from kubernetes import client

        self.core: Any = client.CoreV1Api(self.api)
        storage: Any = client.StorageV1Api(self.api)
        (self.workdir / "pods").mkdir(parents=True, exist_ok=True)
        (self.workdir / "volumes").mkdir(parents=True, exist_ok=True)
        self.memory_cgroups = MemoryCgroups.find()
        # what the loops read: watched, not listed at every tick (tests/support/informer.py)
        self._informers = {
            "pods": Informer(self.core.list_pod_for_all_namespaces, "pods"),
            "services": Informer(self.core.list_service_for_all_namespaces, "services"),
            "claims": Informer(self.core.list_persistent_volume_claim_for_all_namespaces, "claims"),
            "volumes": Informer(self.core.list_persistent_volume, "volumes"),
            "classes": Informer(storage.list_storage_class, "classes"),
        }
        for informer in self._informers.values():
            informer.start()
        for informer in self._informers.values():
            informer.wait_synced(60)
        for target in (self._pod_loop, self._volume_loop):
            t = threading.Thread(target=self._guard(target), daemon=True, name=target.__name__)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        self._stop.set()
        for informer in self._informers.values():
            informer.stop()
        with self._lock:
            pods = list(self._pods.values())
        for p in pods:
            _kill_container(p.uid, signal.SIGKILL)
        for t in self._threads:
            t.join(timeout=10)
        if self.memory_cgroups is not None:
            self._stale_cgroups += [p.cgroup for p in pods if p.cgroup is not None]
            deadline = time.monotonic() + 10
            while self._stale_cgroups and time.monotonic() < deadline:
                self._remove_stale_cgroups()
                time.sleep(0.1)
            self.memory_cgroups.close()
        for folder in (self.workdir / "volumes").iterdir():
            if folder.is_dir() and os.path.ismount(folder):
                _unmount(folder)
        for made in reversed(self._made_on_host):
            with contextlib.suppress(OSError):  # not empty: something else wrote there, kept
                if made.is_dir():
                    made.rmdir()
                elif made.stat().st_size == 0:
                    made.unlink()

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
        # at once when a pod changes; at least every 0.3 s for the containers' own exits
        changed = self._informers["pods"].changed
        while not self._stop.is_set():
            changed.clear()
            live = set()
            for pod in self._informers["pods"].items():
                if not pod.spec.node_name:  # not bound to a node yet
                    continue
                uid = pod.metadata.uid
                live.add(uid)
                if not self.wanted(pod):
                    continue
                with self._lock:
                    running = self._pods.get(uid)
                if pod.metadata.deletion_timestamp is not None:
                    self._terminate(pod, running)
                elif running is None and uid not in self._ran and node_started(pod):
                    self._start_pod(pod)
            self._reap(live)
            self._refresh_hosts()
            changed.wait(0.3)

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
        command = self._command(container)
        # mount points that do not exist here are made inside the pod's mount namespace, never on
        # this machine (the module's docstring)
        binds = self._mount_point_layers(root, [(Path(t), src.is_dir()) for t, src in mounts])
        # parents before what is mounted inside them
        for target, source in sorted(mounts, key=lambda m: len(Path(m[0]).parts)):
            kind = "-d" if source.is_dir() else "-f"
            make = f"mkdir -p {shlex.quote(target)}" if source.is_dir() else f"touch {shlex.quote(target)}"
            binds.append(
                f"[ {kind} {shlex.quote(target)} ] || {make}; "
                f"mount --bind {shlex.quote(str(source))} {shlex.quote(target)}"
            )
        cd = f"cd {shlex.quote(container.working_dir)} && " if container.working_dir else ""
        cgroup = self._memory_cgroup(pod, container)
        # the shell joins the cgroup before anything else runs: every process of the container is in it
        join = f"echo $$ > {shlex.quote(str(cgroup / 'cgroup.procs'))}; " if cgroup is not None else ""
        # the pod's own host name, in its own UTS namespace (``gethostname()`` in the container, as
        # the kubelet gives it: the Lease holder of an operator pod is named after the pod)
        name = f"hostname {shlex.quote(pod_hostname(pod))}; "
        inner = "set -e; " + join + name + "; ".join(binds) + f" && {cd}exec " + shlex.join(command)
        log = root / "container.log"
        out = log.open("ab")
        proc = subprocess.Popen(
            ["unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c", inner],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        out.close()
        fallback = (container.termination_message_policy or "File") == "FallbackToLogsOnError"
        with self._lock:
            self._pods[meta.uid] = RunningPod(
                meta.uid,
                meta.namespace,
                meta.name,
                root,
                proc,
                log,
                term_file,
                fallback,
                now(),
                cgroup=cgroup,
            )
            self._ran.add(meta.uid)

    def _command(self, container: Any) -> list[str]:
        """What the container runs, as the kubelet decides it: its ``command`` (the image's ENTRYPOINT
        where it has none) and its ``args`` (the image's CMD where it has neither)."""
        if container.command:
            return [*container.command, *(container.args or [])]
        image = self.entrypoints.get(image_repository(container.image or ""))
        if image is None:  # an image this runner does not stand in for: its args alone
            return [*(container.args or [])]
        entrypoint, cmd = image
        return [*entrypoint, *(container.args or cmd)]

    def _mount_point_layers(self, root: Path, targets: list[tuple[Path, bool]]) -> list[str]:
        """Shell commands, run first in the pod's mount namespace, after which every mount target can
        be made without changing this machine: each existing folder that a missing target would be
        made in gets a writable layer (an overlay on a tmpfs of the pod's own, with the folder's own
        mounts put back on top). A target whose first missing folder is at the machine's root cannot
        be layered (an overlay on / is not seen from /): that folder is made here, empty, and removed
        when the runner stops."""
        below: list[Path] = []
        for target, is_dir in targets:
            missing = target
            while not missing.parent.exists():
                missing = missing.parent
            if target.exists() or missing.is_symlink():
                continue
            if missing.parent == Path("/"):  # made here; inside it, layered like any other folder
                with self._lock:
                    if not missing.exists():
                        if missing == target and not is_dir:
                            missing.touch(mode=0o644)
                        else:
                            missing.mkdir(mode=0o755)
                        self._made_on_host.append(missing)
                if missing != target:
                    below.append(missing)
                continue
            below.append(missing.parent.resolve())
        folders = sorted(set(below), key=lambda f: len(f.parts))
        if not folders:
            return []
        layers = root / "layers"
        layers.mkdir(exist_ok=True)
        q = shlex.quote
        commands = [f"mount -t tmpfs -o mode=0700 kubetune-layers {q(str(layers))}"]
        mounted = _mount_points()
        for i, folder in enumerate(folders):
            upper, work, lower = (layers / f"{i}-{part}" for part in ("upper", "work", "lower"))
            commands.append(f"mkdir {q(str(upper))} {q(str(work))} {q(str(lower))}")
            commands.append(f"chmod {folder.stat().st_mode & 0o7777:o} {q(str(upper))}")
            # the folder as it is (with what is mounted inside it), to put its mounts back from
            commands.append(f"mount --rbind {q(str(folder))} {q(str(lower))}")
            commands.append(
                f"mount -t overlay kubetune-layer -o lowerdir={folder},upperdir={upper},workdir={work} {q(str(folder))}"
            )
            inside = [m for m in mounted if m != folder and m.is_relative_to(folder)]
            for m in inside:
                if any(m != n and m.is_relative_to(n) for n in inside):
                    continue  # under another of them: rbind puts it back with its parent
                rel = m.relative_to(folder)
                commands.append(f"mount --rbind {q(str(lower / rel))} {q(str(m))}")
        return commands

    def _memory_cgroup(self, pod: Any, container: Any) -> Path | None:
        limit = ((container.resources and container.resources.limits) or {}).get("memory")
        if not limit:
            return None
        if self.memory_cgroups is None:
            logger.warning(
                "pod %s/%s: memory limit %s not enforced (no writable memory cgroup on this machine)",
                pod.metadata.namespace,
                pod.metadata.name,
                limit,
            )
            return None
        return self.memory_cgroups.create(pod.metadata.uid, int(_parse_quantity(str(limit))))

    def _reap(self, live: set[str]) -> None:
        with self._lock:
            pods = list(self._pods.values())
        self._remove_stale_cgroups()
        for p in pods:
            code = p.proc.poll()
            if p.cgroup is not None and not p.oom_killed and MemoryCgroups.oom_kills(p.cgroup):
                # the kernel's OOM killer killed a process of the container: the whole container goes,
                # as under the kubelet's memory.oom.group (what cgroup v2 does by itself)
                p.oom_killed = True
                _kill_container(p.uid, signal.SIGKILL)
                if code is None:
                    continue  # reported once the main process has gone
            if code is None:
                continue
            if code < 0:  # killed by a signal: the container runtime reports 128 + signal
                code = 128 - code
            if p.oom_killed:
                code = OOM_EXIT_CODE
            _kill_container(p.uid, signal.SIGKILL)  # the main process ended: so does the container
            if p.cgroup is not None:
                self._stale_cgroups.append(p.cgroup)
            # a pod being deleted too: the kubelet writes its terminal phase (Failed or Succeeded,
            # the container's exit) before the object goes, and the Job controller, which holds a
            # finalizer on its pods, waits for it when the Job has a pod failure policy (a
            # TrainJob's JobSet's Jobs: a pod left Running while deleted stalls its Job for good)
            if not p.deleting:
                self._report_exit(p, code)
            else:  # it may be gone already (its grace period over, or no finalizer held it)
                from kubernetes.client.rest import ApiException

                with contextlib.suppress(ApiException):
                    self._report_exit(p, code)
            with self._lock:
                self._pods.pop(p.uid, None)
            if p.deleting:
                self._remove(p.namespace, p.name, p.uid)
            if p.uid not in live:
                continue

    def _remove_stale_cgroups(self) -> None:
        """Remove the cgroups of ended containers (a cgroup goes once its last process has)."""
        left = []
        for cgroup in self._stale_cgroups:
            try:
                cgroup.rmdir()
            except FileNotFoundError:
                pass
            except OSError:  # EBUSY: a process of it is still exiting
                left.append(cgroup)
        self._stale_cgroups = left

    def _report_exit(self, p: RunningPod, code: int) -> None:
        message = p.termination_file.read_text(errors="replace") if p.termination_file else ""
        if not message.strip() and code != 0 and p.fallback_to_logs:
            lines = p.log.read_text(errors="replace").splitlines()[-LOG_TAIL_LINES:]
            message = "\n".join(lines)
        message = message[-TERMINATION_LOG_MAX:]
        pod = self.core.read_namespaced_pod(p.name, p.namespace)
        if pod.metadata.uid != p.uid:
            return
        containers = [(c.name, c.image) for c in pod.spec.containers]
        body = exit_status(containers, code, message, started=p.started, oom_killed=p.oom_killed)
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
        for pod in self._informers["pods"].items():
            host = pod_hostname(pod)
            names.update({host, pod.metadata.name})
            if pod.spec.subdomain:  # a headless Service's pod (a JobSet's): <host>.<subdomain>[.<ns>[.svc]]
                fqdn = f"{host}.{pod.spec.subdomain}"
                names.update(
                    {fqdn, f"{fqdn}.{pod.metadata.namespace}", f"{fqdn}.{pod.metadata.namespace}.svc"}
                )
        for svc in self._informers["services"].items():
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
            "HOSTNAME": pod_hostname(pod),
            "KUBERNETES_SERVICE_HOST": self.api_host,
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
            # every process of the container inherits it: the stand-in for its cgroup (_container_pids)
            CONTAINER_MARK: pod.metadata.uid,
        }
        if os.environ.get(proc_account.ENV):  # the run's CPU accounting reaches the pods' processes too
            env.update({k: os.environ[k] for k in (proc_account.ENV, "PYTHONPATH") if k in os.environ})
        for var in container.env or []:
            if var.value_from is None:
                env[var.name] = _expand(var.value or "", env)
                continue
            value = self._value_from(pod, container, var.value_from)
            if value is not None:
                env[var.name] = value
        job = _job_of(pod)
        for name in RENDEZVOUS_PORT_ENV:
            if job is not None and env.get(name, "").isdigit():
                env[name] = str(self._job_port(pod.metadata.namespace, job, int(env[name])))
        return env

    def _job_port(self, namespace: str, job: str, port: int) -> int:
        """The port that stands in for ``port`` for every pod of one job (the module's docstring)."""
        key = (namespace, job, port)
        with self._lock:
            if key not in self._job_ports:
                self._job_ports[key] = _free_port(f"{namespace}/{job}/{port}", set(self._job_ports.values()))
            return self._job_ports[key]

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
        from kubernetes.client.rest import ApiException

        released: set[str] = set()  # volumes deleted (the cache may still show them a moment)
        while not self._stop.is_set():
            ours = {
                sc.metadata.name: (sc.parameters or {}).get(CAPACITY_PARAMETER) == "enforced"
                for sc in self._informers["classes"].items()
                if sc.provisioner == PROVISIONER
            }
            for pvc in self._informers["claims"].items():
                if pvc.spec.volume_name or pvc.metadata.deletion_timestamp is not None:
                    continue
                if pvc.spec.storage_class_name not in ours or pvc.metadata.uid in self._provisioned:
                    continue
                self._provision(pvc, sized=ours[pvc.spec.storage_class_name])
                self._provisioned.add(pvc.metadata.uid)
            for pv in self._informers["volumes"].items():
                ann = pv.metadata.annotations or {}
                if ann.get("pv.kubernetes.io/provisioned-by") != PROVISIONER or pv.metadata.uid in released:
                    continue
                if pv.status.phase == "Released" and pv.spec.persistent_volume_reclaim_policy == "Delete":
                    with contextlib.suppress(ApiException):
                        self.core.delete_persistent_volume(pv.metadata.name)
                    folder = Path(pv.spec.host_path.path)
                    if os.path.ismount(folder):
                        _unmount(folder)
                    shutil.rmtree(folder, ignore_errors=True)
                    released.add(pv.metadata.uid)
            self._stop.wait(0.3)

    def _provision(self, pvc: Any, *, sized: bool = False) -> None:
        from kubernetes.client.rest import ApiException

        name = f"pvc-{pvc.metadata.uid}"
        path = self.workdir / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o777)
        if sized:  # mounted before the PV exists: no pod can see the folder before it is the disk
            size = int(_parse_quantity(str(pvc.spec.resources.requests["storage"])))
            _mount_sized(path, path.parent / f"{name}.img", size)
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


# --- memory cgroups --------------------------------------------------------------------------------

CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass
class MemoryCgroups:
    """A folder of memory cgroups, one per container with a memory limit: the kubelet's part.

    cgroup v2 (``/sys/fs/cgroup/cgroup.controllers`` lists ``memory``): a cgroup under the root with
    the memory controller enabled for its children, each with ``memory.max``, ``memory.swap.max`` 0
    and ``memory.oom.group`` 1, as the kubelet sets them. cgroup v1 (a memory hierarchy at
    ``/sys/fs/cgroup/memory``): a cgroup under the runner's own (the processes stay accounted where
    the runner's are), else under the hierarchy's root, each child with ``memory.limit_in_bytes``.
    """

    version: int
    parent: Path

    @classmethod
    def find(cls) -> MemoryCgroups | None:
        name = f"kubetune-podrunner-{os.getpid()}"
        tried = []
        controllers = CGROUP_ROOT / "cgroup.controllers"
        if controllers.exists() and "memory" in controllers.read_text().split():
            parent = CGROUP_ROOT / name
            try:
                subtree = (CGROUP_ROOT / "cgroup.subtree_control").read_text().split()
                if "memory" not in subtree:
                    (CGROUP_ROOT / "cgroup.subtree_control").write_text("+memory")
                parent.mkdir(exist_ok=True)
                (parent / "cgroup.subtree_control").write_text("+memory")
                return cls(2, parent)
            except OSError as e:
                tried.append(f"cgroup v2 at {parent}: {e}")
        v1 = CGROUP_ROOT / "memory"
        if (v1 / "memory.limit_in_bytes").exists():
            for base in (v1 / _own_v1_memory_cgroup(), v1):
                parent = base / name
                try:
                    parent.mkdir(exist_ok=True)
                    probe = cls(1, parent).create("probe", 2**30)
                    probe.rmdir()
                    return cls(1, parent)
                except OSError as e:
                    tried.append(f"cgroup v1 at {parent}: {e}")
                    with contextlib.suppress(OSError):
                        parent.rmdir()
        logger.warning(
            "pod runner: containers' memory limits are not enforced: no writable memory cgroup (%s)",
            "; ".join(tried)
            or f"neither cgroup v2 with the memory controller nor a v1 memory hierarchy under {CGROUP_ROOT}",
        )
        return None

    def create(self, uid: str, limit: int) -> Path:
        cgroup = self.parent / uid
        cgroup.mkdir(exist_ok=True)
        if self.version == 2:
            (cgroup / "memory.max").write_text(str(limit))
            for knob, value in (("memory.swap.max", "0"), ("memory.oom.group", "1")):
                if (cgroup / knob).exists():
                    (cgroup / knob).write_text(value)
        else:
            (cgroup / "memory.limit_in_bytes").write_text(str(limit))
        return cgroup

    @staticmethod
    def oom_kills(cgroup: Path) -> int:
        """Processes of this cgroup the kernel's OOM killer killed (v2 memory.events, v1 memory.oom_control)."""
        for knob in ("memory.events", "memory.oom_control"):
            with contextlib.suppress(OSError):
                for line in (cgroup / knob).read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "oom_kill":
                        return int(value)
        return 0

    def close(self) -> None:
        for child in self.parent.iterdir() if self.parent.is_dir() else ():
            if child.is_dir():
                with contextlib.suppress(OSError):
                    child.rmdir()
        with contextlib.suppress(OSError):
            self.parent.rmdir()


def _own_v1_memory_cgroup() -> str:
    """This process's cgroup in the v1 memory hierarchy, relative to its root ("" for the root)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if "memory" in controllers.split(","):
                return path.lstrip("/")
    return ""


# --- sized volumes ----------------------------------------------------------------------------------


def _mount_sized(folder: Path, image: Path, size: int) -> str:
    """A file system of ``size`` bytes at ``folder``: an ext4 image, formatted as Kubernetes formats a
    block volume (``mkfs.ext4 -F -m0 -O ^has_journal``: no journal, no blocks reserved for root, who the containers run as here),
    loop-mounted; a tmpfs of that size where that fails. Returns what it mounted."""
    if os.path.ismount(folder):
        return "mounted"
    try:
        with image.open("wb") as f:
            f.truncate(size)
        # no journal: on a volume of a few MiB, ext4's journal alone would take a fifth of the claim
        subprocess.run(
            ["mkfs.ext4", "-q", "-F", "-m0", "-O", "^has_journal", str(image)],
            check=True,
            capture_output=True,
        )
        subprocess.run(["mount", "-o", "loop", str(image), str(folder)], check=True, capture_output=True)
        kind = "ext4"
    except (OSError, subprocess.CalledProcessError) as e:
        detail = (
            e.stderr.decode(errors="replace").strip() if isinstance(e, subprocess.CalledProcessError) else e
        )
        logger.warning(
            "volume %s: no loop-mounted ext4 (%s); a tmpfs of %d bytes instead", folder, detail, size
        )
        image.unlink(missing_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], check=True)
        kind = "tmpfs"
    folder.chmod(0o777)
    return kind


def _unmount(folder: Path) -> None:
    """Unmount a sized volume (lazily, should a process still hold it) and delete its image."""
    subprocess.run(["umount", "--lazy", str(folder)], check=False, capture_output=True)
    (folder.parent / f"{folder.name}.img").unlink(missing_ok=True)


# --- helpers ----------------------------------------------------------------------------------------


def pod_hostname(pod: Any) -> str:
    """A pod's host name as the kubelet sets it: ``spec.hostname``, else the pod's name (its first
    63 characters, the limit of a host name's label, without a trailing ``-`` or ``.``)."""
    return str(pod.spec.hostname or pod.metadata.name[:63].rstrip("-."))


def image_repository(image: str) -> str:
    """An image reference without its tag or digest: ``ghcr.io/kubetune/operator:0.1.0`` ->
    ``ghcr.io/kubetune/operator`` (a registry's port stays: ``host:5000/x``)."""
    name = image.split("@", 1)[0]
    head, _, last = name.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}" if head else last.split(":", 1)[0]


def dockerfile_command(dockerfile: Path) -> tuple[list[str], list[str]]:
    """The ENTRYPOINT and CMD of a Dockerfile's last stage, in their exec (JSON) form: what a
    container of its image runs when the pod names no command."""
    import json

    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in dockerfile.read_text().splitlines():
        word, _, rest = line.strip().partition(" ")
        if word.upper() == "FROM":  # a new stage: what an earlier one set does not carry over
            entrypoint, cmd = [], []
        elif word.upper() in ("ENTRYPOINT", "CMD"):
            value = json.loads(rest)  # the shell form would run under /bin/sh -c: not used here
            if word.upper() == "ENTRYPOINT":
                entrypoint, cmd = value, []  # as Docker does: an ENTRYPOINT drops the CMD before it
            else:
                cmd = value
    return entrypoint, cmd


def _job_of(pod: Any) -> str | None:
    """The training job a pod belongs to, by its engine's label (None: not a training job's pod)."""
    labels = pod.metadata.labels or {}
    return next((labels[k] for k in JOB_NAME_LABELS if labels.get(k)), None)


def _free_port(seed: str, taken: set[int]) -> int:
    """A port nothing listens on now, below the kernel's ephemeral range (where clients' ports come
    from), starting at a place the seed picks, so that runners in other processes rarely try the same."""
    span = JOB_PORTS[1] - JOB_PORTS[0]
    start = int(hashlib.sha256(seed.encode()).hexdigest(), 16) % span
    for i in range(span):
        port = JOB_PORTS[0] + (start + i) % span
        if port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"pod runner: no free port in {JOB_PORTS[0]}-{JOB_PORTS[1]} for {seed}")


def _mount_points() -> list[Path]:
    """Where something is mounted in this process's mount namespace (/proc/self/mountinfo)."""
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4]  # with space, tab, newline and backslash octal-escaped
        points.append(Path(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)))
    return points


def exit_status(
    containers: list[tuple[str, str]],
    code: int,
    message: str,
    *,
    started: str,
    finished: str | None = None,
    oom_killed: bool = False,
) -> dict[str, Any]:
    """The pod status a kubelet writes when the container exits with ``code`` (each of
    ``containers``, ``(name, image)``, terminated alike), ``message`` its termination message: the
    body of a ``patch_namespaced_pod_status``."""
    finished = finished or now()
    statuses = []
    for name, image in containers:
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": "OOMKilled" if oom_killed else "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": finished,
        }
        if message:
            terminated["message"] = message[-TERMINATION_LOG_MAX:]
        statuses.append(
            {
                "name": name,
                "image": image,
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"terminated": terminated},
            }
        )
    completed = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": finished}
    return {
        "status": {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": statuses,
            "conditions": [{"type": "Ready", **completed}, {"type": "ContainersReady", **completed}],
        }
    }


def node_started(pod: Any) -> bool:
    """Whether the node (KWOK) reports the pod's containers running: where a kubelet would run them."""
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
