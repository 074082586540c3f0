"""The checkpoint catalog: every complete checkpoint on the volume with its step, epoch, losses,
time and size; which one is best by eval loss; what registration picks; the base model's eval loss.

Each entry is read from the checkpoint's ``COMPLETE`` marker (the trainer writes ``step``, ``epoch``,
``loss``, ``eval_loss``, ``size_bytes`` and ``completed_at`` there). A marker written before kubetune
recorded those fields falls back to the checkpoint's ``trainer_state.json`` (the Trainer's log
history) and to the folder's size on disk.

No torch, no transformers here: the operator and the registration step use it too.

>>> import tempfile
>>> from .checkpoints import mark_complete
>>> out = Path(tempfile.mkdtemp())
>>> for step, ev in ((10, 2.0), (20, 1.5), (30, 1.7)):
...     p = out / "checkpoints" / f"checkpoint-{step}"
...     p.mkdir(parents=True)
...     _ = mark_complete(p, {"step": step, "loss": 3.0, "eval_loss": ev})
>>> [e.step for e in catalog(out)], best_entry(catalog(out)).step
([10, 20, 30], 20)
>>> status_of(out)["bestStep"], status_of(out)["latestStep"], status_of(out)["count"]
(20, 30, 3)
"""

from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetune_api.trainer_config import COMPLETE_MARKER, FINAL_DIR

from . import checkpoints

BASE_EVAL_FILE = "base-eval.json"


@dataclass(frozen=True)
class CatalogEntry:
    """One complete checkpoint (the fields of ``status.checkpoints.items``)."""

    step: int
    path: Path
    epoch: float | None = None
    loss: float | None = None
    eval_loss: float | None = None
    time: str | None = None
    size_bytes: int | None = None

    def as_status(self) -> dict[str, Any]:
        """The camelCase status item (unset fields left out)."""
        item = {
            "step": self.step,
            "epoch": round(self.epoch, 4) if self.epoch is not None else None,
            "loss": self.loss,
            "evalLoss": self.eval_loss,
            "time": self.time,
            "sizeBytes": self.size_bytes,
            "path": str(self.path),
        }
        return {k: v for k, v in item.items() if v is not None}


@dataclass(frozen=True)
class Selected:
    """What registration takes: the folder, its eval loss (None: unknown) and ``final`` or
    ``checkpoint-<step>``."""

    path: Path
    eval_loss: float | None
    label: str


def folder_size(path: Path) -> int:
    """Bytes of the files under ``path`` (what the folder holds on the volume)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):  # a file deleted while counting
                total += (Path(dirpath) / name).stat().st_size
    return total


def read_marker(path: Path) -> dict[str, Any]:
    """The COMPLETE marker of ``path`` as a dict ({} without one or when unreadable)."""
    try:
        data = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _from_trainer_state(path: Path, step: int) -> dict[str, Any]:
    """epoch, loss (last logged at or before ``step``) and eval loss (at ``step``) from the
    checkpoint's trainer_state.json; {} when it is missing or unreadable."""
    try:
        state = json.loads((path / checkpoints.TRAINER_STATE).read_text())
        history = state.get("log_history") or []
    except (OSError, ValueError, AttributeError):
        return {}
    found: dict[str, Any] = {"epoch": _number(state.get("epoch"))}
    for entry in history:
        if not isinstance(entry, dict) or not isinstance(entry.get("step"), int) or entry["step"] > step:
            continue
        if "loss" in entry:
            found["loss"] = _number(entry["loss"])
        if "eval_loss" in entry and entry["step"] == step:
            found["eval_loss"] = _number(entry["eval_loss"])
    return found


def entry_of(ckpt: checkpoints.Checkpoint) -> CatalogEntry:
    """The catalog entry of one complete checkpoint: its marker's fields, the gaps filled from its
    trainer_state.json and the folder's size."""
    marker = read_marker(ckpt.path)
    known = {key: _number(marker.get(key)) for key in ("epoch", "loss", "eval_loss")}
    if any(value is None for value in known.values()):
        fallback = _from_trainer_state(ckpt.path, ckpt.step)
        known = {key: value if value is not None else fallback.get(key) for key, value in known.items()}
    size = marker.get("size_bytes")
    if not isinstance(size, int) or isinstance(size, bool):
        size = folder_size(ckpt.path)
    completed = marker.get("completed_at")
    return CatalogEntry(
        step=ckpt.step,
        path=ckpt.path,
        epoch=known["epoch"],
        loss=known["loss"],
        eval_loss=known["eval_loss"],
        time=str(completed) if completed else None,
        size_bytes=size,
    )


def catalog(output_dir: str | Path) -> list[CatalogEntry]:
    """Every complete checkpoint under ``<output_dir>/checkpoints``, oldest step first."""
    root = checkpoints.checkpoints_root(output_dir)
    return [entry_of(c) for c in checkpoints.complete_checkpoints(root)]


def best_entry(entries: list[CatalogEntry]) -> CatalogEntry | None:
    """The entry with the lowest eval loss (the earlier step on a tie); None when none has one."""
    rated = [e for e in entries if e.eval_loss is not None]
    return min(rated, key=lambda e: (e.eval_loss, e.step)) if rated else None


def status_of(output_dir: str | Path) -> dict[str, Any]:
    """``status.checkpoints`` (camelCase): latest, latestStep, count, bestStep, items."""
    entries = catalog(output_dir)
    if not entries:
        return {"count": 0, "items": []}
    best = best_entry(entries)
    out: dict[str, Any] = {
        "latest": str(entries[-1].path),
        "latestStep": entries[-1].step,
        "count": len(entries),
        "items": [e.as_status() for e in entries],
    }
    if best is not None:
        out["bestStep"] = best.step
    return out


def final_eval_loss(output_dir: str | Path) -> float | None:
    """The final model's eval loss from ``final/COMPLETE`` (None: not evaluated, or no final)."""
    return _number(read_marker(Path(output_dir) / FINAL_DIR).get("eval_loss"))


def final_step(output_dir: str | Path) -> int | None:
    step = read_marker(Path(output_dir) / FINAL_DIR).get("step")
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def select_for_registration(output_dir: str | Path, choice: str) -> Selected:
    """What to register: ``final`` (the final model) or ``bestEval`` (the lowest eval loss among the
    complete checkpoints and the final model; the final model on a tie, or when nothing has one).

    The final model must be complete either way (registration follows a finished training).
    """
    final = Path(output_dir) / FINAL_DIR
    final_loss = final_eval_loss(output_dir)
    chosen = Selected(final, final_loss, "final")
    if str(choice) != "bestEval":
        return chosen
    best = best_entry(catalog(output_dir))
    if best is None or best.eval_loss is None or (final_loss is not None and final_loss <= best.eval_loss):
        return chosen
    if best.step == final_step(output_dir):
        # the checkpoint of the final step holds the final model's weights: take final/
        return Selected(final, best.eval_loss, "final")
    return Selected(best.path, best.eval_loss, f"{checkpoints.PREFIX}{best.step}")


def base_eval_loss(output_dir: str | Path) -> float | None:
    """The base model's eval loss measured before training (``base-eval.json``); None: not measured."""
    try:
        data = json.loads((Path(output_dir) / BASE_EVAL_FILE).read_text())
    except (OSError, ValueError):
        return None
    return _number(data.get("eval_loss")) if isinstance(data, dict) else None
