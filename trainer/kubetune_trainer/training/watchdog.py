"""The loss watchdog: stop a run whose loss diverged (``LossDiverged``) before it burns its GPU-hours.

Every logged training loss (``spec.training.loggingSteps``) is checked: NaN or Inf stops the run at
once; a loss above ``spikeFactor`` times the median of the last ``window`` logged losses, for
``patience`` logged steps in a row, stops it too. The checkpoints saved from the first bad step on
are removed, so that the newest one left (what a re-created job resumes from) is the last good one.

>>> w = LossWatchdog(LossWatchdogSpec(spike_factor=3, patience=2, window=5))
>>> [w.observe(s, loss) for s, loss in [(1, 2.0), (2, 1.9), (3, 1.8), (4, 1.7), (5, 9.0)]]
[None, None, None, None, None]
>>> w.observe(6, 9.5)
'the loss stayed above 3 x its recent median (1.85) for 2 logged steps: 9 at step 5, 9.5 at step 6'
>>> LossWatchdog(LossWatchdogSpec()).observe(7, float("nan"))
'the loss is nan at step 7 (a logged loss, every loggingSteps)'
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from kubetune_api.spec import LossWatchdog as LossWatchdogSpec

# The spike test needs this many earlier logged losses (the first steps' losses fall fast).
MIN_HISTORY = 3


class LossDivergedError(RuntimeError):
    """Training stopped: the loss diverged (the message says how, and at which step)."""

    def __init__(self, message: str, first_bad_step: int) -> None:
        super().__init__(message)
        self.first_bad_step = first_bad_step


class LossWatchdog:
    def __init__(self, spec: LossWatchdogSpec) -> None:
        self.spec = spec
        self.history: deque[float] = deque(maxlen=spec.window)
        self.spikes: list[tuple[int, float]] = []
        self.baseline: float | None = None
        # the newest logged step whose loss passed (the logged loss is the mean since the log before
        # it: a checkpoint saved after this step may already hold bad weights)
        self.last_good_step: int | None = None

    def observe(self, step: int, loss: float) -> str | None:
        """Why the run must stop at this logged loss, or None."""
        if not self.spec.enabled:
            return None
        if math.isnan(loss) or math.isinf(loss):
            self.spikes = [(step, loss)]
            return f"the loss is {loss} at step {step} (a logged loss, every loggingSteps)"
        if len(self.history) >= MIN_HISTORY:
            median = self.baseline if self.spikes else statistics.median(self.history)
            assert median is not None
            if loss > self.spec.spike_factor * median:
                if not self.spikes:
                    self.baseline = median
                self.spikes.append((step, loss))
                if len(self.spikes) >= self.spec.patience:
                    seen = ", ".join(f"{v:.4g} at step {s}" for s, v in self.spikes)
                    return (
                        f"the loss stayed above {self.spec.spike_factor:g} x its recent median ({median:.4g}) "
                        f"for {len(self.spikes)} logged steps: {seen}"
                    )
                return None
        self.spikes, self.baseline = [], None
        self.history.append(loss)
        self.last_good_step = step
        return None

    @property
    def first_bad_step(self) -> int | None:
        return self.spikes[0][0] if self.spikes else None
