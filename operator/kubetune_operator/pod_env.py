"""The environment of every pod the operator creates, in one table.

One row per variable: its name, the pods that get it, and where its value comes from (a constant,
the operator's settings, the job's spec, the Downward API, a Secret). One row stands for the job's
own ``spec.env`` entries, in their order. A pod's ``env`` is the rows that name it, in table order,
without those whose value this job leaves unset (:func:`env`); the builders
(:mod:`kubetune_operator.builders`) put it in each container. Pure.

What the operator sets is never overridden by the spec: the rules refuse every reserved name in
``spec.env`` (:data:`kubetune_api.pod_env.RESERVED_ENV`), and a job admitted before a rule existed
(the operator does not check a started job again) still gets none of them: :func:`env` leaves out a
``spec.env`` entry that is reserved or that a row of this pod sets, whatever its case. And behind
that wall a second one: no control setting travels in the environment at all. Whether a registration
is forced past its gate (only one that the ``kubetune.io/retry-registration`` annotation asked for),
the workers' shutdown grace, where each step writes its report, the registration's retry budget and
claim wait: the containers' commands (:mod:`kubetune_operator.builders`) and the mounted trainer
config say them, and the trainer reads them nowhere else (:mod:`kubetune_trainer.settings`).

The names come from :mod:`kubetune_api.pod_env`: the trainer reads its own by those names, and the
rules refuse them in ``spec.env``. A new variable is
one row here (and its name there); tests/unit/test_pod_env.py holds the two together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kubetune_api import pod_env as names
from kubetune_api import spec as api
from kubetune_api.trainer_config import CHECKPOINT_MOUNT, CONFIG_PATH

from .settings import Settings

# Where the writable scratch space goes: the root filesystem is read-only (the builders mount there).
CACHE_MOUNT = "/var/cache/kubetune"
COMPILE_CACHE = f"{CHECKPOINT_MOUNT}/.cache"
TMP_MOUNT = "/tmp"


class Pod(StrEnum):
    TRAINING = "training"  # the PyTorchJob's pods (Master and Workers)
    PREPARATION = "preparation"  # the preparation Job's pod
    REGISTRATION = "registration"  # the registration Job's pod (and the alias Jobs', the same pod)


@dataclass(frozen=True)
class Context:
    """What a value may come from: the job, the operator's settings, the pod, and what the builder
    decided for it (the image it runs, its container's name)."""

    job: api.FineTuneJob
    settings: Settings
    pod: Pod
    image: str
    container: str


# A row's value for one pod: a string (``value``), a dict (``valueFrom``), or None (not set for this job)
Value = Callable[[Context], str | dict[str, Any] | None]


@dataclass(frozen=True)
class Var:
    name: str
    pods: frozenset[Pod]
    value: Value


@dataclass(frozen=True)
class SpecEnv:
    """The job's own ``spec.env`` entries, as written (a value, or a Secret key)."""

    pods: frozenset[Pod]


ALL = frozenset(Pod)
TRAINING = frozenset({Pod.TRAINING})
CPU_PODS = frozenset({Pod.PREPARATION, Pod.REGISTRATION})


def shutdown_grace_seconds(settings: Settings) -> int:
    """The workers' time to checkpoint after SIGTERM: inside the pod's grace period, with a margin
    for the launcher and the pod to exit before the kubelet's SIGKILL."""
    return max(30, settings.termination_grace_seconds - 60)


def _secret(field: str) -> Value:
    def value(ctx: Context) -> dict[str, Any] | None:
        ref: api.SecretKeyRef | None = getattr(ctx.job.spec.secrets, field, None)
        return None if ref is None else {"secretKeyRef": {"name": ref.name, "key": ref.key}}

    return value


def _defaulted(ctx: Context) -> str | None:
    """Set after the preparation step (the model and the tokenized data are on the volume: a
    (re)started trainer never reaches for the Hub)."""
    return "1" if ctx.settings.preparation else None


def _cpus(ctx: Context) -> dict[str, Any] | None:
    """The container's CPU request, whole CPUs rounded up (Downward API). The trainer shares it
    among its processes for torch.compile's worker pools: inductor would otherwise start min(32, the
    node's CPUs) workers per process, ~0.4 GB each, whatever the pod asked for."""
    if not ctx.job.spec.resources.cpu:
        return None
    return {"resourceFieldRef": {"containerName": ctx.container, "resource": "requests.cpu", "divisor": "1"}}


TABLE: tuple[Var | SpecEnv, ...] = (
    # the Training Operator sets it in training pods, with the rest of TRAINING_OPERATOR_ENV
    Var("PYTHONUNBUFFERED", CPU_PODS, lambda ctx: "1"),
    # Caches go to the writable emptyDir: the root filesystem is read-only.
    Var("HOME", ALL, lambda ctx: CACHE_MOUNT),  # exists (the mount point); some tools write to ~
    Var("XDG_CACHE_HOME", ALL, lambda ctx: CACHE_MOUNT),
    Var("HF_HOME", ALL, lambda ctx: f"{CACHE_MOUNT}/huggingface"),
    # Compiled kernels live on the checkpoint volume: an attempt restarted after preemption finds the
    # previous attempt's kernels instead of compiling again (keys include the torch version and the
    # GPU, so a new image or another GPU simply compiles anew).
    Var("TRITON_CACHE_DIR", ALL, lambda ctx: f"{COMPILE_CACHE}/triton"),
    Var("TORCHINDUCTOR_CACHE_DIR", ALL, lambda ctx: f"{COMPILE_CACHE}/torchinductor"),
    Var("TMPDIR", ALL, lambda ctx: TMP_MOUNT),
    Var(names.CONFIG_ENV, ALL, lambda ctx: CONFIG_PATH),
    # lineage: the registered model version is tagged with the image that trained it
    Var(names.IMAGE_ENV, ALL, lambda ctx: ctx.image),
    Var(names.HF_ENDPOINT_ENV, ALL, lambda ctx: ctx.settings.hf_endpoint or None),
    *(Var(name, TRAINING, _defaulted) for name in names.DEFAULTED_ENV),
    *(Var(name, ALL, _secret(field)) for field, name in names.SECRET_ENV.items()),
    SpecEnv(ALL),
    Var(names.CPUS_ENV, TRAINING, _cpus),
)


def _spec_env(job: api.FineTuneJob, pod: Pod, fault_injection: bool) -> list[dict[str, Any]]:
    """The job's own entries, less those the spec may not set (see the module's docstring), and
    less the trainer's test hook where this operator does not honour it (``fault_injection``)."""
    ours = {name.upper() for name in names_set(pod)}
    out: list[dict[str, Any]] = []
    for extra in job.spec.env or []:
        if names.reserved(extra.name) is not None or extra.name.upper() in ours:
            continue
        if extra.name == names.FAULT_INJECT_ENV and not fault_injection:
            continue
        if extra.value_from is not None:
            ref = extra.value_from.secret_key_ref
            out.append(
                {"name": extra.name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}
            )
        else:
            out.append({"name": extra.name, "value": extra.value or ""})
    return out


def env(ctx: Context) -> list[dict[str, Any]]:
    """The ``env`` of ``ctx.pod``'s container: the table's rows for that pod, in order."""
    out: list[dict[str, Any]] = []
    for row in TABLE:
        if ctx.pod not in row.pods:
            continue
        if isinstance(row, SpecEnv):
            out += _spec_env(ctx.job, ctx.pod, ctx.settings.fault_injection)
            continue
        value = row.value(ctx)
        if isinstance(value, str):
            out.append({"name": row.name, "value": value})
        elif value is not None:
            out.append({"name": row.name, "valueFrom": value})
    return out


def names_set(pod: Pod) -> tuple[str, ...]:
    """Every name the table may set in ``pod`` (not the job's own spec.env)."""
    return tuple(row.name for row in TABLE if isinstance(row, Var) and pod in row.pods)
