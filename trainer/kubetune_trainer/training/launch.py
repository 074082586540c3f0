"""``torchrun`` for preemptible pods: the trainer's container command in a PyTorchJob.

    python -m kubetune_trainer.launch [--shutdown-grace-s 540] --nproc_per_node 8 -m kubetune_trainer.train --config /etc/kubetune/config.yaml

It takes torchrun's arguments unchanged (after its own option, first) and runs torchrun in this process, fixing two things that
matter when a pod is preempted (the kubelet sends SIGTERM to the container's first process only):

1. torchrun exits 1 when it gets SIGTERM (it raises ``SignalException``), and a PyTorchJob with
   ``restartPolicy: ExitCode`` treats 1 as a permanent failure. Here the launcher exits 128 + the
   signal (143 for SIGTERM, ``EXIT_PREEMPTED``: retryable). Likewise when the workers themselves
   exited 143 (they saved a checkpoint on SIGTERM).
2. torchrun gives its workers 30 s after forwarding SIGTERM, then SIGKILLs them: too short to
   finish a step and save a big model's checkpoint. Here the workers get ``--shutdown-grace-s``
   seconds (default 300; the operator writes it into the command, inside the pod's
   ``terminationGracePeriodSeconds``; never read from the environment).
3. torchrun exits 1 whatever its workers' failure was. Here the launcher exits with the code of the
   failure the workers classified (:mod:`kubetune_trainer.training.failures`, read back from the termination
   message: the kubelet's file, or the workers' ``--termination-log``): retryable ones (a CUDA
   out-of-memory retry, NCCL) restart the pod.

The second point replaces the timeout default of torch's ``PContext.close`` (torch 2.11, pinned in
the trainer image); the launcher logs when it cannot.
"""

from __future__ import annotations

import logging
import signal
import sys
from pathlib import Path
from typing import Any

from kubetune_api.failures import EXIT_RETRY, parse_failure
from kubetune_api.trainer_config import EXIT_PREEMPTED, SHUTDOWN_GRACE_FLAG

from .. import settings
from .failures import TERMINATION_LOG_FLAG, read_termination_log, use_termination_log

log = logging.getLogger("kubetune_trainer.launch")

GRACE_FLAG = SHUTDOWN_GRACE_FLAG
DEFAULT_GRACE_S = 300


def split_args(args: list[str]) -> tuple[int, list[str]]:
    """The launcher's own option (``--shutdown-grace-s N``, before torchrun's: how long the ranks get
    to save a checkpoint after SIGTERM, at least 1; default 300) and torchrun's arguments. SystemExit
    naming the option when its value is malformed."""
    raw: str | None = None
    rest = list(args)
    if rest and rest[0] == GRACE_FLAG:
        if len(rest) < 2:
            raise SystemExit(f"{GRACE_FLAG} needs a whole number of seconds")
        raw, rest = rest[1], rest[2:]
    elif rest and rest[0].startswith(GRACE_FLAG + "="):
        raw, rest = rest[0].split("=", 1)[1], rest[1:]
    if raw is None:
        return DEFAULT_GRACE_S, rest
    try:
        return max(1, int(raw)), rest
    except ValueError:
        raise SystemExit(f"{GRACE_FLAG} {raw!r} is not a whole number of seconds") from None


def termination_log_of(args: list[str]) -> Path | None:
    """The workers' ``--termination-log`` in torchrun's arguments (the launcher reads what they wrote)."""
    for i, arg in enumerate(args):
        if arg == TERMINATION_LOG_FLAG and i + 1 < len(args):
            return Path(args[i + 1])
        if arg.startswith(TERMINATION_LOG_FLAG + "="):
            return Path(arg.split("=", 1)[1])
    return None


def extend_worker_grace(grace_s: int) -> bool:
    """Make torchrun wait ``grace_s`` (not 30 s) for its workers after forwarding a signal."""
    try:
        from torch.distributed.elastic.multiprocessing.api import PContext
    except ImportError:
        return False
    original = PContext.close
    if getattr(original, "_kubetune_grace", None) == grace_s:
        return True

    def close(self: Any, death_sig: Any = None, timeout: int = grace_s) -> None:
        original(self, death_sig, max(timeout, grace_s))

    close._kubetune_grace = grace_s  # type: ignore[attr-defined]
    PContext.close = close  # type: ignore[method-assign]
    return True


def exit_code_for_failures(exit_codes: list[int]) -> int | None:
    """EXIT_PREEMPTED when every failed worker exited that way (they were preempted); else None."""
    codes = set(exit_codes)
    return EXIT_PREEMPTED if codes and codes <= {EXIT_PREEMPTED, -15} else None


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from torch.distributed import run as torchrun
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    grace, args = split_args(list(sys.argv[1:] if argv is None else argv))
    use_termination_log(termination_log_of(args))
    settings.warn_ignored_control(log, "launch")
    if not extend_worker_grace(grace):
        log.warning("could not extend torchrun's 30 s shutdown grace; big checkpoints may be cut short")
    try:
        # Not torchrun.main: its @record wrapper turns every failure into exit code 1.
        torchrun.run(torchrun.parse_args(args))
    except SignalException as e:
        code = 128 + int(e.sigval)
        name = signal.Signals(int(e.sigval)).name
        log.warning("got %s: workers were asked to checkpoint; exiting %d (retryable)", name, code)
        return code
    except ChildFailedError as e:
        preempted = exit_code_for_failures([f.exitcode for f in e.failures.values()])
        if preempted is not None:
            log.warning("workers were preempted and saved a checkpoint; exiting %d (retryable)", preempted)
            return preempted
        log.error("%s", e.format_msg())
        return exit_code_after_failure([f.exitcode for f in e.failures.values()])
    return 0


def exit_code_after_failure(exit_codes: list[int]) -> int:
    """The pod's exit code when a worker failed: the classified failure's (the first one the pod's
    workers wrote to the termination message: retryable or not), else EXIT_RETRY when a worker
    exited that way, else 1."""
    failure = parse_failure(read_termination_log())
    if failure is not None:
        return failure.exit_code
    return EXIT_RETRY if EXIT_RETRY in exit_codes else 1
