"""SIGTERM and the ranks, without the training library: :class:`PreemptionGuard` turns SIGTERM into
"save a checkpoint at the end of this step, then stop" (all ranks agree on it, so no rank waits alone
in a collective), :func:`barrier` waits for every rank, :func:`workers_ignore_sigterm` keeps data-loader
workers out of it.

Apart from :mod:`.callbacks` because a training process installs the guard before it checks its data
and its folder: one that refuses (bad data, another training's folder, a model already complete) ends
without importing transformers (and torch and PEFT with it) for nothing: 6.4 CPU seconds to 0.5 (16.7
without the libraries' bytecode; tests/unit/test_step_startup.py).
"""

from __future__ import annotations

import functools
import gc
import logging
import signal
import time
from types import FrameType
from typing import Any

log = logging.getLogger("kubetune_trainer.training.callbacks")  # the guard's lines keep their logger


def _dist() -> Any:
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def barrier() -> None:
    dist = _dist()
    if dist is not None:
        dist.barrier()


def workers_ignore_sigterm(loader: Any) -> Any:
    """Make ``loader``'s worker processes ignore SIGTERM; the loader, for chaining.

    On preemption torchrun forwards SIGTERM to each trainer's whole process group, data-loader
    workers included. A worker dies of it (PyTorch's worker handler re-raises the default), and
    the trainer's SIGCHLD handler then raises "DataLoader worker ... killed" wherever the trainer
    is, e.g. in the middle of the checkpoint that SIGTERM asked for. The trainer alone handles
    SIGTERM (:class:`PreemptionGuard`); the workers end with it, or with the SIGKILL after the
    grace period.
    """
    # accelerate's prepared loaders wrap the torch DataLoader that starts the workers
    torch_loader = getattr(loader, "base_dataloader", loader)
    init = getattr(torch_loader, "worker_init_fn", None)
    already = isinstance(init, functools.partial) and init.func is _ignore_sigterm
    if getattr(torch_loader, "num_workers", 0) > 0 and not already:
        torch_loader.worker_init_fn = functools.partial(_ignore_sigterm, init)
    return loader


def _ignore_sigterm(then: Any, worker_id: int) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # a forked worker inherits the trainer's paused collection (paused_gc); it collects as usual
    gc.enable()
    if then is not None:
        then(worker_id)


class PreemptionGuard:
    """Remembers a SIGTERM (or that rank 0 found the budget spent); the training loop asks
    :meth:`agreed` at each step end."""

    def __init__(self, *, ctrl_c: bool = False) -> None:
        self.requested = False
        # the spec.budget limit reached (rank 0 finds it; agreed() tells every rank): stop, not retry
        self.budget_limit: str | None = None
        self.received_at: float | None = None
        # Locally (kubetune run --local) Ctrl-C does the same: save, stop; a second Ctrl-C aborts.
        self.signals = [signal.SIGTERM, signal.SIGINT] if ctrl_c else [signal.SIGTERM]
        self._previous: dict[int, Any] = {}

    def install(self) -> PreemptionGuard:
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if not self.requested:
            # Only a flag here: saving from a signal handler could interrupt a half-done step.
            log.warning("%s: saving a checkpoint at the end of this step, then exiting", name)
        self.requested = True
        self.received_at = self.received_at or time.monotonic()

    def request_budget_stop(self, limit: str) -> None:
        """Rank 0: the budget is spent; every rank stops at the end of this step (:meth:`agreed`)."""
        if self.budget_limit is None:
            log.warning("budget reached (%s): saving, then stopping", limit)
        self.budget_limit = limit

    def agreed(self) -> bool:
        """True on every rank when any rank got SIGTERM, or rank 0 found the budget spent (one tiny
        all-reduce per optimizer step; a spent budget wins: the run ends, it is not retried)."""
        dist = _dist()
        if dist is None or dist.get_world_size() == 1:
            return self.requested or self.budget_limit is not None
        import torch

        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        flag = torch.tensor([2 if self.budget_limit else 1 if self.requested else 0], device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        value = int(flag.item())
        if value == 2 and self.budget_limit is None:
            self.budget_limit = "the budget"
        elif value == 1 and not self.requested:
            self.requested = True
            self.received_at = time.monotonic()
        return value > 0
