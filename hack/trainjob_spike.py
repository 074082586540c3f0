"""Spike: Kubeflow Trainer v2 (TrainJob) and JobSet as plain processes on the test cluster.

    python hack/trainjob_spike.py up [--no-kueue]   # starts everything, writes ENV_FILE, waits for SIGTERM

The cluster of ``tests/support/cluster.py`` (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, KWOK with the fake GPU nodes, the pod runner) without the Training Operator, plus:

* the JobSet controller (``hack/build-control-plane.sh trainer-v2``): internal cert management off,
  its webhook server on 127.0.0.1 with a certificate of the test CA (``webhook.certDir``), metrics
  off, leader election off; its webhooks registered in ``url`` form, the pod webhooks with the
  objectSelector of its kustomize patches;
* the Trainer v2 controller manager: ``certManagement.enable: false``, the webhook server reading
  its certificate from controller-runtime's default folder under a ``TMPDIR`` of its own, metrics
  off; its webhooks in ``url`` form under the names its cert rotator would use;
* Kueue (optional) with the ``trainer.kubeflow.org/trainjob`` integration only.

What a scenario needs is in ENV_FILE (KUBECONFIG, KUBECTL, the work folder): the scenarios are
driven with kubectl (``hack/trainjob_spike_cases.py``). Not part of the test suite.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import cluster as cluster_mod
from tests.support.controlplane import REPO, _issue, free_port, running_control_plane

ENV_FILE = Path("/tmp/trainjob-spike.env")
NAMESPACE = "spike"


def trainer_assets() -> Path:
    env = os.environ.get("KUBETUNE_TRAINER_V2_ASSETS")
    if env:
        return Path(env)
    out = subprocess.run(
        [str(REPO / "hack" / "build-control-plane.sh"), "trainer-v2"],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(out.stdout.strip().splitlines()[-1])


def wait_ready(c: cluster_mod.Cluster, name: str, port: int, timeout: float = 120) -> float:
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        c.check_alive()
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r,
        ):
            if r.status == 200:
                return time.monotonic() - start
        time.sleep(0.5)
    raise TimeoutError(f"{name} not ready:\n{c.log(name)}")


def url_form(
    docs: list[dict[str, Any]], port: int, ca: bytes, keep: Any = lambda path: True
) -> list[dict[str, Any]]:
    for doc in docs:
        hooks = []
        for hook in doc["webhooks"]:
            path = hook["clientConfig"]["service"]["path"]
            if not keep(path):
                continue
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{port}{path}",
                "caBundle": base64.b64encode(ca).decode(),
            }
            hooks.append(hook)
        doc["webhooks"] = hooks
    return docs


def install_crds(c: cluster_mod.Cluster, folder: Path) -> None:
    c.kubectl("apply", "--server-side", "-f", str(folder))
    deadline = time.monotonic() + 60
    while c.kubectl(
        "wait", "--for=condition=Established", "--timeout=30s", "-f", str(folder), check=False
    ).returncode:
        if time.monotonic() > deadline:
            raise TimeoutError(f"CRDs of {folder} not established")
        time.sleep(0.5)


class SpikeCluster(cluster_mod.Cluster):
    trainer: Path = Path()
    with_kueue: bool = True
    timings: dict[str, float] = {}

    def start(self) -> None:
        t0 = time.monotonic()
        d = self.cp.workdir
        self._spawn(
            "kube-controller-manager",
            [
                str(self.assets / "kube-controller-manager"), *self._kube_flags(), "--leader-elect=false",
                "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
                f"--service-account-private-key-file={d / 'sa.key'}", f"--root-ca-file={d / 'ca.crt'}",
                f"--cluster-signing-cert-file={d / 'ca.crt'}", f"--cluster-signing-key-file={d / 'ca.key'}",
                "--controllers=*",
            ],
        )  # fmt: skip
        self._spawn(
            "kube-scheduler",
            [str(self.assets / "kube-scheduler"), *self._kube_flags(), "--leader-elect=false",
             "--bind-address=127.0.0.1", f"--secure-port={free_port()}"],
        )  # fmt: skip
        self._start_kwok()
        self._make_nodes_and_storage()
        self.timings["kcm+scheduler+kwok+nodes"] = time.monotonic() - t0
        self._serving_cert()
        self._start_jobset()
        self._start_trainer()
        if self.with_kueue:
            self._start_kueue_trainjob()
        self._start_runner()
        assert self.runner is not None and self.runner.namespaces is not None
        self.runner.namespaces.add(NAMESPACE)

    def _serving_cert(self) -> None:
        d = self.workdir / "serving"
        d.mkdir(exist_ok=True)
        shutil.copy(self.cp.workdir / "ca.crt", d / "ca.crt")
        shutil.copy(self.cp.workdir / "ca.key", d / "ca.key")
        _issue(
            d, "tls", "/CN=trainer-spike-webhook", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth"
        )
        self.serving = d

    def _start_jobset(self) -> None:
        t0 = time.monotonic()
        install_crds(self, self.trainer / "jobset-crds")
        d = self.workdir / "jobset"
        d.mkdir()
        shutil.copy(self.serving / "tls.crt", d / "tls.crt")
        shutil.copy(self.serving / "tls.key", d / "tls.key")
        port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": port, "host": "127.0.0.1", "certDir": str(d)},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "jobset",
            [str(self.trainer / "jobset"), f"--config={d / 'config.yaml'}", f"--kubeconfig={self.kubeconfig}",
             "--metrics-bind-address=0", "--leader-elect=false", f"--health-probe-bind-address=127.0.0.1:{health}",
             "--zap-devel=false"],
        )  # fmt: skip
        self.timings["jobset ready"] = wait_ready(self, "jobset", health)
        docs = list(yaml.safe_load_all((self.trainer / "jobset-webhooks.yaml").read_text()))
        # the kustomize patches: the pod webhooks (index 1 of each) only for pods of a JobSet
        for patch_file in sorted((self.trainer / "jobset-webhook-patches").glob("*.yaml")):
            for op in yaml.safe_load(patch_file.read_text()):
                assert op["op"] == "replace" and op["path"] == "/webhooks/1", op
                kind = (
                    "MutatingWebhookConfiguration"
                    if "mutating" in patch_file.name
                    else "ValidatingWebhookConfiguration"
                )
                doc = next(x for x in docs if x["kind"] == kind)
                doc["webhooks"][1] = op["value"]
        for doc in docs:
            doc["metadata"]["name"] = "jobset-" + doc["metadata"]["name"]
        self.apply(*url_form(docs, port, (self.serving / "ca.crt").read_bytes()))
        self.timings["jobset total"] = time.monotonic() - t0

    def _start_trainer(self) -> None:
        t0 = time.monotonic()
        install_crds(self, self.trainer / "trainer-crds")
        d = self.workdir / "trainer"
        tmp = d / "tmp"
        certs = tmp / "k8s-webhook-server" / "serving-certs"  # controller-runtime's default, under TMPDIR
        certs.mkdir(parents=True)
        shutil.copy(self.serving / "tls.crt", certs / "tls.crt")
        shutil.copy(self.serving / "tls.key", certs / "tls.key")
        port, health = free_port(), free_port()
        config = {
            "apiVersion": "config.trainer.kubeflow.org/v1alpha1",
            "kind": "Configuration",
            "webhook": {"port": port, "host": "127.0.0.1"},
            "health": {"healthProbeBindAddress": f"127.0.0.1:{health}"},
            "metrics": {"bindAddress": "0"},
            "certManagement": {"enable": False},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "trainer",
            [str(self.trainer / "trainer-controller-manager"), f"--config={d / 'config.yaml'}",
             f"--kubeconfig={self.kubeconfig}"],
            env={"TMPDIR": str(tmp)},
        )  # fmt: skip
        self.timings["trainer ready"] = wait_ready(self, "trainer", health)
        docs = list(yaml.safe_load_all((self.trainer / "trainer-webhooks.yaml").read_text()))
        for doc in docs:  # the names of its kustomize patches (what its cert rotator would look for)
            doc["metadata"]["name"] = {
                "MutatingWebhookConfiguration": "defaulter.trainer.kubeflow.org",
                "ValidatingWebhookConfiguration": "validator.trainer.kubeflow.org",
            }[doc["kind"]]
        self.apply(*url_form(docs, port, (self.serving / "ca.crt").read_bytes()))
        self.timings["trainer total"] = time.monotonic() - t0

    def _start_kueue_trainjob(self) -> None:
        """cluster.py's Kueue start, with the TrainJob integration instead of the PyTorchJob one."""
        t0 = time.monotonic()
        d = self.workdir / "kueue"
        d.mkdir(exist_ok=True)
        shutil.copy(self.serving / "tls.crt", d / "tls.crt")
        shutil.copy(self.serving / "tls.key", d / "tls.key")
        shutil.copy(self.serving / "ca.crt", d / "ca.crt")
        metrics = self.workdir / "kueue-metrics-certs"
        metrics.mkdir()
        shutil.copy(d / "tls.crt", metrics / "tls.crt")
        shutil.copy(d / "tls.key", metrics / "tls.key")
        self.kubectl("create", "namespace", "kueue-system")
        install_crds(self, self.assets / "kueue-crds")
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
            "integrations": {"frameworks": ["trainer.kubeflow.org/trainjob"]},
        }
        (d / "config.yaml").write_text(yaml.safe_dump(config))
        self._spawn(
            "kueue",
            [str(self.assets / "kueue"), f"--config={d / 'config.yaml'}", f"--kubeconfig={self.kubeconfig}",
             "--feature-gates=VisibilityOnDemand=false"],
            private={cluster_mod.KUEUE_METRICS_CERTS: metrics},
        )  # fmt: skip
        self.timings["kueue ready"] = wait_ready(self, "kueue", health)
        docs = list(yaml.safe_load_all((self.assets / "kueue-webhooks.yaml").read_text()))
        kinds = ("kueue-x-k8s-io", "trainer-kubeflow-org-v1alpha1-trainjob")
        docs = url_form(docs, port, (d / "ca.crt").read_bytes(), keep=lambda p: any(k in p for k in kinds))
        for doc in docs:
            doc["metadata"]["name"] = f"kueue-{doc['metadata']['name']}"
        self.apply(*docs)
        self.apply(
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": cluster_mod.FLAVOR},
             "spec": {"nodeLabels": {"nvidia.com/gpu.product": cluster_mod.GPU_PRODUCT}}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cluster_mod.CLUSTER_QUEUE},
             "spec": {"namespaceSelector": {}, "resourceGroups": [{
                 "coveredResources": ["cpu", "memory", "nvidia.com/gpu"],
                 "flavors": [{"name": cluster_mod.FLAVOR, "resources": [
                     {"name": "cpu", "nominalQuota": "100"}, {"name": "memory", "nominalQuota": "10Ti"},
                     {"name": "nvidia.com/gpu", "nominalQuota": "16"}]}]}]}},
        )  # fmt: skip
        self.timings["kueue total"] = time.monotonic() - t0

    def stop(self) -> None:
        if self.runner is not None:
            self.runner.stop()
        for name in ("kueue", "trainer", "jobset", "kwok", "kube-scheduler", "kube-controller-manager"):
            p = self.procs.get(name)
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(timeout=15)
            except subprocess.TimeoutExpired:
                p.kill()


def up(with_kueue: bool) -> None:
    assets = cluster_mod.find_cluster_assets()
    trainer = trainer_assets()
    workdir = Path(tempfile.mkdtemp(prefix="kubetune-trainjob-spike-", dir="/var/tmp"))
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    t0 = time.monotonic()
    with running_control_plane(admission_plugins_off=()) as cp:
        cp_s = time.monotonic() - t0
        c = SpikeCluster(cp=cp, assets=assets, workdir=workdir, image_files={})
        c.trainer, c.with_kueue = trainer, with_kueue
        try:
            c.start()
            c.kubectl("create", "namespace", NAMESPACE)
            if with_kueue:
                c.local_queue(NAMESPACE)
            ENV_FILE.write_text(
                f"export KUBECONFIG={cp.kubeconfig}\nexport KUBECTL={cp.assets / 'kubectl'}\n"
                f"export SPIKE_WORKDIR={workdir}\n"
            )
            print(json.dumps({"control plane": cp_s, **c.timings}, indent=1), flush=True)
            print(f"UP {workdir}", flush=True)
            while not stop["now"]:
                c.check_alive()
                if c.runner is not None and c.runner.errors:
                    print("runner errors:", c.runner.errors, flush=True)
                    c.runner.errors.clear()
                time.sleep(1)
        finally:
            c.stop()
            ENV_FILE.unlink(missing_ok=True)
            print(f"logs kept in {workdir}", flush=True)


if __name__ == "__main__":
    if sys.argv[1:2] != ["up"]:
        sys.exit(__doc__)
    up(with_kueue="--no-kueue" not in sys.argv)
