"""Data-loader workers survive the SIGTERM that torchrun forwards to a trainer's process group."""

from __future__ import annotations

import os
import signal
import time

import pytest

torch = pytest.importorskip("torch")

from kubetune_trainer.training.preemption import workers_ignore_sigterm  # noqa: E402


def _loader() -> object:
    data = list(range(64))
    return torch.utils.data.DataLoader(data, batch_size=2, num_workers=1, persistent_workers=True)


def _terminate_worker_then_read(loader: object) -> list[int]:
    it = iter(loader)
    first = next(it)
    (worker,) = it._workers  # the one worker process
    # Let the worker prefetch and go idle (waiting on its index queue) first: killed while it holds
    # the loader's shared done-event lock (which it takes to read the event), the trainer's next
    # read of that event would wait forever instead of seeing the dead worker (seen once in CI).
    time.sleep(0.5)
    os.kill(worker.pid, signal.SIGTERM)  # as torchrun's killpg on preemption
    time.sleep(1.5)
    try:
        return [*first.tolist(), *(int(x) for batch in it for x in batch)]
    finally:
        it._shutdown_workers()


def test_workers_of_a_wrapped_loader_ignore_sigterm_and_the_epoch_completes() -> None:
    loader = workers_ignore_sigterm(_loader())
    assert workers_ignore_sigterm(loader).worker_init_fn is loader.worker_init_fn  # wrapping twice is a no-op
    assert _terminate_worker_then_read(loader) == list(range(64))


def test_a_loader_prepared_by_accelerate_is_wrapped_where_its_workers_start() -> None:
    accelerate = pytest.importorskip("accelerate")
    prepared = accelerate.Accelerator(cpu=True).prepare(_loader())
    assert hasattr(prepared, "base_dataloader")  # what the trainer gets: a wrapper of the torch loader
    workers_ignore_sigterm(prepared)
    assert _terminate_worker_then_read(prepared.base_dataloader) == list(range(64))


def test_without_it_a_terminated_worker_breaks_the_trainer() -> None:
    with pytest.raises(RuntimeError, match="DataLoader worker"):
        _terminate_worker_then_read(_loader())


class _GcState(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        import gc

        return int(gc.isenabled())


def test_workers_collect_garbage_while_the_trainer_has_collection_paused() -> None:
    from kubetune_trainer.training.callbacks import paused_gc

    def states(wrap: bool) -> list[int]:
        loader = torch.utils.data.DataLoader(_GcState(), batch_size=2, num_workers=1)
        if wrap:
            workers_ignore_sigterm(loader)
        with paused_gc():  # the workers start (fork) while the trainer's collection is paused
            return [int(x) for batch in loader for x in batch]

    assert states(wrap=True) == [1, 1, 1, 1]
    assert states(wrap=False) == [0, 0, 0, 0]  # what a forked worker would inherit otherwise
