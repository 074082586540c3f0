"""The evaluation gate before registration (``spec.registration.gate``) and what it reports.

The gate compares the eval loss of what ``spec.registration.select`` picked (the final model, or the
checkpoint with the lowest eval loss) with a threshold:

- ``maxEvalLoss: x``: the threshold is ``x``; met when the eval loss is at most ``x``.
- ``minImprovement: m``: the threshold is the base model's own eval loss on the same eval tokens
  (``base-eval.json``, measured once before training) times ``1 - m``; met when the eval loss is
  strictly below it (``m = 0``: any improvement at all).

An eval loss that is not known (no evaluation of that model), or a base eval loss that was not
measured, does not meet the gate. A gate not met registers nothing unless the registration is forced
(``register --force``, on the command line only: the operator writes it when the retry annotation
asks for a registration after ``GateNotMet``); the forced version is tagged ``kubetune.gate.forced=true``.

No torch here: the arithmetic is plain and tested on its own.

>>> from kubetune_api.spec import GateSpec
>>> threshold_of(GateSpec(min_improvement=0.1), 2.0)
1.8
>>> decide(GateSpec(min_improvement=0.1), "final", 1.8, 2.0).passed  # strictly below
False
>>> decide(GateSpec(max_eval_loss=1.8), "final", 1.8, None).passed  # at most
True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kubetune_api.registration import GATE_NOT_MET
from kubetune_api.spec import GateSpec

REASON_GATE_NOT_MET = GATE_NOT_MET

TAG_SELECTED = "kubetune.selected"
TAG_THRESHOLD = "kubetune.gate.threshold"
TAG_EVAL_LOSS = "kubetune.gate.eval_loss"
TAG_BASE_EVAL_LOSS = "kubetune.gate.base_eval_loss"
TAG_PASSED = "kubetune.gate.passed"
TAG_FORCED = "kubetune.gate.forced"

# the run's metrics (step 0): the gate's numbers, and 1/0 for met/not met
METRIC_THRESHOLD = "kubetune.gate.threshold"
METRIC_EVAL_LOSS = "kubetune.gate.eval_loss"
METRIC_BASE_EVAL_LOSS = "kubetune.gate.base_eval_loss"
METRIC_PASSED = "kubetune.gate.passed"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def threshold_of(gate: GateSpec, base_eval_loss: float | None) -> float | None:
    """The eval loss to reach: ``maxEvalLoss``, or the base's times ``1 - minImprovement`` (None when
    the base eval loss is not known)."""
    if gate.max_eval_loss is not None:
        return float(gate.max_eval_loss)
    base = _finite(base_eval_loss)
    if base is None or gate.min_improvement is None:
        return None
    return base * (1.0 - float(gate.min_improvement))


def met(gate: GateSpec, eval_loss: float | None, threshold: float | None) -> bool:
    """Whether ``eval_loss`` meets the threshold: at most ``maxEvalLoss``, strictly below the
    improvement threshold. Unknown numbers never meet it."""
    loss = _finite(eval_loss)
    if loss is None or threshold is None:
        return False
    if gate.max_eval_loss is not None:
        return loss <= threshold
    return loss < threshold


def _number(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f}"


@dataclass(frozen=True)
class Verdict:
    """What was selected, its eval loss, and (with a gate) the threshold and whether it was met."""

    selected: str
    eval_loss: float | None
    base_eval_loss: float | None
    gate: GateSpec | None = None
    threshold: float | None = None
    passed: bool | None = None  # None: no gate
    forced: bool = False

    @property
    def blocks(self) -> bool:
        """The gate was not met and the registration is not forced: register nothing."""
        return self.passed is False and not self.forced

    def rule(self) -> str:
        """The gate in the spec's words."""
        if self.gate is None:
            return "no gate"
        if self.gate.max_eval_loss is not None:
            return f"spec.registration.gate.maxEvalLoss {self.gate.max_eval_loss:g}"
        share = float(self.gate.min_improvement or 0.0)
        return (
            f"spec.registration.gate.minImprovement {share:g}: the base model's eval loss "
            f"{_number(self.base_eval_loss)} less {share * 100:g}%"
        )

    def message(self) -> str:
        """One sentence with both numbers: the eval loss and the threshold (and why, when unknown)."""
        what = f"{self.selected} (spec.registration.select)"
        if self.passed is None:
            return f"selected {what}, eval loss {_number(self.eval_loss)} (no gate)"
        if _finite(self.eval_loss) is None:
            head = f"the eval loss of {what} is not known (it was never evaluated)"
        elif self.threshold is None:
            head = (
                f"eval loss {_number(self.eval_loss)} of {what}, but the base model's eval loss was not "
                "measured (base-eval.json), so the threshold is not known"
            )
        else:
            strict = "at most" if self.gate is not None and self.gate.max_eval_loss is not None else "below"
            verdict = "meets" if self.passed else "does not meet"
            head = (
                f"eval loss {_number(self.eval_loss)} of {what} {verdict} the threshold "
                f"{_number(self.threshold)} ({strict}; {self.rule()})"
            )
        if self.passed:
            return head
        return head + ("; registered anyway (forced)" if self.forced else "")

    def status(self) -> dict[str, Any]:
        """``status.evaluation`` (camelCase; unknowns left out)."""
        out: dict[str, Any] = {
            "baseEvalLoss": _finite(self.base_eval_loss),
            "evalLoss": _finite(self.eval_loss),
            "selected": self.selected,
            "threshold": self.threshold,
            "gatePassed": self.passed,
            "forced": True if self.forced and self.passed is False else None,
        }
        return {k: v for k, v in out.items() if v is not None}

    def tags(self) -> dict[str, str]:
        """The model version's tags: what was selected; the gate's numbers when a gate let it through
        (or it was forced past one)."""
        tags = {TAG_SELECTED: self.selected}
        if self.passed is None or self.blocks:
            return tags
        tags[TAG_PASSED] = str(self.passed).lower()
        for key, value in (
            (TAG_THRESHOLD, self.threshold),
            (TAG_EVAL_LOSS, _finite(self.eval_loss)),
            (TAG_BASE_EVAL_LOSS, _finite(self.base_eval_loss)),
        ):
            if value is not None:
                tags[key] = repr(float(value))
        if self.forced and not self.passed:
            tags[TAG_FORCED] = "true"
        return tags

    def metrics(self) -> dict[str, float]:
        """The gate's numbers for the MLflow run (none without a gate)."""
        if self.passed is None:
            return {}
        out = {METRIC_PASSED: 1.0 if self.passed else 0.0}
        for key, value in (
            (METRIC_THRESHOLD, self.threshold),
            (METRIC_EVAL_LOSS, _finite(self.eval_loss)),
            (METRIC_BASE_EVAL_LOSS, _finite(self.base_eval_loss)),
        ):
            if value is not None:
                out[key] = float(value)
        return out


def decide(
    gate: GateSpec | None,
    selected: str,
    eval_loss: float | None,
    base_eval_loss: float | None,
    *,
    forced: bool = False,
) -> Verdict:
    """The verdict on what was selected (``forced`` matters only when the gate is not met)."""
    if gate is None:
        return Verdict(selected, _finite(eval_loss), _finite(base_eval_loss))
    threshold = threshold_of(gate, base_eval_loss)
    passed = met(gate, eval_loss, threshold)
    return Verdict(
        selected,
        _finite(eval_loss),
        _finite(base_eval_loss),
        gate=gate,
        threshold=threshold,
        passed=passed,
        forced=forced and not passed,
    )


class GateNotMetError(RuntimeError):
    """The gate was not met and the registration was not forced: nothing is registered."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(f"{verdict.message()}; nothing registered, the model stays on the volume")
        self.verdict = verdict
