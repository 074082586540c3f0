"""The checkpoint catalog (status.checkpoints items, the best by eval loss, what registration takes),
retention that keeps the best, and the status payload that carries it."""

from __future__ import annotations

import json
from pathlib import Path

from kubetune_api.status import CheckpointStatus
from kubetune_api.trainer_config import COMPLETE_MARKER
from kubetune_trainer.training.progress import ProgressState
from kubetune_trainer.volume import catalog
from kubetune_trainer.volume import checkpoints as ck


def save(
    out: Path, step: int, *, eval_loss: float | None = None, loss: float = 2.0, **marker: object
) -> Path:
    path = ck.checkpoint_path(ck.checkpoints_root(out), step)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 100)
    info: dict[str, object] = {"step": step, "epoch": step / 10, "loss": loss, "size_bytes": 100, **marker}
    if eval_loss is not None:
        info["eval_loss"] = eval_loss
    ck.mark_complete(path, info)
    return path


def final(out: Path, step: int, eval_loss: float | None) -> Path:
    path = out / "final"
    path.mkdir(parents=True)
    ck.mark_complete(path, {"step": step, "eval_loss": eval_loss})
    return path


def test_entries_come_from_the_complete_markers_oldest_first(tmp_path: Path) -> None:
    save(tmp_path, 20, eval_loss=1.5, loss=1.8)
    save(tmp_path, 10, eval_loss=2.0, loss=2.5)
    cut_short = ck.checkpoint_path(ck.checkpoints_root(tmp_path), 30)
    cut_short.mkdir()  # a save without its marker is not in the catalog
    entries = catalog.catalog(tmp_path)
    assert [(e.step, e.loss, e.eval_loss, e.epoch, e.size_bytes) for e in entries] == [
        (10, 2.5, 2.0, 1.0, 100),
        (20, 1.8, 1.5, 2.0, 100),
    ]
    assert all(e.time and e.time.endswith("Z") for e in entries)


def test_an_older_marker_falls_back_to_the_trainer_state_and_the_folder_size(tmp_path: Path) -> None:
    path = ck.checkpoint_path(ck.checkpoints_root(tmp_path), 4)
    path.mkdir(parents=True)
    (path / "model.safetensors").write_bytes(b"\0" * 1000)
    history = [
        {"step": 2, "loss": 3.0},
        {"step": 3, "loss": 2.5},
        {"step": 4, "eval_loss": 2.2},
        {"step": 5, "loss": 9.9},  # after the checkpoint (a state file copied late): not its loss
    ]
    (path / ck.TRAINER_STATE).write_text(json.dumps({"epoch": 0.4, "log_history": history}))
    ck.mark_complete(path, {"step": 4})  # written before kubetune recorded losses
    (entry,) = catalog.catalog(tmp_path)
    assert (entry.step, entry.loss, entry.eval_loss, entry.epoch) == (4, 2.5, 2.2, 0.4)
    assert entry.size_bytes is not None and entry.size_bytes > 1000  # the weights and the state file


def test_the_best_is_the_lowest_eval_loss_and_the_earlier_step_on_a_tie(tmp_path: Path) -> None:
    save(tmp_path, 10, eval_loss=1.5)
    save(tmp_path, 20, eval_loss=1.5)
    save(tmp_path, 30)  # not evaluated at its step
    save(tmp_path, 40, eval_loss=1.7)
    best = catalog.best_entry(catalog.catalog(tmp_path))
    assert best is not None and best.step == 10
    assert catalog.best_entry([e for e in catalog.catalog(tmp_path) if e.step == 30]) is None


def test_status_of_is_the_camelcase_status_the_api_accepts(tmp_path: Path) -> None:
    assert catalog.status_of(tmp_path) == {"count": 0, "items": []}
    save(tmp_path, 10, eval_loss=1.2)
    save(tmp_path, 20, eval_loss=1.4)
    status = catalog.status_of(tmp_path)
    assert status["latestStep"] == 20 and status["count"] == 2 and status["bestStep"] == 10
    assert status["latest"] == str(ck.checkpoint_path(ck.checkpoints_root(tmp_path), 20))
    assert [i["step"] for i in status["items"]] == [10, 20]
    assert status["items"][0] == {
        "step": 10,
        "epoch": 1.0,
        "loss": 2.0,
        "evalLoss": 1.2,
        "time": status["items"][0]["time"],
        "sizeBytes": 100,
        "path": str(ck.checkpoint_path(ck.checkpoints_root(tmp_path), 10)),
    }
    parsed = CheckpointStatus.model_validate(status)  # strict: an unknown field is refused
    assert parsed.best_step == 10 and parsed.items is not None and parsed.items[1].eval_loss == 1.4


def test_registration_takes_final_or_the_lowest_eval_loss(tmp_path: Path) -> None:
    save(tmp_path, 10, eval_loss=1.1)
    save(tmp_path, 20, eval_loss=1.3)
    final(tmp_path, 30, eval_loss=1.4)
    assert catalog.select_for_registration(tmp_path, "final") == catalog.Selected(
        tmp_path / "final", 1.4, "final"
    )
    chosen = catalog.select_for_registration(tmp_path, "bestEval")
    assert chosen.label == "checkpoint-10" and chosen.eval_loss == 1.1
    assert chosen.path == ck.checkpoint_path(ck.checkpoints_root(tmp_path), 10)


def test_best_eval_keeps_final_when_it_is_as_good_or_nothing_was_evaluated(tmp_path: Path) -> None:
    save(tmp_path, 10, eval_loss=1.3)
    final(tmp_path, 20, eval_loss=1.3)
    assert catalog.select_for_registration(tmp_path, "bestEval").label == "final"


def test_best_eval_at_the_final_step_is_the_final_model(tmp_path: Path) -> None:
    save(tmp_path, 10, eval_loss=1.3)
    save(tmp_path, 20, eval_loss=1.0)
    final(tmp_path, 20, eval_loss=None)  # a final marker from before final models were evaluated
    assert catalog.select_for_registration(tmp_path, "bestEval") == catalog.Selected(
        tmp_path / "final", 1.0, "final"
    )


def test_base_eval_loss_is_read_from_base_eval_json(tmp_path: Path) -> None:
    assert catalog.base_eval_loss(tmp_path) is None
    (tmp_path / catalog.BASE_EVAL_FILE).write_text(json.dumps({"eval_loss": 3.25}))
    assert catalog.base_eval_loss(tmp_path) == 3.25
    (tmp_path / catalog.BASE_EVAL_FILE).write_text("{not json")
    assert catalog.base_eval_loss(tmp_path) is None


def test_retention_keeps_the_newest_and_the_best_even_when_older(tmp_path: Path) -> None:
    root = ck.checkpoints_root(tmp_path)
    for step, ev in ((10, 2.0), (20, 1.0), (30, 1.5), (40, 1.6), (50, 1.7)):
        save(tmp_path, step, eval_loss=ev)
    best = catalog.best_entry(catalog.catalog(tmp_path))
    assert best is not None
    deleted = ck.prune(root, keep=2, keep_also=[best.step])
    assert [c.step for c in deleted] == [10, 30]
    assert [c.step for c in ck.complete_checkpoints(root)] == [20, 40, 50]
    assert not (ck.checkpoint_path(root, 10)).exists()
    # the best inside the window costs nothing extra
    assert ck.prune(root, keep=3, keep_also=[50]) == []


def test_progress_sends_the_catalog_with_best_step_removed_when_there_is_none(tmp_path: Path) -> None:
    state = ProgressState(total_steps=10)
    save(tmp_path, 2)
    state.checkpoint_latest, state.checkpoint_step, state.checkpoint_count = "x", 2, 1
    state.checkpoint_catalog = catalog.status_of(tmp_path)
    sent = state.as_status()["checkpoints"]
    assert sent["bestStep"] is None  # null in a merge patch: an old bestStep is removed
    assert sent["latestStep"] == 2 and [i["step"] for i in sent["items"]] == [2]
    assert sent["latest"] == str(ck.checkpoint_path(ck.checkpoints_root(tmp_path), 2))


def test_a_nan_in_an_old_marker_is_no_loss(tmp_path: Path) -> None:
    path = save(tmp_path, 5)
    marker = json.loads((path / COMPLETE_MARKER).read_text())
    (path / COMPLETE_MARKER).write_text(json.dumps({**marker, "loss": float("nan")}))
    assert catalog.catalog(tmp_path)[0].loss is None
