"""`helm install` end to end, through the real controllers: the chart as a user installs it, its
operator and MLflow running as pods, a job trained and registered; then `helm upgrade` and
`helm uninstall` with a job running.

What runs: the real `helm` (the control plane's assets) installs charts/kubetune into a namespace
of its own (restricted Pod Security, enforced): the FineTuneJob CRD, the RBAC, the operator
Deployment and the chart's MLflow (Deployment, Service, PVC). kube-controller-manager makes their
ReplicaSets and pods, the scheduler places them on KWOK's nodes and the pod runner runs them
(tests/support/podrunner.py): the operator's container names no command, so the runner runs what
images/operator/Dockerfile's ENTRYPOINT says with the chart's args; its ServiceAccount token comes
from the API server's TokenRequest API (the ServiceAccount admission plugin's projected volume), so
the operator works under the chart's RBAC with authorization on. A permission missing from the chart
fails this test: the operator's requests refused (their words in its log) are asserted to be none
after each step, and a refused one that blocks a job shows in the timeout's message.

The session's cluster, not one of its own (a cluster costs a core-minute to start on this two-core
machine): the chart's cluster-scoped objects are named after the release (ClusterRoles
``kubetune-*``), which nothing else in the cluster uses, except the FineTuneJob CRD, which the
harness installed from crds/ with kubectl. The install adopts it as a user whose cluster already has
it does (``--take-ownership``); the chart's copy is byte-identical (tests/unit/test_chart.py), so
nothing changes. The upgrade adds a field to it; at the end the repository's CRD is put back
(``kubectl replace``), so the tests that run later in the session see it unchanged. The operator
watches the job's namespace only (``operator.watchNamespaces``): the session's other namespaces keep
what earlier tests left, which a cluster-wide operator would take up.

Values a user would not set, and why:

- ``operator.replicas: 1``: pods share this machine's network (the pod runner has no pod network), so
  two replicas cannot both listen on the health and metrics ports. Leader election stays on (the
  chart's default), so the rollout of an upgrade still runs the new pod beside the old one, waiting
  for the Lease; the upgrade moves the ports (free ones of this machine) for that reason.
- The ports of the operator and of MLflow: free ports of this machine, for the same reason.
- The images' tag ``test``: the pod runner stands in for the images (the runner's ``entrypoints``).

Upgrade (a chart with one more CRD field, ``operator.retrySeconds`` changed): applied while a job
trains. The Deployment rolls, the old operator hands the Lease over as it stops, the new pod leads
with the new value, the CRD accepts the new field, and the job completes under the new pod.

Uninstall with a job training: Helm removes the operator and MLflow Deployments, the Services and
the RBAC; it keeps the CRD and the MLflow volume (their ``helm.sh/resource-policy: keep``), and so
the FineTuneJob, its checkpoint volume and its PyTorchJob, which are not the release's. The
Training Operator finishes the training, but nothing advances the FineTuneJob (no registration, its
phase stays Training); the Lease stays, naming the last leader until it expires (Helm deletes
the RBAC before the pod stops, so the pod's release of it is refused). Installing again with the same release name and
namespace adopts what was kept: the job registers, and MLflow still holds the versions registered
before (docs/install.md "Uninstall").
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cluster.conftest import tiny_job, wait_for
from tests.cluster.test_real_controllers import apply_job, get, job_status, pod_logs
from tests.support.cluster import Cluster, image_entrypoints
from tests.support.controlplane import OUR_CRDS, REPO, free_port
from tests.support.podrunner import image_repository

CHART = REPO / "charts" / "kubetune"
RELEASE = "kubetune"  # the chart's full name is then "kubetune": Deployment, Lease, ClusterRoles
MLFLOW = f"{RELEASE}-mlflow"
CRD = "finetunejobs.kubetune.io"
NEW_FIELD = "notes"  # the field the upgraded chart's CRD adds to spec
JOB_TIMEOUT = 600
RESTRICTED = [f"pod-security.kubernetes.io/{mode}=restricted" for mode in ("enforce", "warn")]
LEADING = re.compile(r"([\w.-]+_[0-9a-f]{10}): leading; starting the operator")


class Release:
    """The chart's release in the cluster: helm, its pods' logs, MLflow through its pod's port."""

    def __init__(self, cluster: Cluster, namespace: str, job_ns: str, workdir: Path) -> None:
        self.cluster = cluster
        self.ns = namespace
        self.job_ns = job_ns
        self.workdir = workdir
        self.mlflow_port = free_port()
        # operator containers whose refused requests are expected: those stopping while Helm
        # removes their RBAC (uninstall)
        self.stopped: set[str] = set()

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cluster.cp.helm(*args, home=self.workdir / "helm-home", check=check)

    def values(self, retry_seconds: int) -> Path:
        """A values file: the ports free now (see the module's docstring), the images' test tag."""
        values = {
            "operator": {
                "replicas": 1,
                "image": {"tag": "test"},
                "healthPort": free_port(),
                "retrySeconds": retry_seconds,
                "watchNamespaces": [self.job_ns],
            },
            "metrics": {"port": free_port()},
            "trainer": {"image": {"tag": "test"}},
            "mlflow": {"server": {"enabled": True, "port": self.mlflow_port, "workers": 1}},
        }
        path = self.workdir / f"values-{retry_seconds}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    # --- the operator's pods ---------------------------------------------------------------------

    def operator_pods(self) -> list[dict[str, Any]]:
        out = get(self.cluster, "pod", self.ns, selector="app.kubernetes.io/component=operator") or {}
        return list(out.get("items") or [])

    def log(self, pod: str) -> str:
        assert self.cluster.runner is not None
        return self.cluster.runner.log_of(self.ns, pod)

    def operator_runs(self) -> set[str]:
        """The runner's folder of every operator container it started (one per pod)."""
        assert self.cluster.runner is not None
        folders = (self.cluster.runner.workdir / "pods").glob(f"{self.ns}_{RELEASE}-*")
        return {f.name for f in folders if not f.name.startswith(f"{self.ns}_{MLFLOW}-")}

    def operator_logs(self) -> str:
        """The logs of the operator containers the runner started (but the ``stopped`` ones)."""
        assert self.cluster.runner is not None
        pods = self.cluster.runner.workdir / "pods"
        return "\n".join(
            (pods / name / "container.log").read_text(errors="replace")
            for name in sorted(self.operator_runs() - self.stopped)
            if (pods / name / "container.log").exists()
        )

    def forbidden(self) -> list[str]:
        """The operator's requests that the API server refused (403), as its log says them."""
        return [line for line in self.operator_logs().splitlines() if "forbidden" in line.lower()]

    def trouble(self) -> str:
        """What a failure message needs: the refused requests first (a permission the chart lacks),
        else the end of the operator's log."""
        refused = self.forbidden()
        if refused:
            return "the operator's requests refused (a permission missing from the chart?):\n" + "\n".join(
                refused[-10:]
            )
        return "the operator's log (its end):\n" + "\n".join(self.operator_logs().splitlines()[-40:])

    def assert_nothing_forbidden(self) -> None:
        refused = self.forbidden()
        assert not refused, "the chart's RBAC refused the operator:\n" + "\n".join(refused[-10:])

    def leading(self, exclude: str | None = None) -> tuple[str, str]:
        """Until one operator pod (not ``exclude``) leads: its name, and its identity in the Lease."""

        def leader() -> tuple[str, str] | None:
            for pod in self.operator_pods():
                name = pod["metadata"]["name"]
                if name == exclude or pod["metadata"].get("deletionTimestamp"):
                    continue
                found = LEADING.search(self.log(name))
                lease = get(self.cluster, "lease", self.ns, RELEASE) or {}
                if found and (lease.get("spec") or {}).get("holderIdentity") == found.group(1):
                    # the identity names the pod: its host name, as in any pod (its own UTS namespace)
                    assert found.group(1).startswith(f"{name}_"), (found.group(1), name)
                    return name, found.group(1)
            return None

        return self.wait(leader, 180, "an operator pod holding the Lease")

    def wait(self, check: Any, timeout: float, what: str) -> Any:
        """``wait_for``, failing at once when the operator is refused a request (the chart lacks a
        permission), and saying why in a timeout's message."""

        def checked() -> Any:
            self.assert_nothing_forbidden()
            return check()

        try:
            return wait_for(checked, timeout, what, self.cluster)
        except AssertionError as e:
            raise AssertionError(
                f"{e}\n{self.trouble()}\n{pod_logs(self.cluster, self.ns)[-3000:]}"
            ) from None

    def job_phase(self, name: str, phase: str) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = job_status(self.cluster, self.job_ns, name)
            if status.get("phase") == "Failed" and phase != "Failed":
                raise AssertionError(f"{name} failed: {status}\n{self.trouble()}")
            return status if status.get("phase") == phase else None

        result: dict[str, Any] = self.wait(reached, JOB_TIMEOUT, f"{name} {phase}")
        return result

    # --- MLflow, through its pod's port, as through `kubectl port-forward` -----------------------

    def mlflow(self, path: str, **query: str) -> Any:
        url = f"http://127.0.0.1:{self.mlflow_port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        # its DNS-rebinding protection allows the Service's names and localhost (a port-forward)
        request = urllib.request.Request(url, headers={"Host": f"localhost:{self.mlflow_port}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            body = r.read().decode()
        return json.loads(body) if path.startswith("/api/") else body

    def mlflow_up(self) -> None:
        def healthy() -> bool:
            try:
                return bool(self.mlflow("/health") == "OK")
            except OSError:
                return False

        self.wait(healthy, 180, "the chart's MLflow answering /health")

    def versions(self, model: str) -> list[str]:
        found = self.mlflow("/api/2.0/mlflow/model-versions/search", filter=f"name='{model}'")
        return sorted(v["version"] for v in found.get("model_versions") or [])


def next_chart(workdir: Path) -> Path:
    """The chart's next release: a version up, one more optional field in the CRD's spec."""
    chart = workdir / "next" / "kubetune"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "0.1.1"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    crd_file = chart / "files" / "crds" / "kubetune.io_finetunejobs.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    (version,) = crd["spec"]["versions"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert NEW_FIELD not in spec["properties"], "the CRD has the upgrade's field already: pick another"
    spec["properties"][NEW_FIELD] = {"type": "string", "maxLength": 256, "description": "Free text."}
    crd_file.write_text(yaml.safe_dump(crd, sort_keys=False))
    return chart


def with_new_field(cluster: Cluster, job_ns: str) -> subprocess.CompletedProcess[str]:
    """A server-side dry run of a FineTuneJob that sets the upgrade's field (strict validation)."""
    doc = tiny_job("notes", job_ns, **{"registration.modelName": f"{job_ns}.notes", NEW_FIELD: "hello"})
    return cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump(doc), check=False)


def job(name: str, job_ns: str) -> dict[str, Any]:
    """The tiny job, its model named as the chart's registry tenancy (on by default) requires."""
    return tiny_job(name, job_ns, **{"registration.modelName": f"{job_ns}.{name}"})


@pytest.mark.timeout(2400)
def test_helm_install_runs_a_job_then_upgrade_and_uninstall_keep_it(
    cluster: Cluster, ns: str, tmp_path: Path
) -> None:
    # the chart's images are the ones the runner stands in for, by the Dockerfiles' names
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    stood_in = image_entrypoints()
    for image in (chart_values["operator"]["image"], chart_values["trainer"]["image"]):
        assert image_repository(image["repository"]) in stood_in, (image, sorted(stood_in))

    rel_ns = f"kubetune-{ns[-5:]}"
    cluster.kubectl("create", "namespace", rel_ns)
    cluster.kubectl("label", "--overwrite", "namespace", rel_ns, *RESTRICTED)
    assert cluster.runner is not None
    cluster.runner.namespaces = {*(cluster.runner.namespaces or set()), rel_ns}
    release = Release(cluster, rel_ns, ns, tmp_path)
    try:
        _install_upgrade_uninstall(cluster, release)
    finally:
        _clean_up(cluster, release)


def _install_upgrade_uninstall(cluster: Cluster, release: Release) -> None:
    rel_ns, job_ns = release.ns, release.job_ns

    # --- helm install, as a user would: the CRD the cluster has already is adopted --------------
    out = release.helm(
        "install",
        RELEASE,
        str(CHART),
        "--namespace",
        rel_ns,
        "-f",
        str(release.values(2)),
        "--take-ownership",
    ).stdout
    assert "STATUS: deployed" in out, out
    first_pod, first_holder = release.leading()
    pod = get(cluster, "pod", rel_ns, first_pod)
    assert pod["spec"]["serviceAccountName"] == RELEASE
    assert not pod["spec"]["containers"][0].get("command"), "the chart relies on the image's ENTRYPOINT"
    # the ServiceAccount admission plugin's projected token: what the operator authenticates with
    token_volumes = [v for v in pod["spec"]["volumes"] if "projected" in v]
    assert any("serviceAccountToken" in s for v in token_volumes for s in v["projected"]["sources"]), pod[
        "spec"
    ]["volumes"]
    release.mlflow_up()

    apply_job(cluster, job("first", job_ns))
    status = release.job_phase("first", "Succeeded")
    assert status["registeredModel"]["name"] == f"{job_ns}.first"
    assert release.versions(f"{job_ns}.first") == [status["registeredModel"]["version"]] == ["1"]
    release.assert_nothing_forbidden()

    # --- helm upgrade while a job trains: a new CRD field, a changed value --------------------------
    apply_job(cluster, job("across", job_ns))
    release.job_phase("across", "Training")
    refused = with_new_field(cluster, job_ns)
    assert refused.returncode != 0 and NEW_FIELD in refused.stderr, refused
    chart = next_chart(release.workdir)
    values = release.values(1)
    upgrade = release.helm(
        "upgrade", RELEASE, str(chart), "--namespace", rel_ns, "-f", str(values), check=False
    )
    if upgrade.returncode != 0:
        # kubectl's field manager (the harness applied the CRD) owns the fields the new CRD changes
        assert "conflict" in (upgrade.stderr + upgrade.stdout).lower(), upgrade
        print(f"helm upgrade without --force-conflicts: {upgrade.stderr.strip()}")
        upgrade = release.helm(
            "upgrade", RELEASE, str(chart), "--namespace", rel_ns, "-f", str(values), "--force-conflicts"
        )
    assert "STATUS: deployed" in upgrade.stdout, upgrade.stdout
    second_pod, second_holder = release.leading(exclude=first_pod)
    assert second_holder != first_holder
    release.wait(lambda: get(cluster, "pod", rel_ns, first_pod) is None, 120, "the old operator pod gone")
    assert "released the Lease" in release.log(first_pod), release.log(first_pod)[-2000:]
    env = {
        e["name"]: e.get("value")
        for e in get(cluster, "pod", rel_ns, second_pod)["spec"]["containers"][0]["env"]
    }
    assert env["KUBETUNE_RETRY_SECONDS"] == "1", env
    accepted = with_new_field(cluster, job_ns)
    assert accepted.returncode == 0, accepted.stderr
    status = release.job_phase("across", "Succeeded")
    assert release.versions(f"{job_ns}.across") == [status["registeredModel"]["version"]] == ["1"]
    release.assert_nothing_forbidden()

    # --- helm uninstall while a job trains ------------------------------------------------------------
    apply_job(cluster, job("orphan", job_ns))
    release.job_phase("orphan", "Training")
    release.assert_nothing_forbidden()
    # the stopping operator's last requests may be refused: Helm removes its RBAC meanwhile
    release.stopped = release.operator_runs()
    out = release.helm("uninstall", RELEASE, "--namespace", rel_ns).stdout
    print(f"helm uninstall:\n{out}")
    release.wait(lambda: not release.operator_pods(), 120, "the operator pods gone")
    release.wait(
        lambda: (
            not (get(cluster, "pod", rel_ns, selector="app.kubernetes.io/component=mlflow") or {}).get(
                "items"
            )
        ),
        120,
        "the MLflow pod gone",
    )
    for kind, namespace, name in (
        ("deployment", rel_ns, RELEASE),
        ("deployment", rel_ns, MLFLOW),
        ("service", rel_ns, MLFLOW),
        ("serviceaccount", rel_ns, RELEASE),
        ("clusterrole", "default", f"{RELEASE}-operator"),
        ("rolebinding", job_ns, f"{RELEASE}-operator"),
    ):
        assert get(cluster, kind, namespace, name) is None, (kind, name)
    # kept by the chart's resource policy: the CRD (and so the job) and MLflow's store
    assert get(cluster, "crd", "default", CRD) is not None
    assert get(cluster, "pvc", rel_ns, MLFLOW)["status"]["phase"] == "Bound"
    # the job's own objects are not the release's
    orphan = get(cluster, "finetunejobs", job_ns, "orphan")
    # kopf's finalizer stays: deleting the job now would wait for an operator to come back
    assert orphan["metadata"].get("finalizers") == ["kubetune.io/finalizer"], orphan["metadata"]
    assert get(cluster, "pvc", job_ns, "orphan-ckpt")["status"]["phase"] == "Bound"
    # The Lease, the operator's and not Helm's, stays. Helm deletes the operator's ServiceAccount
    # and RBAC along with its Deployment, before the pod has stopped: the leader's release of the
    # Lease is then refused, and the Lease names it until it expires (leaseDurationSeconds).
    lease = get(cluster, "lease", rel_ns, RELEASE)
    assert lease is not None
    holder = lease["spec"].get("holderIdentity")
    print(f"the Lease after helm uninstall: holder {holder!r}, renewed {lease['spec'].get('renewTime')}")
    if holder:
        assert holder == second_holder, (holder, second_holder)
        assert "not released" in release.log(second_pod), release.log(second_pod)[-2000:]
    # the Training Operator trains on; nothing advances the FineTuneJob
    release.wait(
        lambda: any(
            c["type"] == "Succeeded" and c["status"] == "True"
            for c in ((get(cluster, "pytorchjob", job_ns, "orphan-train") or {}).get("status") or {}).get(
                "conditions"
            )
            or []
        ),
        JOB_TIMEOUT,
        "the orphaned job's PyTorchJob Succeeded",
    )
    time.sleep(5)
    assert job_status(cluster, job_ns, "orphan")["phase"] == "Training"
    assert get(cluster, "job", job_ns, "orphan-register") is None

    # --- helm install again: what was kept is adopted, the job registers -------------------------
    out = release.helm("install", RELEASE, str(chart), "--namespace", rel_ns, "-f", str(values)).stdout
    assert "STATUS: deployed" in out, out
    release.leading(exclude=second_pod)
    release.mlflow_up()
    status = release.job_phase("orphan", "Succeeded")
    assert release.versions(f"{job_ns}.orphan") == [status["registeredModel"]["version"]] == ["1"]
    # the versions registered before the uninstall are in the kept store
    assert release.versions(f"{job_ns}.first") == release.versions(f"{job_ns}.across") == ["1"]
    release.assert_nothing_forbidden()


def _clean_up(cluster: Cluster, release: Release) -> None:
    """The jobs deleted while an operator may still act on them, the release uninstalled, the
    repository's CRD put back for the session's later tests, the release's namespace deleted."""
    cluster.kubectl(
        "-n", release.job_ns, "delete", "finetunejobs", "--all", "--wait=true", "--timeout=60s", check=False
    )
    release.helm("uninstall", RELEASE, "--namespace", release.ns, check=False)
    # the repository's CRD whole (a replace, not an apply: the upgrade's field goes, and Helm's
    # labels and annotations), at the live version (an update of a CRD must name it)
    crd = yaml.safe_load((OUR_CRDS / "kubetune.io_finetunejobs.yaml").read_text())
    live = get(cluster, "crd", "default", CRD)
    if live is not None:
        crd["metadata"]["resourceVersion"] = live["metadata"]["resourceVersion"]
        put = cluster.kubectl("replace", "-f", "-", input=yaml.safe_dump(crd), check=False)
        if put.returncode != 0:
            print(f"the repository's CRD not put back: {put.stderr}")
    cluster.kubectl("delete", "namespace", release.ns, "--wait=false", check=False)
