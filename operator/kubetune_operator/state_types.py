"""The state machine's outputs (:mod:`kubetune_operator.state`): the decision per condition (keyed by
:class:`~kubetune_api.status.ConditionType`), the events, and the next status."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from kubetune_api.status import Condition, ConditionType, Phase


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass
class Transition:
    """The next status (fields the operator owns) and the events for what changed."""

    status: dict[str, Any]
    events: list[Event]
    phase: str
    # True when only time (or the outside world) can move things on: re-check soon.
    waiting: bool = False


class Decided(NamedTuple):
    """One condition as decided: its status, reason and message."""

    ok: bool
    reason: str
    message: str


@dataclass
class Verdicts:
    """The conditions decided so far in a pass, by type, and whether only time (or the outside
    world) can move things on (``waiting``)."""

    by_type: dict[ConditionType, Decided] = field(default_factory=dict)
    waiting: bool = False

    def __setitem__(self, type_: ConditionType, decided: tuple[bool, str, str]) -> None:
        self.by_type[type_] = Decided(*decided)

    def __getitem__(self, type_: ConditionType) -> Decided:
        return self.by_type[type_]

    def __contains__(self, type_: object) -> bool:
        return type_ in self.by_type

    def get(self, type_: ConditionType) -> Decided | None:
        return self.by_type.get(type_)


@dataclass(frozen=True)
class Decision:
    """The phase, and per condition type its (status, reason, message); ``waiting``: only time can
    move things on."""

    phase: Phase
    conditions: Mapping[ConditionType, Decided]
    waiting: bool = False


def condition_of(
    previous: dict[str, Condition],
    type_: str,
    decided: tuple[bool, str, str],
    *,
    now: str,
    generation: int,
) -> Condition:
    """A condition as decided (status, reason, message); its transition time moves only when the
    status flips (Kubernetes convention)."""
    status, reason, message = decided
    value: Literal["True", "False"] = "True" if status else "False"
    old = previous.get(type_)
    # lastTransitionTime moves only when the status flips (Kubernetes convention).
    when = old.last_transition_time if old is not None and old.status == value else now
    return Condition(
        type=type_,
        status=value,
        reason=reason,
        message=message,
        last_transition_time=when,
        observed_generation=generation,
    )
