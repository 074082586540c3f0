"""Checkpoint discovery, the atomic COMPLETE marker, cleanup of cut-short saves, and retention."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubetune_api.trainer_config import COMPLETE_MARKER
from kubetune_trainer.volume import checkpoints as ck


def _save(root: Path, step: int, *, complete: bool) -> Path:
    path = ck.checkpoint_path(root, step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    if complete:
        ck.mark_complete(path, {"step": step})
    return path


def test_discovery_orders_by_step_not_by_name(tmp_path: Path) -> None:
    for step in (100, 9, 20):
        _save(tmp_path, step, complete=True)
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [9, 20, 100]
    assert ck.latest_complete(tmp_path).step == 100  # type: ignore[union-attr]


def test_incomplete_checkpoint_is_never_the_one_to_resume_from(tmp_path: Path) -> None:
    _save(tmp_path, 10, complete=True)
    _save(tmp_path, 20, complete=False)
    latest = ck.latest_complete(tmp_path)
    assert latest is not None and latest.step == 10
    assert [(c.step, c.complete) for c in ck.list_checkpoints(tmp_path)] == [(10, True), (20, False)]


def test_no_checkpoints_means_fresh_start(tmp_path: Path) -> None:
    assert ck.latest_complete(tmp_path / "missing") is None
    _save(tmp_path, 5, complete=False)
    assert ck.latest_complete(tmp_path) is None


def test_unrelated_and_temporary_entries_are_ignored(tmp_path: Path) -> None:
    _save(tmp_path, 3, complete=True)
    (tmp_path / "checkpoint-7.tmp").mkdir()
    (tmp_path / "checkpoint-abc").mkdir()
    (tmp_path / "checkpoint-8").write_text("a file, not a folder")
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [3]


def test_marker_is_written_atomically_and_last(tmp_path: Path) -> None:
    path = _save(tmp_path, 1, complete=False)
    marker = ck.mark_complete(path, {"step": 1, "world_size": 2})
    assert marker == path / COMPLETE_MARKER
    data = json.loads(marker.read_text())
    assert data["step"] == 1 and data["world_size"] == 2 and "completed_at" in data
    # No temporary file is left behind that a reader could mistake for anything.
    assert sorted(p.name for p in path.iterdir()) == [COMPLETE_MARKER, "model.safetensors"]


def test_a_leftover_temporary_marker_does_not_count(tmp_path: Path) -> None:
    path = _save(tmp_path, 4, complete=False)
    (path / f".{COMPLETE_MARKER}.tmp").write_text("{}")  # killed between write and rename
    assert not ck.is_complete(path)


def test_remove_incomplete_deletes_only_cut_short_saves(tmp_path: Path) -> None:
    _save(tmp_path, 10, complete=True)
    _save(tmp_path, 20, complete=False)
    _save(tmp_path, 30, complete=False)
    removed = ck.remove_incomplete(tmp_path)
    assert [c.step for c in removed] == [20, 30]
    assert [c.step for c in ck.list_checkpoints(tmp_path)] == [10]


def test_prune_keeps_the_newest_complete_ones(tmp_path: Path) -> None:
    for step in (10, 20, 30, 40):
        _save(tmp_path, step, complete=True)
    _save(tmp_path, 50, complete=False)  # maybe a save in progress: not prune's business
    deleted = ck.prune(tmp_path, keep=2)
    assert [c.step for c in deleted] == [10, 20]
    assert [(c.step, c.complete) for c in ck.list_checkpoints(tmp_path)] == [
        (30, True),
        (40, True),
        (50, False),
    ]


def test_prune_never_deletes_the_last_complete_checkpoint(tmp_path: Path) -> None:
    _save(tmp_path, 10, complete=True)
    assert ck.prune(tmp_path, keep=5) == []
    with pytest.raises(ValueError, match="at least 1"):
        ck.prune(tmp_path, keep=0)


def test_checkpoints_root_follows_the_volume_layout(tmp_path: Path) -> None:
    assert ck.checkpoints_root(tmp_path) == tmp_path / "checkpoints"
    assert ck.checkpoint_path(ck.checkpoints_root(tmp_path), 7).name == "checkpoint-7"
