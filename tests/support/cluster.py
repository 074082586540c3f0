"""A Kubernetes cluster without containers, for end-to-end tests through the real controllers.

The control plane of ``controlplane.py`` (etcd, kube-apiserver, with ServiceAccount admission on)
plus, as processes on 127.0.0.1, every controller a user's cluster runs for kubetune's children:

* kube-controller-manager: Job controller, garbage collector, PV binder, ServiceAccount and root
  CA publisher, EndpointSlices...;
* kube-scheduler: places pods on nodes by their ``nvidia.com/gpu`` requests and node selectors;
* KWOK: keeps the fake GPU nodes Ready (with leases) and marks pods bound to them Running;
* the Kubeflow Training Operator v1.9: PyTorchJob -> pods, headless Service, env, conditions,
  restarts by exit code;
* Kueue: quota and admission of PyTorchJobs (and TrainJobs) that name a queue, with its webhooks
  called by the API server;
* on request (``running_cluster(trainer_v2=True)``): Kubeflow Trainer v2's controller manager
  (TrainJob -> JobSet) and the JobSet controller (JobSet -> Jobs, headless Service), with their
  real CRDs and their webhooks called by the API server (JobSet's defaults are load-bearing), and
  Kueue's TrainJob integration on. ``training_operator=False`` leaves the Training Operator out
  (a cluster with only Trainer v2, as a 2026 Kubeflow platform installs).

Then ``podrunner.PodRunner`` stands in for the container runtime (and a volume provisioner): it
runs each pod's command as a local process and reports its real exit. The binaries are built from
Go modules by ``hack/build-control-plane.sh cluster`` (Trainer v2 and JobSet: ``trainer-v2``) into
the cache outside the repository.

Fake nodes: ``NODES`` nodes with ``GPUS_PER_NODE`` ``nvidia.com/gpu`` each, labelled with the GPU
product of the examples. StorageClass ``STORAGE_CLASS`` (default) provisions folder volumes;
``SIZED_STORAGE_CLASS`` provisions volumes that are full at the claim's size, as a cloud disk is (a
file system of that many bytes). The pod runner enforces containers' memory limits in cgroups.
Kueue: ResourceFlavor ``FLAVOR`` (that GPU product), ClusterQueue ``CLUSTER_QUEUE`` with a quota of
``QUEUE_GPUS`` GPUs and ``QUEUE_CPUS`` CPUs; a test makes a LocalQueue in its namespace with ``local_queue``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.support import proc_account
from tests.support.controlplane import REPO, ControlPlane, _issue, free_port, running_control_plane
from tests.support.podrunner import CAPACITY_PARAMETER, PROVISIONER, PodRunner, dockerfile_command

NODES = 4
GPUS_PER_NODE = 8
GPU_PRODUCT = "NVIDIA-H100-80GB-HBM3"
STORAGE_CLASS = "kubetune-test"
# An image no node can pull: the registry's name is under .invalid (RFC 2606), which never resolves.
# KWOK reports its pods as the kubelet does (ErrImagePull), through a Stage of ours.
UNPULLABLE_IMAGE = "registry.invalid/kubetune/trainer:0"
# Where the release workflow pushes images/<name>: the chart's default repositories (the pod runner
# runs what images/<name>/Dockerfile's ENTRYPOINT and CMD say for a container without a command).
IMAGE_REGISTRY = "ghcr.io/kubetune"
SIZED_STORAGE_CLASS = "kubetune-test-sized"  # spec.storage.size is the disk's size: writing past it fails
FLAVOR = "h100"
CLUSTER_QUEUE = "gpu-cluster"
QUEUE_GPUS = 16  # the two-node example fits; a third 8-GPU job waits
QUEUE_CPUS = 100  # two jobs of 60 CPUs do not fit together
# Hard-coded in the Training Operator (its webhook server's default): in a cluster, the Secret's mount.
TRAINING_OPERATOR_CERTS = Path("/tmp/k8s-webhook-server/serving-certs")
# Hard-coded in Kueue v0.17: it will not start without a metrics serving certificate there.
KUEUE_METRICS_CERTS = Path("/etc/kueue/metrics/certs")
KUEUE_KINDS = ("kueue-x-k8s-io",)  # the webhooks of Kueue's own kinds; a framework's: KUEUE_FRAMEWORKS
# Kueue's name of each training engine's integration, and the path fragment of its webhooks
KUEUE_PYTORCHJOB = ("kubeflow.org/pytorchjob", "kubeflow-org-v1-pytorchjob")
KUEUE_TRAINJOB = ("trainer.kubeflow.org/trainjob", "trainer-kubeflow-org-v1alpha1-trainjob")


def _built(env: str, binary: str, mode: str) -> Path:
    """The folder named by ``env`` when it holds ``binary``, else what ``hack/build-control-plane.sh
    mode`` builds (or finds in its cache): the folder on its last line."""
    own = os.environ.get(env)
    if own and (Path(own) / binary).exists():
        return Path(own)
    build = subprocess.run(
        [str(REPO / "hack" / "build-control-plane.sh"), mode], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(build.stdout.strip().splitlines()[-1])


def find_cluster_assets() -> Path:
    """The controllers of the PyTorchJob cluster (``KUBETUNE_CLUSTER_ASSETS``: a folder of your own,
    where Kueue may be missing)."""
    return _built("KUBETUNE_CLUSTER_ASSETS", "training-operator", "cluster")


def find_trainer_v2_assets() -> Path:
    """Kubeflow Trainer v2's controller manager and the JobSet controller, with their CRDs and
    webhook configurations (``hack/build-control-plane.sh trainer-v2``; or a folder of your own in
    ``KUBETUNE_TRAINER_V2_ASSETS``)."""
    return _built("KUBETUNE_TRAINER_V2_ASSETS", "trainer-controller-manager", "trainer-v2")


@dataclass
class Cluster:
    cp: ControlPlane
    assets: Path
    workdir: Path
    image_files: dict[str, Path]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    runner: PodRunner | None = None
    training_operator: bool = True  # the Kubeflow Training Operator v1 (PyTorchJob)
    trainer_v2: Path | None = None  # Trainer v2 and JobSet's assets: run them (TrainJob)

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl(*args, input=input, check=check)

    def apply(self, *docs: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", input=yaml.safe_dump_all(docs))

    # --- processes -------------------------------------------------------------------------------

    def _spawn(
        self,
        name: str,
        args: list[str],
        env: dict[str, str] | None = None,
        private: dict[Path, Path] | None = None,
    ) -> None:
        """Start a component; ``private`` bind-mounts folders of this cluster over hard-coded paths
        in a mount namespace of its own, so two clusters on one machine do not share them."""
        log = (self.workdir / f"{name}.log").open("ab")
        if private:
            binds = []
            for target, source in private.items():
                target.mkdir(parents=True, exist_ok=True)
                source.mkdir(parents=True, exist_ok=True)
                binds.append(f"mount --bind {shlex.quote(str(source))} {shlex.quote(str(target))}")
            script = "set -e; " + "; ".join(binds) + "; exec " + shlex.join(args)
            args = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script]
        self.procs[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}):\n{self.log(name)}")

    def log(self, name: str, tail: int = 60) -> str:
        path = self.workdir / f"{name}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-tail:]) if path.exists() else ""

    def _kube_flags(self) -> list[str]:
        k = str(self.kubeconfig)
        return [f"--kubeconfig={k}", f"--authentication-kubeconfig={k}", f"--authorization-kubeconfig={k}"]

    def start(self) -> None:
        d = self.cp.workdir
        self._spawn(
            "kube-controller-manager",
            [
                str(self.assets / "kube-controller-manager"),
                *self._kube_flags(),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                f"--service-account-private-key-file={d / 'sa.key'}",
                f"--root-ca-file={d / 'ca.crt'}",
                f"--cluster-signing-cert-file={d / 'ca.crt'}",
                f"--cluster-signing-key-file={d / 'ca.key'}",
                "--controllers=*",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.assets / "kube-scheduler"),
                *self._kube_flags(),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
            ],
        )
        self._start_kwok()
        self._make_nodes_and_storage()
        if self.training_operator:
            self._start_training_operator()
        else:  # the control plane installs the PyTorchJob CRD: a cluster without it has none
            self.kubectl("delete", "crd", "pytorchjobs.kubeflow.org", "--ignore-not-found")
        if self.trainer_v2 is not None:
            self._start_jobset(self.trainer_v2)
            self._start_trainer(self.trainer_v2)
        if self.has_kueue:
            self._start_kueue()
        self._start_runner()

    @property
    def has_kueue(self) -> bool:
        return (self.assets / "kueue").exists()

    def _start_kwok(self) -> None:
        stages = self.workdir / "kwok-stages.yaml"
        texts = [_without_unpullable(p) for p in sorted((self.assets / "kwok-stages").glob("*.yaml"))]
        stages.write_text("\n---\n".join([*texts, IMAGE_PULL_FAILED_STAGE]))
        self._spawn(
            "kwok",
            [
                str(self.assets / "kwok"),
                f"--kubeconfig={self.kubeconfig}",
                f"--config={stages}",
                "--manage-all-nodes=false",
                "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                "--node-ip=10.0.0.1",
                "--cidr=10.0.1.0/24",
                f"--server-address=127.0.0.1:{free_port()}",
                "--node-lease-duration-seconds=40",
            ],
        )

    def _make_nodes_and_storage(self) -> None:
        nodes = [
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": f"gpu-node-{i}",
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "kubernetes.io/hostname": f"gpu-node-{i}",
                        "kubernetes.io/os": "linux",
                        "nvidia.com/gpu.product": GPU_PRODUCT,
                        "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                        "type": "kwok",
                    },
                },
                "status": {
                    "capacity": {
                        "cpu": "96",
                        "memory": "2Ti",
                        "pods": "110",
                        "nvidia.com/gpu": str(GPUS_PER_NODE),
                    },
                    "allocatable": {
                        "cpu": "96",
                        "memory": "2Ti",
                        "pods": "110",
                        "nvidia.com/gpu": str(GPUS_PER_NODE),
                    },
                },
            }
            for i in range(NODES)
        ]
        storage_class = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {
                "name": STORAGE_CLASS,
                "annotations": {"storageclass.kubernetes.io/is-default-class": "true"},
            },
            "provisioner": PROVISIONER,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        sized_storage_class = {
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": SIZED_STORAGE_CLASS},
            "provisioner": PROVISIONER,
            "parameters": {CAPACITY_PARAMETER: "enforced"},
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
        }
        self.apply(*nodes, storage_class, sized_storage_class)
        # KWOK reports capacity from the status the node was created with; a server-side apply of
        # a Node keeps status, but make sure it is there (and that KWOK made the nodes Ready).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            self.check_alive()
            out = json.loads(self.kubectl("get", "nodes", "-o", "json").stdout)
            ready = [
                n
                for n in out["items"]
                if any(
                    c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", [])
                )
                and n["status"].get("allocatable", {}).get("nvidia.com/gpu") == str(GPUS_PER_NODE)
            ]
            if len(ready) == NODES:
                return
            time.sleep(0.5)
        raise TimeoutError(f"fake nodes not Ready:\n{self.log('kwok')}")

    def _start_training_operator(self) -> None:
        self.kubectl("create", "namespace", "kubeflow")
        self.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "training-operator-webhook-cert", "namespace": "kubeflow"},
            }
        )
        certs = self.workdir / "training-operator-certs"  # seen by it at TRAINING_OPERATOR_CERTS
        self._spawn(
            "training-operator",
            [
                str(self.assets / "training-operator"),
                f"--kubeconfig={self.kubeconfig}",
                "--enable-scheme=pytorchjob",
                "--leader-elect=false",
                f"--metrics-bind-address=127.0.0.1:{free_port()}",
                f"--health-probe-bind-address=127.0.0.1:{free_port()}",
                f"--webhook-server-port={free_port()}",
            ],
            env={"MY_POD_NAMESPACE": "kubeflow"},
            private={TRAINING_OPERATOR_CERTS: certs},
        )
        # its cert rotator fills the Secret; the webhook server reads the files a Secret volume would hold
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            self.check_alive()
            out = json.loads(
                self.kubectl(
                    "-n", "kubeflow", "get", "secret", "training-operator-webhook-cert", "-o", "json"
                ).stdout
            )
            data = out.get("data") or {}
            if data.get("tls.crt") and data.get("tls.key"):
                import base64

                for key in ("tls.key", "tls.crt"):  # key first, each by rename: never half-written
                    tmp = certs / f".{key}.tmp"
                    tmp.write_bytes(base64.b64decode(data[key]))
                    tmp.rename(certs / key)
                break
            time.sleep(0.5)
        else:
            raise TimeoutError(f"training-operator certificate not issued:\n{self.log('training-operator')}")
        self._wait_log("training-operator", "Starting workers", 90)

    def _serving_certs(self, name: str) -> Path:
        """A folder of this cluster holding a serving certificate for 127.0.0.1 that the API server
        trusts (``tls.crt``, ``tls.key``, as a webhook Secret's volume holds them) and ``ca.crt``."""
        d = self.workdir / name
        d.mkdir(exist_ok=True)
        shutil.copy(self.cp.workdir / "ca.crt", d / "ca.crt")
        shutil.copy(self.cp.workdir / "ca.key", d / "ca.key")
        _issue(d, "tls", f"/CN={name}-webhook", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth")
        return d

    def _url_webhooks(
        self,
        manifest: Path,
        certs: Path,
        port: int,
        prefix: str,
        paths: tuple[str, ...] | None = None,
        object_selectors: dict[str, dict[str, Any]] | None = None,
    ) -> list[dict[str, Any]]:
        """A component's webhook configurations as shipped (its Service's paths), called at
        ``https://127.0.0.1:<port>`` instead, renamed ``<prefix>-<name>``; only the webhooks whose
        path contains one of ``paths`` (None: all); ``object_selectors`` by webhook name (what the
        component's kustomize patches add)."""
        import base64

        ca = base64.b64encode((certs / "ca.crt").read_bytes()).decode()
        docs = []
        for doc in yaml.safe_load_all(manifest.read_text()):
            if not doc:
                continue
            hooks = []
            for hook in doc["webhooks"]:
                path = hook["clientConfig"]["service"]["path"]
                if paths is not None and not any(p in path for p in paths):
                    continue
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca}
                if hook["name"] in (object_selectors or {}):
                    hook["objectSelector"] = (object_selectors or {})[hook["name"]]
                hooks.append(hook)
            doc["webhooks"] = hooks
            doc["metadata"]["name"] = f"{prefix}-{doc['metadata']['name']}"
            docs.append(doc)
        return docs

    def _apply_crds(self, folder: Path, what: str) -> None:
        """CRDs by server-side apply (too large for the last-applied annotation), until Established."""
        self.kubectl("apply", "--server-side", "-f", str(folder))
        deadline = time.monotonic() + 60
        while self.kubectl(
            "wait", "--for=condition=Established", "--timeout=30s", "-f", str(folder), check=False
        ).returncode:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what}'s CRDs not established")
            time.sleep(0.5)

    def _wait_ready(self, name: str, health_port: int, timeout: float = 90) -> None:
        """Until the component's ``/readyz`` answers 200 (a manager's, once its webhook server serves)."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            with (
                contextlib.suppress(OSError),
                urllib.request.urlopen(f"http://127.0.0.1:{health_port}/readyz", timeout=2) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.5)
        raise TimeoutError(f"{name} not ready:\n{self.log(name)}")

    def _start_jobset(self, assets: Path) -> None:
        """The JobSet controller, its CRD, and its webhooks: the JobSet ones (its defaults: Indexed
        Jobs, DNS hostnames, the success policy; Trainer v2 relies on them) and the pod ones, only
        for JobSet's pods (the objectSelector of its kustomize patches)."""
        self._apply_crds(assets / "jobset-crds", "JobSet")
        certs = self._serving_certs("jobset")
        port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(certs)},
            "metrics": {"bindAddress": "0", "certDir": str(certs)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }
        (certs / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "jobset",
            [
                str(assets / "jobset"),
                f"--config={certs / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--metrics-bind-address=0",
                f"--health-probe-bind-address=127.0.0.1:{health}",
            ],
        )
        self._wait_ready("jobset", health)
        selectors = {}
        for patch in sorted((assets / "jobset-webhook-patches").glob("*.yaml")):
            for op in yaml.safe_load(patch.read_text()) or []:
                value = op.get("value") or {}
                if value.get("objectSelector"):
                    selectors[value["name"]] = value["objectSelector"]
        assert {"mpod.kb.io", "vpod.kb.io"} <= set(selectors), (
            f"JobSet's pod webhooks lost their selector: {selectors}"
        )
        self.apply(
            *self._url_webhooks(assets / "jobset-webhooks.yaml", certs, port, "jobset", None, selectors)
        )

    def _start_trainer(self, assets: Path) -> None:
        """Kubeflow Trainer v2's controller manager (TrainJob -> JobSet), its CRDs and its webhooks
        (defaulting TrainJobs; validating TrainJobs and runtimes). Certificates come from this
        cluster (its own certificate management off): the webhook server reads them from
        controller-runtime's default folder under ``TMPDIR``, a folder of this process."""
        self._apply_crds(assets / "trainer-crds", "Trainer v2")
        certs = self._serving_certs("trainer")
        tmp = self.workdir / "trainer-tmp"
        served = tmp / "k8s-webhook-server" / "serving-certs"
        served.mkdir(parents=True)
        for key in ("tls.crt", "tls.key"):
            shutil.copy(certs / key, served / key)
        port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": port, "host": "127.0.0.1"},
            "metrics": {"bindAddress": "0"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "certManagement": {"enable": False},
        }
        (certs / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "trainer",
            [
                str(assets / "trainer-controller-manager"),
                f"--config={certs / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
            ],
            env={"TMPDIR": str(tmp)},
        )
        self._wait_ready("trainer", health)
        self.apply(*self._url_webhooks(assets / "trainer-webhooks.yaml", certs, port, "trainer"))

    def _start_kueue(self) -> None:
        d = self._serving_certs("kueue")
        metrics = self.workdir / "kueue-metrics-certs"  # seen by it at KUEUE_METRICS_CERTS
        metrics.mkdir()
        shutil.copy(d / "tls.crt", metrics / "tls.crt")
        shutil.copy(d / "tls.key", metrics / "tls.key")
        self.kubectl("create", "namespace", "kueue-system")
        # Kueue sets up its indexes at start and exits if a kind is not served yet
        self._apply_crds(self.assets / "kueue-crds", "Kueue")
        frameworks = [
            f
            for f, on in ((KUEUE_PYTORCHJOB, self.training_operator), (KUEUE_TRAINJOB, self.trainer_v2))
            if on
        ]
        port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2",
            "kind": "Configuration",
            "namespace": "kueue-system",
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(d)},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": [name for name, _ in frameworks]},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "kueue",
            [
                str(self.assets / "kueue"),
                f"--config={d / 'config.yaml'}",
                f"--kubeconfig={self.kubeconfig}",
                "--feature-gates=VisibilityOnDemand=false",
            ],
            private={KUEUE_METRICS_CERTS: metrics},
        )
        self._wait_ready("kueue", health)
        # its webhooks, only after it answers (failurePolicy Fail), for its kinds and its frameworks'
        paths = (*KUEUE_KINDS, *(path for _, path in frameworks))
        self.apply(*self._url_webhooks(self.assets / "kueue-webhooks.yaml", d, port, "kueue", paths))
        self.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ResourceFlavor",
                "metadata": {"name": FLAVOR},
                "spec": {"nodeLabels": {"nvidia.com/gpu.product": GPU_PRODUCT}},
            },
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "ClusterQueue",
                "metadata": {"name": CLUSTER_QUEUE},
                "spec": {
                    "namespaceSelector": {},
                    "resourceGroups": [
                        {
                            "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                            "flavors": [
                                {
                                    "name": FLAVOR,
                                    "resources": [
                                        {"name": "cpu", "nominalQuota": str(QUEUE_CPUS)},
                                        {"name": "memory", "nominalQuota": "10Ti"},
                                        {"name": "nvidia.com/gpu", "nominalQuota": str(QUEUE_GPUS)},
                                    ],
                                }
                            ],
                        }
                    ],
                },
            },
        )

    def local_queue(self, namespace: str, name: str = "gpu-training") -> str:
        self.apply(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta2",
                "kind": "LocalQueue",
                "metadata": {"name": name, "namespace": namespace},
                "spec": {"clusterQueue": CLUSTER_QUEUE},
            }
        )
        return name

    def _start_runner(self) -> None:
        from kubernetes import client, config

        api = config.new_client_from_config(str(self.kubeconfig))
        port = int(self.cp.url.rsplit(":", 1)[1])
        self.runner = PodRunner(
            api=api,
            api_host="127.0.0.1",
            api_port=port,
            ca_file=self.cp.workdir / "ca.crt",
            workdir=self.workdir / "runner",
            image_files=self.image_files,
            python_bin=Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")) / "bin" / "python",
            keep_visible=(REPO, Path(os.environ.get("VIRTUAL_ENV", REPO / ".venv")).resolve()),
            namespaces=set(),
            entrypoints=image_entrypoints(),
        )
        del client
        self.runner.start()

    def _wait_log(self, name: str, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        path = self.workdir / f"{name}.log"
        while time.monotonic() < deadline:
            self.check_alive()
            if path.exists() and text in path.read_text(errors="replace"):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{name}: no {text!r} in its log:\n{self.log(name)}")

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        for name in (
            "kueue",
            "trainer",
            "jobset",
            "training-operator",
            "kwok",
            "kube-scheduler",
            "kube-controller-manager",
        ):
            p = self.procs.get(name)
            if p is None:
                continue
            proc_account.record_pid(p.pid, name)
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def image_entrypoints() -> dict[str, tuple[list[str], list[str]]]:
    """Each of this repository's images (``IMAGE_REGISTRY/<name>`` for ``images/<name>/Dockerfile``)
    -> its ENTRYPOINT and CMD, read from the Dockerfile: what the pod runner runs for a container of
    that image without a command (the chart's operator Deployment sets only ``args``)."""
    return {
        f"{IMAGE_REGISTRY}/{d.parent.name}": dockerfile_command(d)
        for d in sorted((REPO / "images").glob("*/Dockerfile"))
    }


@contextlib.contextmanager
def running_cluster(
    image_files: dict[str, Path], *, trainer_v2: bool = False, training_operator: bool = True
) -> Iterator[Cluster]:
    """``trainer_v2``: Kubeflow Trainer v2 and JobSet run too (they cost CPU: only for the tests
    of TrainJob); ``training_operator=False``: the Training Operator does not (nor its CRD)."""
    assets = find_cluster_assets()
    trainer_assets = find_trainer_v2_assets() if trainer_v2 else None
    workdir = Path(tempfile.mkdtemp(prefix="kubetune-cluster-", dir="/var/tmp"))
    with running_control_plane(admission_plugins_off=()) as cp:
        cluster = Cluster(
            cp=cp,
            assets=assets,
            workdir=workdir,
            image_files=image_files,
            training_operator=training_operator,
            trainer_v2=trainer_assets,
        )
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
            shutil.rmtree(workdir, ignore_errors=True)


# KWOK's pod-ready Stage starts every pod; a pod of UNPULLABLE_IMAGE must stay Pending instead.
_NOT_UNPULLABLE = f"""    - key: '.spec.containers.[] | .image'
      operator: 'NotIn'
      values:
      - '{UNPULLABLE_IMAGE}'
"""


def _without_unpullable(stage: Path) -> str:
    """KWOK's Stage as shipped; the pod-ready one skips pods of UNPULLABLE_IMAGE."""
    text = stage.read_text()
    if "name: pod-ready" not in text:
        return text
    head = "  selector:\n    matchExpressions:\n"
    assert head in text, f"{stage}: KWOK's pod-ready Stage changed shape"
    return text.replace(head, head + _NOT_UNPULLABLE, 1)


# What a kubelet reports for an image whose registry does not resolve (containerd's words).
IMAGE_PULL_FAILED_STAGE = f"""apiVersion: kwok.x-k8s.io/v1alpha1
kind: Stage
metadata:
  name: pod-image-pull-failed
spec:
  resourceRef:
    apiGroup: v1
    kind: Pod
  selector:
    matchExpressions:
    - key: '.metadata.deletionTimestamp'
      operator: 'DoesNotExist'
    - key: '.spec.nodeName'
      operator: 'Exists'
    - key: '.spec.containers.[] | .image'
      operator: 'In'
      values:
      - '{UNPULLABLE_IMAGE}'
    - key: '.status.containerStatuses.[] | .state.waiting.reason'
      operator: 'NotIn'
      values:
      - 'ErrImagePull'
  next:
    statusTemplate: |
      phase: Pending
      containerStatuses:
      {{{{ range .spec.containers }}}}
      - image: {{{{ .image | Quote }}}}
        name: {{{{ .name | Quote }}}}
        ready: false
        restartCount: 0
        started: false
        state:
          waiting:
            reason: ErrImagePull
            message: 'failed to pull and unpack image "{UNPULLABLE_IMAGE}": failed to resolve reference "{UNPULLABLE_IMAGE}": dial tcp: lookup registry.invalid: no such host'
      {{{{ end }}}}
"""
