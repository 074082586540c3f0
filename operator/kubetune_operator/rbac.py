"""Exactly the API access the operator needs: the Helm chart's ClusterRole (or per-namespace Roles).

An integration test runs the operator as a ServiceAccount bound to these rules and no more, through
a whole fine-tune, so this list stays true. kopf's own needs come first (its framework block).

Why each rule:

- CRDs, namespaces (list/watch): kopf discovers resources and namespaces as they come and go.
- events (create): ``kubectl describe ftj`` shows what happened (kopf posts them, core v1).
- finetunejobs (get/list/watch/patch): read and watch jobs (also a job's parent, spec.model.fromJob:
  read, and watched to start or fail the jobs waiting for it); kopf patches its finalizer and its
  progress annotations. finetunejobs/status (get/patch): the operator's status writes. The per-job
  trainer Role grants patch on the status too, and RBAC lets only a holder grant a permission.
- pytorchjobs (get/list/watch/create/patch): create training, watch it, flip ``runPolicy.suspend``.
- trainingruntimes (get/create), trainjobs (get/list/watch/create/patch): the same on Kubeflow
  Trainer v2 (a job whose engine is TrainJob): the job's own TrainingRuntime, created once before
  its TrainJob, and the TrainJob, watched, its ``spec.suspend`` flipped. jobsets (get): the
  TrainJob's JobSet, read while its pods restart: its ``status.restarts`` counts the restarts.
- workloads (list): Kueue's Workload of a queued job's training object (by Kueue's job-uid label),
  listed while Kueue holds the object suspended: its ``Evicted``/``Preempted`` conditions say whether
  Kueue preempted training that had run, and why (best effort: without it the job says less).
- jobs (get/list/watch/create/patch/delete): the registration Job; a failed one is deleted when the
  user asks for a retry (the ``kubetune.io/retry-registration`` annotation), and only that Job (by
  its uid). A TrainJob's training Job (its JobSet's, ``<tj>-node-0``): read when the TrainJob failed
  (past its deadline?), and patched once per attempt with the hard deadline of ``spec.budget``
  (``activeDeadlineSeconds``, by its uid). jobsets (get) also: whether its failure policy fails on
  that deadline. pods (list/watch): its termination message; the training pods, watched, and listed while
  they do not all run (scheduled? image pulled?).
- events (list): the PyTorchJob's, read only while one of its pods is missing (the Training
  Operator's ``FailedCreatePod``: why it cannot create the pod).
- persistentvolumeclaims (get/create): the checkpoint volume. configmaps (get/create/patch): the
  trainer config, patched when a mutable field (suspend, registration.enabled, registration.alias)
  changes (``kubetune_api.spec.MUTABLE_SPEC_PATHS``).
- serviceaccounts, roles, rolebindings (get/create): the per-job trainer identity (not needed when
  ``KUBETUNE_TRAINER_SERVICE_ACCOUNT`` names an existing ServiceAccount).

Nothing else is deleted: children go with their FineTuneJob through owner references.

With leader election (:mod:`.leader`), a Role in the Lease's namespace (the release's, in the chart):
leases (create; get and update of the one Lease by name): each replica reads the Lease, takes it when
free or expired, and the leader renews and releases it (an update each; no watch, no delete).
"""

from __future__ import annotations

from typing import Any

from kubetune_api import spec as api
from kubetune_api.engines import Engine

KOPF_FRAMEWORK_RULES: list[dict[str, Any]] = [
    {
        "apiGroups": ["apiextensions.k8s.io"],
        "resources": ["customresourcedefinitions"],
        "verbs": ["list", "watch"],
    },
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]

OPERATOR_RULES: list[dict[str, Any]] = [
    {"apiGroups": [api.GROUP], "resources": [api.PLURAL], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/status"], "verbs": ["get", "patch"]},
    {
        "apiGroups": ["kubeflow.org"],
        "resources": ["pytorchjobs"],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": [Engine.TRAINJOB.group], "resources": ["trainingruntimes"], "verbs": ["get", "create"]},
    {
        "apiGroups": [Engine.TRAINJOB.group],
        "resources": [Engine.TRAINJOB.plural],
        "verbs": ["get", "list", "watch", "create", "patch"],
    },
    {"apiGroups": ["jobset.x-k8s.io"], "resources": ["jobsets"], "verbs": ["get"]},
    {"apiGroups": ["kueue.x-k8s.io"], "resources": ["workloads"], "verbs": ["list"]},
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["get", "list", "watch", "create", "patch", "delete"],
    },
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["get", "create"]},
    {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "create", "patch"]},
    {"apiGroups": [""], "resources": ["serviceaccounts"], "verbs": ["get", "create"]},
    {
        "apiGroups": ["rbac.authorization.k8s.io"],
        "resources": ["roles", "rolebindings"],
        "verbs": ["get", "create"],
    },
]


def cluster_role(name: str = "kubetune-operator") -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": name},
        "rules": KOPF_FRAMEWORK_RULES + OPERATOR_RULES,
    }


def leader_election_rules(lease: str = "kubetune-operator") -> list[dict[str, Any]]:
    """The Role the replicas need in the Lease's namespace: create it (RBAC cannot name an object
    that does not exist yet), read and write that one Lease."""
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]


def leader_election_role(
    namespace: str, name: str = "kubetune-operator-leader-election", lease: str = "kubetune-operator"
) -> dict[str, Any]:
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": namespace},
        "rules": leader_election_rules(lease),
    }
