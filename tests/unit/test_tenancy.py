"""Tenancy of the model registry: which names a namespace's jobs may use (kubetune_api.tenancy), the
operator's settings for it, and the state machine's answer to a job outside its names (Failed before
anything is created, whatever its status says; a job whose training object exists keeps training, but
no registration Job or alias Job is created for it: checked again before each)."""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO
from tests.unit.test_state_advance import (
    FAILED_REGISTRATION,
    PTJ_RUNNING,
    PTJ_SUCCEEDED,
    SUCCEEDED_REGISTERED,
    TRAINED_COND,
    World,
    annotated,
    cond,
    drive,
    first,
    kinds,
    manifest,
)

from kubetune_api import tenancy
from kubetune_api.spec import parse_job
from kubetune_api.status import ConditionType, FineTuneJobStatus, Reason
from kubetune_operator import state
from kubetune_operator.settings import Settings
from kubetune_operator.state import Child, Fact


def job(namespace: str = "team-a", name: str = "j", **registration: Any) -> Any:
    obj = manifest(name, registration=registration)
    obj["metadata"]["namespace"] = namespace
    return parse_job(obj)


def chained(registered: str) -> Any:
    obj = manifest("j", model={"registered": registered}, registration={"modelName": "team-a.m"})
    obj["metadata"]["namespace"] = "team-a"
    return parse_job(obj)


@pytest.mark.parametrize(
    ("the_job", "grants", "refused"),
    [
        (job(modelName="team-a.assistant"), {}, None),
        (job(modelName="team-b.assistant"), {}, "spec.registration.modelName 'team-b.assistant'"),
        # '-' is no separator: namespace team-a must not own team-a-b's names, nor team those of team-a
        (job(modelName="team-a-assistant"), {}, "spec.registration.modelName 'team-a-assistant'"),
        (job("team", modelName="team-a.assistant"), {}, "spec.registration.modelName 'team-a.assistant'"),
        # the default name is the job's own name: outside every namespace's prefix
        (job(name="assistant"), {}, "spec.registration.modelName (unset: the job's name) 'assistant'"),
        (job(modelName="shared-base"), {"team-a": ["shared-*"]}, None),
        (job(modelName="shared-base"), {"team-b": ["shared-*"]}, "'shared-base'"),
        (chained("models:/team-a.base@champion"), {}, None),
        (chained("models:/team-b.base/3"), {}, "spec.model.registered 'team-b.base'"),
        (job(modelName="team-a.m", experiment="kubetune/team-a/sweep"), {}, None),
        (job(modelName="team-a.m", experiment="kubetune/team-b"), {}, "spec.registration.experiment"),
        (job(modelName="team-a.m", experiment="kubetune/team-ab"), {}, "spec.registration.experiment"),
    ],
)
def test_names_outside_the_namespace_are_refused_with_the_field_and_the_rule(
    the_job: Any, grants: dict[str, list[str]], refused: str | None
) -> None:
    message = tenancy.refusal(the_job, "namespace-prefix", grants)
    if refused is None:
        assert message is None
    else:
        assert message is not None and refused in message
        ns = the_job.metadata.namespace
        # the rule of the field refused, and only that one
        if refused.startswith("spec.registration.experiment"):
            assert f"namespace {ns} may use experiments kubetune/{ns} or below it" in message
            assert "model names" not in message
        else:
            assert f"namespace {ns} may use model names starting with" in message
            assert "experiments" not in message
    # off: nothing is checked
    assert tenancy.refusal(the_job, "off", grants) is None


def test_settings_read_the_mode_and_the_grants() -> None:
    assert Settings.from_env({}).registry_tenancy == "off"
    s = Settings.from_env(
        {
            "KUBETUNE_REGISTRY_TENANCY": "namespace-prefix",
            "KUBETUNE_REGISTRY_MODEL_NAMES": '{"team-a": ["shared-*", "base.*"]}',
        }
    )
    assert s.registry_tenancy == "namespace-prefix"
    assert dict(s.registry_model_names) == {"team-a": ("shared-*", "base.*")}
    with pytest.raises(ValueError, match="registry tenancy 'namespace'"):
        Settings.from_env({"KUBETUNE_REGISTRY_TENANCY": "namespace"})
    with pytest.raises(ValueError, match="JSON object of namespace"):
        Settings.from_env({"KUBETUNE_REGISTRY_MODEL_NAMES": '["shared-*"]'})


REJECTED_COND = cond(ConditionType.READY, False, Reason.CHILD_REJECTED)
REFUSAL = "spec.registration.modelName 'team-b.m' is outside its namespace's names (registry tenancy ...)"


def test_a_new_job_outside_its_names_fails_on_its_first_pass_and_creates_nothing() -> None:
    obs = first(manifest("j"))
    actions, commit = drive(state.Observation(**{**obs.__dict__, "registry_refusal": REFUSAL}), World())
    assert actions == [commit]  # no read, no child
    status = FineTuneJobStatus.model_validate(
        {k: v for k, v in commit.transition.status.items() if v is not None}
    )
    assert status.phase == "Failed"
    ready = next(c for c in status.conditions or [] if c.type == "Ready")
    assert (ready.reason, ready.message) == ("ModelNameNotAllowed", REFUSAL)
    assert commit.outcome.invalid and commit.outcome.message == REFUSAL
    assert [(e.type, e.reason, e.message) for e in commit.transition.events] == [
        ("Warning", "ModelNameNotAllowed", REFUSAL)
    ]


def test_a_job_that_started_keeps_the_names_it_started_with() -> None:
    """An operator upgraded with tenancy on stops no job that had started: its training object
    exists and is the job's (read from the API server)."""
    obs = first(manifest("j", status={"phase": "Training"}))
    world = World({(Fact.TRAINING_JOB, "j-train"): PTJ_RUNNING}, {Child.TRAINING_JOB: PTJ_RUNNING})
    actions, commit = drive(state.Observation(**{**obs.__dict__, "registry_refusal": REFUSAL}), world)
    assert state.Read(Fact.TRAINING_JOB, "j-train") in actions
    assert "EnsureChild:trainingJob" in kinds(actions)
    assert commit.outcome.phase == "Training"


FORGED = [
    {"phase": "Pending", "conditions": []},  # what a user with the shared trainer identity's token writes
    {"phase": "Training"},
    {"phase": "Training", "engine": "PyTorchJob"},
    {"phase": "Registering", "conditions": [TRAINED_COND]},
    {"phase": "Pending", "children": {"checkpointClaim": "j-ckpt", "pytorchJob": "j-train"}},
    {"phase": "Failed", "conditions": [REJECTED_COND]},  # Failed with ChildRejected, the spec changed since
]


@pytest.mark.parametrize("status", FORGED, ids=lambda s: "-".join(f"{k}" for k in s))
@pytest.mark.parametrize("engine", [state.Engine.PYTORCHJOB, None], ids=["engine-known", "engine-unknown"])
@pytest.mark.parametrize(
    "training_object",
    [None, {"metadata": {"name": "j-train", "ownerReferences": [{"uid": "uid-other"}]}}],
    ids=["no-training-object", "not-ours"],
)
def test_a_status_that_says_started_without_a_training_object_of_the_job_is_refused(
    status: dict[str, Any], engine: Any, training_object: Any
) -> None:
    """The status is no proof that a job started: whoever may patch it (a shared trainer
    ServiceAccount) can write any phase, engine or children. Without the job's own training object
    the job is refused before anything is created, however its status reads."""
    obs = replace(first(manifest("j", status=status), engine=engine), generation=2)  # the spec changed
    world = World({(Fact.TRAINING_JOB, "j-train"): training_object, (Fact.SERVED, "*"): True})
    actions, commit = drive(state.Observation(**{**obs.__dict__, "registry_refusal": REFUSAL}), world)
    assert not [a for a in actions if isinstance(a, (state.EnsureChild, state.FollowChild))], kinds(actions)
    assert commit.outcome.phase == "Failed" and commit.outcome.invalid
    raw = {k: v for k, v in commit.transition.status.items() if v is not None}
    ready = next(c for c in FineTuneJobStatus.model_validate(raw).conditions or [] if c.type == "Ready")
    assert (ready.reason, ready.message) == ("ModelNameNotAllowed", REFUSAL)


def _refused(obj: dict[str, Any], world: World) -> tuple[list[str], state.Commit, FineTuneJobStatus]:
    obs = first(obj)
    actions, commit = drive(state.Observation(**{**obs.__dict__, "registry_refusal": REFUSAL}), world)
    raw = {k: v for k, v in commit.transition.status.items() if v is not None}
    return kinds(actions), commit, FineTuneJobStatus.model_validate(raw)


def _condition(status: FineTuneJobStatus, ctype: str) -> tuple[str, str]:
    found = next(c for c in status.conditions or [] if c.type == ctype)
    return found.reason, found.message or ""


TRAINED = World({(Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED}, {Child.TRAINING_JOB: PTJ_SUCCEEDED})


@pytest.mark.parametrize(
    "status",
    [
        {"phase": "Training"},  # started before tenancy was on (its training object exists)
        {"phase": "Registering", "conditions": [TRAINED_COND]},  # training finished (the status says)
    ],
    ids=["training", "registering"],
)
def test_a_job_past_its_first_pass_creates_no_registration_job_outside_its_names(
    status: dict[str, Any],
) -> None:
    """The rule is checked again before the registration Job: the job trains (it had started), then
    ends Failed with ModelNameNotAllowed, the rule in the message, and nothing registered."""
    done, commit, status_after = _refused(manifest("j", status=status), TRAINED)
    assert "EnsureChild:registrationJob" not in done
    assert "EnsureChild:trainingJob" in done  # a job that started is not stopped
    assert status_after.phase == "Failed"
    for ctype in ("Registered", "Ready"):
        reason, message = _condition(status_after, ctype)
        assert reason == "ModelNameNotAllowed"
        assert REFUSAL in message and "registration Job j-register not created" in message
    assert [(e.type, e.reason) for e in commit.transition.events] == [("Warning", "ModelNameNotAllowed")]


def test_a_registration_retry_outside_its_names_creates_no_registration_job() -> None:
    """Failed in registration (before tenancy was on), the retry annotation set: refused, not registered."""
    world = World({**TRAINED.reads, (Fact.REGISTRATION_JOB, "j-register"): None}, TRAINED.children)
    done, _, status_after = _refused(annotated(manifest(status=FAILED_REGISTRATION), "1"), world)
    assert "EnsureChild:registrationJob" not in done
    assert status_after.phase == "Failed"
    assert _condition(status_after, "Ready")[0] == "ModelNameNotAllowed"


def test_an_alias_move_outside_its_names_creates_no_alias_job() -> None:
    """Succeeded and registered (before tenancy was on), then registration.alias changed: no alias Job,
    AliasSynced False with the rule, the job still Succeeded with its version's alias unchanged."""
    obj = manifest(status=SUCCEEDED_REGISTERED, registration={"alias": "production"})
    done, commit, status_after = _refused(obj, World())
    assert done == ["Commit"]  # nothing read, nothing created
    assert commit.transition.phase == "Succeeded" and commit.outcome.phase == "Succeeded"
    reason, message = _condition(status_after, "AliasSynced")
    assert reason == "ModelNameNotAllowed"
    assert message == f"alias 'production' not moved: {REFUSAL}"
    assert "registeredModel" not in commit.transition.status  # the alias the version carries stays
    assert [(e.type, e.reason) for e in commit.transition.events] == [("Warning", "ModelNameNotAllowed")]


def test_the_first_job_of_getting_started_is_allowed_in_namespace_demo_by_the_default_tenancy() -> None:
    """examples/first-job.yaml (shown verbatim on docs/getting-started.md) runs in namespace demo under
    the chart's default ``registry.tenancy: namespace-prefix``: its model name and experiment are demo's."""
    obj = yaml.safe_load((REPO / "examples" / "first-job.yaml").read_text())
    obj["metadata"]["namespace"] = "demo"
    assert tenancy.refusal(parse_job(obj), "namespace-prefix", {}) is None


NOTE = re.compile(r"^#\s+(sed .*) examples/(\S+) \| kubectl -n (\S+) apply -f -$", re.M)
# examples that are no cluster job of a chart install: tiny-local.yaml is `kubetune run --local`
LOCAL_ONLY = {"tiny-local.yaml"}


def _sed(expressions: list[str], text: str) -> str:
    """The few ``s<d>from<d>to<d>`` expressions the examples' notes use, as sed applies them."""
    for e in expressions:
        assert e.startswith("s"), e
        d = e[1]
        _, old, new, flags = e.split(d)
        assert flags == "", e
        text = "\n".join(line.replace(old, new, 1) for line in text.split("\n"))
    return text


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (REPO / "examples").glob("*.yaml") if p.name not in LOCAL_ONLY)
)
def test_every_cluster_example_is_allowed_by_the_default_tenancy_as_its_note_says_to_apply_it(
    name: str,
) -> None:
    text = (REPO / "examples" / name).read_text()
    if name == "first-job.yaml":  # docs/getting-started.md applies it as it is in namespace demo
        namespace, applied = "demo", text
    else:
        notes = NOTE.findall(text)
        assert len(notes) == 1, f"examples/{name}: a tenancy note with the command that applies it"
        ((sed, named, namespace),) = notes
        assert named == name
        words = shlex.split(sed)
        assert words[0] == "sed" and words[1::2] == ["-e"] * (len(words) // 2)
        applied = _sed(words[2::2], text)
    for obj in yaml.safe_load_all(applied):
        obj["metadata"]["namespace"] = namespace
        assert tenancy.refusal(parse_job(obj), "namespace-prefix", {}) is None, name
