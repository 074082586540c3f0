"""Every environment variable the trainer reads, in one place: :class:`Settings`, typed.

A pod gets its settings from the operator (the container's ``env``: ranks from torchrun, the
image, the CPU request, credentials as secretKeyRefs); a local run from the shell. ``spec.env`` may
not set any name of :data:`kubetune_api.pod_env.RESERVED_ENV`, and the operator leaves such entries
out of the pods (tests/unit/test_pod_env.py reads every name read here and holds it against that
list). Nothing else in ``kubetune_trainer`` reads ``os.environ`` for its own control variables:
a module calls :func:`current` (or takes a :class:`Settings` from its caller) and reads a field.
Writing the environment to configure a library (``MLFLOW_HTTP_REQUEST_MAX_RETRIES``, inductor's
compile threads) stays where that library is set up.

**Control settings are not read from the environment at all** (the second wall behind the rules,
issue 33): what decides the evaluation gate, the registration, where the report the operator reads
is written, the retries and the shutdown grace comes from the command line the operator builds
(:mod:`kubetune_operator.builders`) or the trainer config it mounts (``--config``), else the
step's own default; a local run passes the same flags. A variable of :data:`IGNORED_CONTROL_ENV` in the
environment (an older operator's, or a pod's free environment) changes nothing: :class:`Settings`
only lists its name (:attr:`Settings.ignored_control`), and each step's entry point logs it.

=====================================  ==============================================================
control input                          read from (pod: the operator writes it; local: the same flag)
=====================================  ==============================================================
forced past the gate                   ``register --force`` (only a ``kubetune.io/retry-registration``)
the gate itself, the selection         the trainer config (``spec.registration``), ``--config``
registration's report path             ``register --termination-message-path``, else the kubelet's file
training's and preparation's report    ``--termination-log`` (train, prepare), else the kubelet's file
registration retry budget, claim wait  ``register --retry-budget`` / ``--claim-wait`` (defaults 600 s, 1 h)
the workers' shutdown grace            ``launch --shutdown-grace-s`` (the operator: pod grace less 60 s)
the output folder, the tracking URI    the trainer config (``outputDir``, ``trackingUri``)
=====================================  ==============================================================

A new variable: its name as a constant here, a typed field of :class:`Settings`, read in
:func:`from_environ`. A value that can be malformed is kept raw and parsed by a method that fails
with the variable's name, only when the step that needs it asks.

:func:`current` reads the process's environment each time it is called (cheap, and tests that set a
variable see it); a step reads it once at its start and passes what it needs down.

>>> s = from_environ({"RANK": "3", "WORLD_SIZE": "4", "KUBETUNE_REGISTER_FORCE": "yes"})
>>> (s.rank, s.local_rank, s.world_size, s.ignored_control)
(3, 0, 4, ('KUBETUNE_REGISTER_FORCE',))
>>> from_environ({}).hf_token is None
True
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass

from kubetune_api.pod_env import CPUS_ENV, FAULT_INJECT_ENV, IMAGE_ENV, SHUTDOWN_GRACE_ENV
from kubetune_api.registration import FORCE_ENV
from kubetune_api.tuning import FP8_ENV, GPU_MEMORY_ENV, TUNING_ENV, TuningConfig

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
# Set by the operator, by the names kubetune_api.pod_env declares once (kubetune_operator.pod_env's
# table): the image the pod runs (a lineage tag of the registered model), the pod's CPU request
# (Downward API: inductor's compile workers).
# --- control settings: never read from the environment (the module's docstring) ---------------------
# Variables earlier versions read for control; their values are ignored, their names only reported.
TERMINATION_LOG_ENV = "KUBETUNE_TERMINATION_LOG"  # now: train/prepare --termination-log
TERMINATION_MESSAGE_ENV = "KUBETUNE_TERMINATION_MESSAGE_PATH"  # now: register --termination-message-path
GRACE_ENV = SHUTDOWN_GRACE_ENV  # now: launch --shutdown-grace-s
RETRY_BUDGET_ENV = "KUBETUNE_REGISTER_RETRY_BUDGET_S"  # now: register --retry-budget
CLAIM_WAIT_ENV = "KUBETUNE_REGISTER_CLAIM_WAIT_S"  # now: register --claim-wait
IGNORED_CONTROL_ENV = (
    FORCE_ENV,  # now: register --force
    TERMINATION_LOG_ENV,
    TERMINATION_MESSAGE_ENV,
    GRACE_ENV,
    RETRY_BUDGET_ENV,
    CLAIM_WAIT_ENV,
)
# tests' fault injection in real training processes (never set in production; spec.env may set it)
FAULT_ENV = FAULT_INJECT_ENV
# library settings kubetune looks at before it sets its own default
COMPILE_THREADS_ENV = "TORCHINDUCTOR_COMPILE_THREADS"
OMP_THREADS_ENV = "OMP_NUM_THREADS"  # torch's (and OpenMP's, BLAS's) threads per process

__all__ = [
    "CPUS_ENV",
    "FAULT_ENV",
    "GPU_MEMORY_ENV",
    "IGNORED_CONTROL_ENV",
    "IMAGE_ENV",
    "Settings",
    "current",
    "from_environ",
    "warn_ignored_control",
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
    image: str | None = None
    cpus_requested: int | None = None  # KUBETUNE_CPUS when a positive whole number
    compile_threads_set: bool = False  # TORCHINDUCTOR_COMPILE_THREADS set by the user: it wins
    omp_threads_set: bool = False  # OMP_NUM_THREADS set (by the user, or torchrun for its workers): it wins
    gpu_memory_gib: str | None = None  # KUBETUNE_GPU_MEMORY_GIB as written (for messages)
    fault: str = ""  # KUBETUNE_FAULT_INJECT
    # the names of IGNORED_CONTROL_ENV that are set (never their values: nothing decides with them)
    ignored_control: tuple[str, ...] = ()
    tuning_env: tuple[tuple[str, str], ...] = ()  # the variables TuningConfig reads

    def tuning(self) -> TuningConfig:
        """The measuring knobs (:class:`kubetune_api.tuning.TuningConfig`); ValueError naming the
        variable when one is malformed."""
        return TuningConfig.from_env(dict(self.tuning_env))

    @property
    def float8_asked(self) -> bool:
        """``KUBETUNE_FP8`` asks for float8 training: set, and not ``off`` (a malformed value counts,
        and :meth:`tuning` names it where the plan reads it). Read before the step imports anything
        (:func:`kubetune_trainer.process.skip_unused_libraries`).

        >>> (from_environ({}).float8_asked, from_environ({"KUBETUNE_FP8": "off"}).float8_asked)
        (False, False)
        >>> from_environ({"KUBETUNE_FP8": "tensorwise"}).float8_asked
        True
        """
        return dict(self.tuning_env).get(FP8_ENV, "").strip() not in ("", "off")


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
        image=env.get(IMAGE_ENV, "").strip() or None,
        cpus_requested=int(cpus) if cpus.isdigit() and int(cpus) > 0 else None,
        compile_threads_set=COMPILE_THREADS_ENV in env,
        omp_threads_set=bool(env.get(OMP_THREADS_ENV, "").strip()),
        gpu_memory_gib=env.get(GPU_MEMORY_ENV) or None,
        fault=env.get(FAULT_ENV, ""),
        ignored_control=tuple(name for name in IGNORED_CONTROL_ENV if name in env),
        tuning_env=tuple((name, env[name]) for name in TUNING_ENV if name in env),
    )


def current() -> Settings:
    """The settings of this process's environment, as it is now."""
    return from_environ(os.environ)


def warn_ignored_control(log: logging.Logger, step: str) -> Settings:
    """Log, once at ``step``'s start, each control variable set in the environment and ignored (a
    name, never its value); the settings read. Nothing stops: the value simply changes nothing."""
    now = current()
    for name in now.ignored_control:
        log.warning(
            "%s: %s is set in the environment and ignored: kubetune reads this setting only from its "
            "command line or the trainer config the operator wrote",
            step,
            name,
        )
    return now
