"""spec.resume decisions on a real folder: which checkpoint, what is set aside, once per job uid, the
refusal naming the steps there are, and another training's folder refused before anything moves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kubetune_trainer.volume import checkpoints as ck
from kubetune_trainer.volume import resume
from kubetune_trainer.volume.checkpoints import AttemptKind


def save(out: Path, step: int, eval_loss: float | None = None, training_hash: str = "ours") -> Path:
    path = ck.checkpoint_path(ck.checkpoints_root(out), step)
    path.mkdir(parents=True)
    info: dict[str, object] = {"step": step, "training_hash": training_hash}
    if eval_loss is not None:
        info["eval_loss"] = eval_loss
    ck.mark_complete(path, info)
    return path


def final(out: Path, step: int) -> Path:
    path = out / "final"
    path.mkdir()
    ck.mark_complete(path, {"step": step, "training_hash": "ours"})
    return path


def not_ours(path: Path | None) -> str | None:
    written = ck.marked_training(path) if path else None
    return f"{path} is another training's" if written and written != "ours" else None


def steps(out: Path) -> list[int]:
    return [c.step for c in ck.complete_checkpoints(ck.checkpoints_root(out))]


@pytest.fixture
def volume(tmp_path: Path) -> Path:
    """A finished run: checkpoints 10 (eval 2.0), 20 (1.5), 30 (1.7), 40 (no eval) and final/ (40)."""
    for step, ev in ((10, 2.0), (20, 1.5), (30, 1.7), (40, None)):
        save(tmp_path, step, ev)
    final(tmp_path, 40)
    return tmp_path


def decide(out: Path, choice: str, uid: str | None = "uid-b") -> ck.Attempt:
    return resume.attempt_for(out, choice, uid, not_ours, rank0=True)


def test_latest_resumes_from_the_newest_and_a_finished_run_stays_finished(volume: Path) -> None:
    assert decide(volume, "latest").kind == AttemptKind.ALREADY_COMPLETE
    (volume / "final" / "COMPLETE").unlink()
    attempt = decide(volume, "latest", uid="uid-c")
    assert attempt.kind == AttemptKind.TRAIN and attempt.resume is not None and attempt.resume.step == 40
    recorded = json.loads((volume / resume.RESUME_FILE).read_text())
    assert recorded == {"job_uid": "uid-c", "resume": "latest", "from_step": 40}
    assert not (volume / resume.SUPERSEDED_DIR).exists()


def test_best_resumes_from_the_lowest_eval_loss_and_sets_later_work_aside(volume: Path) -> None:
    attempt = decide(volume, "best")
    assert attempt.kind == AttemptKind.TRAIN and attempt.resume is not None and attempt.resume.step == 20
    assert steps(volume) == [10, 20]
    aside = volume / resume.SUPERSEDED_DIR
    assert sorted(p.name for p in (aside / "checkpoints").iterdir()) == ["checkpoint-30", "checkpoint-40"]
    assert (aside / "final" / "COMPLETE").is_file() and not (volume / "final").exists()
    assert json.loads((volume / resume.RESUME_FILE).read_text())["from_step"] == 20
    assert resume.drop_superseded(volume) and not aside.exists()
    assert not resume.drop_superseded(volume)


def test_a_step_resumes_from_that_checkpoint(volume: Path) -> None:
    attempt = decide(volume, "30")
    assert attempt.resume is not None and attempt.resume.step == 30
    assert steps(volume) == [10, 20, 30]


def test_none_starts_over_keeping_everything_aside(volume: Path) -> None:
    attempt = decide(volume, "none")
    assert attempt.kind == AttemptKind.TRAIN and attempt.resume is None
    assert steps(volume) == []
    aside = volume / resume.SUPERSEDED_DIR / "checkpoints"
    assert sorted(p.name for p in aside.iterdir()) == [f"checkpoint-{s}" for s in (10, 20, 30, 40)]


def test_a_restart_of_the_same_job_continues_from_its_newest_checkpoint(volume: Path) -> None:
    first = decide(volume, "20")
    assert first.resume is not None and first.resume.step == 20
    save(volume, 25)  # the new run saved, then was preempted
    again = decide(volume, "20")  # same uid: the choice was applied once
    assert again.resume is not None and again.resume.step == 25
    assert steps(volume) == [10, 20, 25]


def test_a_new_job_on_the_same_volume_applies_its_own_choice(volume: Path) -> None:
    decide(volume, "20", uid="uid-1")
    save(volume, 25)
    attempt = decide(volume, "10", uid="uid-2")
    assert attempt.resume is not None and attempt.resume.step == 10
    assert steps(volume) == [10]


def test_a_run_without_a_uid_applies_the_choice_at_every_invocation(volume: Path) -> None:
    decide(volume, "20", uid=None)
    save(volume, 25)
    attempt = decide(volume, "20", uid=None)
    assert attempt.resume is not None and attempt.resume.step == 20
    assert steps(volume) == [10, 20]


def test_a_missing_step_is_refused_naming_the_steps_there_are_and_nothing_moves(volume: Path) -> None:
    with pytest.raises(resume.CheckpointNotFoundError) as e:
        decide(volume, "35")
    assert str(e.value) == (
        'spec.resume "35": the volume has no complete checkpoint of step 35; it has steps 10, 20, 30, 40'
    )
    assert e.value.steps == [10, 20, 30, 40]
    assert steps(volume) == [10, 20, 30, 40] and (volume / "final" / "COMPLETE").is_file()
    assert not (volume / resume.RESUME_FILE).exists()


def test_best_without_any_eval_loss_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 5)
    with pytest.raises(
        resume.CheckpointNotFoundError, match=r'"best": no checkpoint has an eval loss; it has step 5$'
    ):
        decide(tmp_path, "best")
    # a fresh volume: best has nothing to choose from, and the run starts (as with latest)
    (tmp_path / "fresh").mkdir()
    fresh = decide(tmp_path / "fresh", "best")
    assert fresh.kind == AttemptKind.TRAIN and fresh.resume is None
    with pytest.raises(resume.CheckpointNotFoundError, match="it has no complete checkpoint"):
        decide(tmp_path / "empty", "3")


def test_none_on_an_empty_volume_simply_trains(tmp_path: Path) -> None:
    attempt = decide(tmp_path, "none")
    assert attempt.kind == AttemptKind.TRAIN and attempt.resume is None
    assert not (tmp_path / resume.SUPERSEDED_DIR).exists()


def test_another_trainings_folder_is_refused_before_anything_moves(tmp_path: Path) -> None:
    save(tmp_path, 10, 1.0, training_hash="theirs")
    save(tmp_path, 20, 2.0, training_hash="theirs")
    attempt = decide(tmp_path, "best")
    assert attempt.kind == AttemptKind.REFUSE and "another training" in (attempt.refusal or "")
    assert steps(tmp_path) == [10, 20] and not (tmp_path / resume.SUPERSEDED_DIR).exists()


def test_an_older_foreign_checkpoint_chosen_by_step_is_refused(tmp_path: Path) -> None:
    save(tmp_path, 10, training_hash="theirs")
    save(tmp_path, 20)
    attempt = decide(tmp_path, "10")
    assert attempt.kind == AttemptKind.REFUSE
    assert steps(tmp_path) == [10, 20]


def test_other_ranks_take_the_same_decision_without_moving_anything(volume: Path) -> None:
    other = resume.attempt_for(volume, "best", "uid-b", not_ours, rank0=False)
    assert other.resume is not None and other.resume.step == 20
    assert steps(volume) == [10, 20, 30, 40] and not (volume / resume.RESUME_FILE).exists()
    ours = decide(volume, "best")  # rank 0 moves and records
    assert ours.resume == other.resume
    # a rank that reads resume.json after rank 0 wrote it continues from the newest: the same one
    late = resume.attempt_for(volume, "best", "uid-b", not_ours, rank0=False)
    assert late.resume == other.resume


@pytest.mark.parametrize(
    ("choice", "steps", "final", "expected"),
    [("best", (10, 20, 30), False, 20), ("none", (10, 20), True, None)],
)
def test_every_rank_takes_rank_0s_decision_whenever_rank_0_moves_the_folders(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    choice: str,
    steps: tuple[int, ...],
    final: bool,
    expected: int | None,
) -> None:
    """Rank 1 looks at the folders, then rank 0 runs its whole decision (moving folders aside) before
    rank 1 is done: rank 1 still resumes from the checkpoint rank 0 does, not from a moved one (and
    never finds the moved final model 'already complete' while rank 0 trains)."""
    from kubetune_trainer.volume import checkpoints, resume

    for step in steps:
        folder = tmp_path / "checkpoints" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        checkpoints.mark_complete(folder, {"step": step, "eval_loss": {10: 2.0, 20: 1.5, 30: 1.7}[step]})
    if final:
        (tmp_path / "final").mkdir()
        checkpoints.mark_complete(tmp_path / "final", {"step": steps[-1]})
    decide = checkpoints.decide_attempt
    seen: dict[str, checkpoints.Attempt] = {}

    def rank0_meanwhile(out: Path, foreign: Any, *, clean_up: bool) -> checkpoints.Attempt:
        attempt = decide(out, foreign, clean_up=clean_up)
        if not clean_up and "rank0" not in seen:
            monkeypatch.setattr(checkpoints, "decide_attempt", decide)
            seen["rank0"] = resume.attempt_for(tmp_path, choice, "uid-1", lambda _p: None, rank0=True)
        return attempt

    monkeypatch.setattr(checkpoints, "decide_attempt", rank0_meanwhile)
    rank1 = resume.attempt_for(tmp_path, choice, "uid-1", lambda _p: None, rank0=False)
    for attempt in (seen["rank0"], rank1):
        assert attempt.kind == checkpoints.AttemptKind.TRAIN
        assert (attempt.resume.step if attempt.resume else None) == expected
        assert attempt.resume is None or attempt.resume.path.exists()
