"""Pure builders: a FineTuneJob (+ Settings) in, the child manifests out. No client, no kopf, no I/O.

Children and their fixed names (``<job>`` is the FineTuneJob's name):

=====================  ============================  ==========================================
Child                  Name                          Notes
=====================  ============================  ==========================================
PersistentVolumeClaim  ``<job>-ckpt``                not when ``storage.existingClaim``; no owner
                                                     reference when ``storage.keepOnDelete``
ConfigMap              ``<job>-config``              key ``config.yaml``: the TrainerConfig
Job                    ``<job>-prepare``             batch/v1, CPU only: downloads, checks,
                                                     tokenizes, estimates (before the PyTorchJob)
PyTorchJob             ``<job>-train``               kubeflow.org/v1, Master + (nodes-1) Workers
TrainingRuntime,       ``<job>-train``               trainer.kubeflow.org/v1alpha1, instead of the
TrainJob                                             PyTorchJob on Kubeflow Trainer v2 (the job's
                                                     engine, ``status.engine``, is TrainJob)
Job                    ``<job>-register``            batch/v1, created once training succeeded
Job                    ``<job>-alias-<hash>``        batch/v1, when ``registration.alias`` changes
                                                     after the model was registered (moves it)
ServiceAccount, Role,  ``<job>-trainer``             the trainer's identity (see ``identity``);
RoleBinding                                          not when the settings name a ServiceAccount
=====================  ============================  ==========================================

Every child carries ``kubetune.io/job=<job>`` (the operator watches children by it) and
``kubetune.io/job-uid=<uid>`` (so a kept PVC, which has no owner reference, is still recognised as
ours). User labels of the FineTuneJob are copied, except Argo CD's tracking labels and Kueue's: a
copied ``app.kubernetes.io/instance`` would make Argo CD think it owns (and prune) our children.

Trainer identity: the trainer reports progress by patching ``finetunejobs/status`` of its own
FineTuneJob. Unless ``KUBETUNE_TRAINER_SERVICE_ACCOUNT`` names an existing ServiceAccount, the
operator creates per job a ServiceAccount, a Role that allows only ``patch`` on
``finetunejobs/status`` with ``resourceNames: [<job>]``, and a RoleBinding, all owned by the job.
Registration pods need no API access and mount no token.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

from kubetune_api import spec as api
from kubetune_api.engines import Engine
from kubetune_api.preparation import EXIT_REFUSED
from kubetune_api.registration import EXIT_GATE_NOT_MET, FORCE_FLAG
from kubetune_api.trainer_config import (
    CHECKPOINT_MOUNT,
    CONFIG_KEY,
    CONFIG_MOUNT_DIR,
    CONFIG_PATH,
    SHUTDOWN_GRACE_FLAG,
    TERMINATION_MESSAGE_PATH,
    resolve,
)

from . import parent
from .pod_env import CACHE_MOUNT, TMP_MOUNT, Context, Pod, env, shutdown_grace_seconds
from .settings import Settings

# --- names and labels -------------------------------------------------------------------------------

LABEL_JOB = f"{api.GROUP}/job"
LABEL_JOB_UID = f"{api.GROUP}/job-uid"
LABEL_COMPONENT = "app.kubernetes.io/component"
ANNOTATION_CONFIG_HASH = f"{api.GROUP}/config-hash"
# Set while the PyTorchJob is suspended because spec.suspend says so. The operator only ever
# un-suspends what it suspended itself: Kueue suspends jobs waiting for quota, and those are Kueue's.
# on the PyTorchJob (and a TrainJob's training Job): the status.startTime its budget deadline was set
# for; on a TrainJob: the attempt (JobSet restarts, last resume) it was set for (children.sync_deadline)
ANNOTATION_DEADLINE_FOR = "kubetune.io/deadline-for-start"
ANNOTATION_SUSPENDED_BY_US = f"{api.GROUP}/suspended-by-kubetune"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

COMPONENT_CHECKPOINTS = "checkpoints"
COMPONENT_CONFIG = "trainer-config"
COMPONENT_TRAINING = "training"
COMPONENT_REGISTRATION = "registration"
COMPONENT_PREPARATION = "preparation"
COMPONENT_ALIAS = "alias"
ANNOTATION_ALIAS = f"{api.GROUP}/alias"
COMPONENT_IDENTITY = "trainer-identity"

TRAIN_CONTAINER = "pytorch"  # the Training Operator finds its container by this name
REGISTER_CONTAINER = "register"
PREPARE_CONTAINER = "prepare"
MASTER_PORT = 23456  # the Training Operator's default; named so it need not inject one
PYTORCHJOB_API_VERSION = Engine.PYTORCHJOB.api_version

# Where the writable scratch space goes (the root filesystem is read-only): CACHE_MOUNT and TMP_MOUNT,
# with the variables that point there (kubetune_operator.pod_env); /dev/shm for NCCL and data loaders.
SHM_MOUNT = "/dev/shm"

# Labels never copied from the FineTuneJob onto children.
_NOT_COPIED_PREFIXES = ("argocd.argoproj.io/", "kueue.x-k8s.io/", f"{api.GROUP}/")
_NOT_COPIED = {"app.kubernetes.io/instance"}


def pvc_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-ckpt"


def config_map_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-config"


def pytorchjob_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-train"


def registration_job_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-register"


def preparation_job_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-prepare"


def identity_name(job: api.FineTuneJob) -> str:
    return f"{job.metadata.name}-trainer"


def checkpoint_claim(job: api.FineTuneJob) -> str:
    """The PVC that holds the checkpoints: the existing claim, or the one kubetune creates."""
    return job.spec.storage.existing_claim or pvc_name(job)


def service_account(job: api.FineTuneJob, settings: Settings) -> str:
    return settings.trainer_service_account or identity_name(job)


def labels(job: api.FineTuneJob, component: str) -> dict[str, str]:
    copied = {
        k: v
        for k, v in (job.metadata.labels or {}).items()
        if k not in _NOT_COPIED and not k.startswith(_NOT_COPIED_PREFIXES)
    }
    out = {
        **copied,
        "app.kubernetes.io/name": "kubetune",
        "app.kubernetes.io/part-of": "kubetune",
        "app.kubernetes.io/managed-by": "kubetune-operator",
        LABEL_COMPONENT: component,
        LABEL_JOB: job.metadata.name,
    }
    if job.metadata.uid:
        out[LABEL_JOB_UID] = job.metadata.uid
    return out


def selector_labels(job: api.FineTuneJob, component: str) -> dict[str, str]:
    """The few labels that select one child's pods (stable, unlike user labels)."""
    return {LABEL_JOB: job.metadata.name, LABEL_COMPONENT: component}


def owner_references(job: api.FineTuneJob) -> list[dict[str, Any]]:
    """Owner reference to the FineTuneJob; none before it exists (``kubetune render``)."""
    if not job.metadata.uid:
        return []
    return [
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "name": job.metadata.name,
            "uid": job.metadata.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]


def _metadata(job: api.FineTuneJob, name: str, component: str, *, owned: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": job.metadata.namespace,
        "labels": labels(job, component),
    }
    refs = owner_references(job) if owned else []
    if refs:
        meta["ownerReferences"] = refs
    return meta


# --- PVC, ConfigMap, identity -------------------------------------------------------------------------


def build_pvc(job: api.FineTuneJob, settings: Settings) -> dict[str, Any] | None:
    """The checkpoint PVC, or None when the job uses an existing claim."""
    storage = job.spec.storage
    if storage.existing_claim:
        return None
    pvc_spec: dict[str, Any] = {
        "accessModes": [storage.access_mode],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": storage.size}},
    }
    storage_class = storage.storage_class_name or settings.default_storage_class
    if storage_class:
        pvc_spec["storageClassName"] = storage_class
    # keepOnDelete: no owner reference, so garbage collection leaves the checkpoints alone.
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": _metadata(job, pvc_name(job), COMPONENT_CHECKPOINTS, owned=not storage.keep_on_delete),
        "spec": pvc_spec,
    }


def trainer_config_yaml(job: api.FineTuneJob, settings: Settings) -> str:
    # with spec.model.fromJob's (or registered's) parent
    return parent.trainer_config(job, settings.default_tracking_uri, settings.default_registry_uri).to_yaml()


def config_hash(job: api.FineTuneJob, settings: Settings) -> str:
    return resolve(
        job,
        default_tracking_uri=settings.default_tracking_uri,
        default_registry_uri=settings.default_registry_uri,
        report_progress=True,
    ).config_hash()


def build_config_map(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, config_map_name(job), COMPONENT_CONFIG),
        "data": {CONFIG_KEY: trainer_config_yaml(job, settings)},
    }


def build_trainer_identity(job: api.FineTuneJob, settings: Settings) -> list[dict[str, Any]]:
    """ServiceAccount + Role + RoleBinding for the trainer pods; empty when settings name one."""
    if settings.trainer_service_account:
        return []
    name = identity_name(job)
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": _metadata(job, name, COMPONENT_IDENTITY),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": _metadata(job, name, COMPONENT_IDENTITY),
            "rules": [
                {
                    "apiGroups": [api.GROUP],
                    "resources": [f"{api.PLURAL}/status"],
                    "resourceNames": [job.metadata.name],
                    "verbs": ["patch"],  # the trainer only ever patches its progress in
                }
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": _metadata(job, name, COMPONENT_IDENTITY),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job.metadata.namespace}],
        },
    ]


# --- pod pieces ------------------------------------------------------------------------------------------


def pod_security_context(settings: Settings) -> dict[str, Any]:
    uid = settings.run_as_user
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        # fsGroup makes the checkpoint volume writable by the non-root trainer.
        "fsGroup": uid,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context(settings: Settings) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": settings.run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _data_volumes(job: api.FineTuneJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Read-only volumes holding the base model or the data set (``path`` + ``volume``)."""
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    for name, source in (("model", job.spec.model), ("dataset", job.spec.dataset)):
        if source.volume is None or source.path is None:
            continue
        volumes.append(
            {"name": name, "persistentVolumeClaim": {"claimName": source.volume.claim_name, "readOnly": True}}
        )
        mount: dict[str, Any] = {"name": name, "mountPath": source.path, "readOnly": True}
        if source.volume.sub_path:
            mount["subPath"] = source.volume.sub_path
        mounts.append(mount)
    return volumes, mounts


def _volumes_and_mounts(
    job: api.FineTuneJob, settings: Settings, *, shm: bool, component: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        {"name": "checkpoints", "persistentVolumeClaim": {"claimName": checkpoint_claim(job)}},
        {"name": "config", "configMap": {"name": config_map_name(job)}},
        {"name": "cache", "emptyDir": {"sizeLimit": settings.cache_size_limit}},
        {"name": "tmp", "emptyDir": {"sizeLimit": settings.tmp_size_limit}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT},
        {"name": "config", "mountPath": CONFIG_MOUNT_DIR, "readOnly": True},
        {"name": "cache", "mountPath": CACHE_MOUNT},
        {"name": "tmp", "mountPath": TMP_MOUNT},
    ]
    if shm:
        # NCCL and data-loader workers share tensors through /dev/shm; the container default is 64Mi.
        volumes.append(
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": job.spec.resources.shared_memory}}
        )
        mounts.append({"name": "dshm", "mountPath": SHM_MOUNT})
    data_volumes, data_mounts = _data_volumes(job)
    # spec.model.fromJob: the preparation and the trainer read the parent's volume; the registration never
    parent_volumes, parent_mounts = parent.volumes(job) if component != COMPONENT_REGISTRATION else ([], [])
    return volumes + data_volumes + parent_volumes, mounts + data_mounts + parent_mounts


def _scheduling(job: api.FineTuneJob, *, gpu: bool, priority: bool = True) -> dict[str, Any]:
    res = job.spec.resources
    out: dict[str, Any] = {}
    node_selector = dict(res.node_selector or {})
    if gpu and res.gpu_product:
        node_selector["nvidia.com/gpu.product"] = res.gpu_product
    if node_selector:
        out["nodeSelector"] = node_selector
    if res.tolerations:
        out["tolerations"] = [t.wire() for t in res.tolerations]
    if priority and res.priority_class_name:
        out["priorityClassName"] = res.priority_class_name
    return out


def _train_resources(job: api.FineTuneJob) -> dict[str, Any]:
    res = job.spec.resources
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if res.cpu:
        requests["cpu"] = res.cpu  # no CPU limit: throttling data loaders only slows the GPUs down
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if res.gpus_per_node > 0:
        limits["nvidia.com/gpu"] = str(res.gpus_per_node)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def train_command(settings: Settings) -> list[str]:
    # kubetune_trainer.launch is torchrun (same arguments) that exits 143, retryable under the
    # ExitCode restart policy, when the pod is preempted (plain torchrun exits 1: permanent), and
    # gives the workers --shutdown-grace-s (its own option, first) to checkpoint instead of torchrun's
    # 30 s: here, inside the pod's terminationGracePeriodSeconds. The trainer reads its control
    # settings from this command and the mounted config only, never from the pod's environment.
    # torchrun reads its rendezvous settings from the PET_* variables the Training Operator sets
    # (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT) and runs
    # `python -m kubetune_trainer.train --config ...` once per GPU.
    return [
        "python",
        "-m",
        "kubetune_trainer.launch",
        SHUTDOWN_GRACE_FLAG,
        str(shutdown_grace_seconds(settings)),
        "--module",
        "kubetune_trainer.train",
        "--config",
        CONFIG_PATH,
    ]


def register_command(*, force: bool = False) -> list[str]:
    """``force``: past the gate (FORCE_FLAG: a registration retried by kubetune.io/retry-registration).
    The only way a registration is forced: the trainer ignores the environment for it."""
    return [
        "python",
        "-m",
        "kubetune_trainer.register",
        "--config",
        CONFIG_PATH,
        *([FORCE_FLAG] if force else []),
    ]


def _image(job: api.FineTuneJob, settings: Settings) -> str:
    return job.spec.image or settings.trainer_image


def build_train_pod_template(
    job: api.FineTuneJob, settings: Settings, *, container_name: str = TRAIN_CONTAINER
) -> dict[str, Any]:
    """The training pods' template, the same on either engine but for the container's name (each
    engine finds it by its own) and the PyTorchJob's rendezvous port (Trainer v2's torch runtime adds
    its own, 29500)."""
    volumes, mounts = _volumes_and_mounts(job, settings, shm=True, component=COMPONENT_TRAINING)
    container: dict[str, Any] = {
        "name": container_name,
        "image": _image(job, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": train_command(settings),
        "workingDir": CACHE_MOUNT,
        "env": env(Context(job, settings, Pod.TRAINING, _image(job, settings), container_name)),
    }
    if container_name == TRAIN_CONTAINER:
        container["ports"] = [{"name": "pytorchjob-port", "containerPort": MASTER_PORT, "protocol": "TCP"}]
    container |= {
        "resources": _train_resources(job),
        "volumeMounts": mounts,
        "securityContext": container_security_context(settings),
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    spec: dict[str, Any] = {
        "serviceAccountName": service_account(job, settings),
        "automountServiceAccountToken": True,  # the trainer patches its progress into the status
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "securityContext": pod_security_context(settings),
        "containers": [container],
        "volumes": volumes,
        **_scheduling(job, gpu=True),
    }
    return {
        "metadata": {
            "labels": {**labels(job, COMPONENT_TRAINING), **selector_labels(job, COMPONENT_TRAINING)},
            "annotations": {ANNOTATION_CONFIG_HASH: config_hash(job, settings)},
        },
        "spec": spec,
    }


def build_pytorchjob(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    res = job.spec.resources
    template = build_train_pod_template(job, settings)
    replica_specs: dict[str, Any] = {
        "Master": {"replicas": 1, "restartPolicy": "ExitCode", "template": template},
    }
    if res.nodes > 1:
        replica_specs["Worker"] = {
            "replicas": res.nodes - 1,
            "restartPolicy": "ExitCode",
            "template": copy.deepcopy(template),  # no shared dicts (and no YAML anchors when rendered)
        }
    meta = _training_metadata(job, settings)
    return {
        "apiVersion": PYTORCHJOB_API_VERSION,
        "kind": "PyTorchJob",
        "metadata": meta,
        "spec": {
            # One process per GPU; on CPU (0 GPUs) one process per pod.
            "nprocPerNode": str(max(res.gpus_per_node, 1)),
            "pytorchReplicaSpecs": replica_specs,
            "runPolicy": {
                # ExitCode restart policy: 128-255 (143 = the trainer saved on SIGTERM, 137 = killed)
                # restart the pod and resume from the checkpoint; 1-127 (bad config, a bug) fail at once.
                "backoffLimit": settings.train_backoff_limit,
                # Delete still-running pods when the job ends (frees GPUs), keep finished ones (logs).
                "cleanPodPolicy": "Running",
                "suspend": job.spec.suspend,
                # activeDeadlineSeconds (spec.budget) is set once the pods run: children.sync_deadline
            },
        },
    }


# --- TrainJob (Kubeflow Trainer v2) ------------------------------------------------------------------

TRAINJOB_API_VERSION = Engine.TRAINJOB.api_version
TRAINJOB_CONTAINER = "node"  # Trainer v2 applies `trainer` and the torch env to the container of this name
TRAINJOB_STEP = "node"  # the replicated job of the training pods (Trainer v2's name for it)
TRAINER_ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
# The JobSet a TrainJob runs on (Trainer v2 names it as the TrainJob)
JOBSET_API_VERSION = "jobset.x-k8s.io/v1alpha2"
# The Job controller's reason on a Job that ran past its activeDeadlineSeconds (batch/v1
# JobReasonDeadlineExceeded): the hard deadline of a TrainJob's training Job (children.sync_deadline)
JOB_DEADLINE_REASON = "DeadlineExceeded"
# The JobSet failure policy rule that fails the JobSet on it, instead of restarting (below)
DEADLINE_RULE = {
    "name": "deadlineExceeded",
    "action": "FailJobSet",
    "onJobFailureReasons": [JOB_DEADLINE_REASON],
}
# Exit codes that end training for good (the trainer's refusals, bad data, a bug), as the PyTorchJob's
# ExitCode restart policy has it; 128-255 (143 saved on SIGTERM, 137 killed) restart
PERMANENT_EXIT_CODES = tuple(range(1, 128))


def _training_metadata(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    """The training object's metadata, either engine's (same name): the config hash it was built
    from, whether kubetune suspended it, and Kueue's queue label."""
    meta = _metadata(job, pytorchjob_name(job), COMPONENT_TRAINING)
    meta["annotations"] = {ANNOTATION_CONFIG_HASH: config_hash(job, settings)}
    if job.spec.suspend:
        meta["annotations"][ANNOTATION_SUSPENDED_BY_US] = "true"
    if job.spec.resources.queue_name:
        meta["labels"][KUEUE_QUEUE_LABEL] = job.spec.resources.queue_name
    return meta


def step_job_name(trainjob_name: str) -> str:
    """The Job of a TrainJob's training pods: ``<name>-node-0`` (JobSet's ``<jobset>-<step>-<index>``)."""
    return f"{trainjob_name}-{TRAINJOB_STEP}-0"


def trainjob_name(job: api.FineTuneJob) -> str:
    """The TrainJob, and its per-job TrainingRuntime: ``<job>-train`` as the PyTorchJob (at most 46
    characters, so the JobSet's longest pod name ``<tj>-node-0-<index>-<5>`` stays within 63 up to
    512 nodes)."""
    return pytorchjob_name(job)


def build_training_runtime(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    """The job's own TrainingRuntime: the JobSet template of its training pods, which a TrainJob
    cannot set itself (volumes, identity, priority, grace period, pod security, the failure policy).

    Restarts as the PyTorchJob's: an exit code 1-127 fails the Job at once (pod failure policy) and
    the JobSet with it; any other failure (128-255: 143 after the checkpoint on SIGTERM, 137; a pod
    disrupted: preempted, evicted, drained) restarts the JobSet, as the Training Operator restarts
    a pod by exit code, without JobSet's ``maxRestarts``: the limit is the operator's own
    (``trainBackoffLimit`` restarts without a new checkpoint, counted from the JobSet's
    ``status.restarts``; then it fails the job and suspends the TrainJob). A JobSet limit would end
    a long run after that many restarts in all, however far each got, where the PyTorchJob goes on.
    A training Job past its hard deadline (``activeDeadlineSeconds``, which the operator sets on the
    running Job a margin above ``spec.budget``: ``children.sync_deadline``) fails the JobSet at once
    (:data:`DEADLINE_RULE`, before the catch-all, which would restart it), as the Training Operator
    fails a PyTorchJob past its deadline.
    The JobSet webhook's defaults are set here, not left to it.
    """
    template = build_train_pod_template(job, settings, container_name=TRAINJOB_CONTAINER)
    template["spec"]["restartPolicy"] = "Never"  # what a pod failure policy needs
    pod_failure_policy = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": TRAINJOB_CONTAINER,
                    "operator": "In",
                    "values": list(PERMANENT_EXIT_CODES),
                },
            },
            {"action": "FailJob", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        ]
    }
    # rule names as JobSet's webhook takes them: a letter, then letters, digits, '_', ',' or ':'
    failure_policy = {
        "rules": [
            dict(DEADLINE_RULE),
            {
                "name": "permanentExitCode",
                "action": "FailJobSet",
                "onJobFailureReasons": ["PodFailurePolicy"],
                "onJobFailureMessagePatterns": ["failed with exit code"],
            },
            # any other failure: a disruption (PodFailurePolicy), a retryable exit code (the Job's
            # backoffLimit 0 exceeded); JobSet tries the rules in order, so this one comes last
            {"name": "retryable", "action": "RestartJobSetAndIgnoreMaxRestarts"},
        ],
    }
    replicated = {
        "name": TRAINJOB_STEP,
        "replicas": 1,
        "template": {
            "metadata": {"labels": {TRAINER_ANCESTOR_LABEL: "trainer"}},
            "spec": {
                "backoffLimit": 0,
                "completionMode": "Indexed",
                "podFailurePolicy": pod_failure_policy,
                "template": template,
            },
        },
    }
    return {
        "apiVersion": TRAINJOB_API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": _metadata(job, trainjob_name(job), COMPONENT_TRAINING),
        "spec": {
            "mlPolicy": {"numNodes": job.spec.resources.nodes, "torch": {}},
            "template": {
                "spec": {
                    "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
                    "successPolicy": {"operator": "All"},
                    "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
                    "failurePolicy": failure_policy,
                    "replicatedJobs": [replicated],
                }
            },
        },
    }


def fails_on_deadline(jobset: dict[str, Any]) -> bool:
    """Whether a JobSet (a TrainJob's, as its Trainer built it from the runtime) fails at once on a
    Job past its deadline (:data:`DEADLINE_RULE` before any rule that would restart it). A runtime
    an older operator made has no such rule: JobSet's catch-all would restart the Job past its
    deadline again and again, so no deadline is set on it."""
    for rule in ((jobset.get("spec") or {}).get("failurePolicy") or {}).get("rules") or []:
        reasons = rule.get("onJobFailureReasons") or []
        patterns = rule.get("onJobFailureMessagePatterns") or []
        targets = rule.get("targetReplicatedJobs") or []
        if (reasons and JOB_DEADLINE_REASON not in reasons) or (targets and TRAINJOB_STEP not in targets):
            continue  # not about the training Job past its deadline
        if patterns and rule.get("action") == "FailJobSet":
            continue  # may not match the Job controller's message: a later rule may restart
        return rule.get("action") == "FailJobSet"
    return False


def build_trainjob(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    """The TrainJob on the job's own runtime (:func:`build_training_runtime`, created first: the
    trainer's webhook refuses a TrainJob whose runtime does not exist). ``trainer`` is always sent
    (without it no torch env is set): the nodes and one process per GPU (per pod on CPU)."""
    res = job.spec.resources
    meta = _training_metadata(job, settings)
    return {
        "apiVersion": TRAINJOB_API_VERSION,
        "kind": "TrainJob",
        "metadata": meta,
        "spec": {
            "runtimeRef": {
                "name": trainjob_name(job),
                "apiGroup": Engine.TRAINJOB.group,
                "kind": "TrainingRuntime",
            },
            "trainer": {"numNodes": res.nodes, "numProcPerNode": max(res.gpus_per_node, 1)},
            "suspend": job.spec.suspend,
        },
    }


def alias_job_name(job: api.FineTuneJob) -> str:
    """One Job per alias change (alias and spec generation): changing it back to an earlier alias
    never mistakes that alias's old, finished Job for the move it asks for now."""
    alias = job.spec.registration.alias or ""
    key = f"{alias}\n{job.metadata.generation or 0}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:8]
    return f"{job.metadata.name}-alias-{digest}"


def build_alias_job(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    """The registration Job again, for a changed ``registration.alias`` after the model was registered.

    Registration is idempotent: the run finds the version it registered and only moves the alias
    (the trainer config it reads follows the spec's alias). Kubernetes deletes the Job
    ``alias_job_ttl_seconds`` after it finishes; by then its result is in the FineTuneJob's status.
    """
    manifest = build_registration_job(job, settings)
    name = alias_job_name(job)
    manifest["metadata"] = _metadata(job, name, COMPONENT_ALIAS)
    manifest["metadata"]["annotations"] = {ANNOTATION_ALIAS: job.spec.registration.alias or ""}
    manifest["spec"]["template"]["metadata"]["labels"] = {
        **labels(job, COMPONENT_ALIAS),
        **selector_labels(job, COMPONENT_ALIAS),
    }
    # one Job per alias change: finished ones go after a while instead of piling up
    manifest["spec"]["ttlSecondsAfterFinished"] = settings.alias_job_ttl_seconds
    return manifest


def register_resources(settings: Settings) -> dict[str, Any]:
    # Merging a LoRA adapter (and logging the model) loads the whole model in CPU memory. Not the
    # trainer's memory: that was sized for GPU nodes, and this pod runs anywhere.
    memory = settings.register_memory
    return {"requests": {"cpu": "1", "memory": memory}, "limits": {"memory": memory}}


def _cpu_job(
    job: api.FineTuneJob,
    settings: Settings,
    *,
    name: str,
    component: str,
    container_name: str,
    command: list[str],
    resources: dict[str, Any],
    backoff_limit: int,
    deadline_seconds: int,
    pod: Pod,
    priority: bool = True,
) -> dict[str, Any]:
    """A batch/v1 Job of one CPU pod in the trainer image (registration, preparation), with the
    checkpoint volume and the trainer config mounted, and its result in the termination message."""
    volumes, mounts = _volumes_and_mounts(job, settings, shm=False, component=component)
    container: dict[str, Any] = {
        "name": container_name,
        "image": _image(job, settings),
        "imagePullPolicy": settings.image_pull_policy,
        "command": command,
        # The image's working directory lies under the cache mount, which hides it.
        "workingDir": CACHE_MOUNT,
        "env": env(Context(job, settings, pod, _image(job, settings), container_name)),
        "resources": resources,
        "volumeMounts": mounts,
        "securityContext": container_security_context(settings),
        # The result JSON goes to /dev/termination-log; a crash leaves the log tail there instead.
        "terminationMessagePath": TERMINATION_MESSAGE_PATH,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",  # a new pod per attempt: each has its own termination message
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(settings),
        "containers": [container],
        "volumes": volumes,
        **_scheduling(job, gpu=False, priority=priority),
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": _metadata(job, name, component),
        "spec": {
            "backoffLimit": backoff_limit,
            "activeDeadlineSeconds": deadline_seconds,
            # A retry's pod starts only once the previous one has ended, not while it is still
            # terminating (the default, TerminatingOrFailed, would run both at once: two
            # registrations, or two preparations writing the same folders). batch/v1 field, on by
            # default since Kubernetes 1.29, GA in 1.34.
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {"labels": {**labels(job, component), **selector_labels(job, component)}},
                "spec": pod_spec,
            },
        },
    }


def build_registration_job(
    job: api.FineTuneJob, settings: Settings, *, force: bool = False
) -> dict[str, Any]:
    """The registration step; a gate not met fails it at once; ``force``: past the gate (a retry)."""
    manifest = _cpu_job(
        job,
        settings,
        name=registration_job_name(job),
        component=COMPONENT_REGISTRATION,
        container_name=REGISTER_CONTAINER,
        command=register_command(force=force),
        resources=register_resources(settings),
        backoff_limit=settings.register_backoff_limit,
        deadline_seconds=settings.register_deadline_seconds,
        pod=Pod.REGISTRATION,
    )
    gate = {"containerName": REGISTER_CONTAINER, "operator": "In", "values": [EXIT_GATE_NOT_MET]}
    manifest["spec"]["podFailurePolicy"] = {"rules": [{"action": "FailJob", "onExitCodes": gate}]}
    return manifest


def prepare_command() -> list[str]:
    return ["python", "-m", "kubetune_trainer.prepare", "--config", CONFIG_PATH]


def build_preparation_job(job: api.FineTuneJob, settings: Settings) -> dict[str, Any]:
    """The CPU step before training (``kubetune_trainer.prepare``): downloads the model and the data
    onto the checkpoint volume once, checks and tokenizes the data, estimates memory, time and cost.

    A refusal (exit code ``EXIT_REFUSED``: bad data, a gated model, a job that does not fit) fails
    the Job at once through its pod failure policy; a crash (another exit code) is retried up to
    ``prepare_backoff_limit`` times; a pod disrupted (evicted, preempted, its node drained) is
    retried without counting."""
    memory = settings.prepare_memory
    resources = {"requests": {"cpu": settings.prepare_cpu, "memory": memory}, "limits": {"memory": memory}}
    manifest = _cpu_job(
        job,
        settings,
        name=preparation_job_name(job),
        component=COMPONENT_PREPARATION,
        container_name=PREPARE_CONTAINER,
        command=prepare_command(),
        resources=resources,
        backoff_limit=settings.prepare_backoff_limit,
        deadline_seconds=settings.prepare_deadline_seconds,
        pod=Pod.PREPARATION,
        # it holds no GPU: the job's priorityClassName (GPU preemption) is the training pods'
        priority=False,
    )
    manifest["spec"]["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": PREPARE_CONTAINER,
                    "operator": "In",
                    "values": [EXIT_REFUSED],
                },
            },
            {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        ]
    }
    return manifest


def build_training(engine: Engine, job: api.FineTuneJob, settings: Settings) -> list[dict[str, Any]]:
    """The training child on ``engine``, in creation order: the PyTorchJob; or the job's own
    TrainingRuntime, then the TrainJob on it (Trainer v2's webhook refuses a TrainJob whose runtime
    does not exist yet)."""
    if engine == Engine.TRAINJOB:
        return [build_training_runtime(job, settings), build_trainjob(job, settings)]
    return [build_pytorchjob(job, settings)]


def build_children(
    job: api.FineTuneJob,
    settings: Settings,
    *,
    registration: bool = True,
    engine: Engine = Engine.PYTORCHJOB,
) -> list[dict[str, Any]]:
    """Every manifest the operator creates for this job on ``engine``, in creation order
    (``kubetune render``)."""
    out = build_trainer_identity(job, settings)
    pvc = build_pvc(job, settings)
    if pvc is not None:
        out.append(pvc)
    out.append(build_config_map(job, settings))
    if settings.preparation:
        out.append(build_preparation_job(job, settings))
    out.extend(build_training(engine, job, settings))
    if registration and job.spec.registration.enabled:
        out.append(build_registration_job(job, settings))
    return out
