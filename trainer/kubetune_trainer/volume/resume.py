"""``spec.resume``: where training starts when the volume already holds this training's checkpoints.

- ``latest`` (the default): the newest complete checkpoint, or the start.
- ``best``: the checkpoint with the lowest eval loss; later checkpoints and an old ``final/`` are set
  aside under ``<output_dir>/superseded/``.
- ``"<step>"``: that step's complete checkpoint; later ones and an old ``final/`` set aside.
- ``none``: start over; every checkpoint and an old ``final/`` set aside.

What was set aside stays on the volume until the new run has its first complete checkpoint (then it
is deleted), so a run that fails before that loses nothing.

The choice is applied once per job: the first attempt records its decision in
``<output_dir>/resume.json`` (``{"job_uid", "resume", "from_step"}``), and later attempts of the same
job (restarts after preemption, a retry after out-of-memory) continue from the newest checkpoint, as
with ``latest``. A run without a job uid (``kubetune run --local``) applies it at every invocation.

A step with no complete checkpoint, or ``best`` when no checkpoint has an eval loss, is refused with
:class:`CheckpointNotFoundError` naming the steps there are.

No torch here.

>>> import tempfile
>>> from .checkpoints import mark_complete
>>> out = Path(tempfile.mkdtemp())
>>> for step, ev in ((10, 2.0), (20, 1.5), (30, 1.7)):
...     p = out / "checkpoints" / f"checkpoint-{step}"
...     p.mkdir(parents=True)
...     _ = mark_complete(p, {"step": step, "eval_loss": ev})
>>> plan = plan_resume(out, "best", "uid-1")
>>> plan.from_step, [p.name for p in plan.set_aside]
(20, ['checkpoint-30'])
>>> plan_resume(out, "25", "uid-1")
Traceback (most recent call last):
...
kubetune_trainer.volume.resume.CheckpointNotFoundError: spec.resume "25": the volume has no complete checkpoint of step 25; it has steps 10, 20, 30
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kubetune_api.trainer_config import FINAL_DIR, dump_json

from . import catalog, checkpoints

log = logging.getLogger(__name__)

RESUME_FILE = "resume.json"
SUPERSEDED_DIR = "superseded"
LATEST, BEST, NONE = "latest", "best", "none"


class CheckpointNotFoundError(ValueError):
    """spec.resume names a checkpoint the volume does not hold."""

    def __init__(self, message: str, steps: list[int]) -> None:
        super().__init__(message)
        self.steps = steps


@dataclass(frozen=True)
class ResumePlan:
    """What this attempt does about ``spec.resume``.

    ``applied``: the choice applies now (the job's first attempt, or a run without a uid); False: a
    restart of the same job, which continues from the newest checkpoint. ``from_step``: the checkpoint
    to resume from when applied (None: the start, or the newest for ``latest``). ``set_aside``: the
    folders to move under ``superseded/`` before training.
    """

    choice: str
    applied: bool
    from_step: int | None = None
    set_aside: list[Path] = field(default_factory=list)

    @property
    def overrides(self) -> bool:
        """True when the attempt must not simply take the newest checkpoint."""
        return self.applied and self.choice != LATEST


def recorded(output_dir: Path) -> dict[str, object] | None:
    """The decision an earlier attempt recorded in resume.json (None: none, or unreadable)."""
    try:
        data = json.loads((output_dir / RESUME_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _steps_text(steps: list[int]) -> str:
    if not steps:
        return "it has no complete checkpoint"
    return "it has step" + ("s " if len(steps) > 1 else " ") + ", ".join(str(s) for s in steps)


def _target(output_dir: Path, choice: str) -> int | None:
    """The step ``choice`` resumes from (None: the start); CheckpointNotFoundError when missing."""
    entries = catalog.catalog(output_dir)
    steps = [e.step for e in entries]
    if choice == NONE:
        return None
    if choice == BEST:
        best = catalog.best_entry(entries)
        if not entries:
            return None  # a fresh volume: nothing to choose from, the run starts (as latest does)
        if best is None:
            why = "no checkpoint has an eval loss" if entries else "the volume has no complete checkpoint"
            rated = f"; {_steps_text(steps)}" if entries else ""
            raise CheckpointNotFoundError(f'spec.resume "best": {why}{rated}', steps)
        return best.step
    step = int(choice)
    if step not in steps:
        raise CheckpointNotFoundError(
            f'spec.resume "{choice}": the volume has no complete checkpoint of step {step}; {_steps_text(steps)}',
            steps,
        )
    return step


def plan_resume(output_dir: str | Path, choice: str, job_uid: str | None) -> ResumePlan:
    """What ``spec.resume`` = ``choice`` means for this attempt (no change on disk)."""
    out = Path(output_dir)
    earlier = recorded(out)
    if job_uid is not None and earlier is not None and earlier.get("job_uid") == job_uid:
        return ResumePlan(choice, applied=False)
    if choice == LATEST:
        newest = checkpoints.latest_complete(checkpoints.checkpoints_root(out))
        return ResumePlan(choice, applied=True, from_step=newest.step if newest else None)
    step = _target(out, choice)
    later = [
        c.path
        for c in checkpoints.list_checkpoints(checkpoints.checkpoints_root(out))
        if step is None or c.step > step
    ]
    final = out / FINAL_DIR
    if final.exists():
        later.append(final)
    return ResumePlan(choice, applied=True, from_step=step, set_aside=later)


def apply(output_dir: str | Path, plan: ResumePlan, job_uid: str | None) -> list[Path]:
    """Rank 0: move the plan's folders under ``superseded/``, then record the decision in
    resume.json (after the moves: a restart that reads it finds the newest checkpoint is the one
    chosen). Returns where the folders went."""
    out = Path(output_dir)
    if not plan.applied:
        return []
    moved = []
    if plan.set_aside:
        aside = out / SUPERSEDED_DIR
        for path in plan.set_aside:
            where = aside / path.relative_to(out)
            where.parent.mkdir(parents=True, exist_ok=True)
            if where.exists():  # an earlier set-aside of the same name: the newer one wins
                shutil.rmtree(where, ignore_errors=True)
            path.replace(where)
            moved.append(where)
        log.info(
            'spec.resume "%s": set aside %s under %s until the new run saves its first checkpoint',
            plan.choice,
            ", ".join(str(p.relative_to(out)) for p in plan.set_aside),
            aside,
        )
    dump_json({"job_uid": job_uid, "resume": plan.choice, "from_step": plan.from_step}, out / RESUME_FILE)
    return moved


def drop_superseded(output_dir: str | Path) -> bool:
    """Delete ``superseded/`` (the new run has a complete checkpoint of its own); True if it existed."""
    aside = Path(output_dir) / SUPERSEDED_DIR
    if not aside.exists():
        return False
    shutil.rmtree(aside, ignore_errors=True)
    log.info("deleted %s: the new run has its own checkpoint", aside)
    return True


def attempt_for(
    output_dir: str | Path,
    choice: str,
    job_uid: str | None,
    foreign: Callable[[Path | None], str | None],
    *,
    rank0: bool,
) -> checkpoints.Attempt:
    """What this attempt does (:func:`checkpoints.decide_attempt`), with ``spec.resume`` applied.

    A folder of another training is refused before anything moves. Every rank takes the same
    decision from the same folders; rank 0 alone moves what is set aside and records resume.json.
    CheckpointNotFoundError when ``choice`` names a checkpoint the volume does not hold.
    """
    out = Path(output_dir)
    # The plan first: a rank that finds rank 0's resume.json decides after rank 0's moves (resume.json
    # is written after them); one that does not takes the plan's target, whatever has moved since.
    plan = plan_resume(out, choice, job_uid)
    attempt = checkpoints.decide_attempt(out, foreign, clean_up=rank0)
    if attempt.kind == checkpoints.AttemptKind.REFUSE:
        return attempt
    if not plan.overrides:
        if rank0 and plan.applied:
            apply(out, plan, job_uid)
        return attempt
    root = checkpoints.checkpoints_root(out)
    target = None
    if plan.from_step is not None:
        target = checkpoints.Checkpoint(
            plan.from_step, checkpoints.checkpoint_path(root, plan.from_step), True
        )
        refusal = foreign(target.path)
        if refusal:
            return checkpoints.Attempt(checkpoints.AttemptKind.REFUSE, refusal=refusal)
    if rank0:
        apply(out, plan, job_uid)
        checkpoints.remove_incomplete(root)
    where = f"checkpoint {plan.from_step}" if target else "the start (nothing resumed)"
    log.info('spec.resume "%s": training from %s', choice, where)
    return checkpoints.Attempt(checkpoints.AttemptKind.TRAIN, resume=target)
