"""The trainer's own failures, classified: a reason, a one-line message with the numbers that matter,
and what to do (:mod:`kubetune_api.failures`), written where the operator and the user look.

:func:`classify` reads an exception (its whole chain: torch often wraps the ``OSError`` that says
what happened) and what the run knew when it failed (:data:`context`: the step, the micro-step
layout, the checkpoint volume). :func:`report` logs the failure and leaves it, as compact JSON, in
the container's termination message (``/dev/termination-log``; the first process of the pod to fail
writes it, so a rank that only saw its peer go away does not hide the cause).

Test hooks (``KUBETUNE_FAULT_INJECT``), for the causes a CPU cannot produce:
``cuda-oom:<step>:<rows>`` raises torch's CUDA out-of-memory error at the start of optimizer step
``<step>`` (and later ones) while a micro-step holds more than ``<rows>`` rows;
``nccl-timeout:<step>`` raises the error torch's NCCL watchdog raises for a collective that timed out.
"""

from __future__ import annotations

import errno
import logging
import shutil
import traceback
from dataclasses import dataclass
from pathlib import Path

from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.trainer_config import TERMINATION_MESSAGE_PATH

from .. import settings
from ..mlflow.run import redact
from ..settings import FAULT_ENV

log = logging.getLogger(__name__)

# The kubelet's file in a pod; a local run names another with --termination-log (use_termination_log).
# Never from the environment (kubetune_trainer.settings: control settings).
DEFAULT_TERMINATION_LOG = TERMINATION_MESSAGE_PATH
# A volume with less free space than this, when a save failed with torch's stream errors, is full.
FULL_BELOW_BYTES = 64 * 2**20
LOG_TAIL_LINES = 12
# torch's words for a CUDA allocation that failed (its OutOfMemoryError, or a CUDA error re-raised)
CUDA_OOM_WORDS = ("cuda out of memory", "cuda error: out of memory")


@dataclass
class RunContext:
    """What the run knew when it failed (set as it goes; read by :func:`classify`)."""

    step: int | None = None
    layout: str | None = None  # the micro-step layout, e.g. "4 rows x 2 micro-steps, no recomputation"
    output_dir: Path | None = None
    resume_from: Path | None = None  # the checkpoint this attempt resumes from
    training_started: bool = False  # the first optimizer step began (a resume load is behind)
    model: str | None = None  # the base model (Hub id or path), for ModelGated / ModelNotFound


context = RunContext()


TERMINATION_LOG_FLAG = "--termination-log"  # train's and prepare's option
_explicit_termination_log: list[Path] = []  # the --termination-log of this process, when given


def use_termination_log(path: Path | None) -> None:
    """Write (and read) the termination message at ``path`` (the step's ``--termination-log``);
    None: the kubelet's file, :data:`DEFAULT_TERMINATION_LOG`."""
    _explicit_termination_log[:] = [] if path is None else [Path(path)]


def termination_log_path() -> Path:
    return _explicit_termination_log[0] if _explicit_termination_log else Path(DEFAULT_TERMINATION_LOG)


def write_termination_log(text: str, *, first_only: bool = False) -> None:
    """Write the termination message (not in a pod: nothing). ``first_only``: keep one already there
    (another process of the pod failed first: its cause is the one that matters)."""
    path = termination_log_path()
    if not _explicit_termination_log and not path.exists():
        return  # not in a Kubernetes container (the kubelet makes the file): nothing under /dev here
    try:
        if first_only and path.exists() and path.stat().st_size > 0:
            return
        path.write_text(text)
    except OSError:
        pass


def read_termination_log() -> str:
    try:
        return termination_log_path().read_text()
    except OSError:
        return ""


def report(failure: TrainingFailure, *, logged: bool = False) -> None:
    """Log the failure and its remedy (unless ``logged``: a refusal's one line is), and leave it in
    the termination message (JSON, also the last line of stdout)."""
    failure = redacted(failure)
    if not logged:
        log.error("training failed: %s", failure.describe())
    message = failure.termination_message()
    write_termination_log(message, first_only=True)
    # also the log's last line: with FallbackToLogsOnError an unwritable file still tells it
    print(message, flush=True)


def redacted(failure: TrainingFailure) -> TrainingFailure:
    """The failure without credentials in its message (an exception's text may quote a tracking URI
    with its password, or a token): the termination message becomes a condition, an Event and
    Argo CD's health message."""
    return failure.model_copy(update={"message": redact(failure.message)})


# --- classification -----------------------------------------------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        out.append(current)
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return out


def _names(chain: list[BaseException]) -> set[str]:
    """The class names of every exception in the chain and of their bases."""
    return {base.__name__ for e in chain for base in type(e).__mro__}


def _gib(n: float) -> str:
    """A size in the unit that shows it: '0.7 MiB', '12.0 GiB'."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def volume_usage(path: Path | None) -> str:
    """The volume's used and free bytes, e.g. '9.9 GiB used, 0.0 GiB free of 10.0 GiB'."""
    if path is None:
        return ""
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError:
        return ""
    return (
        f"{_gib(usage.used)} used, {_gib(usage.free)} free of {_gib(usage.total)} ({usage.free:,} bytes free)"
    )


def _free_bytes(path: Path | None) -> int | None:
    if path is None:
        return None
    try:
        return shutil.disk_usage(path if path.exists() else path.parent).free
    except OSError:
        return None


def _cuda_memory() -> str:
    try:
        import torch

        if not torch.cuda.is_available():
            return ""
        used, reserved = torch.cuda.memory_allocated(), torch.cuda.memory_reserved()
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        return f"{_gib(used)} allocated, {_gib(reserved)} reserved by PyTorch of {_gib(total)}"
    except Exception:  # a broken CUDA context: the numbers are a bonus
        return ""


def classify(exc: BaseException, ctx: RunContext | None = None) -> TrainingFailure:
    """The reason, message and hint for ``exc`` (a failure of the run described by ``ctx``), its
    message without credentials."""
    return redacted(_classify(exc, ctx or context))


def _classify(exc: BaseException, ctx: RunContext) -> TrainingFailure:  # noqa: PLR0911  one return per reason, in order
    chain = _chain(exc)
    names = _names(chain)
    text = " | ".join(f"{type(e).__name__}: {e}" for e in chain)
    lower = text.lower()
    step = ctx.step
    of = TrainingFailure.of

    if "LossDivergedError" in names:
        return of(Failure.LOSS_DIVERGED, str(exc), step)
    # a bad row is named by the trainer's own check: its text (a quoted row) may say anything
    if "BadInputError" in names:
        return of(Failure.DATASET_ERROR, str(exc), step)
    if "OutOfMemoryError" in names or any(s in lower for s in CUDA_OOM_WORDS):
        memory = _cuda_memory()
        parts = [f"micro-step {ctx.layout}" if ctx.layout else "", memory, _gpu_cap()]
        detail = "; ".join(p for p in parts if p)
        return of(Failure.CUDA_OUT_OF_MEMORY, f"CUDA out of memory ({detail or _first_line(exc)})", step)
    if "nccl" in lower and ("timeout" in lower or "timed out" in lower):
        return of(Failure.NCCL_TIMEOUT, _first_line(exc), step)
    if "DistBackendError" in names or "nccl error" in lower or "ncclinternalerror" in lower.replace(" ", ""):
        return of(Failure.NCCL_ERROR, _first_line(exc), step)
    model = f"model {ctx.model}: " if ctx.model else ""
    if "GatedRepoError" in names:
        return of(Failure.MODEL_GATED, f"{model}{_first_line(exc)}", step)
    missing = {"RepositoryNotFoundError", "RevisionNotFoundError"}
    if names & missing or "is not a valid model identifier" in lower:
        return of(Failure.MODEL_NOT_FOUND, f"{model}{_first_line(exc)}", step)
    if "trying to access a gated repo" in lower:  # transformers' OSError, its cause dropped
        return of(Failure.MODEL_GATED, f"{model}{_first_line(exc)}", step)
    if _disk_full(chain, lower, ctx):
        where = ctx.output_dir or Path()
        return of(
            Failure.DISK_FULL,
            f"No space left on device on the checkpoint volume {where}: {volume_usage(where)}",
            step,
        )
    if ctx.resume_from is not None and not ctx.training_started and _unreadable(names, lower):
        return of(
            Failure.CHECKPOINT_CORRUPT,
            f"cannot read checkpoint {ctx.resume_from}: {_first_line(exc)}",
            step,
        )
    if "MemoryError" in names or "can't allocate memory" in lower:
        return of(Failure.HOST_OUT_OF_MEMORY, f"host memory exhausted: {_first_line(exc)}", step)
    return of(Failure.UNKNOWN, _tail(exc), step)


def _gpu_cap() -> str:
    cap = settings.current().gpu_memory_gib
    return f"cap {settings.GPU_MEMORY_ENV}={cap}" if cap else ""


def _disk_full(chain: list[BaseException], lower: str, ctx: RunContext) -> bool:
    if any(isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT) for e in chain):
        return True
    if "no space left on device" in lower or "disk quota exceeded" in lower:
        return True
    # torch's checkpoint writer reports a full disk in its own words ("unexpected pos ... vs ...",
    # "basic_ios::clear: iostream error", "file write failed"): full when the volume has no room
    stream = ("unexpected pos", "iostream error", "file write failed", "write failed")
    free = _free_bytes(ctx.output_dir)
    return any(s in lower for s in stream) and free is not None and free < FULL_BELOW_BYTES


def _unreadable(names: set[str], lower: str) -> bool:
    signs = (
        "safetensorerror",
        "error while deserializing",
        "pytorchstreamreader failed",
        "invalid load key",
        "unpickling",
        "failed finding central directory",
        "incomplete metadata",
        "ran out of input",
    )
    return bool(names & {"SafetensorError", "UnpicklingError", "EOFError"}) or any(s in lower for s in signs)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:1000]


def _tail(exc: BaseException) -> str:
    lines = "".join(traceback.format_exception(exc)).rstrip().splitlines()
    return "\n".join(lines[-LOG_TAIL_LINES:])


# --- test hooks -----------------------------------------------------------------------------------------


def injected(step: int, micro_rows: int) -> None:
    """Raise the error a test hook asks for at the start of optimizer step ``step``, if any."""
    fault = settings.current().fault
    kind, _, rest = fault.partition(":")
    if kind == "cuda-oom":
        at, _, rows = rest.partition(":")
        if step >= int(at) and micro_rows > int(rows or 0):
            import torch

            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate 2.00 GiB (test hook {FAULT_ENV}={fault})"
            )
    if kind == "nccl-timeout" and step >= int(rest):
        raise RuntimeError(
            "[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=42, OpType=ALLREDUCE) "
            f"ran for 600000 milliseconds before timing out (test hook {FAULT_ENV}={fault})"
        )
