"""Python's garbage collector runs at fixed steps during training, not when allocation counts trip it."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

pytest.importorskip("transformers")

from kubetune_trainer.training.callbacks import ScheduledCollection, paused_gc


def test_collection_is_paused_during_training_and_restored_after() -> None:
    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        assert gc.get_freeze_count() > 0  # what lived before training is out of every collection
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError), paused_gc():
        raise RuntimeError("training failed")
    assert gc.isenabled()  # restored even when training raises


def test_scheduled_collections_at_fixed_steps_and_checkpoints() -> None:
    started: list[int] = []

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started.append(info["generation"])

    callback = ScheduledCollection(every=3, full_every=7)
    gc.callbacks.append(count)
    try:
        with paused_gc():
            started.clear()
            for step in range(1, 8):
                state = SimpleNamespace(global_step=step)
                callback.on_step_end(None, state, None)
                if step == 5:
                    callback.on_save(None, state, None)
    finally:
        gc.callbacks.remove(count)
    assert callback.collections == [(3, 1), (5, 2), (6, 1), (7, 2)]
    assert started == [1, 2, 1, 2]  # the collector really ran, and only then
    # with automatic collection on (outside training) the callback leaves it alone
    callback.collections.clear()
    callback.on_step_end(None, SimpleNamespace(global_step=3), None)
    assert callback.collections == []
