"""Where a run's GPU time went, across attempts (``status.goodput``), and its budget (``spec.budget``).

Rank 0 keeps one record per attempt in ``<output_dir>/.kubetune/attempts.json`` on the checkpoint
volume: when the attempt's process started, when its first optimizer step began, the step it
resumed from, the last step it reached, the seconds it spent saving checkpoints, and its GPUs. From
these (GPU-seconds = seconds x GPUs):

- held: from each attempt's start to its last record;
- start-up: from each attempt's start to its first step (loading, compiling, resuming);
- checkpoint saves: the seconds in ``save`` calls;
- lost to restarts: the steps an attempt redid (done by the attempt before it, after the checkpoint
  it resumed from), at the earlier attempt's seconds per step;
- lost to preemptions: the same, when the attempt before it was preempted (it stopped on SIGTERM:
  Kueue took its admission back, the scheduler preempted a pod, a node was drained, spec.suspend);
  such an attempt is marked in the ledger, and the wall time from its last record to the next
  attempt's start (no GPUs held, waiting to be admitted and scheduled again) is the time preempted;
- productive: the rest of the time in steps.

The budget counts held time (what the GPUs cost), summed over attempts: the time preempted is not in it.

>>> led = Ledger(gpus=8)
>>> led.attempts = [Attempt(started=0, gpus=8, resumed_step=0, first_step_at=60, last_at=1060, last_step=100,
...                         checkpoint_seconds=40)]
>>> led.begin(started=2000, resumed_step=80)
>>> led.on_step(81, now=2090); led.on_step(100, now=2290); led.on_step(120, now=2490)
>>> g = led.goodput(now=2490)
>>> g["heldGpuSeconds"], g["startupGpuSeconds"], g["restartLostGpuSeconds"], g["productiveGpuSeconds"], g["restarts"]
(12400.0, 1200.0, 1536.0, 9344.0, 1)

The same run, its first attempt preempted (it stopped at step 100 on SIGTERM, saved a checkpoint there
and the next attempt, admitted 940 s later, resumed from it: nothing redone):

>>> led.attempts[0].preempted = True
>>> led.attempts[1].resumed_step = 100
>>> g = led.goodput(now=2490)
>>> g["preemptions"], g["preemptedSeconds"], g["preemptionLostGpuSeconds"], g["restartLostGpuSeconds"]
(1, 940.0, 0.0, 0.0)
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.spec import BudgetSpec

from .. import settings

LEDGER_FILE = ".kubetune/attempts.json"
# rank 0 writes the ledger at most this often between checkpoints and logs
SAVE_EVERY_S = 30.0


@dataclass
class Attempt:
    started: float  # epoch seconds: the attempt's process start
    gpus: int
    resumed_step: int = 0
    first_step_at: float | None = None
    last_at: float | None = None
    last_step: int | None = None
    checkpoint_seconds: float = 0.0
    preempted: bool = False  # it stopped on SIGTERM (after saving a checkpoint, or while loading)

    def held(self, now: float | None = None) -> float:
        end = now if now is not None else (self.last_at or self.started)
        return max(0.0, end - self.started)

    def in_steps(self, now: float | None = None) -> float:
        if self.first_step_at is None:
            return 0.0
        end = now if now is not None else (self.last_at or self.first_step_at)
        return max(0.0, end - self.first_step_at - self.checkpoint_seconds)

    def seconds_per_step(self) -> float | None:
        done = (self.last_step or 0) - self.resumed_step
        return self.in_steps() / done if done > 0 else None


@dataclass
class Ledger:
    gpus: int
    path: Path | None = None
    attempts: list[Attempt] = field(default_factory=list)
    _saved_at: float = field(default=float("-inf"), repr=False)

    @classmethod
    def load(cls, output_dir: Path, gpus: int) -> Ledger:
        path = output_dir / LEDGER_FILE
        led = cls(gpus=gpus, path=path)
        try:
            data = json.loads(path.read_text())
            led.attempts = [Attempt(**a) for a in data.get("attempts", [])]
        except (OSError, ValueError, TypeError):
            led.attempts = []
        return led

    @property
    def current(self) -> Attempt:
        return self.attempts[-1]

    def begin(self, *, started: float, resumed_step: int) -> None:
        self.attempts.append(Attempt(started=started, gpus=self.gpus, resumed_step=resumed_step))

    def on_step(self, step: int, now: float | None = None) -> None:
        now = time.time() if now is None else now
        a = self.current
        if a.first_step_at is None:
            a.first_step_at = now
        a.last_step, a.last_at = step, now

    def on_checkpoint(self, seconds: float) -> None:
        self.current.checkpoint_seconds += seconds

    def on_preempted(self) -> None:
        """This attempt stops on SIGTERM (preempted): its successor's redone steps and the wait before
        it count as preemption."""
        self.current.preempted = True

    def held_seconds(self, now: float | None = None) -> float:
        """Wall time of every attempt (this one up to ``now``)."""
        done = sum(a.held() for a in self.attempts[:-1])
        return done + (self.current.held(now) if self.attempts else 0.0)

    def held_gpu_seconds(self, now: float | None = None) -> float:
        earlier = sum(a.held() * a.gpus for a in self.attempts[:-1])
        return earlier + (self.current.held(now) * self.current.gpus if self.attempts else 0.0)

    def goodput(self, now: float | None = None) -> dict[str, Any]:
        """``status.goodput`` (camelCase, GPU-seconds rounded to 0.1)."""
        now = time.time() if now is None else now
        held = startup = saving = lost = preemption_lost = preempted = in_steps = 0.0
        for i, a in enumerate(self.attempts):
            last = i == len(self.attempts) - 1
            held += a.held(now if last else None) * a.gpus
            start_end = a.first_step_at if a.first_step_at is not None else (now if last else a.last_at)
            startup += max(0.0, (start_end or a.started) - a.started) * a.gpus
            saving += a.checkpoint_seconds * a.gpus
            in_steps += a.in_steps(now if last else None) * a.gpus
            if i > 0:
                before = self.attempts[i - 1]
                redone = (before.last_step or 0) - a.resumed_step
                pace = before.seconds_per_step()
                cost = redone * pace * before.gpus if redone > 0 and pace else 0.0
                if before.preempted:
                    preemption_lost += cost
                    preempted += max(0.0, a.started - (before.last_at or before.started))
                else:
                    lost += cost
        productive = max(0.0, in_steps - lost - preemption_lost)
        return {
            "heldGpuSeconds": round(held, 1),
            "productiveGpuSeconds": round(productive, 1),
            "restartLostGpuSeconds": round(lost, 1),
            "preemptionLostGpuSeconds": round(preemption_lost, 1),
            "startupGpuSeconds": round(startup, 1),
            "checkpointGpuSeconds": round(saving, 1),
            "restarts": max(0, len(self.attempts) - 1),
            "preemptions": sum(1 for a in self.attempts if a.preempted),
            "preemptedSeconds": round(preempted, 1),
            "goodputPercent": round(100 * productive / held, 1) if held > 0 else None,
        }

    def save(self, *, force: bool = False) -> None:
        """Write the ledger (atomically); between forced saves at most every SAVE_EVERY_S."""
        if self.path is None:
            return
        now = time.monotonic()
        if not force and now - self._saved_at < SAVE_EVERY_S:
            return
        self._saved_at = now
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps({"attempts": [asdict(a) for a in self.attempts]}, indent=1))
        tmp.replace(self.path)


def budget_reached(budget: BudgetSpec | None, ledger: Ledger, now: float | None = None) -> str | None:
    """Which limit of ``budget`` the run has reached (e.g. 'maxDuration 30s'), or None."""
    if budget is None:
        return None
    limit = budget.seconds()
    if limit is not None and ledger.held_seconds(now) >= limit:
        return f"maxDuration {budget.max_duration}"
    if budget.max_gpu_hours is not None and ledger.held_gpu_seconds(now) >= budget.max_gpu_hours * 3600:
        return f"maxGpuHours {budget.max_gpu_hours:g}"
    return None


def process_start_time() -> float:
    """When this attempt's process started (epoch seconds): under torchrun its agent, the pod's first
    process; else this process. From /proc; now when it cannot be read."""
    pid = os.getppid() if settings.current().under_torchrun else os.getpid()
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
