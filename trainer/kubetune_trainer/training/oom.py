"""Retry after CUDA out of memory with smaller micro-steps and the same tokens per optimizer step.

When a step runs out of GPU memory, the trainer records a leaner layout in
``<output_dir>/.kubetune/memory.json`` on the checkpoint volume and exits retryable; the Training
Operator starts a new pod, whose plan takes the layout (:func:`apply`) and resumes from the newest
complete checkpoint. An optimizer step keeps its rows (``rows x micro-steps`` stays the same), so
the same optimizer steps see the same data: only how each step is cut into micro-steps changes.
Leaner, in order: half the rows per micro-step (the largest divisor of the step's rows at most
half), down to one row; then recomputation (gradient checkpointing) on. At most
``spec.training.oomRetries`` times.

>>> str(leaner(Layout(rows=8, micro_steps=2, recompute=False)))
'4 rows x 4 micro-steps, no recomputation'
>>> str(leaner(Layout(rows=6, micro_steps=2, recompute=False)))
'3 rows x 4 micro-steps, no recomputation'
>>> str(leaner(Layout(rows=1, micro_steps=16, recompute=False)))
'1 rows x 16 micro-steps, with recomputation'
>>> leaner(Layout(1, 16, True)) is None
True
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

MEMORY_FILE = ".kubetune/memory.json"


@dataclass(frozen=True)
class Layout:
    rows: int  # packed rows (or sequences) per GPU per micro-step
    micro_steps: int  # micro-steps per optimizer step
    recompute: bool  # gradient checkpointing

    def __str__(self) -> str:
        return (
            f"{self.rows} rows x {self.micro_steps} micro-steps, "
            f"{'with' if self.recompute else 'no'} recomputation"
        )

    @classmethod
    def of(cls, plan: Any) -> Layout:
        return cls(plan.per_device_batch_size, plan.gradient_accumulation_steps, plan.gradient_checkpointing)


def leaner(layout: Layout) -> Layout | None:
    """The next layout to try after ``layout`` ran out of memory; None when there is none."""
    step_rows = layout.rows * layout.micro_steps
    if layout.rows > 1:
        rows = max(r for r in range(1, layout.rows // 2 + 1) if step_rows % r == 0)
        return Layout(rows, step_rows // rows, layout.recompute)
    if not layout.recompute:
        return replace(layout, recompute=True)
    return None


def load(output_dir: Path) -> list[dict[str, Any]]:
    """The retries recorded so far (``status.memoryRetries``: attempt, step, before, after, layout)."""
    try:
        data = json.loads((output_dir / MEMORY_FILE).read_text())
    except (OSError, ValueError):
        return []
    retries = data.get("retries") if isinstance(data, dict) else None
    return retries if isinstance(retries, list) else []


def record(output_dir: Path, step: int | None, before: Layout, after: Layout) -> list[dict[str, Any]]:
    """Record one more retry with layout ``after``; the retries so far."""
    retries = load(output_dir)
    retries.append(
        {
            "attempt": len(retries) + 1,
            "step": step,
            "before": str(before),
            "after": str(after),
            "layout": asdict(after),
        }
    )
    path = output_dir / MEMORY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"retries": retries}, indent=1))
    tmp.replace(path)
    return retries


def apply(plan: Any, retries: list[dict[str, Any]]) -> Any:
    """The plan with the newest retry's layout, when it is leaner than the plan's own (the step's rows
    kept); the plan as it is otherwise."""
    if not retries:
        return plan
    layout = Layout(**retries[-1]["layout"])
    step_rows = plan.per_device_batch_size * plan.gradient_accumulation_steps
    if layout.rows >= plan.per_device_batch_size and not (
        layout.recompute and not plan.gradient_checkpointing
    ):
        return plan
    rows = max(r for r in range(1, min(layout.rows, plan.per_device_batch_size) + 1) if step_rows % r == 0)
    plan.per_device_batch_size = rows
    plan.gradient_accumulation_steps = step_rows // rows
    plan.gradient_checkpointing = plan.gradient_checkpointing or layout.recompute
    plan.reasons["oom_retry"] = (
        f"retry {len(retries)} after CUDA out of memory: {Layout.of(plan)} (the same {step_rows} rows "
        "per optimizer step)"
    )
    return plan


def public(retries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The retries as ``status.memoryRetries`` shows them."""
    return [
        {k: r[k] for k in ("attempt", "step", "before", "after") if r.get(k) is not None} for r in retries
    ]
