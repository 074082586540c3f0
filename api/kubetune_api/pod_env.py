"""The environment variables kubetune sets in the pods it creates, by name, declared once.

The operator's table (:mod:`kubetune_operator.pod_env`: one row per variable, which pods get it, where
its value comes from) sets them; the trainer reads its own by these names; the rules
(:mod:`kubetune_api.rules`) refuse them in ``spec.env``, where a second definition would either hide
kubetune's or be hidden by it. A test holds the operator's table and these names together.
"""

from __future__ import annotations

# --- read by the trainer (the operator sets them; refused in spec.env by a rule of their own) -------

CONFIG_ENV = "KUBETUNE_CONFIG"  # where the trainer config is mounted
CPUS_ENV = "KUBETUNE_CPUS"  # the training container's CPU request, whole CPUs (Downward API)
SHUTDOWN_GRACE_ENV = "KUBETUNE_SHUTDOWN_GRACE_S"  # the workers' time to checkpoint after SIGTERM
IMAGE_ENV = "KUBETUNE_IMAGE"  # the trainer image (lineage: the registered version is tagged with it)
# Variables the operator sets on the trainer's pods itself. A spec.env entry of the same name would
# replace KUBETUNE_CONFIG (set before spec.env: the later entry wins, and the trainer finds no
# config) and silently lose to the other two (set after it); refused, so what the spec says runs.
OPERATOR_ENV = (CONFIG_ENV, CPUS_ENV, SHUTDOWN_GRACE_ENV, IMAGE_ENV)
# (and kubetune_api.registration.FORCE_ENV: a registration retried past its gate)

# --- read by the libraries in the pods --------------------------------------------------------------

# Set by kubetune on the trainer pods after the preparation step (they read the volume only), unless
# spec.env names them: then the spec's value is the only one.
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
