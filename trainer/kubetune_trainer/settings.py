"""Every environment variable the trainer reads, in one place: :class:`Settings`, typed.

A pod gets its settings from the operator (the container's ``env``: ranks from torchrun, the
termination-log path, the image, the CPU request, credentials as secretKeyRefs); a local run from
the shell. In a pod, a control variable read here can only be the operator's (or the Training
Operator's and torchrun's): ``spec.env`` may not set any name of
:data:`kubetune_api.pod_env.RESERVED_ENV`, and the operator leaves such entries out of the pods
(tests/unit/test_pod_env.py reads every name read here and holds it against that list). Nothing else in ``kubetune_trainer`` reads ``os.environ`` for its own control variables:
a module calls :func:`current` (or takes a :class:`Settings` from its caller) and reads a field.
Writing the environment to configure a library (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, inductor's
compile threads) stays where that library is set up.

A new variable: its name as a constant here, a typed field of :class:`Settings`, read in
:func:`from_environ`. A value that can be malformed is kept raw and parsed by a method that fails
with the variable's name, only when the step that needs it asks (a bad grace period must not stop
the preparation step, which never uses it).

:func:`current` reads the process's environment each time it is called (cheap, and tests that set a
variable see it); a step reads it once at its start and passes what it needs down.

>>> s = from_environ({"RANK": "3", "WORLD_SIZE": "4", "KUBETUNE_REGISTER_FORCE": "yes"})
>>> (s.rank, s.local_rank, s.world_size, s.register_force)
(3, 0, 4, True)
>>> from_environ({}).hf_token is None
True
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from kubetune_api.pod_env import CPUS_ENV, FAULT_INJECT_ENV, IMAGE_ENV, SHUTDOWN_GRACE_ENV
from kubetune_api.registration import FORCE_ENV
from kubetune_api.tuning import GPU_MEMORY_ENV, TUNING_ENV, TuningConfig

# --- the names ----------------------------------------------------------------------------------------

# torchrun's (or one process: rank 0 of 1)
RANK_ENV = "RANK"
LOCAL_RANK_ENV = "LOCAL_RANK"
WORLD_SIZE_ENV = "WORLD_SIZE"
LOCAL_WORLD_SIZE_ENV = "LOCAL_WORLD_SIZE"
TORCHELASTIC_RUN_ID_ENV = "TORCHELASTIC_RUN_ID"  # set under torchrun: the pod's first process is its agent
# credentials (secretKeyRefs in a pod; never logged, redacted from every log line and MLflow field)
HF_TOKEN_ENVS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
SECRET_ENV_VARS = (
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_USERNAME",
    "MLFLOW_TRACKING_PASSWORD",
    *HF_TOKEN_ENVS,
)
# where a failing step leaves its one-line reason for the operator (the kubelet's file in a pod)
TERMINATION_LOG_ENV = "KUBETUNE_TERMINATION_LOG"  # training and preparation
TERMINATION_MESSAGE_ENV = "KUBETUNE_TERMINATION_MESSAGE_PATH"  # registration
DEFAULT_TERMINATION_LOG = "/dev/termination-log"
# Set by the operator, by the names kubetune_api.pod_env declares once (kubetune_operator.pod_env's
# table): the image the pod runs (a lineage tag of the registered model), the pod's CPU request
# (Downward API: inductor's compile workers), how long ranks get to save a checkpoint after SIGTERM.
GRACE_ENV = SHUTDOWN_GRACE_ENV
DEFAULT_GRACE_S = 300
# registration
RETRY_BUDGET_ENV = "KUBETUNE_REGISTER_RETRY_BUDGET_S"
DEFAULT_RETRY_BUDGET_S = 600.0
CLAIM_WAIT_ENV = "KUBETUNE_REGISTER_CLAIM_WAIT_S"
DEFAULT_CLAIM_WAIT_S = 3600.0
# tests' fault injection in real training processes (never set in production; spec.env may set it)
FAULT_ENV = FAULT_INJECT_ENV
# library settings kubetune looks at before it sets its own default
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"

__all__ = [
    "CLAIM_WAIT_ENV",
    "CPUS_ENV",
    "FAULT_ENV",
    "FORCE_ENV",
    "GPU_MEMORY_ENV",
    "GRACE_ENV",
    "IMAGE_ENV",
    "RETRY_BUDGET_ENV",
    "TERMINATION_LOG_ENV",
    "TERMINATION_MESSAGE_ENV",
    "Settings",
    "current",
    "from_environ",
]


@dataclass(frozen=True)
class Settings:
    """The trainer's environment, read once (:func:`from_environ`)."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    under_torchrun: bool = False
    hf_token: str | None = None
    secrets: tuple[str, ...] = ()  # the credential variables' values (empty ones left out)
    termination_log: str | None = None  # KUBETUNE_TERMINATION_LOG when set
    termination_message_path: str | None = None  # KUBETUNE_TERMINATION_MESSAGE_PATH when set
    image: str | None = None
    cpus_requested: int | None = None  # KUBETUNE_CPUS when a positive whole number
    compile_threads_set: bool = False  # TORCHINDUCTOR_COMPILE_THREADS set by the user: it wins
    gpu_memory_gib: str | None = None  # KUBETUNE_GPU_MEMORY_GIB as written (for messages)
    register_force: bool = False  # KUBETUNE_REGISTER_FORCE: register although the gate is not met
    fault: str = ""  # KUBETUNE_FAULT_INJECT
    # raw, parsed when asked (see the module's docstring)
    grace_raw: str = ""
    retry_budget_raw: str = ""
    claim_wait_raw: str = ""
    tuning_env: tuple[tuple[str, str], ...] = ()  # the variables TuningConfig reads

    def shutdown_grace_s(self) -> int:
        """KUBETUNE_SHUTDOWN_GRACE_S (at least 1), else 300; SystemExit naming it when malformed."""
        raw = self.grace_raw
        try:
            return max(1, int(raw)) if raw else DEFAULT_GRACE_S
        except ValueError:
            raise SystemExit(f"{GRACE_ENV}={raw!r} is not a whole number of seconds") from None

    def register_retry_budget_s(self) -> float:
        return _seconds(RETRY_BUDGET_ENV, self.retry_budget_raw, DEFAULT_RETRY_BUDGET_S)

    def register_claim_wait_s(self) -> float:
        return _seconds(CLAIM_WAIT_ENV, self.claim_wait_raw, DEFAULT_CLAIM_WAIT_S)

    def tuning(self) -> TuningConfig:
        """The measuring knobs (:class:`kubetune_api.tuning.TuningConfig`); ValueError naming the
        variable when one is malformed."""
        return TuningConfig.from_env(dict(self.tuning_env))


def _seconds(name: str, raw: str, default: float) -> float:
    try:
        return float(raw) if raw else default
    except ValueError:
        raise SystemExit(f"{name}={raw!r} is not a number of seconds") from None


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    return int(env.get(name) or default)


def from_environ(env: Mapping[str, str]) -> Settings:
    """The settings that ``env`` holds."""
    cpus = env.get(CPUS_ENV, "").strip()
    return Settings(
        rank=_int(env, RANK_ENV, 0),
        local_rank=_int(env, LOCAL_RANK_ENV, 0),
        world_size=_int(env, WORLD_SIZE_ENV, 1),
        local_world_size=_int(env, LOCAL_WORLD_SIZE_ENV, 1),
        under_torchrun=bool(env.get(TORCHELASTIC_RUN_ID_ENV)),
        hf_token=next((env[n] for n in HF_TOKEN_ENVS if env.get(n)), None),
        secrets=tuple(v for v in (env.get(n, "") for n in SECRET_ENV_VARS) if v),
        termination_log=env.get(TERMINATION_LOG_ENV) or None,
        termination_message_path=env.get(TERMINATION_MESSAGE_ENV),
        image=env.get(IMAGE_ENV, "").strip() or None,
        cpus_requested=int(cpus) if cpus.isdigit() and int(cpus) > 0 else None,
        compile_threads_set=COMPILE_THREADS_ENV in env,
        gpu_memory_gib=env.get(GPU_MEMORY_ENV) or None,
        register_force=env.get(FORCE_ENV, "").strip().lower() in ("1", "true", "yes"),
        fault=env.get(FAULT_ENV, ""),
        grace_raw=env.get(GRACE_ENV, ""),
        retry_budget_raw=env.get(RETRY_BUDGET_ENV, ""),
        claim_wait_raw=env.get(CLAIM_WAIT_ENV, ""),
        tuning_env=tuple((name, env[name]) for name in TUNING_ENV if name in env),
    )


def current() -> Settings:
    """The settings of this process's environment, as it is now."""
    return from_environ(os.environ)
