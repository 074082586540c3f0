"""The trainer's test hook (``KUBETUNE_FAULT_INJECT``) is honoured only where the platform turned it
on (``KUBETUNE_FAULT_INJECTION``, the chart's ``operator.faultInjection``; issue 33): the rules admit
it, but on an operator that does not honour it a job that sets it fails before anything is created
(``InvalidSpec``, naming the entry), and no pod of any job gets it. The real operator's answer, under
its real RBAC: tests/integration/test_confused_deputy.py ("fault-injection-hook")."""

from __future__ import annotations

from typing import Any

import pytest
from tests.unit.test_chart import operator_container, render
from tests.unit.test_state_advance import PTJ_RUNNING, World, drive, first, kinds, manifest

from kubetune_api import pod_env as names
from kubetune_api.spec import parse_job
from kubetune_api.status import FineTuneJobStatus
from kubetune_operator import builders, reconcile, state
from kubetune_operator.pod_env import Context, Pod, env
from kubetune_operator.settings import Settings
from kubetune_operator.state import Child, Fact

HOOK = {"name": names.FAULT_INJECT_ENV, "value": "cuda-oom:6:4"}


def _status(commit: state.Commit) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(
        {k: v for k, v in commit.transition.status.items() if v is not None}
    )


def test_the_setting_is_off_unless_the_platform_turns_it_on() -> None:
    assert Settings().fault_injection is False
    assert Settings.from_env({}).fault_injection is False
    assert Settings.from_env({"KUBETUNE_FAULT_INJECTION": "true"}).fault_injection is True
    assert Settings.from_env({"KUBETUNE_FAULT_INJECTION": "false"}).fault_injection is False
    with pytest.raises(ValueError, match="KUBETUNE_FAULT_INJECTION='on'"):
        Settings.from_env({"KUBETUNE_FAULT_INJECTION": "on"})


def test_the_refusal_names_the_entry_and_says_how_to_turn_it_on() -> None:
    job = parse_job(manifest(env=[{"name": "NCCL_DEBUG", "value": "INFO"}, HOOK]))
    message = names.fault_injection_refusal(job.spec.env, allowed=False)
    assert message is not None
    assert message.startswith("spec.env[1].name: KUBETUNE_FAULT_INJECT is the trainer's test hook")
    assert "operator.faultInjection" in message
    assert "cuda-oom" not in message  # the entry, not its value
    assert names.fault_injection_refusal(job.spec.env, allowed=True) is None
    # other entries, or none, are no refusal
    for entries in ([], [{"name": "NCCL_DEBUG", "value": "INFO"}]):
        assert names.fault_injection_refusal(parse_job(manifest(env=entries)).spec.env, allowed=False) is None
    assert names.fault_injection_refusal(None, allowed=False) is None


@pytest.mark.parametrize("allowed", [False, True])
def test_the_reconcilers_observation_carries_the_refusal_of_its_settings(allowed: bool) -> None:
    class Ctx:
        settings = Settings(fault_injection=allowed)

    obs = reconcile.observe(Ctx(), manifest(env=[HOOK]))  # type: ignore[arg-type]
    assert (obs.fault_injection_refusal is None) is allowed
    assert reconcile.observe(Ctx(), manifest()).fault_injection_refusal is None  # type: ignore[arg-type]


def _refused(obj: dict[str, Any], world: World) -> tuple[list[Any], state.Commit]:
    obs = first(obj)
    message = names.fault_injection_refusal(obs.job.spec.env if obs.job else None, allowed=False)
    assert message is not None
    return drive(state.Observation(**{**obs.__dict__, "fault_injection_refusal": message}), world)


def test_a_new_job_that_sets_the_hook_fails_on_its_first_pass_and_creates_nothing() -> None:
    actions, commit = _refused(manifest("j", env=[HOOK]), World())
    assert actions == [commit]  # no read, no child
    status = _status(commit)
    assert status.phase == "Failed"
    ready = next(c for c in status.conditions or [] if c.type == "Ready")
    assert ready.reason == "InvalidSpec"
    assert ready.message.startswith("spec.env[0].name: KUBETUNE_FAULT_INJECT")
    assert commit.outcome.invalid
    assert [(e.type, e.reason) for e in commit.transition.events] == [("Warning", "InvalidSpec")]


def test_a_forged_status_does_not_unlock_it_but_a_started_job_keeps_training() -> None:
    """Whoever may patch a status can write phase Training; only the job's own training object,
    read from the API server, shows that it started (made while the setting was on)."""
    forged = manifest("j", env=[HOOK], status={"phase": "Training", "engine": "PyTorchJob"})
    actions, commit = _refused(forged, World({(Fact.TRAINING_JOB, "j-train"): None}))
    assert not [a for a in actions if isinstance(a, (state.EnsureChild, state.FollowChild))], kinds(actions)
    assert commit.outcome.phase == "Failed"
    world = World({(Fact.TRAINING_JOB, "j-train"): PTJ_RUNNING}, {Child.TRAINING_JOB: PTJ_RUNNING})
    actions, commit = _refused(forged, world)
    assert "EnsureChild:trainingJob" in kinds(actions)
    assert commit.outcome.phase == "Training"


def test_no_pod_gets_the_hook_unless_the_operator_honours_it() -> None:
    job = parse_job(manifest(env=[HOOK, {"name": "NCCL_DEBUG", "value": "INFO"}]))
    for allowed in (False, True):
        settings = Settings(fault_injection=allowed)
        for pod in Pod:
            got = {e["name"]: e.get("value") for e in env(Context(job, settings, pod, "img", "c"))}
            assert got["NCCL_DEBUG"] == "INFO"
            assert (names.FAULT_INJECT_ENV in got) is allowed, (pod, allowed)
        for engine in state.Engine:
            containers = list(_containers(builders.build_training(engine, job, settings)))
            assert containers, engine
            for c in containers:
                assert (names.FAULT_INJECT_ENV in {e["name"] for e in c.get("env", [])}) is allowed, engine


def _containers(node: Any) -> Any:
    """Every container (a mapping with a command and an env) anywhere in ``node``."""
    if isinstance(node, dict):
        if "env" in node and "image" in node:
            yield node
        for value in node.values():
            yield from _containers(value)
    elif isinstance(node, list):
        for value in node:
            yield from _containers(value)


@pytest.mark.parametrize(
    ("values", "expected"), [((), "false"), (("--set", "operator.faultInjection=true"), "true")]
)
def test_the_chart_sets_it_off_by_default(values: tuple[str, ...], expected: str) -> None:
    by_name = {e["name"]: e.get("value") for e in operator_container(render(*values))["env"]}
    assert by_name["KUBETUNE_FAULT_INJECTION"] == expected
    assert Settings.from_env(by_name).fault_injection is (expected == "true")
