"""Who writes each field of the FineTuneJob's status: the operator or the trainer, never both.

Two processes patch ``finetunejobs/status`` with JSON merge patches: the operator (its state machine,
:mod:`kubetune_operator.state`, with what the preparation and registration Jobs report in their
termination messages) and the trainer's rank 0 (its progress reports,
:mod:`kubetune_trainer.training.progress`). A merge patch replaces what it names, so a field with two writers
shows whichever wrote last. Each top-level field (by its wire name) has exactly one writer here;
each writer's patches are checked against this table (:func:`check_patch`; tests build them with
the writers' own code), and a test holds the table to :class:`~kubetune_api.status.FineTuneJobStatus`.

>>> OWNERS["progress"], OWNERS["phase"]
(<Writer.TRAINER: 'trainer'>, <Writer.OPERATOR: 'operator'>)
>>> check_patch({"progress": {"step": 3}, "goodput": {}}, Writer.TRAINER)
>>> check_patch({"phase": "Training", "progress": {}}, Writer.OPERATOR)
Traceback (most recent call last):
...
kubetune_api.ownership.StatusOwnershipError: the operator may not write status.progress (the trainer's)
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any


class Writer(StrEnum):
    OPERATOR = "operator"  # kubetune_operator: phase, conditions, what the pods' Jobs reported
    TRAINER = "trainer"  # kubetune_trainer, rank 0 of the training pods: progress while it trains


OWNERS: dict[str, Writer] = {
    # the state machine
    "phase": Writer.OPERATOR,
    "observedGeneration": Writer.OPERATOR,
    "conditions": Writer.OPERATOR,
    "children": Writer.OPERATOR,
    "engine": Writer.OPERATOR,  # chosen once (spec.engine, else the operator's default), never changed
    "startTime": Writer.OPERATOR,
    "completionTime": Writer.OPERATOR,
    "trainingRestarts": Writer.OPERATOR,  # counted from the recreated pods (a TrainJob: its JobSet)
    "preemptions": Writer.OPERATOR,  # Kueue's evictions, from the training object's Workload
    "parent": Writer.OPERATOR,  # spec.model.fromJob: what the job started from
    "registrationRetry": Writer.OPERATOR,
    # the preparation Job's report (termination message)
    "preparation": Writer.OPERATOR,
    # the registration Job's result (termination message): the version with its run, the gate's verdict
    "registeredModel": Writer.OPERATOR,
    "evaluation": Writer.OPERATOR,
    # the trainer, while it trains (and when it stops)
    "progress": Writer.TRAINER,  # with the base model's eval loss, measured before the first step
    "checkpoints": Writer.TRAINER,
    "mlflow": Writer.TRAINER,  # the run the training logs to (the registration logs into it too)
    "goodput": Writer.TRAINER,
    "budget": Writer.TRAINER,
    "memoryRetries": Writer.TRAINER,
}


class StatusOwnershipError(ValueError):
    """A status patch names a field its writer does not own (a bug in that writer)."""


def owned_by(writer: Writer) -> frozenset[str]:
    """The top-level status fields ``writer`` writes."""
    return frozenset(name for name, owner in OWNERS.items() if owner == writer)


def foreign_fields(status: Mapping[str, Any], writer: Writer) -> list[str]:
    """The fields of the status patch ``status`` that ``writer`` does not own (or nobody declared)."""
    return [name for name in status if OWNERS.get(name) != writer]


def check_patch(status: Mapping[str, Any], writer: Writer) -> None:
    """Raise :class:`StatusOwnershipError` unless ``writer`` owns every field of the status patch
    ``status`` (the body's ``status``). Cheap: one lookup per top-level field."""
    foreign = foreign_fields(status, writer)
    if foreign:
        said = ", ".join(f"status.{name} ({_whose(name)})" for name in foreign)
        raise StatusOwnershipError(f"the {writer} may not write {said}")


def _whose(name: str) -> str:
    owner = OWNERS.get(name)
    return f"the {owner}'s" if owner is not None else "undeclared"
