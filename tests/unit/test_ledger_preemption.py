"""status.goodput counts preemption apart (issue 31 item 3): an attempt that stopped on SIGTERM is
marked in the ledger on the checkpoint volume, the steps its successor redid are lost to preemption
(not to a restart), and the wait until the next attempt started is the time preempted, held by no
GPU (so neither in heldGpuSeconds nor in the budget)."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune_api.spec import BudgetSpec
from kubetune_api.status import Goodput
from kubetune_trainer.training.ledger import LEDGER_FILE, Attempt, Ledger, budget_reached


def _run(first_preempted: bool) -> Ledger:
    """Two attempts on 2 GPUs: the first steps 1..100 from t=0 (first step at 10, last record at 110),
    the second started at 1010, resumed from the checkpoint of step 90 (10 steps redone)."""
    led = Ledger(gpus=2)
    led.attempts = [
        Attempt(started=0, gpus=2, first_step_at=10, last_at=110, last_step=100, preempted=first_preempted)
    ]
    led.begin(started=1010, resumed_step=90)
    led.on_step(91, now=1020)
    led.on_step(120, now=1050)
    return led


def test_a_preempted_attempt_counts_as_preemption_not_as_a_restart() -> None:
    restarted, preempted = _run(False).goodput(now=1050), _run(True).goodput(now=1050)
    # the GPU time is the same: only where it is counted differs
    assert restarted["heldGpuSeconds"] == preempted["heldGpuSeconds"] == (110 + 40) * 2
    assert restarted["restartLostGpuSeconds"] == 20.0  # 10 steps at 1 s each, 2 GPUs
    assert (restarted["preemptions"], restarted["preemptedSeconds"]) == (0, 0.0)
    assert preempted["restartLostGpuSeconds"] == 0.0
    assert preempted["preemptionLostGpuSeconds"] == 20.0
    assert (preempted["preemptions"], preempted["preemptedSeconds"]) == (1, 900.0)  # 110 to 1010
    assert preempted["productiveGpuSeconds"] == restarted["productiveGpuSeconds"]
    assert preempted["restarts"] == 1  # an attempt after the first, as before
    Goodput.model_validate(preempted)  # the status model takes every key the trainer writes
    assert set(preempted) == {f.alias or name for name, f in Goodput.model_fields.items()}


def test_the_time_preempted_is_not_in_the_budget() -> None:
    led = _run(True)
    assert led.held_seconds(now=1050) == 150  # the 900 s between the attempts are not held
    assert budget_reached(BudgetSpec(max_duration="3m"), led, now=1050) is None


def test_the_mark_is_kept_on_the_volume_and_an_older_ledger_still_loads(tmp_path: Path) -> None:
    led = Ledger.load(tmp_path, gpus=1)
    led.begin(started=0, resumed_step=0)
    led.on_step(1, now=5)
    led.on_preempted()
    led.save(force=True)
    again = Ledger.load(tmp_path, gpus=1)
    assert again.attempts[0].preempted
    # a ledger written before the mark existed: every attempt reads as not preempted
    (tmp_path / LEDGER_FILE).write_text(json.dumps({"attempts": [{"started": 0, "gpus": 1}]}))
    assert Ledger.load(tmp_path, gpus=1).attempts[0].preempted is False
