"""kubetune's tuning variables: the one table the admission rules (CEL), the operator and the trainer share."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

# kubetune's own tuning variables, read by the trainer: name -> (the values it takes, as a regular
# expression; what they are, for the error). Checked where a FineTuneJob is admitted (CEL) and by the
# trainer, so a typo stops the job before anything is created instead of being ignored, or failing
# in the pod. An empty value means unset. Not by the operator's own parsing of the spec: a job
# admitted before a rule existed must not turn Failed when the operator is upgraded. The patterns
# go into single-quoted CEL strings as they are: no quotes or backslashes.
TUNING_ENV: dict[str, tuple[str, str]] = {
    "KUBETUNE_SHARDING": ("^(ddp|fsdp2)$", "ddp or fsdp2"),
    "KUBETUNE_DATALOADER_WORKERS": ("^[0-9]{1,3}$", "a whole number of data-loader workers, 0 to 999"),
    "KUBETUNE_DDP_BUCKET_MB": ("^[1-9][0-9]{0,4}$", "a whole number of megabytes, 1 to 99999"),
    "KUBETUNE_FSDP_RESHARD": (
        "^[01]$",
        "1 (free each layer's gathered weights after its forward) or 0 (keep them)",
    ),
    "KUBETUNE_VARLEN_KERNEL": ("^(flash|flash-repeat)$", "flash or flash-repeat"),
    "KUBETUNE_FP8": ("^(off|tensorwise)$", "off or tensorwise"),
    "KUBETUNE_GPU_MEMORY_GIB": (
        "^[1-9][0-9]{0,3}([.][0-9]+)?$",
        "a number of GiB, at least 1 and below 10000",
    ),
}


def tuning_env_error(name: str, value: str) -> str | None:
    """Why ``value`` is not one a kubetune tuning variable takes (None: fine, or not one of them).

    >>> tuning_env_error("KUBETUNE_SHARDING", "fsdp")
    "KUBETUNE_SHARDING must be ddp or fsdp2, got 'fsdp'"
    >>> tuning_env_error("KUBETUNE_SHARDING", "fsdp2") is None and tuning_env_error("NCCL_DEBUG", "x") is None
    True
    """
    known = TUNING_ENV.get(name)
    if known is None or value == "" or re.fullmatch(known[0], value):
        return None
    return f"{name} must be {known[1]}, got {value!r}"


SHARDING_ENV = "KUBETUNE_SHARDING"
DATALOADER_WORKERS_ENV = "KUBETUNE_DATALOADER_WORKERS"
DDP_BUCKET_ENV = "KUBETUNE_DDP_BUCKET_MB"
FSDP_RESHARD_ENV = "KUBETUNE_FSDP_RESHARD"
VARLEN_KERNEL_ENV = "KUBETUNE_VARLEN_KERNEL"
FP8_ENV = "KUBETUNE_FP8"
GPU_MEMORY_ENV = "KUBETUNE_GPU_MEMORY_GIB"


@dataclass(frozen=True)
class TuningConfig:
    """The tuning variables' values, read once where a process starts (:meth:`from_env`) and passed
    to what they tune; the defaults are "none set": the plan decides.

    >>> TuningConfig.from_env({"KUBETUNE_SHARDING": "fsdp2", "KUBETUNE_FP8": ""}).sharding
    'fsdp2'
    >>> TuningConfig.from_env({"KUBETUNE_GPU_MEMORY_GIB": "79.5"}).gpu_memory_cap_bytes == int(79.5 * 2**30)
    True
    """

    sharding: str | None = None  # ddp | fsdp2; None: the plan's choice
    dataloader_workers: int | None = None  # None: the plan's choice
    ddp_bucket_mb: int | None = None  # None: PyTorch's 25
    fsdp_reshard: bool = True  # free each layer's gathered weights after its forward
    varlen_kernel: str | None = None  # None: varlen's first kernel
    fp8: str = "off"  # off | tensorwise
    gpu_memory_gib: float | None = None  # the GPU memory each process may take; None: the whole GPU

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TuningConfig:
        """The config from ``environ`` (the process's environment by default); ValueError naming the
        variable when one holds a value it does not take."""
        env = os.environ if environ is None else environ

        def value(name: str) -> str | None:
            raw = env.get(name, "").strip()
            error = tuning_env_error(name, raw)
            if error:
                raise ValueError(error)
            return raw or None

        workers, bucket, reshard = (
            value(DATALOADER_WORKERS_ENV),
            value(DDP_BUCKET_ENV),
            value(FSDP_RESHARD_ENV),
        )
        memory = value(GPU_MEMORY_ENV)
        return cls(
            sharding=value(SHARDING_ENV),
            dataloader_workers=None if workers is None else int(workers),
            ddp_bucket_mb=None if bucket is None else int(bucket),
            fsdp_reshard=reshard != "0",
            varlen_kernel=value(VARLEN_KERNEL_ENV),
            fp8=value(FP8_ENV) or "off",
            gpu_memory_gib=None if memory is None else float(memory),
        )

    @property
    def gpu_memory_cap_bytes(self) -> int | None:
        return None if self.gpu_memory_gib is None else int(self.gpu_memory_gib * 2**30)
