"""The pod launcher's exit codes and shutdown grace (the torchrun run itself: tests/e2e/test_train_ddp.py)."""

from __future__ import annotations

from pathlib import Path

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


def test_shutdown_grace_comes_from_the_command_never_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GRACE_ENV, "1")  # ignored: the operator writes it into the command
    torchrun_args = ["--nproc_per_node", "2", "--module", "kubetune_trainer.train", "--config", "c.yaml"]
    assert launch.split_args(torchrun_args) == (launch.DEFAULT_GRACE_S, torchrun_args)
    assert launch.split_args([launch.GRACE_FLAG, "900", *torchrun_args]) == (900, torchrun_args)
    assert launch.split_args([f"{launch.GRACE_FLAG}=0", *torchrun_args]) == (1, torchrun_args)
    with pytest.raises(SystemExit, match="--shutdown-grace-s 'soon' is not a whole number"):
        launch.split_args([launch.GRACE_FLAG, "soon", *torchrun_args])


def test_the_launcher_reads_the_report_where_its_workers_write_it() -> None:
    args = ["--module", "kubetune_trainer.train", "--config", "c.yaml", "--termination-log", "/tmp/t"]
    assert launch.termination_log_of(args) == Path("/tmp/t")
    assert launch.termination_log_of(["--config", "c.yaml", "--termination-log=/tmp/u"]) == Path("/tmp/u")
    assert launch.termination_log_of(["--config", "c.yaml"]) is None  # the kubelet's file


def test_torchrun_waits_the_grace_for_its_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.elastic.multiprocessing.api import PContext

    seen = []
    monkeypatch.setattr(PContext, "close", lambda self, death_sig=None, timeout=30: seen.append(timeout))
    assert launch.extend_worker_grace(420)
    PContext.close(object(), None)  # type: ignore[arg-type]  # how torchrun's agent calls it: no timeout, so 30 s by default
    assert seen == [420]
