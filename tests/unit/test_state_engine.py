"""The training engine a job runs on (``state.engine``, issue 31 item 1), as rows of one table: the
status as read, ``spec.engine``, the operator's default (``KUBETUNE_ENGINE``) and which engines'
resources the API server serves, in; the actions of the pass, the engine recorded in
``status.engine`` and the conditions, out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from tests.unit.test_state_advance import World, drive, first, kinds, manifest

from kubetune_api.engines import AUTO, Engine, parse_default
from kubetune_api.status import ConditionType, Phase, Reason
from kubetune_operator import observations, state
from kubetune_operator.settings import Settings
from kubetune_operator.state import Fact

PTJ, TJ = Engine.PYTORCHJOB, Engine.TRAINJOB
CHILDREN = {"checkpointClaim": "j-ckpt", "configMap": "j-config", "pytorchJob": "j-train"}
CREATED = ["EnsureChild:identity", "EnsureChild:checkpointClaim", "EnsureChild:configMap"]


def served(*engines: Engine) -> World:
    """A world whose API server serves these engines' resources (and the children are new)."""
    return World({(Fact.SERVED, str(e)): e in engines for e in Engine})


@dataclass(frozen=True)
class Row:
    status: dict[str, Any] | None  # the status as read (None: a new job)
    spec_engine: str | None
    default: Engine | str
    world: World
    actions: list[str]  # up to the commit (its first EnsureChild calls, or none)
    recorded: str | None  # status.engine committed (None: not written)
    reason: str | None = None  # ChildrenReady, Training and Ready's reason when the job waits
    names: tuple[str, ...] = field(default_factory=tuple)  # what that message names


ROWS = {
    # recorded wins: no discovery at all, whatever the default and whatever is served now
    "recorded/pytorchjob-default-trainjob-only-trainjob-served": Row(
        {"phase": "Pending", "engine": "PyTorchJob", "children": CHILDREN},
        None,
        TJ,
        served(TJ),
        ["UseEngine", *CREATED],
        "PyTorchJob",
    ),
    "recorded/trainjob-pytorchjob-installed-since": Row(
        {"phase": "Pending", "engine": "TrainJob"},
        None,
        AUTO,
        served(PTJ, TJ),
        ["UseEngine", *CREATED],
        "TrainJob",
    ),
    # a job that started before engines were recorded (children, no engine) ran on the PyTorchJob
    "recorded/older-than-the-record": Row(
        {"phase": "Training", "children": CHILDREN},
        None,
        TJ,
        served(TJ),
        ["UseEngine", *CREATED],
        "PyTorchJob",
    ),
    # forced by the spec: that engine or none, never a fallback
    "spec/trainjob-served": Row(
        None,
        "TrainJob",
        AUTO,
        served(PTJ, TJ),
        ["Read:served", "UseEngine", *CREATED],
        "TrainJob",
    ),
    "spec/trainjob-not-served": Row(
        None,
        "TrainJob",
        AUTO,
        served(PTJ),
        ["Read:served", "Commit"],
        None,
        Reason.ENGINE_NOT_SERVED,
        ("spec.engine", "trainjobs.trainer.kubeflow.org", "Kubeflow Trainer v2"),
    ),
    "spec/pytorchjob-over-the-default": Row(
        None, "PyTorchJob", TJ, served(PTJ, TJ), ["Read:served", "UseEngine", *CREATED], "PyTorchJob"
    ),
    "spec/pytorchjob-not-served": Row(
        None,
        "PyTorchJob",
        AUTO,
        served(TJ),
        ["Read:served", "Commit"],
        None,
        Reason.ENGINE_NOT_SERVED,
        ("pytorchjobs.kubeflow.org",),
    ),
    # the operator's default names an engine: as forced
    "default/trainjob-not-served": Row(
        None,
        None,
        TJ,
        served(PTJ),
        ["Read:served", "Commit"],
        None,
        Reason.ENGINE_NOT_SERVED,
        ("KUBETUNE_ENGINE", "trainjobs.trainer.kubeflow.org"),
    ),
    "default/pytorchjob": Row(
        None, None, PTJ, served(PTJ, TJ), ["Read:served", "UseEngine", *CREATED], "PyTorchJob"
    ),
    # auto: PyTorchJob where served, else TrainJob where served, else nothing created
    "auto/both-served": Row(
        None, None, AUTO, served(PTJ, TJ), ["Read:served", "UseEngine", *CREATED], "PyTorchJob"
    ),
    "auto/only-pytorchjob": Row(
        None, None, AUTO, served(PTJ), ["Read:served", "UseEngine", *CREATED], "PyTorchJob"
    ),
    "auto/only-trainjob": Row(
        None,
        None,
        AUTO,
        served(TJ),
        ["Read:served", "Read:served", "UseEngine", *CREATED],
        "TrainJob",
    ),
    "auto/neither": Row(
        None,
        None,
        AUTO,
        served(),
        ["Read:served", "Read:served", "Commit"],
        None,
        Reason.NO_TRAINING_ENGINE,
        ("pytorchjobs.kubeflow.org", "trainjobs.trainer.kubeflow.org"),
    ),
}


def _first_commit(row: Row) -> tuple[list[str], state.Commit | None]:
    """The pass's actions up to its commit, or up to its first children (the normal path goes on)."""
    obj = manifest(status=row.status, **({"engine": row.spec_engine} if row.spec_engine else {}))
    obs = first(obj, engine=None, default_engine=row.default)
    done, commit = drive(obs, row.world)
    names = kinds(done)
    if "EnsureChild:identity" in names:
        cut = names.index("EnsureChild:identity") + len(CREATED)
        return names[:cut], commit
    return names, commit


@pytest.mark.parametrize("name", list(ROWS))
def test_the_engine_of_a_job(name: str) -> None:
    row = ROWS[name]
    actions, commit = _first_commit(row)
    assert actions == row.actions
    assert commit is not None and commit.transition is not None
    status = commit.transition.status
    assert status.get("engine") == row.recorded
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if row.reason is None:
        assert conditions[ConditionType.CHILDREN_READY]["reason"] not in (
            Reason.NO_TRAINING_ENGINE,
            Reason.ENGINE_NOT_SERVED,
            Reason.ENGINE_NOT_IMPLEMENTED,
        )
        return
    # the job waits, Pending, nothing created, and says why on each condition a reader looks at
    assert not any(a.startswith("EnsureChild") for a in actions)
    assert commit.outcome.waiting and status["phase"] == Phase.PENDING
    for type_ in (ConditionType.CHILDREN_READY, ConditionType.TRAINING, ConditionType.READY):
        assert conditions[type_]["status"] == "False"
        assert conditions[type_]["reason"] == row.reason
        for word in row.names:
            assert word in conditions[type_]["message"], (type_, word)
    # a Warning event says it once, when it starts
    warnings = [e for e in commit.transition.events if e.type == "Warning"]
    assert [e.reason for e in warnings] == [row.reason]


def test_a_waiting_job_is_not_warned_again_and_takes_its_engine_once_served() -> None:
    """The pass after: the same condition sends no second event; once the CRD is served, the job
    starts on that engine and records it."""
    obj = manifest(engine="PyTorchJob")
    _, waiting = drive(first(obj, engine=None), served(TJ))
    assert waiting.transition is not None
    status = waiting.transition.status
    again = manifest(status=status, engine="PyTorchJob")
    _, commit = drive(first(again, engine=None), served(TJ))
    assert commit.transition is not None and commit.transition.events == []
    done, started = drive(first(again, engine=None), served(PTJ, TJ))
    assert "EnsureChild:identity" in kinds(done)
    assert started.transition is not None and started.transition.status["engine"] == "PyTorchJob"


def test_the_legacy_rule_needs_children() -> None:
    """A job that waited for its engine (a status without children) is not taken for an old one."""
    from kubetune_api.status import FineTuneJobStatus

    assert state.engine.recorded(FineTuneJobStatus(phase=Phase.PENDING)) is None
    waited = FineTuneJobStatus.model_validate({"phase": "Pending", "children": {}})
    assert state.engine.recorded(waited) is None
    old = FineTuneJobStatus.model_validate({"phase": "Succeeded", "children": CHILDREN})
    assert state.engine.recorded(old) == PTJ


def test_the_default_engine_setting() -> None:
    assert Settings.from_env({}).engine == AUTO
    assert Settings.from_env({"KUBETUNE_ENGINE": "TrainJob"}).engine == TJ
    assert Settings.from_env({"KUBETUNE_ENGINE": "PyTorchJob"}).engine == PTJ
    with pytest.raises(
        ValueError, match="KUBETUNE_ENGINE='trainjob': expected one of auto, PyTorchJob, TrainJob"
    ):
        parse_default("trainjob")


def test_served_is_read_from_discovery() -> None:
    listed = {"kind": "APIResourceList", "resources": [{"name": "trainjobs"}, {"name": "trainjobs/status"}]}
    assert observations.serves(listed, "trainjobs")
    assert not observations.serves(listed, "pytorchjobs")
    assert not observations.serves(None, "trainjobs")  # the group and version are not served (404)


def test_children_are_only_asked_for_with_an_engine() -> None:
    """No EnsureChild of any kind comes before the engine is known (nothing half-created)."""
    for row in ROWS.values():
        actions, _ = _first_commit(row)
        if "EnsureChild:identity" in actions:
            assert "UseEngine" in actions[: actions.index("EnsureChild:identity")]
