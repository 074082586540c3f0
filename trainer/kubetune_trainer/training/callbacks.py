"""The trainer's hooks into the Hugging Face training loop.

- :class:`PreemptionGuard` (:mod:`.preemption`, which needs no transformers) turns SIGTERM into
  "save a checkpoint at the end of this step, then stop" (all ranks agree on it).
- :class:`ScheduledCollection` and :func:`paused_gc` run Python's garbage collector at fixed steps
  instead of whenever allocation counts trip it.
- :class:`RunCallback` marks each checkpoint COMPLETE once every rank finished writing it, prunes old
  ones, and (rank 0) sends metrics to MLflow, progress to the FineTuneJob status, and keeps the loss
  history for ``train-result.json``.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from kubetune_api.spec import BudgetSpec

from .. import settings
from ..mlflow.tracking import MlflowTracker
from ..volume import catalog, checkpoints, resume
from . import failures
from .ledger import Ledger, budget_reached
from .preemption import PreemptionGuard, barrier
from .progress import ProgressReporter
from .watchdog import LossDivergedError, LossWatchdog

log = logging.getLogger(__name__)

# Test-only fault injection: "kill-before-mark:<step>" makes the process SIGKILL itself after the
# checkpoint of <step> is written and before it is marked COMPLETE, i.e. a save cut short;
# "kill-after-mark:<step>" right after the marker (a crash between a save and the next step, or,
# at the last step, before the final model is written).


GC_EVERY_STEPS = 50
GC_FULL_EVERY_STEPS = 1000


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Training without Python's automatic garbage collection; :class:`ScheduledCollection` runs it.

    The cyclic collector runs whenever allocation counts trip its thresholds. A full collection
    walks every tracked object (a compiled model holds hundreds of thousands) and stalls that
    process for a fraction of a second. Under DDP a stall on any rank is a stall on all of them,
    since every rank waits for the slowest in the gradient all-reduce; with more ranks it happens
    more often. So the objects alive at the start (model, compiled graphs, dataset) are frozen out
    of collection, and collection is paused for the run. Automatic collection comes back after.
    """
    was_enabled = gc.isenabled()
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.unfreeze()
        if was_enabled:
            gc.enable()


class ScheduledCollection(TrainerCallback):
    """Collect the young generations every ``every`` optimizer steps; everything every ``full_every``
    steps and at each checkpoint (what survives the young collections would otherwise wait for a
    checkpoint, however far apart those are).

    Every rank reaches the same step together, so the ranks collect at the same moment instead of
    one rank stalling the others at random.
    """

    def __init__(self, every: int = GC_EVERY_STEPS, full_every: int = GC_FULL_EVERY_STEPS) -> None:
        self.every = every
        self.full_every = full_every
        self.collections: list[tuple[int, int]] = []  # (step, generation), for tests and logs

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if gc.isenabled():
            return
        step = state.global_step
        if self.full_every > 0 and step % self.full_every == 0:
            gc.collect()
            self.collections.append((step, 2))
        elif self.every > 0 and step % self.every == 0:
            gc.collect(1)
            self.collections.append((step, 1))

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not gc.isenabled():
            gc.collect()
            self.collections.append((state.global_step, 2))


class RunCallback(TrainerCallback):
    def __init__(
        self,
        *,
        checkpoints_root: Path,
        save_total_limit: int,
        guard: PreemptionGuard,
        tracker: MlflowTracker | None,
        progress: ProgressReporter | None,
        is_rank0: bool,
        world_size: int,
        earlier_losses: list[tuple[int, float]] | None = None,
        earlier_eval_losses: list[tuple[int, float]] | None = None,
        training_hash: str | None = None,
        data_hash: str | None = None,
        watchdog: LossWatchdog | None = None,
        ledger: Ledger | None = None,
        budget: BudgetSpec | None = None,
        micro_rows: int = 1,
        extra_status: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.watchdog = watchdog
        self.begin_step = 0
        self.ledger = ledger
        self.budget = budget
        self.micro_rows = micro_rows
        self.extra_status = extra_status
        self.budget_stop: tuple[int, str] | None = None  # (step, limit) where the budget stopped the run
        self._step_ended_at = 0.0
        self.root = checkpoints_root
        self.training_hash = training_hash
        self.data_hash = data_hash
        self.keep = save_total_limit
        self.guard = guard
        self.tracker = tracker
        self.progress = progress
        self.is_rank0 = is_rank0
        self.world_size = world_size
        # The whole run's loss curve: what earlier attempts logged up to the resumed checkpoint, then ours.
        self.losses: list[tuple[int, float]] = list(earlier_losses or [])
        self.eval_losses: list[tuple[int, float]] = list(earlier_eval_losses or [])
        self.saved: list[int] = []
        self.preempted_at_step: int | None = None
        self._tokens_mark: tuple[float, float] | None = None  # (time, num_tokens) at the last log
        self.tokens_per_second: float | None = None

    # --- preemption -------------------------------------------------------------------------

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        failures.context.training_started = True
        failures.context.step = state.global_step + 1
        failures.injected(state.global_step + 1, self.micro_rows)  # test hooks only
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        if self.ledger is not None:
            self.ledger.on_step(step)
            self.ledger.save()
            if self.is_rank0 and (limit := budget_reached(self.budget, self.ledger)):
                self.guard.request_budget_stop(limit)
        if self.guard.agreed() and self.preempted_at_step is None and self.budget_stop is None:
            if self.guard.budget_limit is not None:
                self.budget_stop = (step, self.guard.budget_limit)
            else:
                self.preempted_at_step = step
                if self.ledger is not None:
                    self.ledger.on_preempted()  # status.goodput counts what follows as preemption
            control.should_save = True
            control.should_training_stop = True
        if self.progress is not None:
            self.refresh_status()
            self.progress.on_step(step, state.epoch)
        self._step_ended_at = time.monotonic()
        return control

    def refresh_status(self) -> None:
        """The trainer-owned status beside the progress (goodput, budget, memory retries)."""
        if self.progress is not None and self.extra_status is not None:
            self.progress.state.extra = self.extra_status()

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._step_ended_at = time.monotonic()  # a save after an evaluation is timed from here
        return control

    # --- checkpoints ------------------------------------------------------------------------

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = state.global_step
        if self.ledger is not None and self._step_ended_at:
            self.ledger.on_checkpoint(time.monotonic() - self._step_ended_at)
            self.ledger.save(force=True)
        path = checkpoints.checkpoint_path(self.root, step)
        # Every rank wrote its part (rank 0 the weights and optimizer, each rank its RNG state):
        # only then may the checkpoint be declared complete.
        barrier()
        if self.is_rank0:
            fault = settings.current().fault
            if fault == f"kill-before-mark:{step}":
                log.error("fault injection: SIGKILL before marking %s complete", path)
                os.kill(os.getpid(), signal.SIGKILL)
            checkpoints.mark_complete(path, self._marker(path, step, state.epoch))
            if fault == f"kill-after-mark:{step}":
                log.error("fault injection: SIGKILL after marking %s complete", path)
                os.kill(os.getpid(), signal.SIGKILL)
            # the new run has a checkpoint of its own: what spec.resume set aside can go
            resume.drop_superseded(self.root.parent)
            best = catalog.best_entry(catalog.catalog(self.root.parent))
            deleted = checkpoints.prune(self.root, self.keep, keep_also=[best.step] if best else [])
            kept = checkpoints.complete_checkpoints(self.root)
            log.info(
                "checkpoint %s complete (%d kept%s%s)",
                path,
                len(kept),
                f", best by eval loss: step {best.step}" if best else "",
                f", removed {[c.step for c in deleted]}" if deleted else "",
            )
            if self.tracker is not None:
                self.tracker.log_metrics({"checkpoint_step": step}, step)
            if self.progress is not None:
                self.progress.on_checkpoint(path, step, len(kept), catalog.status_of(self.root.parent))
        self.saved.append(step)
        # Nobody races ahead (e.g. into the next save, or out of training on preemption) before the
        # marker is on disk.
        barrier()
        return control

    def _marker(self, path: Path, step: int, epoch: float | None) -> dict[str, object]:
        """The COMPLETE marker's fields: what the checkpoint catalog lists (step, epoch, the last
        training loss logged at or before the step, the eval loss at the step, the size)."""
        info: dict[str, object] = {"step": step, "world_size": self.world_size}
        if epoch is not None:
            info["epoch"] = float(epoch)
        losses = [loss for at, loss in self.losses if at <= step]
        if losses and math.isfinite(losses[-1]):  # JSON has no NaN
            info["loss"] = losses[-1]
        evals = [loss for at, loss in self.eval_losses if at == step]
        if evals and math.isfinite(evals[-1]):
            info["eval_loss"] = evals[-1]
        info["size_bytes"] = catalog.folder_size(path)
        if self.training_hash:
            info["training_hash"] = self.training_hash
        if self.data_hash:
            info["data_hash"] = self.data_hash
        return info

    # --- metrics ----------------------------------------------------------------------------

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        if not self.is_rank0 or not logs:
            return control
        step = state.global_step
        if "loss" in logs:
            self.losses.append((step, float(logs["loss"])))
            self._watch(step, float(logs["loss"]))
        if "eval_loss" in logs:
            self.eval_losses.append((step, float(logs["eval_loss"])))
        if "num_tokens" in logs:
            # TRL's num_tokens counts every rank's tokens; the rate between two logs is the run's speed.
            now, tokens = time.monotonic(), float(logs["num_tokens"])
            if self._tokens_mark is not None and now > self._tokens_mark[0] and tokens > self._tokens_mark[1]:
                self.tokens_per_second = (tokens - self._tokens_mark[1]) / (now - self._tokens_mark[0])
            self._tokens_mark = (now, tokens)
        metrics = dict(logs)
        if self.tokens_per_second:
            metrics["tokens_per_second"] = self.tokens_per_second
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step)
        if self.progress is not None:
            self.progress.on_log(logs, self.tokens_per_second)
        return control

    def _watch(self, step: int, loss: float) -> None:
        """The loss watchdog: raise LossDivergedError, after removing every checkpoint saved since the
        last logged step whose loss passed (a logged loss is the mean since the log before it, so the
        weights may have gone bad at any step after that one; before this attempt's first log, that is
        the step it started from), so the newest one left is the last good one."""
        if self.watchdog is None:
            return
        why = self.watchdog.observe(step, loss)
        if why is None:
            return
        first_bad = self.watchdog.first_bad_step or step
        good_until = max(self.watchdog.last_good_step or 0, self.begin_step)
        removed = checkpoints.remove_from(self.root, good_until + 1)
        good = checkpoints.latest_complete(self.root)
        kept = (
            f"; the last good checkpoint is {good.path} (step {good.step})"
            if good
            else "; no checkpoint before it"
        )
        if removed:
            kept += (
                f" (removed {', '.join(str(c.step) for c in removed)}: saved after step {good_until}, "
                "the last logged loss that passed)"
            )
        raise LossDivergedError(f"{why}{kept}", first_bad)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self.begin_step = int(state.global_step or 0)  # a resumed attempt starts from its checkpoint
        return control

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if self.ledger is not None:
            self.ledger.save(force=True)
        self.refresh_status()
        if self.progress is not None:
            self.progress.on_step(state.global_step, state.epoch)
            self.progress.report(force=True)
        return control
