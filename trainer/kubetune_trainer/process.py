"""The process every step runs as: its place in the job (:class:`Dist`: rank, local rank, world
size), its logging, and the trainer config it reads (:func:`load_config`). The preparation,
training and registration steps start with these.
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kubetune_api.trainer_config import TrainerConfig

from . import settings
from .sources.data_check import BadInputError, validation_lines


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_env() -> Dist:
        env = settings.current()
        return Dist(rank=env.rank, local_rank=env.local_rank, world_size=env.world_size)


# Installed beside the trainer (MLflow's dependencies), used by no step, and imported at start by a
# library that finds it: transformers imports scikit-learn, and SciPy's statistics with it, for the
# ROC curve of assisted decoding, which preparation, training and registration never run. Absent
# from the process, it costs nothing: about a second of CPU at every step's start, a sixth of its
# imports (docs/contributing.md, "Where the time goes").
UNUSED_LIBRARIES = ("sklearn",)
# Installed for float8 training (KUBETUNE_FP8, :func:`kubetune_trainer.training.fast.apply_fp8`) and
# used by nothing else here, but imported at start by transformers when it finds it: loading any
# model imports transformers' quantizers, whose torchao one imports torchao (and torch's compiler
# with it) for checkpoints quantized by torchao, which kubetune never loads. Absent, it costs
# nothing: about a second of CPU in every process that loads a model or imports PEFT or TRL
# (docs/contributing.md, "Where the time goes"). Preparation and registration never train in
# float8; a training process keeps it when KUBETUNE_FP8 asks for float8.
FLOAT8_LIBRARIES = ("torchao",)


def skip_unused_libraries(*, float8: bool = False) -> None:
    """Make :data:`UNUSED_LIBRARIES` absent from this process, before anything imports them, and
    :data:`FLOAT8_LIBRARIES` too unless ``float8`` (a training process that KUBETUNE_FP8 asks to
    train in float8: :attr:`kubetune_trainer.settings.Settings.float8_asked`): their ``import``
    raises ImportError and ``importlib.util.find_spec`` answers None (how transformers, PEFT and
    Accelerate ask). One already imported stays."""
    for name in UNUSED_LIBRARIES if float8 else UNUSED_LIBRARIES + FLOAT8_LIBRARIES:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: "not importable"


def cpu_share(cpus_requested: int | None, processes: int, cpus_here: int) -> int | None:
    """The threads each of a pod's ``processes`` gets: its share of the CPUs the pod asked for, no
    more than this machine has, at least one; None where the pod asked for none.

    >>> cpu_share(8, 1, 96), cpu_share(8, 4, 96), cpu_share(60, 1, 2), cpu_share(1, 8, 96), cpu_share(None, 1, 96)
    (8, 2, 2, 1, None)
    """
    if cpus_requested is None:
        return None
    return max(1, min(cpus_requested, cpus_here) // max(1, processes))


def share_cpus() -> int | None:
    """Size this process's thread pools by the CPUs its pod asked for (``KUBETUNE_CPUS``, the Downward
    API's request): torch, and the OpenMP and BLAS pools under it, otherwise start one thread per core
    of the node, whatever the pod asked for. On a node of 96 cores, a pod of 8 CPUs would run 96
    threads under a quota of 8, and they wait for each other: the tiny model's steps took 3 to 4 times
    the CPU with two threads on two busy cores as with one (docs/contributing.md, "Where the CPU
    goes"). Call it before torch is imported (they read ``OMP_NUM_THREADS`` when they start). An
    ``OMP_NUM_THREADS`` already set wins (the user's, or torchrun's 1 for each of several workers).
    Returns the threads set, None where nothing was set."""
    env = settings.current()
    threads = cpu_share(env.cpus_requested, env.local_world_size, len(os.sched_getaffinity(0)))
    if threads is None or env.omp_threads_set:
        return None
    os.environ[settings.OMP_THREADS_ENV] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:  # imported already (a local run's process, a test): its pool is sized now
        torch.set_num_threads(threads)
    return threads


def setup_logging(dist: Dist) -> None:
    level = logging.INFO if dist.is_rank0 else logging.WARNING
    fmt = f"%(asctime)s [rank{dist.rank}] %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr, force=True)
    # The libraries' own chatter (weight loading bars, deprecation notes) drowns the run's story.
    for noisy in ("transformers", "datasets", "accelerate", "peft", "trl", "mlflow", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING if dist.is_rank0 else logging.ERROR)


def load_config(path: Path) -> TrainerConfig:
    """The trainer config; :class:`BadInputError` naming the file and the field when it is not one."""
    import yaml
    from pydantic import ValidationError

    try:
        return TrainerConfig.load(path)
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the trainer config ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise BadInputError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from e
    except ValidationError as e:
        raise BadInputError("\n".join(f"{path}: {line}" for line in validation_lines(e))) from e
