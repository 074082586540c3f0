"""Applying each example creates exactly the three children, stored as sent (the real Kubeflow
PyTorchJob CRD prunes nothing), whose pods pass the API server's own PodSecurity "restricted"."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.integration.conftest import (
    condition,
    get_job,
    load_example,
    wait_for,
    wait_phase,
)
from tests.support.controlplane import ControlPlane
from tests.unit.test_builders_pss import restricted_violations

from kubetune_api.spec import parse_job
from kubetune_operator import builders
from kubetune_operator.settings import Settings

pytestmark = [pytest.mark.integration]

EXAMPLES = {
    "qwen2-0.5b-lora-8gpu.yaml": {"replicas": {"Master": 1}, "gpus": "8"},
    "qwen3-4b-full.yaml": {"replicas": {"Master": 1}, "gpus": "1"},
    "multinode-lora.yaml": {"replicas": {"Master": 1, "Worker": 1}, "gpus": "8"},
}
CHILD_KINDS = {
    "PersistentVolumeClaim": "v1",
    "ConfigMap": "v1",
    "PyTorchJob": "kubeflow.org/v1",
    "Job": "batch/v1",
}


def children_by_kind(kube: Any, namespace: str, name: str) -> dict[str, list[str]]:
    out = {}
    for kind, api_version in CHILD_KINDS.items():
        items = kube.list(api_version, kind, namespace, f"{builders.LABEL_JOB}={name}")
        out[kind] = sorted(i["metadata"]["name"] for i in items)
    return out


@pytest.fixture
def restricted_namespace(control_plane: ControlPlane, namespace: str) -> str:
    control_plane.kubectl(
        "label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted", "--overwrite"
    )
    # The multi-node example names a PriorityClass; Pod admission checks that it exists.
    control_plane.kubectl(
        "apply",
        "-f",
        "-",
        input="apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\nmetadata: {name: training-preemptible}\n"
        "value: 1000\npreemptionPolicy: Never\n",
    )
    return namespace


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_creates_exactly_three_children_stored_as_sent(
    kube: Any,
    restricted_namespace: str,
    operator: Any,
    real_pytorchjob_crd: None,
    example: str,
) -> None:
    ns = restricted_namespace
    doc = load_example(example, ns)
    # Argo CD's tracking label on the parent must not reach any child.
    doc["metadata"].setdefault("labels", {})["app.kubernetes.io/instance"] = "finetunes"
    kube.create(doc)
    name = doc["metadata"]["name"]
    obj = wait_phase(kube, ns, name, "Pending")
    assert condition(obj, "ChildrenReady")["status"] == "True"

    assert children_by_kind(kube, ns, name) == {
        "PersistentVolumeClaim": [f"{name}-ckpt"],
        "ConfigMap": [f"{name}-config"],
        "PyTorchJob": [f"{name}-train"],
        "Job": [],
    }

    # What the operator sent is what the builders make from the stored FineTuneJob.
    job = parse_job(get_job(kube, ns, name))
    settings = Settings.from_env()
    sent = builders.build_pytorchjob(job, settings)
    stored = kube.get("kubeflow.org/v1", "PyTorchJob", ns, f"{name}-train")
    assert stored["spec"] == sent["spec"], "the API server changed (pruned or defaulted) the PyTorchJob spec"
    for key in ("name", "namespace", "labels", "annotations", "ownerReferences"):
        assert stored["metadata"][key] == sent["metadata"][key], key
    for kind, built in (
        ("PersistentVolumeClaim", builders.build_pvc(job, settings)),
        ("ConfigMap", builders.build_config_map(job, settings)),
    ):
        assert built is not None
        live = kube.get("v1", kind, ns, built["metadata"]["name"])
        assert live["metadata"]["ownerReferences"] == built["metadata"]["ownerReferences"]
        assert live["metadata"]["labels"] == built["metadata"]["labels"]
    assert "app.kubernetes.io/instance" not in json.dumps(stored)

    expected = EXAMPLES[example]
    replicas = stored["spec"]["pytorchReplicaSpecs"]
    assert {k: v["replicas"] for k, v in replicas.items()} == expected["replicas"]
    assert stored["spec"]["nprocPerNode"] == expected["gpus"]
    for replica in replicas.values():
        container = replica["template"]["spec"]["containers"][0]
        assert container["name"] == "pytorch"
        assert container["image"] == "registry.example.com/kubetune/trainer:test"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == expected["gpus"]

    # Every pod template: the listed restricted checks, and the API server's PodSecurity admission
    # (the namespace enforces "restricted"; a server-side dry run creates nothing).
    templates = {f"PyTorchJob/{k}": v["template"] for k, v in replicas.items()}
    templates["Job/register"] = builders.build_registration_job(job, settings)["spec"]["template"]
    for where, template in templates.items():
        assert restricted_violations(template["spec"]) == [], where
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"pss-{where.split('/')[1].lower()}",
                "namespace": ns,
                **template["metadata"],
            },
            "spec": template["spec"],
        }
        kube.create(pod, dry_run=True)  # raises (403 Forbidden: violates PodSecurity) on a violation


def test_podsecurity_admission_rejects_a_violation(kube: Any, restricted_namespace: str) -> None:
    """The dry run above would catch a violation: the namespace really enforces restricted."""
    from kubetune_operator.kube import ApiError

    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root", "namespace": restricted_namespace},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    with pytest.raises(ApiError) as e:
        kube.create(pod, dry_run=True)
    assert e.value.status == 403
    assert "PodSecurity" in e.value.body


def test_trainer_identity_can_patch_only_its_own_status(
    kube: Any, control_plane: ControlPlane, namespace: str, operator: Any
) -> None:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    kube.create(doc)
    other = load_example("qwen3-4b-full.yaml", namespace)
    other["metadata"]["name"] = "someone-else"
    kube.create(other)
    name = doc["metadata"]["name"]
    wait_for(lambda: kube.get("rbac.authorization.k8s.io/v1", "RoleBinding", namespace, f"{name}-trainer"))
    sa = f"system:serviceaccount:{namespace}:{name}-trainer"

    def can(verb: str, target: str, *extra: str) -> bool:
        out = control_plane.kubectl(
            "auth", "can-i", verb, target, "-n", namespace, f"--as={sa}", *extra, check=False
        )
        return out.stdout.strip() == "yes"

    assert can("patch", f"finetunejobs.kubetune.io/{name}", "--subresource=status")
    assert not can("get", f"finetunejobs.kubetune.io/{name}", "--subresource=status")  # patches only
    assert not can("patch", "finetunejobs.kubetune.io/someone-else", "--subresource=status")
    assert not can("patch", f"finetunejobs.kubetune.io/{name}")  # the spec: no
    assert not can("get", "secrets")
    ptj = wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, f"{name}-train"))
    assert (
        ptj["spec"]["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["serviceAccountName"]
        == f"{name}-trainer"
    )
