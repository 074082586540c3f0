"""The operator's settings: one object, read from ``KUBETUNE_*`` environment variables.

The Helm chart sets these on the operator Deployment. Every field has a default that works on a
plain cluster; ``Settings.from_env()`` is the only place that reads the environment.

=====================================  ===========================================================
Variable                               Meaning (default)
=====================================  ===========================================================
``KUBETUNE_TRAINER_IMAGE``             trainer image for training and registration pods
                                       (``ghcr.io/kubetune/trainer:0.1.0``); ``spec.image`` wins
``KUBETUNE_IMAGE_PULL_POLICY``         pull policy of those pods (``IfNotPresent``)
``KUBETUNE_MLFLOW_TRACKING_URI``       tracking URI when ``spec.registration.trackingUri`` is unset
``KUBETUNE_MLFLOW_REGISTRY_URI``       model registry URI when ``spec.registration.registryUri`` is
                                       unset (unset: the tracking server's registry)
``KUBETUNE_STORAGE_CLASS``             StorageClass of new checkpoint PVCs when the spec sets none
                                       (unset: the cluster default)
``KUBETUNE_NAMESPACES``                comma-separated namespaces to watch (unset: all)
``KUBETUNE_TRAINER_SERVICE_ACCOUNT``   run trainer pods as this existing ServiceAccount instead of
                                       the per-job one the operator creates (see ``identity``)
``KUBETUNE_RUN_AS_USER``               uid/gid of trainer pods; also fsGroup (``1000``)
``KUBETUNE_TERMINATION_GRACE_SECONDS`` time a trainer pod gets to checkpoint on SIGTERM (``600``)
``KUBETUNE_TRAIN_BACKOFF_LIMIT``       PyTorchJob restarts before it fails (``6``)
``KUBETUNE_REGISTER_BACKOFF_LIMIT``    registration Job retries (``2``)
``KUBETUNE_REGISTER_DEADLINE_SECONDS`` registration Job deadline (``7200``)
``KUBETUNE_REGISTER_MEMORY``           memory of the registration pod, which loads the whole model
                                       on CPU to merge and log it (``64Gi``: up to ~14B in bf16)
``KUBETUNE_PREPARATION``               run the preparation Job (download once, check and tokenize
                                       the data, estimate) before any GPU pod (``true``)
``KUBETUNE_PREPARE_CPU``               CPU request of the preparation pod (``2``)
``KUBETUNE_PREPARE_MEMORY``            memory of the preparation pod (``16Gi``)
``KUBETUNE_PREPARE_BACKOFF_LIMIT``     preparation retries after a crash (``2``; a refusal: none)
``KUBETUNE_PREPARE_DEADLINE_SECONDS``  preparation Job deadline (``14400``)
``KUBETUNE_HF_ENDPOINT``               Hugging Face Hub endpoint (a mirror or proxy) for every pod
                                       (unset: the Hub)
``KUBETUNE_ALIAS_JOB_TTL_SECONDS``     seconds a finished alias Job (and its pod) is kept before
                                       Kubernetes deletes it (``86400``)
``KUBETUNE_CACHE_SIZE_LIMIT``          per-pod emptyDir for HF/Triton/inductor caches (``200Gi``)
``KUBETUNE_TMP_SIZE_LIMIT``            per-pod emptyDir for ``/tmp`` (``8Gi``)
``KUBETUNE_RESYNC_SECONDS``            slow safety-net re-sync of every FineTuneJob (``300``)
``KUBETUNE_RETRY_SECONDS``             re-check delay while waiting, e.g. on a child conflict (``15``)
``KUBETUNE_REGISTRY_TENANCY``          which model names and experiments a namespace's jobs may use
                                       (``namespace-prefix`` or ``off``; unset: ``off``; the chart
                                       sets ``namespace-prefix``): :mod:`kubetune_api.tenancy`
``KUBETUNE_REGISTRY_MODEL_NAMES``      names granted beyond the prefix, a JSON object of namespace
                                       to glob patterns (``{"team-a": ["shared-*"]}``)
``KUBETUNE_ENGINE``                    the training engine of a job whose spec names none: ``auto``
                                       (PyTorchJob where ``pytorchjobs.kubeflow.org`` is served, else
                                       TrainJob where ``trainjobs.trainer.kubeflow.org`` is), or
                                       ``PyTorchJob`` or ``TrainJob`` (that one only) (``auto``)
``KUBETUNE_METRICS_PORT``              serve Prometheus metrics on ``/metrics`` at this port
                                       (unset or ``0``: off; the chart sets ``8081``):
                                       :mod:`kubetune_operator.metrics`
``KUBETUNE_METRICS_ADDRESS``           the address the metrics endpoint binds (``0.0.0.0``)
``KUBETUNE_LEADER_ELECTION``           of several replicas, only the holder of a Lease reconciles
                                       (``false``: this process reconciles alone; the chart sets
                                       ``true``): :mod:`kubetune_operator.leader`
``KUBETUNE_LEADER_ELECTION_NAMESPACE`` the Lease's namespace (unset: the pod's own; outside a pod
                                       it must be set)
``KUBETUNE_LEADER_ELECTION_LEASE``     the Lease's name (``kubetune-operator``)
``KUBETUNE_LEASE_DURATION_SECONDS``    seconds a Lease not renewed stays its holder's (``15``)
``KUBETUNE_RENEW_DEADLINE_SECONDS``    seconds the leader leads without a renewal before it exits
                                       (``10``)
``KUBETUNE_RETRY_PERIOD_SECONDS``      seconds between attempts to renew or to acquire (``2``)
``KUBETUNE_FAULT_INJECTION``           honour the trainer's test hook ``KUBETUNE_FAULT_INJECT`` in
                                       ``spec.env`` (``false``: a job that sets it is refused,
                                       ``InvalidSpec``, and the pods never get it); the test cluster
                                       turns it on: :mod:`kubetune_api.pod_env`
=====================================  ===========================================================
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field

from kubetune_api import engines, tenancy

PREFIX = "KUBETUNE_"


@dataclass(frozen=True)
class Settings:
    trainer_image: str = "ghcr.io/kubetune/trainer:0.1.0"
    image_pull_policy: str = "IfNotPresent"
    default_tracking_uri: str | None = None
    default_registry_uri: str | None = None
    default_storage_class: str | None = None
    namespaces: tuple[str, ...] = field(default_factory=tuple)
    trainer_service_account: str | None = None
    run_as_user: int = 1000
    # Long enough for the trainer to finish an in-flight checkpoint of a multi-GB model on SIGTERM
    # (preemption, node drain); the trainer exits EXIT_PREEMPTED (143) once it is saved.
    termination_grace_seconds: int = 600
    # Each restart resumes from the newest checkpoint, so a few preemptions are cheap; a pod that
    # crashes retryably over and over (e.g. OOM-killed, 137) should not hold GPUs forever.
    train_backoff_limit: int = 6
    # Registration is idempotent (register-result.json on the volume); two retries cover a flaky
    # tracking server without hiding a real misconfiguration for long.
    register_backoff_limit: int = 2
    register_deadline_seconds: int = 7200
    register_memory: str = "64Gi"
    # The CPU step before training; off, every trainer pod downloads and tokenizes for itself.
    preparation: bool = True
    prepare_cpu: str = "2"
    # tokenizing holds the data set's rows and their token ids in memory (Capybara-sized: ~1 GiB)
    prepare_memory: str = "16Gi"
    prepare_backoff_limit: int = 2
    prepare_deadline_seconds: int = 14400
    hf_endpoint: str | None = None
    # Each registration.alias change runs a Job; once finished, its result is in the status and the
    # Job is only a log to read. Kubernetes' TTL controller deletes it after this long (a failed
    # move whose Job is gone is tried again by a fresh Job).
    alias_job_ttl_seconds: int = 86400
    cache_size_limit: str = "200Gi"
    tmp_size_limit: str = "8Gi"
    resync_seconds: float = 300.0
    retry_seconds: float = 15.0
    registry_tenancy: str = "off"
    # namespace -> glob patterns of the model names (and experiments) it may use beyond its prefix
    registry_model_names: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # a job's engine when its spec names none: "auto" or an Engine (kubetune_api.engines)
    engine: engines.Engine | str = engines.AUTO
    # /metrics (kubetune_operator.metrics): 0 is off
    metrics_port: int = 0
    metrics_address: str = "0.0.0.0"  # noqa: S104  the pod's every address: Prometheus scrapes the pod IP
    # the trainer's test hook in spec.env (kubetune_api.pod_env.FAULT_INJECT_ENV): off on a platform
    fault_injection: bool = False
    # leader election on a coordination.k8s.io Lease (kubetune_operator.leader): off, one process
    leader_election: bool = False
    leader_election_namespace: str | None = None
    leader_election_lease: str = "kubetune-operator"
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        env = os.environ if env is None else env

        def get(name: str) -> str | None:
            value = env.get(PREFIX + name, "").strip()
            return value or None

        defaults = cls()
        namespaces = tuple(n.strip() for n in (get("NAMESPACES") or "").split(",") if n.strip())
        return cls(
            trainer_image=get("TRAINER_IMAGE") or defaults.trainer_image,
            image_pull_policy=get("IMAGE_PULL_POLICY") or defaults.image_pull_policy,
            default_tracking_uri=get("MLFLOW_TRACKING_URI"),
            default_registry_uri=get("MLFLOW_REGISTRY_URI"),
            default_storage_class=get("STORAGE_CLASS"),
            namespaces=namespaces,
            trainer_service_account=get("TRAINER_SERVICE_ACCOUNT"),
            run_as_user=_int(get("RUN_AS_USER"), defaults.run_as_user),
            termination_grace_seconds=_int(
                get("TERMINATION_GRACE_SECONDS"), defaults.termination_grace_seconds
            ),
            train_backoff_limit=_int(get("TRAIN_BACKOFF_LIMIT"), defaults.train_backoff_limit),
            register_backoff_limit=_int(get("REGISTER_BACKOFF_LIMIT"), defaults.register_backoff_limit),
            register_deadline_seconds=_int(
                get("REGISTER_DEADLINE_SECONDS"), defaults.register_deadline_seconds
            ),
            register_memory=get("REGISTER_MEMORY") or defaults.register_memory,
            preparation=_bool("PREPARATION", get("PREPARATION"), defaults.preparation),
            prepare_cpu=get("PREPARE_CPU") or defaults.prepare_cpu,
            prepare_memory=get("PREPARE_MEMORY") or defaults.prepare_memory,
            prepare_backoff_limit=_int(get("PREPARE_BACKOFF_LIMIT"), defaults.prepare_backoff_limit),
            prepare_deadline_seconds=_int(get("PREPARE_DEADLINE_SECONDS"), defaults.prepare_deadline_seconds),
            hf_endpoint=get("HF_ENDPOINT"),
            alias_job_ttl_seconds=_int(get("ALIAS_JOB_TTL_SECONDS"), defaults.alias_job_ttl_seconds),
            cache_size_limit=get("CACHE_SIZE_LIMIT") or defaults.cache_size_limit,
            tmp_size_limit=get("TMP_SIZE_LIMIT") or defaults.tmp_size_limit,
            resync_seconds=float(get("RESYNC_SECONDS") or defaults.resync_seconds),
            retry_seconds=float(get("RETRY_SECONDS") or defaults.retry_seconds),
            registry_tenancy=tenancy.parse_mode(get("REGISTRY_TENANCY")),
            registry_model_names=tuple(tenancy.parse_grants(get("REGISTRY_MODEL_NAMES")).items()),
            engine=engines.parse_default(get("ENGINE")),
            metrics_port=_port("METRICS_PORT", get("METRICS_PORT")),
            metrics_address=get("METRICS_ADDRESS") or defaults.metrics_address,
            fault_injection=_bool("FAULT_INJECTION", get("FAULT_INJECTION"), defaults.fault_injection),
            leader_election=_bool("LEADER_ELECTION", get("LEADER_ELECTION"), defaults.leader_election),
            leader_election_namespace=get("LEADER_ELECTION_NAMESPACE"),
            leader_election_lease=get("LEADER_ELECTION_LEASE") or defaults.leader_election_lease,
            lease_duration_seconds=_int(get("LEASE_DURATION_SECONDS"), defaults.lease_duration_seconds),
            renew_deadline_seconds=float(get("RENEW_DEADLINE_SECONDS") or defaults.renew_deadline_seconds),
            retry_period_seconds=float(get("RETRY_PERIOD_SECONDS") or defaults.retry_period_seconds),
        )


def _int(value: str | None, default: int) -> int:
    return default if value is None else int(value)


def _port(name: str, value: str | None) -> int:
    try:
        port = 0 if value is None else int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:  # the highest TCP port
        raise ValueError(f"{PREFIX}{name}={value!r}: expected a port number (0: off)")
    return port


def _bool(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    lowered = value.lower()
    if lowered not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f"{PREFIX}{name}={value!r}: expected true or false")
    return lowered in ("true", "1", "yes")
