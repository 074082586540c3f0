"""A real Kubernetes control plane for tests: etcd + kube-apiserver on 127.0.0.1, envtest-style.

TLS everywhere, an admin client certificate in ``system:masters``, RBAC authorization, a kubeconfig
file, our CRD and a PyTorchJob CRD installed. The binaries come from ``KUBEBUILDER_ASSETS`` (what
``setup-envtest`` gives users elsewhere) or are built from Go modules by
``hack/build-control-plane.sh`` into a cache outside the repository.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import proc_account

REPO = Path(__file__).resolve().parents[2]
SHARED_PYTORCHJOB_CRD = REPO.parent / "shared" / "crds" / "kubeflow.org_pytorchjobs.yaml"
STANDIN_PYTORCHJOB_CRD = REPO / "tests" / "fixtures" / "pytorchjob-standin-crd.yaml"
OUR_CRDS = REPO / "crds"


def find_assets(*names: str) -> Path:
    """The folder with the control-plane binaries, building them when needed."""
    env = os.environ.get("KUBEBUILDER_ASSETS")
    if env and all((Path(env) / n).exists() for n in names):
        return Path(env)
    build = subprocess.run(
        [str(REPO / "hack" / "build-control-plane.sh"), *names],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    return Path(build.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _issue(d: Path, name: str, subject: str, extensions: str) -> None:
    """A key and a certificate for ``name``, signed by the test CA, with the given v3 extensions."""
    (d / f"{name}.cnf").write_text(f"[ext]\n{extensions}\n")
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject,
             "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.cnf", "-extensions", "ext", "-out", f"{name}.crt", cwd=d)  # fmt: skip


def make_pki(d: Path) -> None:
    """CA, apiserver serving cert, admin client cert (system:masters), service-account key pair."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=kubetune-test-ca",
             "-keyout", "ca.key", "-out", "ca.crt", cwd=d)  # fmt: skip
    _issue(d, "apiserver", "/CN=kube-apiserver",
           "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth")  # fmt: skip
    _issue(d, "admin", "/O=system:masters/CN=kubetune-test-admin", "extendedKeyUsage=clientAuth")
    _openssl("genrsa", "-out", "sa.key", "2048", cwd=d)
    _openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=d)


def _b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


@dataclass
class ControlPlane:
    assets: Path
    workdir: Path
    url: str = ""
    kubeconfig: Path = field(default_factory=Path)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    pytorchjob_crd: Path = SHARED_PYTORCHJOB_CRD
    # Without a controller manager nothing creates the `default` ServiceAccount that this plugin
    # requires; the cluster of cluster.py runs one and turns the plugin back on.
    admission_plugins_off: tuple[str, ...] = ("ServiceAccount",)

    @property
    def real_pytorchjob_crd(self) -> bool:
        return self.pytorchjob_crd == SHARED_PYTORCHJOB_CRD

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        out = subprocess.run(
            [str(self.assets / "kubectl"), "--kubeconfig", str(self.kubeconfig), *args],
            input=input,
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
        return out

    def helm(
        self, *args: str, home: Path, check: bool = True, timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        """The real helm of the assets against this API server, its cache, config and data (repos,
        plugins) in ``home``: nothing of the machine's own helm set-up is read or written."""
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        result = subprocess.run(
            [str(self.assets / "helm"), "--kubeconfig", str(self.kubeconfig), *args],
            check=False,
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stdout}\n{result.stderr}")
        return result

    def start(self) -> None:
        d = self.workdir
        make_pki(d)
        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        etcd_log = (d / "etcd.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [
                    str(self.assets / "etcd"),
                    "--data-dir",
                    str(d / "etcd"),
                    "--listen-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--advertise-client-urls",
                    f"http://127.0.0.1:{etcd_port}",
                    "--listen-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-advertise-peer-urls",
                    f"http://127.0.0.1:{peer_port}",
                    "--initial-cluster",
                    f"default=http://127.0.0.1:{peer_port}",
                    "--unsafe-no-fsync",
                ],
                stdout=etcd_log,
                stderr=subprocess.STDOUT,
            )
        )
        api_log = (d / "kube-apiserver.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [
                    str(self.assets / "kube-apiserver"),
                    f"--etcd-servers=http://127.0.0.1:{etcd_port}",
                    "--bind-address=127.0.0.1",
                    "--advertise-address=127.0.0.1",
                    f"--secure-port={api_port}",
                    f"--cert-dir={d}",
                    f"--tls-cert-file={d / 'apiserver.crt'}",
                    f"--tls-private-key-file={d / 'apiserver.key'}",
                    f"--client-ca-file={d / 'ca.crt'}",
                    "--authorization-mode=RBAC",
                    f"--service-account-key-file={d / 'sa.pub'}",
                    f"--service-account-signing-key-file={d / 'sa.key'}",
                    "--service-account-issuer=https://kubernetes.default.svc",
                    "--service-cluster-ip-range=10.96.0.0/24",
                    "--allow-privileged=true",
                    "--enable-priority-and-fairness=false",
                    *(
                        [f"--disable-admission-plugins={','.join(self.admission_plugins_off)}"]
                        if self.admission_plugins_off
                        else []
                    ),
                    "--profiling=false",
                    # no kube-proxy or Endpoints here; loopback may not be advertised otherwise
                    "--endpoint-reconciler-type=none",
                ],
                stdout=api_log,
                stderr=subprocess.STDOUT,
            )
        )
        self.url = f"https://127.0.0.1:{api_port}"
        self.kubeconfig = d / "kubeconfig"
        self.kubeconfig.write_text(
            f"""apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: {self.url}
    certificate-authority-data: {_b64(d / "ca.crt")}
users:
- name: admin
  user:
    client-certificate-data: {_b64(d / "admin.crt")}
    client-key-data: {_b64(d / "admin.key")}
contexts:
- name: test
  context: {{cluster: test, user: admin, namespace: default}}
current-context: test
"""
        )
        self._wait_ready()

    def _wait_ready(self, timeout: float = 120) -> None:
        ctx = ssl.create_default_context(cafile=str(self.workdir / "ca.crt"))
        ctx.load_cert_chain(str(self.workdir / "admin.crt"), str(self.workdir / "admin.key"))
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"control plane process exited: {p.args[0]}\n{self.logs()}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=5) as r:
                    if r.status == 200:
                        break
            except Exception as e:  # not up yet
                last = str(e)
            time.sleep(0.5)
        else:
            raise TimeoutError(f"kube-apiserver not ready: {last}\n{self.logs()}")
        # the default namespace and RBAC bootstrap roles come from post-start hooks
        while time.monotonic() < deadline:
            if (
                self.kubectl("get", "namespace", "default", check=False).returncode == 0
                and self.kubectl("get", "clusterrole", "admin", check=False).returncode == 0
            ):
                return
            time.sleep(0.5)
        raise TimeoutError("kube-apiserver bootstrap did not finish")

    def logs(self, tail: int = 40) -> str:
        out = []
        for name in ("etcd.log", "kube-apiserver.log"):
            p = self.workdir / name
            if p.exists():
                lines = p.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {name}\n" + "\n".join(lines))
        return "\n".join(out)

    def install_crds(self) -> None:
        if not SHARED_PYTORCHJOB_CRD.exists():
            self.pytorchjob_crd = STANDIN_PYTORCHJOB_CRD
        for path in [*sorted(OUR_CRDS.glob("*.yaml")), self.pytorchjob_crd]:
            self.kubectl("apply", "--server-side", "-f", str(path))
        # A CRD created a moment ago may have no status.conditions yet; `kubectl wait` then fails at
        # once ("accessor error") instead of waiting, so retry it until it really waits.
        deadline = time.monotonic() + 60
        while True:
            out = self.kubectl(
                "wait", "--for=condition=Established", "--timeout=60s", "crd", "--all", check=False
            )
            if out.returncode == 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"CRDs not established: {out.stderr}")
            time.sleep(0.2)

    def stop(self) -> None:
        # the API server first, and only then etcd: an API server that loses etcd mid-shutdown
        # retries until it is killed (measured: 20 s, the timeout, against 1 s in order)
        for p in reversed(self.procs):
            proc_account.record_pid(
                p.pid, Path(str(p.args[0])).name if isinstance(p.args, list) else "control plane"
            )
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        self.procs.clear()


@contextlib.contextmanager
def running_control_plane(
    admission_plugins_off: tuple[str, ...] = ("ServiceAccount",),
) -> Iterator[ControlPlane]:
    assets = find_assets("etcd", "kube-apiserver", "kubectl")
    workdir = Path(tempfile.mkdtemp(prefix="kubetune-cp-"))
    cp = ControlPlane(assets=assets, workdir=workdir, admission_plugins_off=admission_plugins_off)
    try:
        cp.start()
        cp.install_crds()
        yield cp
    finally:
        cp.stop()
        shutil.rmtree(workdir, ignore_errors=True)
