"""The loss watchdog keeps only checkpoints saved before the loss can have gone bad: a logged loss
is the mean since the log before it, so every checkpoint saved after the last logged loss that
passed may hold bad weights (and, before an attempt's first log, every one after its start)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from kubetune_api.spec import LossWatchdog as LossWatchdogSpec
from kubetune_trainer.training.callbacks import PreemptionGuard, RunCallback
from kubetune_trainer.training.watchdog import LossDivergedError, LossWatchdog
from kubetune_trainer.volume import checkpoints


def _callback(root: Path, steps: list[int]) -> RunCallback:
    for step in steps:
        folder = root / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        checkpoints.mark_complete(folder, {"step": step})
    return RunCallback(
        checkpoints_root=root,
        save_total_limit=10,
        guard=PreemptionGuard(),
        tracker=None,
        progress=None,
        is_rank0=True,
        world_size=1,
        watchdog=LossWatchdog(LossWatchdogSpec()),
    )


def _log(cb: RunCallback, step: int, loss: float) -> None:
    cb.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": loss})


def test_checkpoints_saved_after_the_last_good_log_are_removed(tmp_path: Path) -> None:
    """loggingSteps 25, saveSteps 10: a NaN logged at step 50 may come from step 26 on, so the
    checkpoints of steps 30 and 40 go and the one of step 20 is the last good one."""
    cb = _callback(tmp_path, [10, 20, 30, 40])
    _log(cb, 25, 2.0)
    with pytest.raises(LossDivergedError) as caught:
        _log(cb, 50, float("nan"))
    assert [c.step for c in checkpoints.complete_checkpoints(tmp_path)] == [10, 20]
    assert "checkpoint-20 (step 20)" in str(caught.value) and "removed 30, 40" in str(caught.value)


def test_nan_at_the_first_log_keeps_only_what_came_before_the_attempt(tmp_path: Path) -> None:
    cb = _callback(tmp_path, [100, 105])
    cb.on_train_begin(None, SimpleNamespace(global_step=100), None)  # resumed from checkpoint-100
    with pytest.raises(LossDivergedError):
        _log(cb, 110, float("inf"))
    assert [c.step for c in checkpoints.complete_checkpoints(tmp_path)] == [100]


def test_a_fresh_run_with_nan_at_its_first_log_keeps_nothing(tmp_path: Path) -> None:
    cb = _callback(tmp_path, [10, 20])
    cb.on_train_begin(None, SimpleNamespace(global_step=0), None)
    with pytest.raises(LossDivergedError) as caught:
        _log(cb, 25, float("nan"))
    assert checkpoints.complete_checkpoints(tmp_path) == []
    assert "no checkpoint before it" in str(caught.value)
