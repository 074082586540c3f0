"""The pod launcher's exit codes and shutdown grace (the torchrun run itself: tests/e2e/test_train_ddp.py)."""

from __future__ import annotations

import pytest

from kubetune_api.trainer_config import EXIT_PREEMPTED
from kubetune_trainer import settings
from kubetune_trainer.training import launch


def test_preempted_workers_give_a_retryable_exit_code() -> None:
    assert launch.exit_code_for_failures([EXIT_PREEMPTED, EXIT_PREEMPTED]) == EXIT_PREEMPTED
    assert launch.exit_code_for_failures([EXIT_PREEMPTED, -15]) == EXIT_PREEMPTED
    # A real failure on any rank stays a failure.
    assert launch.exit_code_for_failures([EXIT_PREEMPTED, 1]) is None
    assert launch.exit_code_for_failures([]) is None


def test_shutdown_grace_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(settings.GRACE_ENV, raising=False)
    assert launch.shutdown_grace_s() == settings.DEFAULT_GRACE_S
    monkeypatch.setenv(settings.GRACE_ENV, "900")
    assert launch.shutdown_grace_s() == 900
    monkeypatch.setenv(settings.GRACE_ENV, "soon")
    with pytest.raises(SystemExit, match="whole number"):
        launch.shutdown_grace_s()


def test_torchrun_waits_the_grace_for_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.multiprocessing.api import PContext

    seen = []
    monkeypatch.setattr(PContext, "close", lambda self, death_sig=None, timeout=30: seen.append(timeout))
    assert launch.extend_worker_grace(420)
    PContext.close(object(), None)  # type: ignore[arg-type]  # how torchrun's agent calls it: no timeout, so 30 s by default
    assert seen == [420]
