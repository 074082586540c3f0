"""The environment variables kubetune sets in the pods it creates, by name, and what ``spec.env``
may not set (:data:`RESERVED_ENV`), declared once.

The operator's table (:mod:`kubetune_operator.pod_env`: one row per variable, which pods get it, where
its value comes from) sets them; the trainer reads its own by these names; the rules
(:mod:`kubetune_api.rules`) refuse every reserved name in ``spec.env`` (one CEL rule and its Python
twin per class of :data:`RESERVED_ENV`), and the operator's table drops any that a job admitted
before a rule existed still carries. A test holds the operator's table, the trainer's reads and
these names together.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .cel import re2_search
from .tuning import TUNING_ENV

# --- read by the trainer (the operator sets them; refused in spec.env by a rule of their own) -------

CONFIG_ENV = "KUBETUNE_CONFIG"  # where the trainer config is mounted
CPUS_ENV = "KUBETUNE_CPUS"  # the training container's CPU request, whole CPUs (Downward API)
IMAGE_ENV = "KUBETUNE_IMAGE"  # the trainer image (lineage: the registered version is tagged with it)
# Variables the operator sets on the trainer's pods itself. A spec.env entry of the same name would
# replace KUBETUNE_CONFIG (set before spec.env: the later entry wins, and the trainer finds no
# config) and silently lose to the others (set after it); refused, so what the spec says runs.
OPERATOR_ENV = (CONFIG_ENV, CPUS_ENV, IMAGE_ENV)
# Control settings earlier versions passed in the environment; now on the command line the operator
# builds (launch --shutdown-grace-s, register --force): the trainer ignores these names, and spec.env
# may not set them (KUBETUNE_CONTROL below). The others it ignores: kubetune_trainer.settings.
SHUTDOWN_GRACE_ENV = "KUBETUNE_SHUTDOWN_GRACE_S"
# The trainer's test hook (tests inject a CUDA out-of-memory error, a kill, an NCCL timeout into real
# training processes; tests/cluster sets it through spec.env). The rules admit it (it decides nothing
# about what is registered or where), but it makes the job fail or restart at will: an operator honours
# it only where its platform turned it on (KUBETUNE_FAULT_INJECTION, the chart's
# operator.faultInjection; off by default), else the job is refused (fault_injection_refusal) and its
# pods never get it.
FAULT_INJECT_ENV = "KUBETUNE_FAULT_INJECT"

# --- read by the libraries in the pods --------------------------------------------------------------

# Set by kubetune on the trainer pods after the preparation step (they read the volume only).
DEFAULTED_ENV = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HF_ENDPOINT_ENV = "HF_ENDPOINT"  # the operator's Hub mirror (KUBETUNE_HF_ENDPOINT), when it has one
# The caches and scratch space (the root filesystem is read-only)
CACHE_ENV = ("HOME", "XDG_CACHE_HOME", "HF_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TMPDIR")
# spec.secrets: the field of each Secret reference, and the variable it fills
SECRET_ENV = {
    "hugging_face_token": "HF_TOKEN",
    "mlflow_tracking_token": "MLFLOW_TRACKING_TOKEN",
    "mlflow_tracking_username": "MLFLOW_TRACKING_USERNAME",
    "mlflow_tracking_password": "MLFLOW_TRACKING_PASSWORD",
}

# --- set by the Kubeflow Training Operator -----------------------------------------------------------

# Variables the Kubeflow Training Operator appends to every PyTorchJob container, whatever is
# already there (v1.9 pytorch/envvar.go): kubetune's builders leave them to it, and a spec.env entry
# of the same name would define one twice (the API server only warns: "hides previous definition").
TRAINING_OPERATOR_ENV = (
    "PYTHONUNBUFFERED",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "PET_MASTER_ADDR",
    "PET_MASTER_PORT",
    "PET_NODE_RANK",
    "PET_NPROC_PER_NODE",
    "PET_NNODES",
)

# Variables kubetune (kubetune_operator.pod_env) or the Kubeflow Training Operator set on the pods;
# a spec.env entry of the same name would define it twice (the API server keeps both, the later wins).
# OPERATOR_ENV is refused by a rule of its own; DEFAULTED_ENV gives way to spec.env.
POD_ENV = (
    *CACHE_ENV,
    *SECRET_ENV.values(),
    *TRAINING_OPERATOR_ENV,  # PYTHONUNBUFFERED: kubetune sets it in the preparation and registration pods
)


# --- what spec.env may not set ------------------------------------------------------------------------


@dataclass(frozen=True)
class Reserved:
    """One class of names ``spec.env`` may not set: ``pattern`` (RE2 and Python's ``re`` agree on it;
    no quotes or backslashes: it goes into a single-quoted CEL string) less ``allowed`` (the names of
    that class the spec may still set, matched exactly). ``what`` and ``why`` make the rule's message.

    Matched without regard to case: Linux keeps ``kubetune_register_force`` apart from
    ``KUBETUNE_REGISTER_FORCE`` and nothing reads the lowercase one, but a lowercase twin of a control
    name is a typo that would silently do nothing, or a bet on a reader that folds case (Windows'
    environment, tools that upper-case names): refused either way. The allowed names are exact.
    """

    what: str
    pattern: str
    why: str
    allowed: str | None = None

    def refuses(self, name: str) -> bool:
        # case folded as the API server's regexp folds it (kubetune_api.cel.re2_search: not U+0130, U+0131)
        return re2_search(self.pattern, name) and not (self.allowed and re2_search(self.allowed, name))

    def cel(self, var: str = "self.name") -> str:
        """The CEL that holds when ``var`` is not refused by this class."""
        allowed = f" || {var}.matches('{self.allowed}')" if self.allowed else ""
        return f"!{var}.matches('{self.pattern}'){allowed}"


def _names(*names: str) -> str:
    return "(?i)^(" + "|".join(names) + ")$"


# kubetune's own: the operator sets them (KUBETUNE_CONFIG, _CPUS, _IMAGE), or earlier versions read
# them for control (KUBETUNE_REGISTER_FORCE, _SHUTDOWN_GRACE_S, where failures are reported, the
# registration's retry budget and claim wait: now the command line's, and ignored in the environment).
# Every KUBETUNE_* name, now and later, is reserved, less the tuning variables (kubetune_api.tuning:
# how fast, checked value by value) and the test hook.
USER_KUBETUNE_ENV = (*TUNING_ENV, FAULT_INJECT_ENV)
KUBETUNE_CONTROL = Reserved(
    "a kubetune control variable (KUBETUNE_*)",
    "(?i)^KUBETUNE_",
    "kubetune sets these or decides with them (KUBETUNE_CONFIG, KUBETUNE_REGISTER_FORCE, ...); only its "
    f"tuning variables ({', '.join(TUNING_ENV)}) and {FAULT_INJECT_ENV} may be set",
    "^(" + "|".join(USER_KUBETUNE_ENV) + ")$",
)
# The Hub: where it is (the operator's trainer.hfEndpoint), whether the pods reach it after the
# preparation step (offline), where its files and the token are (the cache mount, spec.secrets).
# The Hub's other variables (HF_HUB_DOWNLOAD_TIMEOUT, HF_HUB_ENABLE_HF_TRANSFER, HF_HUB_VERBOSITY...)
# tune a download and stay the spec's.
HUB_CONTROL = Reserved(
    "a Hugging Face Hub location, mode, cache or token variable",
    _names(
        "HF_ENDPOINT",
        "HF_HUB_OFFLINE",
        "HF_DATASETS_OFFLINE",
        "TRANSFORMERS_OFFLINE",
        "HF_HOME",
        "HF_HUB_CACHE",
        "HUGGINGFACE_HUB_CACHE",
        "HF_DATASETS_CACHE",
        "HF_ASSETS_CACHE",
        "HF_XET_CACHE",
        "TRANSFORMERS_CACHE",
        "HF_TOKEN",
        "HF_TOKEN_PATH",
        "HUGGING_FACE_HUB_TOKEN",
        # the staging Hub overrides HF_ENDPOINT; transformers puts HF_MODULES_CACHE on sys.path
        "HUGGINGFACE_CO_STAGING",
        "HUGGINGFACE_ASSETS_CACHE",
        "HF_MODULES_CACHE",
        "HF_DATASETS_DOWNLOADED_DATASETS_PATH",
        "HF_DATASETS_EXTRACTED_DATASETS_PATH",
    ),
    "the operator sets the Hub mirror (trainer.hfEndpoint), the offline mode after preparation and the "
    "caches; the token goes in spec.secrets.huggingFaceToken",
)
# MLflow: every MLFLOW_* but the HTTP client's timeouts and retries. The others say where runs and
# models go (MLFLOW_TRACKING_URI, MLFLOW_REGISTRY_URI, MLFLOW_S3_ENDPOINT_URL...), which run or
# experiment is written (MLFLOW_RUN_ID, MLFLOW_EXPERIMENT_NAME), or who kubetune is and how it is
# checked (MLFLOW_TRACKING_TOKEN, MLFLOW_TRACKING_AUTH, MLFLOW_TRACKING_INSECURE_TLS): the spec says
# these in spec.registration and spec.secrets, where the rules and the status see them.
MLFLOW_CONTROL = Reserved(
    "an MLflow variable (MLFLOW_*)",
    "(?i)^MLFLOW_",
    "where runs and models are tracked and registered is spec.registration, credentials go in "
    "spec.secrets; only MLFLOW_HTTP_REQUEST_TIMEOUT, _MAX_RETRIES, _BACKOFF_FACTOR and _BACKOFF_JITTER "
    "may be set",
    "^MLFLOW_HTTP_REQUEST_(TIMEOUT|MAX_RETRIES|BACKOFF_FACTOR|BACKOFF_JITTER)$",
)
# Who a process is and what it reaches: ranks and the rendezvous (the Training Operator and torchrun
# set them; PET_* are torchrun's arguments, TORCHELASTIC_* its agent's), the GPUs a process sees
# (CUDA_VISIBLE_DEVICES; NVIDIA_VISIBLE_DEVICES is read by the NVIDIA container runtime, and "all"
# there would hand the pod the node's other GPUs, past the device plugin), and the API server
# (KUBERNETES_SERVICE_HOST/PORT: the pod's service account token goes there). NCCL_* and TORCH_* stay
# the spec's: the network and collective tuning only the cluster's admins know (NCCL_SOCKET_IFNAME,
# NCCL_IB_HCA, NCCL_DEBUG, TORCH_NCCL_ASYNC_ERROR_HANDLING); they change how fast and how loud, not
# who a rank is or what it may reach.
ENGINE_CONTROL = Reserved(
    "a rank, rendezvous, device or cluster variable",
    _names(
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_NAME",
        "ROLE_WORLD_SIZE",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "PET_[A-Za-z0-9_]*",
        "TORCHELASTIC_[A-Za-z0-9_]*",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_[A-Za-z0-9_]*",
        "KUBERNETES_[A-Za-z0-9_]*",
    ),
    "the Training Operator, torchrun, the device plugin and the kubelet set them (NCCL_* and TORCH_* "
    "may be set)",
)
# Variables that change how every process of the pod starts: the dynamic loader's (libraries loaded
# into every process, where they are looked up), the shells' startup files, the command search path,
# and Python's (modules found or run before kubetune's own, another interpreter). Refused: a
# container image is the place for such changes, where they are built and scanned with the rest.
PROCESS_START = Reserved(
    "a variable that changes how every process starts",
    _names(
        "LD_[A-Za-z0-9_]*",
        "PATH",
        "BASH_ENV",
        "ENV",
        "GCONV_PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONPLATLIBDIR",
        "PYTHONINSPECT",
        "PYTHONEXECUTABLE",
        "PYTHONBREAKPOINT",
        "PYTHONWARNINGS",  # its categories are imported: a module named there runs
        "NCCL_NET_PLUGIN",
        "NCCL_TUNER_PLUGIN",
        "NCCL_PROFILER_PLUGIN",
        "TRITON_CACHE_MANAGER",
        "OPENSSL_CONF",
        "OPENSSL_MODULES",
    ),
    "LD_*, PATH, BASH_ENV, ENV, GCONV_PATH, PYTHONPATH, PYTHONHOME, PYTHONSTARTUP, NCCL_NET_PLUGIN, "
    "OPENSSL_CONF... load code into every process; build such changes into the trainer image (spec.image)",
)
# Where the pods' traffic goes and which certificates it trusts: an S3 endpoint (MLflow's artifacts,
# boto3), a proxy in the middle of every HTTP(S) request (the Hub, MLflow, with the token), or a CA
# bundle that lets such a middle pass for the real servers. Any case: curl and requests read the
# lowercase proxies too.
TRAFFIC_CONTROL = Reserved(
    "a variable that redirects the pods' traffic or the certificates it trusts",
    _names(
        "AWS_ENDPOINT_URL",
        "AWS_ENDPOINT_URL_S3",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "NO_PROXY",
        "ALL_PROXY",
        "REQUESTS_CA_BUNDLE",
        "SSL_CERT_FILE",
        "SSL_CERT_DIR",
        "CURL_CA_BUNDLE",
    ),
    "the registry, the Hub and the artifact store are the operator's (trainer.hfEndpoint, "
    "spec.registration); a proxy or CA bundle belongs in the trainer image or the cluster's network",
)
_CONTROL = (KUBETUNE_CONTROL, HUB_CONTROL, MLFLOW_CONTROL, ENGINE_CONTROL, PROCESS_START, TRAFFIC_CONTROL)
# The rest of what kubetune or the Training Operator set on the pods (the caches and scratch space,
# PYTHONUNBUFFERED): a second definition would hide kubetune's or be hidden by it.
SET_ON_PODS = Reserved(
    "a variable kubetune or the Training Operator sets on the pods",
    _names(*(n for n in POD_ENV if not any(r.refuses(n) for r in _CONTROL))),
    "it would be defined twice (caches and scratch space are kubetune's mounts)",
)
# Every name spec.env may not set, by class; one rule each (kubetune_api.rules).
RESERVED_ENV: tuple[Reserved, ...] = (*_CONTROL, SET_ON_PODS)


def fault_injection_refusal(env: list[Any] | None, allowed: bool) -> str | None:
    """Why a job's ``spec.env`` (its entries, each with a ``name``) may not run on an operator whose
    fault injection is ``allowed`` or not (None: it may).

    >>> from types import SimpleNamespace as E
    >>> fault_injection_refusal([E(name="NCCL_DEBUG"), E(name=FAULT_INJECT_ENV)], allowed=False)[:42]
    'spec.env[1].name: KUBETUNE_FAULT_INJECT is'
    >>> fault_injection_refusal([E(name=FAULT_INJECT_ENV)], allowed=True) is None
    True
    """
    if allowed:
        return None
    for i, entry in enumerate(env or []):
        if entry.name == FAULT_INJECT_ENV:
            return (
                f"spec.env[{i}].name: {FAULT_INJECT_ENV} is the trainer's test hook (it makes the job "
                "fail or restart at will) and this operator does not honour it: remove it (a platform "
                "turns it on for its test clusters with the chart's operator.faultInjection)"
            )
    return None


def reserved(name: str) -> Reserved | None:
    """The class that reserves ``name`` (None: spec.env may set it).

    >>> [reserved(n).what.split()[1] for n in ("KUBETUNE_REGISTER_FORCE", "kubetune_config", "HOME")]
    ['kubetune', 'kubetune', 'variable']
    >>> [reserved(n) for n in ("KUBETUNE_SHARDING", "NCCL_DEBUG", "MLFLOW_HTTP_REQUEST_TIMEOUT")]
    [None, None, None]
    """
    return next((r for r in RESERVED_ENV if r.refuses(name)), None)
