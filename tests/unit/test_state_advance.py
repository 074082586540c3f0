"""``state.advance`` from raw facts: every way out of a final phase the reconciler used to choose itself
(registration retried, registration turned on later, the alias moved) and chaining's verdict (the
parent pending, failed, missing, succeeded), as rows of one table: the facts a pass reads, the actions
the machine asks for, in order, and the status it commits."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from kubetune_api.spec import RETRY_REGISTRATION_ANNOTATION, parse_job
from kubetune_api.status import ConditionType, EventReason, FineTuneJobStatus, Phase, Reason
from kubetune_operator import observations, state
from kubetune_operator.state import Child, Fact

T0 = "2026-12-01T00:00:00Z"
UID = "uid-j"


def cond(ctype: str, ok: bool, reason: str) -> dict[str, Any]:
    return {
        "type": ctype,
        "status": str(ok),
        "reason": reason,
        "lastTransitionTime": T0,
        "observedGeneration": 1,
    }


TRAINED_COND = cond(ConditionType.TRAINING, False, Reason.TRAINING_SUCCEEDED)
FAILED_REGISTRATION = {
    "phase": "Failed",
    "conditions": [cond(ConditionType.READY, False, Reason.REGISTRATION_FAILED), TRAINED_COND],
}
SUCCEEDED_UNREGISTERED = {
    "phase": "Succeeded",
    "conditions": [cond(ConditionType.REGISTERED, False, Reason.REGISTRATION_DISABLED)],
}
MODEL = {"name": "m", "version": "2", "uri": "models:/m/2", "alias": "champion"}
SUCCEEDED_REGISTERED = {
    "phase": "Succeeded",
    "conditions": [cond(ConditionType.READY, True, Reason.SUCCEEDED), TRAINED_COND],
    "registeredModel": MODEL,
}


def manifest(name: str = "j", *, status: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": {"name": "Qwen/Qwen2-0.5B"},
            "dataset": {"name": "trl-lib/Capybara"},
            "training": {"maxSteps": 60},
            **spec,
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def ours(name: str, **status: Any) -> dict[str, Any]:
    meta = {"name": name, "uid": f"uid-{name}", "ownerReferences": [{"uid": "uid-j", "kind": "FineTuneJob"}]}
    return {"metadata": meta, "status": status}


def job_condition(kind: str) -> dict[str, Any]:
    return {"conditions": [{"type": kind, "status": "True"}]}


PTJ_SUCCEEDED = ours("j-train", **job_condition("Succeeded"))
PTJ_RUNNING = ours("j-train", **job_condition("Running"))


@dataclass(frozen=True)
class World:
    """What the pass would read and find: objects by (fact, name), children by kind, and the
    registration (or alias) Job as observed."""

    reads: dict[tuple[Fact, str], Any] = field(default_factory=dict)  # name "*": whatever the name
    children: dict[Child, dict[str, Any]] = field(default_factory=dict)
    registration: state.RegistrationObservation = field(default_factory=state.RegistrationObservation)
    workloads: list[dict[str, Any]] = field(default_factory=list)  # Kueue's, of the training object


def drive(obs: state.Observation, world: World) -> tuple[list[Any], state.Commit]:
    """Carry ``advance``'s actions out against ``world`` until it commits: the actions, and the commit."""
    done: list[Any] = []
    for _ in range(50):
        for action in state.advance(obs).actions:
            done.append(action)
            match action:
                case state.Commit():
                    return done, action
                case state.UseEngine(engine):
                    obs = replace(obs, engine=engine)
                case state.Read(fact, name, held):
                    found = world.reads.get((fact, name), world.reads.get((fact, "*")))
                    obs = replace(obs, reads={**obs.reads, (fact, name, held): found})
                case state.EnsureChild(child):
                    live = world.children.get(child)
                    obs = replace(obs, had={**obs.had, child: state.Had(live or {}, live is None)})
                    if child == Child.TRAINING_JOB:
                        obs = replace(obs, training=observations.training_observation(live))
                    elif child == Child.REGISTRATION_JOB:
                        obs = replace(obs, registration=world.registration)
                    elif child == Child.ALIAS_JOB:
                        obs = replace(obs, alias_job=world.registration)
                case state.FollowChild(child, _, live):
                    obs = replace(
                        obs, had={**obs.had, child: state.Had(live)}, registration=world.registration
                    )
                case state.ObserveTraining(kueue=kueue):
                    obs = replace(obs, observed=obs.observed | {Child.TRAINING_JOB})
                    if kueue:
                        live = obs.had[Child.TRAINING_JOB].obj or {}
                        uid = (live.get("metadata") or {}).get("uid")
                        obs = replace(obs, kueue=observations.kueue_workload(world.workloads, uid))
                case state.DeleteChild(_, _, name, _):
                    obs = replace(obs, deleted=obs.deleted | {name})
    raise AssertionError(f"no commit after {done}")


def first(obj: dict[str, Any], **kw: Any) -> state.Observation:
    """A pass's first observation of ``obj`` (as the reconciler makes it), on the PyTorchJob unless
    ``engine`` says otherwise (the engine's own rows: tests/unit/test_state_engine.py)."""
    raw = obj.get("status") or {}
    kw.setdefault("engine", state.Engine.PYTORCHJOB)
    return state.Observation(
        generation=1,
        now=T0,
        previous=FineTuneJobStatus.model_validate(raw) if raw else None,
        job=parse_job(obj),
        annotations=obj["metadata"].get("annotations") or {},
        namespace="ml",
        preparation_enabled=False,
        **kw,
    )


def annotated(obj: dict[str, Any], value: str) -> dict[str, Any]:
    obj["metadata"]["annotations"] = {RETRY_REGISTRATION_ANNOTATION: value}
    return obj


def kinds(actions: list[Any]) -> list[str]:
    """Each action as ``Kind`` or ``Kind:child-or-fact``."""
    out = []
    for a in actions:
        what = getattr(a, "child", None) or getattr(a, "fact", None)
        out.append(f"{type(a).__name__}:{what}" if what else type(a).__name__)
    return out


NORMAL_PATH = ["EnsureChild:identity", "EnsureChild:checkpointClaim", "EnsureChild:configMap"]
TRAINED_PATH = [
    *NORMAL_PATH,
    "Read:trainingJob",  # the status says trained: is the training object still there?
    "EnsureChild:trainingJob",
    "ObserveTraining",
]
REGISTERING = state.RegistrationObservation(True, "Running")
FAILED_REG_JOB = ours("j-register", **job_condition("Failed"))
PARENT_RECORDED = {"job": "a", "uid": "uid-a", "path": "final", "claim": "a-ckpt", "method": "full"}
PARENT_SUCCEEDED = {
    "phase": "Succeeded",
    "children": {"checkpointClaim": "a-ckpt"},
    "registeredModel": {"name": "a", "version": "1", "uri": "models:/a/1"},
}
FROM_A = {"model": {"fromJob": {"name": "a", "checkpoint": "final"}}}


@dataclass(frozen=True)
class Row:
    obj: dict[str, Any]
    world: World
    actions: list[str]
    phase: Phase
    status: dict[str, Any] = field(default_factory=dict)  # fields the committed status must hold
    conditions: dict[str, str] = field(default_factory=dict)  # condition type: reason
    events: tuple[str, ...] | None = None


ROWS = {
    # Failed in registration, the retry annotation set anew, the failed Job gone: registered again
    "retry/asked-job-gone": Row(
        annotated(manifest(status=FAILED_REGISTRATION), "1"),
        World(
            {(Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED},
            {Child.TRAINING_JOB: PTJ_SUCCEEDED},
            REGISTERING,
        ),
        ["Read:registrationJob", *TRAINED_PATH, "EnsureChild:registrationJob", "Commit"],
        Phase.REGISTERING,
        {"registrationRetry": "1", "completionTime": None},
        events=(EventReason.REGISTRATION_RETRIED,),
    ),
    # ... the failed Job still there: deleted by its uid, the job stays Failed until its deletion's pass
    "retry/asked-job-there": Row(
        annotated(manifest(status=FAILED_REGISTRATION), "1"),
        World({(Fact.REGISTRATION_JOB, "j-register"): FAILED_REG_JOB}),
        ["Read:registrationJob", "DeleteChild", "Commit"],
        Phase.FAILED,
        {"observedGeneration": 1},
    ),
    # ... asked with registration turned off: training finished, nothing registered
    "retry/asked-registration-off": Row(
        annotated(manifest(status=FAILED_REGISTRATION, registration={"enabled": False}), "2"),
        World({(Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED}, {Child.TRAINING_JOB: PTJ_SUCCEEDED}),
        ["Read:registrationJob", *TRAINED_PATH, "Read:registrationJob", "Commit"],
        Phase.SUCCEEDED,
        {"registrationRetry": "2"},
        {ConditionType.REGISTERED: Reason.REGISTRATION_DISABLED},
    ),
    # a registration Job that has not failed (a retry whose status write was lost): followed
    "retry/follow-a-running-job": Row(
        manifest(status=FAILED_REGISTRATION),
        World(
            {
                (Fact.REGISTRATION_JOB, "j-register"): ours("j-register"),
                (Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED,
            },
            {Child.TRAINING_JOB: PTJ_SUCCEEDED, Child.REGISTRATION_JOB: ours("j-register")},
            REGISTERING,
        ),
        ["Read:registrationJob", *TRAINED_PATH, "EnsureChild:registrationJob", "Commit"],
        Phase.REGISTERING,
        events=(),
    ),
    # nobody asked: Failed stays
    "retry/not-asked": Row(
        manifest(status=FAILED_REGISTRATION),
        World({(Fact.REGISTRATION_JOB, "j-register"): FAILED_REG_JOB}),
        ["Read:registrationJob", "Commit"],
        Phase.FAILED,
        {"observedGeneration": 1},
    ),
    # Succeeded without registration, registration turned on, the training object there and Succeeded
    "turned-on/registers": Row(
        manifest(status=SUCCEEDED_UNREGISTERED),
        World(
            {(Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED},
            {Child.TRAINING_JOB: PTJ_SUCCEEDED},
            REGISTERING,
        ),
        [
            "Read:trainingJob",  # is training known to have finished?
            *NORMAL_PATH,
            "EnsureChild:trainingJob",
            "ObserveTraining",
            "EnsureChild:registrationJob",
            "Commit",
        ],
        Phase.REGISTERING,
        {"completionTime": None},
        events=(EventReason.REGISTRATION_ENABLED,),
    ),
    # ... training not known to have finished (its object gone, the status older): stays Succeeded
    "turned-on/training-unknown": Row(
        manifest(status=SUCCEEDED_UNREGISTERED),
        World(),
        ["Read:trainingJob", "Commit"],
        Phase.SUCCEEDED,
        {"observedGeneration": 1},
    ),
    # Succeeded, registration.alias changed: the alias Job moves it (the config first), still Succeeded
    "alias/moves": Row(
        manifest(status=SUCCEEDED_REGISTERED, registration={"alias": "production"}),
        World({(Fact.ALIAS_JOBS, "*"): []}, registration=REGISTERING),
        ["Read:aliasJobs", "EnsureChild:configMap", "EnsureChild:aliasJob", "Commit"],
        Phase.SUCCEEDED,
        conditions={ConditionType.ALIAS_SYNCED: Reason.MOVING_ALIAS},
    ),
    # ... an earlier change's alias Job still running: it finishes first
    "alias/waits-for-an-earlier-move": Row(
        manifest(status=SUCCEEDED_REGISTERED, registration={"alias": "production"}),
        World({(Fact.ALIAS_JOBS, "*"): [ours("j-alias-staging")]}),
        ["Read:aliasJobs", "Commit"],
        Phase.SUCCEEDED,
        conditions={ConditionType.ALIAS_SYNCED: Reason.MOVING_ALIAS},
    ),
    # ... the alias the version carries: nothing to do
    "alias/settled": Row(
        manifest(status=SUCCEEDED_REGISTERED, registration={"alias": "champion"}),
        World(),
        ["Commit"],
        Phase.SUCCEEDED,
        {"observedGeneration": 1},
    ),
    # spec.model.fromJob: the parent still training holds the job, nothing is created
    "chained/parent-pending": Row(
        manifest("j", **FROM_A),
        World({(Fact.FINETUNEJOB, "a"): manifest("a", status={"phase": "Training"})}),
        ["Read:fineTuneJob", "Commit"],
        Phase.PENDING,
        conditions={ConditionType.PARENT_READY: Reason.WAITING_FOR_PARENT},
        events=(Reason.WAITING_FOR_PARENT,),
    ),
    # ... the parent Failed: so does the job
    "chained/parent-failed": Row(
        manifest("j", **FROM_A),
        World({(Fact.FINETUNEJOB, "a"): manifest("a", status={"phase": "Failed"})}),
        ["Read:fineTuneJob", "Commit"],
        Phase.FAILED,
        conditions={ConditionType.PARENT_READY: Reason.PARENT_FAILED},
    ),
    # ... the parent it started from is gone: Failed, its running training object stopped
    "chained/parent-missing": Row(
        manifest("j", status={"phase": "Training", "parent": PARENT_RECORDED}, **FROM_A),
        World({(Fact.TRAINING_JOB, "j-train"): PTJ_RUNNING}),
        ["Read:fineTuneJob", "Read:trainingJob", "StopTraining", "Commit"],
        Phase.FAILED,
        conditions={ConditionType.PARENT_READY: Reason.PARENT_MISSING},
    ),
    # ... the parent Succeeded: the children are created from its model
    "chained/parent-succeeded": Row(
        manifest("j", **FROM_A),
        World({(Fact.FINETUNEJOB, "a"): manifest("a", status=PARENT_SUCCEEDED)}),
        [
            "Read:fineTuneJob",
            *NORMAL_PATH,
            "EnsureChild:trainingJob",
            "SyncSuspend",  # a training object not ended follows spec.suspend
            "ObserveTraining",
            "Commit",
        ],
        Phase.PENDING,
        {"parent": {"job": "a", "path": "final"}},
        {ConditionType.PARENT_READY: Reason.PARENT_SUCCEEDED},
    ),
}


def _holds(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, dict):
        return isinstance(actual, dict) and all(_holds(actual.get(k), v) for k, v in wanted.items())
    return bool(actual == wanted)


@pytest.mark.parametrize("name", list(ROWS))
def test_every_exit_and_parent_verdict_from_raw_facts(name: str) -> None:
    row = ROWS[name]
    done, commit = drive(first(row.obj), row.world)
    assert kinds(done) == row.actions
    assert commit.transition is not None and commit.outcome.phase == row.phase
    status = commit.transition.status
    assert status.get("phase", commit.transition.phase) == row.phase
    for key, value in row.status.items():
        assert key in status and _holds(status[key], value), (key, status.get(key))
    got = {c["type"]: c["reason"] for c in status.get("conditions", [])}
    for ctype, reason in row.conditions.items():
        assert got.get(ctype) == reason, (ctype, got)
    if row.events is not None:
        assert tuple(e.reason for e in commit.transition.events) == row.events


def test_a_retry_deletes_only_the_failed_job_it_owns_by_uid() -> None:
    stranger = {**FAILED_REG_JOB, "metadata": {"name": "j-register", "uid": "x"}}
    obj = annotated(manifest(status=FAILED_REGISTRATION), "1")
    done, _ = drive(first(obj), World({(Fact.REGISTRATION_JOB, "j-register"): FAILED_REG_JOB}))
    assert [a for a in done if isinstance(a, state.DeleteChild)] == [
        state.DeleteChild("batch/v1", "Job", "j-register", "uid-j-register")
    ]
    done, _ = drive(first(obj), World({(Fact.REGISTRATION_JOB, "j-register"): stranger}))
    assert not [a for a in done if isinstance(a, state.DeleteChild)]


def test_a_refused_child_request_ends_in_a_commit_with_backoff() -> None:
    refused = state.ChildError("create", "PyTorchJob", "j-train", 403, "Forbidden", "quota", attempts=2)
    obs = replace(first(manifest()), child_error=refused)
    done, commit = drive(obs, World())
    assert kinds(done) == ["Commit"]
    assert commit.outcome.waiting and commit.outcome.retry_in is not None and not commit.forget_refusals


def test_wanted_holds_training_back_until_the_preparation_succeeded() -> None:
    obs = replace(first(manifest()), preparation_enabled=True)
    had = {c: state.Had({}) for c in (Child.IDENTITY, Child.CHECKPOINT_CLAIM, Child.CONFIG_MAP)}
    assert state.wanted(obs)[-1] == Child.CONFIG_MAP
    obs = replace(obs, had=had)
    assert state.wanted(obs)[-1] == Child.PREPARATION_JOB
    running = observations.PreparationObservation(state="Running")
    obs = replace(obs, had={**had, Child.PREPARATION_JOB: state.Had({})}, preparation=running)
    assert state.wanted(obs)[-1] == Child.PREPARATION_JOB
    obs = replace(obs, preparation=replace(running, state="Succeeded"))
    assert state.wanted(obs)[-1] == Child.TRAINING_JOB
