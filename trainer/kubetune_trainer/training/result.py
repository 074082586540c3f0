"""What a training attempt reports: ``train-result.json`` (one type, whether it finished or was
preempted) and the loss history it carries across attempts.

The file is the run so far, across attempts: a resumed attempt starts from the history its
checkpoint holds. Its keys per status are fixed (``KEYS``); the MLflow run's (``run_id``,
``tracking_uri``...) are added when rank 0 tracked the run.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.trainer_config import dump_json

from ..volume import checkpoints

Losses = list[tuple[int, float]]

# What each kind of result writes, in this order
KEYS = {
    "succeeded": (
        "status", "global_step", "planned_steps", "steps_this_attempt", "epoch", "first_loss",
        "final_loss", "train_loss", "losses", "eval_losses", "resumed_from", "resumed_from_step",
        "final_dir", "checkpoints", "world_size", "plan", "data_format", "data_hash",
        "tokens_per_second", "seconds", "budget", "goodput",
    ),
    "preempted": (
        "status", "preempted_at_step", "global_step", "latest_checkpoint", "latest_checkpoint_step",
        "resumed_from", "resumed_from_step", "first_loss", "final_loss", "losses", "eval_losses",
        "world_size", "plan", "seconds",
    ),
    # told afterwards from the checkpoints, for a final model whose attempt died before its report
    "recovered": (
        "status", "global_step", "first_loss", "final_loss", "train_loss", "losses", "eval_losses",
        "final_dir", "checkpoints",
    ),
}  # fmt: skip


@dataclass
class TrainResult:
    status: str  # succeeded | preempted
    global_step: int | None = None  # succeeded: the last step; preempted: the newest checkpoint's
    losses: Losses = field(default_factory=list)
    eval_losses: Losses = field(default_factory=list)
    train_loss: float | None = None
    planned_steps: int | None = None
    steps_this_attempt: int | None = None
    epoch: float | None = None
    preempted_at_step: int | None = None
    latest_checkpoint: str | None = None
    latest_checkpoint_step: int | None = None
    resumed_from: str | None = None
    resumed_from_step: int | None = None
    final_dir: str | None = None
    checkpoints: list[str] = field(default_factory=list)
    world_size: int | None = None
    plan: dict[str, Any] = field(default_factory=dict)
    data_format: str | None = None
    data_hash: str | None = None
    tokens_per_second: float | None = None
    seconds: float | None = None
    mlflow: dict[str, Any] = field(default_factory=dict)  # the tracked run's identity (rank 0)
    # spec.budget stopped the run: {"reached": true, "limit": ..., "step": ..., "totalSteps": ...}
    budget: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None  # status.goodput at the end (rank 0)

    @property
    def first_loss(self) -> float | None:
        return self.losses[0][1] if self.losses else None

    @property
    def final_loss(self) -> float | None:
        return self.losses[-1][1] if self.losses else None

    def as_dict(self, kind: str | None = None) -> dict[str, Any]:
        """The JSON of ``train-result.json``: the keys of ``kind`` (default: the status), then the
        MLflow run's."""
        return {**{key: getattr(self, key) for key in KEYS[kind or self.status]}, **self.mlflow}

    def write(self, path: Path, kind: str | None = None) -> dict[str, Any]:
        out = self.as_dict(kind)
        dump_json(out, path)
        return out


def mean_loss(losses: Losses) -> float | None:
    """The run's mean training loss from its logged (step, loss) pairs: each logged loss is the mean
    over the steps since the previous log, so it weighs as many steps as it covers.

    >>> mean_loss([(1, 4.0), (3, 1.0)])  # step 1: 4.0; steps 2-3: 1.0 each
    2.0
    """
    total, previous = 0.0, 0
    for step, loss in losses:
        total += loss * (step - previous)
        previous = step
    return total / previous if previous > 0 else None


def earlier_history(resume: checkpoints.Checkpoint | None, result_path: Path) -> tuple[Losses, Losses]:
    """What earlier attempts logged up to the checkpoint this attempt resumes from: the checkpoint's
    own log history (a killed attempt wrote no train-result.json, but its checkpoints hold it), or
    for a checkpoint without one, the losses of the last ``train-result.json``."""
    if resume is None:
        return [], []
    history = checkpoints.checkpoint_history(resume.path)
    if history is not None:
        losses, evals = history
        return [x for x in losses if x[0] <= resume.step], [x for x in evals if x[0] <= resume.step]
    try:
        earlier = json.loads(result_path.read_text())
        pairs = [(int(s), float(v)) for s, v in earlier.get("losses") or []]
        eval_pairs = [(int(s), float(v)) for s, v in earlier.get("eval_losses") or []]
    except (OSError, ValueError, TypeError, AttributeError):
        return [], []
    return [x for x in pairs if x[0] <= resume.step], [x for x in eval_pairs if x[0] <= resume.step]


def finished_earlier(final_dir: Path, root: Path, result_path: Path) -> dict[str, Any]:
    """train-result.json of a training whose final model an earlier attempt wrote: kept when that
    attempt wrote it; else (it died in between) told from the newest checkpoint's history."""
    try:
        kept = json.loads(result_path.read_text())
        if isinstance(kept, dict) and kept.get("status") == "succeeded":
            return kept
    except (OSError, ValueError):
        pass
    newest = checkpoints.latest_complete(root)
    losses, evals = earlier_history(newest, result_path)
    step = checkpoints.marker_step(final_dir)
    result = TrainResult(
        status="succeeded",
        global_step=step if step is not None else (newest.step if newest else None),
        train_loss=mean_loss(losses),
        losses=losses,
        eval_losses=evals,
        final_dir=str(final_dir),
        checkpoints=[str(c.path) for c in checkpoints.complete_checkpoints(root)],
    )
    return result.write(result_path, "recovered")
