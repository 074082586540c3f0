"""Checkpoints that survive anything: discovery, the COMPLETE marker, cleanup and retention.

A checkpoint is a folder ``<output_dir>/checkpoints/checkpoint-<step>/``. It counts only when its
``COMPLETE`` marker exists, and the marker is written last: after every rank finished writing,
after every file in the folder is flushed to disk (fsync), through a temporary file that is renamed
into place (atomic on POSIX file systems, NFS included) and with the folder itself fsynced. So a
crash (kill -9, node loss, a full volume) at any moment leaves either a complete checkpoint or a
folder without a marker, which the next start ignores and deletes.

The same marker makes ``<output_dir>/final/`` count as the finished model.

No torch, no transformers here: the operator and the registration step can use it too.

>>> import tempfile
>>> root = Path(tempfile.mkdtemp())
>>> (root / "checkpoint-10").mkdir(); _ = mark_complete(root / "checkpoint-10")
>>> (root / "checkpoint-20").mkdir()  # a save that was killed before its marker
>>> latest_complete(root).step
10
>>> [c.step for c in remove_incomplete(root)]
[20]
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from kubetune_api.trainer_config import CHECKPOINTS_DIR, COMPLETE_MARKER, FINAL_DIR

log = logging.getLogger(__name__)

PREFIX = "checkpoint-"
TRAINER_STATE = "trainer_state.json"  # written by transformers' Trainer into every checkpoint
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    step: int
    path: Path
    complete: bool


def checkpoints_root(output_dir: str | Path) -> Path:
    """Where the checkpoints of a run live: ``<output_dir>/checkpoints``."""
    return Path(output_dir) / CHECKPOINTS_DIR


def checkpoint_path(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step}"


def is_complete(path: Path) -> bool:
    return (path / COMPLETE_MARKER).is_file()


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Every ``checkpoint-<step>`` folder under ``root``, oldest step first (temporary files skipped)."""
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _NAME.match(child.name)
        if match and child.is_dir():
            found.append(Checkpoint(step=int(match.group(1)), path=child, complete=is_complete(child)))
    return sorted(found, key=lambda c: c.step)


def complete_checkpoints(root: Path) -> list[Checkpoint]:
    return [c for c in list_checkpoints(root) if c.complete]


def latest_complete(root: Path) -> Checkpoint | None:
    """The newest complete checkpoint, or None: the one to resume from."""
    done = complete_checkpoints(root)
    return done[-1] if done else None


def _fsync_path(path: Path) -> None:
    # Directories are opened read-only to fsync their entries; some file systems refuse that, and
    # that is not a reason to fail a save.
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """Flush every file and folder under ``path`` (and ``path`` itself) to stable storage."""
    for dirpath, _dirnames, filenames in os.walk(path):
        for name in filenames:
            _fsync_path(Path(dirpath) / name)
        _fsync_path(Path(dirpath))


def _marker_field(path: Path, name: str) -> str | None:
    try:
        value = json.loads((path / COMPLETE_MARKER).read_text()).get(name)
    except (OSError, ValueError, AttributeError):
        return None
    return str(value) if value else None


def marked_training(path: Path) -> str | None:
    """The training hash the COMPLETE marker of ``path`` records; None without a marker or a hash
    (markers written before kubetune recorded it)."""
    return _marker_field(path, "training_hash")


def marked_data(path: Path) -> str | None:
    """The data hash (content of the data files, or a Hub commit) the COMPLETE marker of ``path``
    records; None without a marker or a data hash (markers written before kubetune recorded it, or a
    Hub data set whose commit could not be resolved)."""
    return _marker_field(path, "data_hash")


def marker_step(path: Path) -> int | None:
    """The step the COMPLETE marker of ``path`` records (None without one)."""
    step = _marker_field(path, "step")
    return int(step) if step is not None and step.isdigit() else None


def checkpoint_history(path: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]] | None:
    """The (step, loss) and (step, eval loss) the run logged up to the checkpoint ``path``: the
    Trainer keeps its whole log history in ``trainer_state.json``, carried from checkpoint to
    checkpoint across attempts. None when the file is missing or unreadable."""
    try:
        history = json.loads((path / TRAINER_STATE).read_text())["log_history"]
        losses = [(int(e["step"]), float(e["loss"])) for e in history if "loss" in e]
        evals = [(int(e["step"]), float(e["eval_loss"])) for e in history if "eval_loss" in e]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return losses, evals


def mark_complete(path: Path, info: dict[str, object] | None = None) -> Path:
    """Declare the folder ``path`` complete: fsync its contents, then atomically write the marker.

    Call it once every writer (every rank) has finished writing into ``path``.
    """
    fsync_tree(path)
    marker = path / COMPLETE_MARKER
    tmp = path / f".{COMPLETE_MARKER}.tmp"
    payload = {"completed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **(info or {})}
    with tmp.open("w") as f:
        f.write(json.dumps(payload, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(marker)
    _fsync_path(path)
    return marker


def remove_incomplete(root: Path) -> list[Checkpoint]:
    """Delete checkpoint folders without a marker (a save that was cut short); returns them."""
    removed = []
    for ckpt in list_checkpoints(root):
        if not ckpt.complete:
            log.warning("removing incomplete checkpoint %s (its save never finished)", ckpt.path)
            shutil.rmtree(ckpt.path, ignore_errors=True)
            removed.append(ckpt)
    if removed:
        _fsync_path(root)
    return removed


def prune(root: Path, keep: int, keep_also: Collection[int] = ()) -> list[Checkpoint]:
    """Keep the newest ``keep`` complete checkpoints and those of the steps ``keep_also`` (the best
    by eval loss), delete the other complete ones; returns the deleted.

    Incomplete folders are left alone here: one may be a save in progress (they are cleaned at start).
    """
    if keep < 1:
        raise ValueError("keep must be at least 1: the newest complete checkpoint is what a restart needs")
    done = complete_checkpoints(root)
    doomed = [c for c in done[:-keep] if c.step not in keep_also]
    _delete(doomed)
    return doomed


def _delete(doomed: list[Checkpoint]) -> None:
    for ckpt in doomed:
        # Remove the marker first: if the deletion is cut short, what is left is an incomplete
        # folder (cleaned at the next start), never a "complete" checkpoint with missing files.
        (ckpt.path / COMPLETE_MARKER).unlink(missing_ok=True)
        _fsync_path(ckpt.path)
        shutil.rmtree(ckpt.path, ignore_errors=True)


def remove_from(root: Path, step: int) -> list[Checkpoint]:
    """Delete the complete checkpoints of ``step`` and later (saved after the loss went bad); the
    deleted. The marker goes first, as in :func:`prune`."""
    doomed = [c for c in complete_checkpoints(root) if c.step >= step]
    _delete(doomed)
    return doomed


class AttemptKind(StrEnum):
    TRAIN = "train"  # from the newest complete checkpoint (``Attempt.resume``), or from the start
    ALREADY_COMPLETE = "already-complete"  # an earlier attempt wrote the final model
    REFUSE = "refuse"  # the folder holds another training's work (``Attempt.refusal`` says whose)


@dataclass(frozen=True)
class Attempt:
    kind: AttemptKind
    resume: Checkpoint | None = None
    refusal: str | None = None


def decide_attempt(
    output_dir: Path, foreign: Callable[[Path | None], str | None], *, clean_up: bool
) -> Attempt:
    """What this attempt does with what the output folder holds.

    ``foreign(path)`` says why a final model or checkpoint folder belongs to another training (None:
    to this one): such a folder is never resumed nor taken as this run's result. A complete final
    model means an earlier attempt finished (and died before it could exit 0). Otherwise the attempt
    trains, from the newest complete checkpoint; ``clean_up`` (rank 0) first deletes the folders of
    saves that were cut short.
    """
    final = output_dir / FINAL_DIR
    root = checkpoints_root(output_dir)
    newest = latest_complete(root)
    refusal = foreign(final) or foreign(newest.path if newest else None)
    if refusal:
        return Attempt(AttemptKind.REFUSE, refusal=refusal)
    if is_complete(final):
        return Attempt(AttemptKind.ALREADY_COMPLETE)
    if clean_up:
        remove_incomplete(root)
    return Attempt(AttemptKind.TRAIN, resume=latest_complete(root))
