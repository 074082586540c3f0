"""The Helm chart against a real kube-apiserver: dry run, install, the operator running as the chart's
ServiceAccount through a whole FineTuneJob, the RBAC matrix, upgrade and uninstall.

These tests get a control plane of their own (etcd + kube-apiserver, like the session one) with only
the Kubeflow PyTorchJob CRD installed: a cluster where kubetune was never installed, so `helm install`
creates the FineTuneJob CRD itself and `helm uninstall` can be judged on what it leaves behind.
The tests in this module run in order and share one release.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.conftest import (
    QWEN3_REGISTRATION_RESULT,
    denials,
    finish_registration_job,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import (
    REPO,
    SHARED_PYTORCHJOB_CRD,
    STANDIN_PYTORCHJOB_CRD,
    ControlPlane,
    find_assets,
    free_port,
)
from tests.unit.test_chart import CHART, CI_VALUES
from tests.unit.test_state_preparation import REPORT as PREPARED

from kubetune_api.preparation import termination_message

pytestmark = [pytest.mark.integration, pytest.mark.helm]

RELEASE = "kubetune"
API = "kubetune.io/v1alpha1"
NAMESPACE = "kubetune-system"
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:kubetune"
RESTRICTED = [f"pod-security.kubernetes.io/{mode}=restricted" for mode in ("enforce", "warn")]
CI_NAMESPACES = ["kubetune-ci-a", "kubetune-ci-b"]
JOB_NAMESPACE = "team-llm"
RESULT = QWEN3_REGISTRATION_RESULT


class Cluster:
    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.home = cp.workdir / "helm-home"

    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return self.cp.kubectl(*args, input=input, check=check)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cp.helm(*args, home=self.home, check=check, timeout=180)

    def get(self, *args: str) -> dict[str, Any] | None:
        result = self.kubectl("get", *args, "-o", "json", check=False)
        if result.returncode != 0:
            assert "NotFound" in result.stderr, result.stderr
            return None
        obj: dict[str, Any] = json.loads(result.stdout)
        return obj

    def namespace(self, name: str, *labels: str) -> None:
        if self.get("namespace", name) is None:
            self.kubectl("create", "namespace", name)
        if labels:
            self.kubectl("label", "--overwrite", "namespace", name, *labels)

    def token_kubeconfig(self, namespace: str, service_account: str, path: Path) -> Path:
        """A kubeconfig that authenticates as the ServiceAccount, with a token from the TokenRequest API."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, "--duration=1h"
        ).stdout.strip()
        admin = yaml.safe_load(self.cp.kubeconfig.read_text())
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": admin["clusters"],
            "users": [{"name": service_account, "user": {"token": token}}],
            "contexts": [
                {
                    "name": "sa",
                    "context": {"cluster": "test", "user": service_account, "namespace": namespace},
                }
            ],
            "current-context": "sa",
        }
        path.write_text(yaml.safe_dump(config))
        return path


def wait_established(cp: ControlPlane, crd: str) -> None:
    """`kubectl wait` fails at once (instead of waiting) while a new CRD has no conditions: retry it."""
    deadline = time.monotonic() + 60
    while True:
        out = cp.kubectl("wait", "--for=condition=Established", "--timeout=60s", f"crd/{crd}", check=False)
        if out.returncode == 0:
            return
        assert time.monotonic() < deadline, f"CRD {crd} not established: {out.stderr}"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    if os.environ.get("KUBETUNE_SKIP_CONTROL_PLANE"):
        pytest.skip("KUBETUNE_SKIP_CONTROL_PLANE is set")
    assets = find_assets("etcd", "kube-apiserver", "kubectl", "helm")
    cp = ControlPlane(assets=assets, workdir=Path(tempfile.mkdtemp(prefix="kubetune-helm-")))
    try:
        cp.start()
        pytorchjob_crd = SHARED_PYTORCHJOB_CRD if SHARED_PYTORCHJOB_CRD.exists() else STANDIN_PYTORCHJOB_CRD
        cp.kubectl("apply", "--server-side", "-f", str(pytorchjob_crd))
        wait_established(cp, "pytorchjobs.kubeflow.org")
        yield Cluster(cp)
    finally:
        # A throwaway cluster: no graceful kube-apiserver shutdown (that takes ~20 s) is needed.
        for proc in cp.procs:
            proc.kill()
        cp.stop()
        shutil.rmtree(cp.workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def admin_kube(cluster: Cluster) -> Iterator[Any]:
    from kubernetes import client, config

    from kubetune_operator.kube import Kube

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(cluster.cp.kubeconfig), client_configuration=cfg)
    with client.ApiClient(cfg) as api:
        yield Kube(api)


def kube_as(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    from kubetune_operator.kube import Kube

    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    return Kube(client.ApiClient(cfg))


@pytest.fixture(scope="module")
def installed(cluster: Cluster) -> str:
    """`helm install` with the default values into a namespace that enforces the restricted profile."""
    cluster.namespace(NAMESPACE, *RESTRICTED)
    result = cluster.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE)
    assert "STATUS: deployed" in result.stdout
    assert f"kubectl -n {NAMESPACE} rollout status deployment/kubetune" in result.stdout  # NOTES.txt
    wait_established(cluster.cp, "finetunejobs.kubetune.io")
    return result.stdout


@pytest.fixture(scope="module")
def kept_job(cluster: Cluster, installed: str, admin_kube: Any) -> str:
    """A FineTuneJob with keepOnDelete storage and a status, and its checkpoint PVC as the operator
    creates it for such a job (no owner reference): what upgrade and uninstall must leave alone."""
    cluster.namespace(JOB_NAMESPACE)
    name = "kept-job"
    if admin_kube.get(API, "FineTuneJob", JOB_NAMESPACE, name) is None:
        doc = load_example("qwen3-4b-full.yaml", JOB_NAMESPACE)
        doc["metadata"]["name"] = name
        doc["spec"]["storage"]["keepOnDelete"] = True
        job = admin_kube.create(doc)
        status = {"phase": "Training", "progress": {"step": 7, "totalSteps": 50}}
        admin_kube.patch(API, "FineTuneJob", JOB_NAMESPACE, name, {"status": status}, subresource="status")
        labels = {
            "app.kubernetes.io/name": "kubetune",
            "app.kubernetes.io/managed-by": "kubetune-operator",
            "app.kubernetes.io/component": "checkpoints",
            "kubetune.io/job": name,
            "kubetune.io/job-uid": job["metadata"]["uid"],
        }
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{name}-ckpt", "namespace": JOB_NAMESPACE, "labels": labels},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "100Gi"}}},
        }
        admin_kube.create(pvc)
    return name


# --- every rendered object is accepted --------------------------------------------------------------------


@pytest.mark.parametrize("values", ["default", "ci"])
def test_every_rendered_object_is_accepted_by_the_api_server(cluster: Cluster, values: str) -> None:
    extra = ["-f", str(CI_VALUES)] if values == "ci" else []
    # a namespace of its own: the install tests' releases (in NAMESPACE) hold objects with other
    # values, some of whose fields are immutable (a claim's size), whatever order the tests run in
    release_ns = f"kubetune-dry-{values}"
    for ns in [release_ns, *CI_NAMESPACES]:
        cluster.namespace(ns, *RESTRICTED)
    rendered = cluster.helm("template", RELEASE, str(CHART), "--namespace", release_ns, *extra).stdout
    objs = [d for d in yaml.safe_load_all(rendered) if d]
    result = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--field-manager=helm-test",
        # objects a helm install of another test left in the session's cluster belong to helm: a
        # dry run asks whether each object is accepted, not who owns its fields
        "--force-conflicts",
        "-f",
        "-",
        input=rendered,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    # one "serverside-applied (server dry run)" line per object, and no PodSecurity warning
    assert result.stdout.count("(server dry run)") == len(objs), result.stdout
    assert "would violate PodSecurity" not in result.stderr, result.stderr


# --- install, and the operator as the chart's ServiceAccount -----------------------------------------------


class OperatorAsServiceAccount:
    """`python -m kubetune_operator` with the args and env of the Deployment stored in the API server,
    authenticated with a token of the chart's ServiceAccount (never as admin)."""

    def __init__(
        self,
        cluster: Cluster,
        kubeconfig: Path,
        log: Path,
        *,
        namespace: str = NAMESPACE,
        deployment: str = "kubetune",
    ) -> None:
        stored = cluster.get("deployment", deployment, "-n", namespace)
        assert stored is not None
        container = stored["spec"]["template"]["spec"]["containers"][0]
        self.port = free_port()
        # The kubelet probes the pod IP; here the probe goes to 127.0.0.1 on a free port.
        self.args = [
            f"--liveness=http://127.0.0.1:{self.port}/healthz" if a.startswith("--liveness=") else a
            for a in container["args"]
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("KUBETUNE_", "KUBERNETES_"))}
        env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
        env["KUBECONFIG"] = str(kubeconfig)
        self.env = env
        self.log = log
        self.probe_path = container["livenessProbe"]["httpGet"]["path"]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> OperatorAsServiceAccount:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "kubetune_operator", *self.args],
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def healthy(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, self.output()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{self.probe_path}", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def run_a_job_through(
    cluster: Cluster,
    kube: Any,
    tmp_path: Path,
    *,
    release_namespace: str,
    deployment: str,
    service_account: str,
    job_namespace: str,
    trainer_service_account: str | None = None,
) -> None:
    """The operator issue's end-to-end flow, with the operator running as the release's ServiceAccount:
    a FineTuneJob goes Pending -> Training -> Registering -> Succeeded, the test playing the Training
    Operator and the Job controller, the trainer reporting progress with its own identity."""
    sa_kubeconfig = cluster.token_kubeconfig(
        release_namespace, service_account, tmp_path / "operator.kubeconfig"
    )
    whoami = subprocess.run(
        [
            str(cluster.cp.assets / "kubectl"),
            "--kubeconfig",
            str(sa_kubeconfig),
            "auth",
            "whoami",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    username = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
    assert username == f"system:serviceaccount:{release_namespace}:{service_account}"

    operator = OperatorAsServiceAccount(
        cluster, sa_kubeconfig, tmp_path / "operator.log", namespace=release_namespace, deployment=deployment
    )
    with operator:
        wait_for(operator.healthy, timeout=60, what="the liveness endpoint")
        doc = load_example("qwen3-4b-full.yaml", job_namespace)
        name = doc["metadata"]["name"]
        # the chart binds namespaces to model names (registry.tenancy: namespace-prefix)
        model_name = f"{job_namespace}.{doc['spec']['registration']['modelName']}"
        doc["spec"]["registration"]["modelName"] = model_name
        kube.create(doc)
        # the chart runs the preparation step: nothing GPU-sized until its Job has succeeded
        prep = f"{name}-prepare"
        wait_for(lambda: kube.get("batch/v1", "Job", job_namespace, prep), timeout=60, what="preparation Job")
        wait_phase(kube, job_namespace, name, "Preparing", timeout=60)
        ptj = f"{name}-train"
        assert kube.get("kubeflow.org/v1", "PyTorchJob", job_namespace, ptj) is None
        finish_registration_job(kube, job_namespace, prep, message=termination_message(PREPARED))
        wait_for(
            lambda: kube.get("kubeflow.org/v1", "PyTorchJob", job_namespace, ptj),
            timeout=60,
            what=f"the PyTorchJob; operator log:\n{operator.output()[-2000:]}",
        )
        children = [("PersistentVolumeClaim", f"{name}-ckpt"), ("ConfigMap", f"{name}-config")]
        identity = [
            ("ServiceAccount", f"{name}-trainer"),
            ("Role", f"{name}-trainer"),
            ("RoleBinding", f"{name}-trainer"),
        ]
        for kind, child in children + identity:
            api = "rbac.authorization.k8s.io/v1" if kind.startswith("Role") else "v1"
            found = kube.get(api, kind, job_namespace, child)
            if trainer_service_account and (kind, child) in identity:
                assert found is None, f"{kind} {child}: the shared trainer identity needs no per-job one"
            else:
                assert found, f"{kind} {child} missing\n{operator.output()}"
        pod_spec = kube.get("kubeflow.org/v1", "PyTorchJob", job_namespace, ptj)["spec"][
            "pytorchReplicaSpecs"
        ]["Master"]["template"]["spec"]
        trainer_sa = trainer_service_account or f"{name}-trainer"
        assert pod_spec["serviceAccountName"] == trainer_sa

        set_pytorchjob_condition(kube, job_namespace, ptj, "Created")
        set_pytorchjob_condition(kube, job_namespace, ptj, "Running")
        wait_phase(kube, job_namespace, name, "Training", timeout=60)

        # Suspend and resume: the operator patches the PyTorchJob and the trainer config.
        kube.patch(API, "FineTuneJob", job_namespace, name, {"spec": {"suspend": True}})
        wait_for(
            lambda: kube.get("kubeflow.org/v1", "PyTorchJob", job_namespace, ptj)["spec"]["runPolicy"][
                "suspend"
            ],
            timeout=60,
            what="the PyTorchJob suspended",
        )
        wait_phase(kube, job_namespace, name, "Suspended", timeout=60)
        set_pytorchjob_condition(kube, job_namespace, ptj, "Suspended")
        kube.patch(API, "FineTuneJob", job_namespace, name, {"spec": {"suspend": False}})
        wait_for(
            lambda: (
                not kube.get("kubeflow.org/v1", "PyTorchJob", job_namespace, ptj)["spec"]["runPolicy"][
                    "suspend"
                ]
            ),
            timeout=60,
            what="the PyTorchJob resumed",
        )
        set_pytorchjob_condition(kube, job_namespace, ptj, "Running")
        wait_phase(kube, job_namespace, name, "Training", timeout=60)

        # The trainer reports progress with its identity: the status subresource and nothing else.
        trainer = kube_as(
            cluster.token_kubeconfig(job_namespace, trainer_sa, tmp_path / "trainer.kubeconfig")
        )
        progress = {"step": 25, "totalSteps": 50, "percent": 50, "loss": 1.5, "etaSeconds": 600}
        trainer.patch(
            API, "FineTuneJob", job_namespace, name, {"status": {"progress": progress}}, subresource="status"
        )
        with pytest.raises(Exception, match="403"):
            trainer.patch(API, "FineTuneJob", job_namespace, name, {"metadata": {"labels": {"x": "y"}}})
        with pytest.raises(Exception, match="403"):
            trainer.request("GET", f"/api/v1/namespaces/{job_namespace}/secrets")

        set_pytorchjob_condition(kube, job_namespace, ptj, "Succeeded")
        wait_phase(kube, job_namespace, name, "Registering", timeout=60)
        reg = f"{name}-register"
        wait_for(lambda: kube.get("batch/v1", "Job", job_namespace, reg), timeout=60, what="registration Job")
        result = {**RESULT, "name": model_name, "uri": f"models:/{model_name}/1"}
        finish_registration_job(kube, job_namespace, reg, message=json.dumps(result))
        obj = wait_phase(kube, job_namespace, name, "Succeeded", timeout=60)
        assert obj["status"]["registeredModel"]["version"] == "1"
        assert obj["status"]["registeredModel"]["name"] == model_name
        assert obj["status"]["preparation"] == PREPARED.wire()
        assert obj["status"]["progress"] == progress
        assert operator.healthy()
        # it reconciled as the holder of the release's Lease (operator.leaderElection, on by default)
        lease = kube.request(
            "GET", f"/apis/coordination.k8s.io/v1/namespaces/{release_namespace}/leases/{deployment}"
        )
        assert lease["spec"]["holderIdentity"] in operator.output(), lease
    log = operator.output()
    assert not denials(log), "\n".join(denials(log))


@pytest.mark.e2e
def test_operator_completes_a_job_as_the_charts_service_account(
    cluster: Cluster, installed: str, admin_kube: Any, tmp_path: Path
) -> None:
    cluster.namespace(JOB_NAMESPACE)
    run_a_job_through(
        cluster,
        admin_kube,
        tmp_path,
        release_namespace=NAMESPACE,
        deployment="kubetune",
        service_account="kubetune",
        job_namespace=JOB_NAMESPACE,
    )


@pytest.mark.parametrize(
    ("verb", "resource", "subresource"),
    [
        ("list", "customresourcedefinitions.apiextensions.k8s.io", ""),
        ("watch", "customresourcedefinitions.apiextensions.k8s.io", ""),
        ("create", "events", ""),
        ("get", "finetunejobs.kubetune.io", ""),
        ("list", "finetunejobs.kubetune.io", ""),
        ("watch", "finetunejobs.kubetune.io", ""),
        ("patch", "finetunejobs.kubetune.io", ""),
        ("get", "finetunejobs.kubetune.io", "status"),
        ("patch", "finetunejobs.kubetune.io", "status"),
        ("get", "persistentvolumeclaims", ""),
        ("create", "persistentvolumeclaims", ""),
        ("get", "configmaps", ""),
        ("create", "configmaps", ""),
        ("patch", "configmaps", ""),
        ("get", "pytorchjobs.kubeflow.org", ""),
        ("create", "pytorchjobs.kubeflow.org", ""),
        ("patch", "pytorchjobs.kubeflow.org", ""),
        ("watch", "pytorchjobs.kubeflow.org", ""),
        ("get", "jobs.batch", ""),
        ("create", "jobs.batch", ""),
        ("watch", "jobs.batch", ""),
        ("list", "pods", ""),
        ("watch", "pods", ""),
        ("create", "serviceaccounts", ""),
        ("create", "roles.rbac.authorization.k8s.io", ""),
        ("create", "rolebindings.rbac.authorization.k8s.io", ""),
    ],
)
def test_operator_service_account_can(
    cluster: Cluster, installed: str, verb: str, resource: str, subresource: str
) -> None:
    extra = ["--subresource", subresource] if subresource else []
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, *extra, f"--as={OPERATOR_SA}", "-n", JOB_NAMESPACE, check=False
    )
    assert result.stdout.strip() == "yes", (verb, resource, subresource, result.stdout, result.stderr)


@pytest.mark.parametrize(
    ("verb", "resource", "subresource"),
    [
        ("get", "secrets", ""),
        ("list", "secrets", ""),
        ("watch", "secrets", ""),
        ("create", "pods", ""),
        ("patch", "pods", "status"),
        ("delete", "finetunejobs.kubetune.io", ""),
        ("update", "finetunejobs.kubetune.io", ""),
        ("delete", "persistentvolumeclaims", ""),
        ("create", "deployments.apps", ""),
        ("create", "clusterrolebindings.rbac.authorization.k8s.io", ""),
        ("escalate", "roles.rbac.authorization.k8s.io", ""),
        ("bind", "roles.rbac.authorization.k8s.io", ""),
        ("impersonate", "serviceaccounts", ""),
        ("create", "serviceaccounts", "token"),
    ],
)
def test_operator_service_account_cannot(
    cluster: Cluster, installed: str, verb: str, resource: str, subresource: str
) -> None:
    extra = ["--subresource", subresource] if subresource else []
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, *extra, f"--as={OPERATOR_SA}", "-n", JOB_NAMESPACE, check=False
    )
    assert result.stdout.strip() == "no", (verb, resource, subresource, result.stdout)


@pytest.mark.parametrize(
    ("verb", "resource", "namespace", "allowed"),
    [
        ("create", "leases.coordination.k8s.io", NAMESPACE, "yes"),
        ("get", "leases.coordination.k8s.io/kubetune", NAMESPACE, "yes"),
        ("update", "leases.coordination.k8s.io/kubetune", NAMESPACE, "yes"),
        # only the release's own Lease, only in its namespace, never deleted
        ("update", "leases.coordination.k8s.io/kube-scheduler", NAMESPACE, "no"),
        ("delete", "leases.coordination.k8s.io/kubetune", NAMESPACE, "no"),
        ("create", "leases.coordination.k8s.io", JOB_NAMESPACE, "no"),
        ("update", "leases.coordination.k8s.io/kubetune", "kube-system", "no"),
    ],
)
def test_operator_service_account_on_the_leader_lease(
    cluster: Cluster, installed: str, verb: str, resource: str, namespace: str, allowed: str
) -> None:
    """Leader election (operator.leaderElection): the replicas' Role on their one Lease."""
    result = cluster.kubectl(
        "auth", "can-i", verb, resource, f"--as={OPERATOR_SA}", "-n", namespace, check=False
    )
    assert result.stdout.strip() == allowed, (verb, resource, namespace, result.stdout, result.stderr)


# --- upgrade and uninstall -------------------------------------------------------------------------------


def test_upgrade_updates_the_crd_and_the_operator_and_keeps_the_jobs(
    cluster: Cluster, installed: str, kept_job: str, admin_kube: Any, tmp_path: Path
) -> None:
    jobs_before = admin_kube.request(
        "GET", f"/apis/kubetune.io/v1alpha1/namespaces/{JOB_NAMESPACE}/finetunejobs"
    )["items"]
    # A newer chart whose CRD has one more printer column: `helm upgrade` must apply it.
    newer = tmp_path / "kubetune"
    shutil.copytree(CHART, newer)
    crd_file = newer / "files" / "crds" / "kubetune.io_finetunejobs.yaml"
    text = crd_file.read_text()
    column = "    - name: Age\n      type: date\n      jsonPath: .metadata.creationTimestamp\n"
    assert column in text
    crd_file.write_text(
        text.replace(
            column,
            "    - name: Tokens/s\n      type: number\n      jsonPath: .status.progress.tokensPerSecond\n"
            + column,
        )
    )

    cluster.helm("upgrade", RELEASE, str(newer), "--namespace", NAMESPACE, "--set", "trainer.image.tag=0.2.0")
    crd = cluster.get("crd", "finetunejobs.kubetune.io")
    assert crd is not None
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert "Tokens/s" in columns
    deployment = cluster.get("deployment", "kubetune", "-n", NAMESPACE)
    assert deployment is not None
    env = {e["name"]: e.get("value") for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["KUBETUNE_TRAINER_IMAGE"] == "ghcr.io/kubetune/trainer:0.2.0"
    jobs_after = admin_kube.request(
        "GET", f"/apis/kubetune.io/v1alpha1/namespaces/{JOB_NAMESPACE}/finetunejobs"
    )["items"]
    assert [(j["metadata"]["uid"], j["status"]) for j in jobs_after] == [
        (j["metadata"]["uid"], j["status"]) for j in jobs_before
    ]

    # And back to this chart, as a rollback would.
    cluster.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE)
    crd = cluster.get("crd", "finetunejobs.kubetune.io")
    assert crd is not None
    assert "Tokens/s" not in [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


def test_uninstall_keeps_the_crd_the_jobs_and_kept_volumes_then_reinstall_adopts_them(
    cluster: Cluster, installed: str, kept_job: str, admin_kube: Any
) -> None:
    cluster.helm(
        "upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "mlflow.server.enabled=true"
    )
    assert cluster.get("pvc", "kubetune-mlflow", "-n", NAMESPACE) is not None
    jobs_before = admin_kube.request("GET", "/apis/kubetune.io/v1alpha1/finetunejobs")["items"]
    assert kept_job in {j["metadata"]["name"] for j in jobs_before}
    pvcs_before = {
        p["metadata"]["name"]
        for p in admin_kube.request("GET", f"/api/v1/namespaces/{JOB_NAMESPACE}/persistentvolumeclaims")[
            "items"
        ]
    }

    result = cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
    assert "kept due to the resource policy" in result.stdout + result.stderr

    # Gone: what runs and what grants.
    assert cluster.get("deployment", "kubetune", "-n", NAMESPACE) is None
    assert cluster.get("serviceaccount", "kubetune", "-n", NAMESPACE) is None
    assert cluster.get("clusterrole", "kubetune-operator") is None
    assert cluster.get("clusterrolebinding", "kubetune-framework") is None
    assert cluster.get("role", "kubetune-leader-election", "-n", NAMESPACE) is None
    assert cluster.get("poddisruptionbudget", "kubetune", "-n", NAMESPACE) is None
    assert cluster.get("deployment", "kubetune-mlflow", "-n", NAMESPACE) is None
    # Kept: the CRD, every FineTuneJob with its status, the checkpoint PVCs and MLflow's store.
    assert cluster.get("crd", "finetunejobs.kubetune.io") is not None
    jobs_after = admin_kube.request("GET", "/apis/kubetune.io/v1alpha1/finetunejobs")["items"]
    assert [(j["metadata"]["uid"], j["status"]) for j in jobs_after] == [
        (j["metadata"]["uid"], j["status"]) for j in jobs_before
    ]
    pvcs_after = {
        p["metadata"]["name"]
        for p in admin_kube.request("GET", f"/api/v1/namespaces/{JOB_NAMESPACE}/persistentvolumeclaims")[
            "items"
        ]
    }
    assert pvcs_after == pvcs_before
    assert f"{kept_job}-ckpt" in pvcs_after
    assert cluster.get("pvc", "kubetune-mlflow", "-n", NAMESPACE) is not None

    # Installing again adopts the kept CRD and MLflow volume.
    cluster.helm(
        "install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--set", "mlflow.server.enabled=true"
    )
    crd = cluster.get("crd", "finetunejobs.kubetune.io")
    assert crd is not None and crd["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert len(admin_kube.request("GET", "/apis/kubetune.io/v1alpha1/finetunejobs")["items"]) == len(
        jobs_before
    )


@pytest.mark.e2e
def test_ci_values_install_in_namespaced_mode(
    cluster: Cluster, installed: str, admin_kube: Any, tmp_path: Path
) -> None:
    """A second release with the CI values (watched namespaces, shared trainer identity, MLflow), its CRD
    left to the first release: installs, grants only in the watched namespaces, and its operator runs a
    job through in a watched namespace that enforces the restricted Pod Security profile."""
    for ns in CI_NAMESPACES:
        cluster.namespace(ns, *RESTRICTED)
    cluster.namespace("kubetune-ci", *RESTRICTED)
    cluster.helm(
        "install",
        "ci",
        str(CHART),
        "--namespace",
        "kubetune-ci",
        "-f",
        str(CI_VALUES),
        "--set",
        "crds.install=false",
    )
    sa = "system:serviceaccount:kubetune-ci:kubetune-ci-operator"
    trainer = "system:serviceaccount:kubetune-ci-a:kubetune-trainer"

    def can(verb: str, resource: str, ns: str, who: str, *extra: str) -> str:
        return cluster.kubectl(
            "auth", "can-i", verb, resource, *extra, f"--as={who}", "-n", ns, check=False
        ).stdout.strip()

    assert can("create", "pytorchjobs.kubeflow.org", "kubetune-ci-a", sa) == "yes"
    assert can("create", "pytorchjobs.kubeflow.org", JOB_NAMESPACE, sa) == "no"
    assert can("list", "namespaces", "", sa) == "yes"  # kopf matches the watched namespaces
    assert can("create", "serviceaccounts", "kubetune-ci-a", sa) == "no"  # the trainer's is shared
    assert can("patch", "finetunejobs.kubetune.io", "kubetune-ci-a", trainer, "--subresource=status") == "yes"
    assert can("patch", "finetunejobs.kubetune.io", "kubetune-ci-a", trainer) == "no"
    assert can("get", "secrets", "kubetune-ci-a", trainer) == "no"

    # The first release's operator would handle this job too (it watches every namespace), but it is
    # not running: only this release's operator, as its own ServiceAccount, in namespaced mode.
    run_a_job_through(
        cluster,
        admin_kube,
        tmp_path,
        release_namespace="kubetune-ci",
        deployment="ci-kubetune",
        service_account="kubetune-ci-operator",
        job_namespace="kubetune-ci-a",
        trainer_service_account="kubetune-trainer",
    )
    cluster.helm("uninstall", "ci", "--namespace", "kubetune-ci")
    assert cluster.get("crd", "finetunejobs.kubetune.io") is not None


def test_a_crd_applied_with_kubectl_is_taken_over_on_request(cluster: Cluster, installed: str) -> None:
    """Users who applied crds/ with kubectl first: `helm install` refuses to adopt the CRD silently;
    `--take-ownership` (docs/troubleshooting.md) makes the release own it."""
    cluster.helm("uninstall", RELEASE, "--namespace", NAMESPACE)
    crd = "crd/finetunejobs.kubetune.io"
    # What `kubectl apply --server-side -f crds/` leaves: the CRD without Helm's ownership metadata.
    cluster.kubectl("annotate", crd, "meta.helm.sh/release-name-", "meta.helm.sh/release-namespace-")
    cluster.kubectl("label", crd, "app.kubernetes.io/managed-by-")
    refused = cluster.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, check=False)
    assert refused.returncode != 0
    assert 'CustomResourceDefinition "finetunejobs.kubetune.io"' in refused.stderr, refused.stderr
    assert "exists and cannot be imported into the current release" in refused.stderr, refused.stderr
    cluster.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--take-ownership")
    owned = cluster.get(crd)
    assert owned is not None
    assert owned["metadata"]["annotations"]["meta.helm.sh/release-name"] == RELEASE
    assert owned["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
