"""Nothing silently ignored (issue 33 item 4): the Python twins of kubetune_api.rules_ignored refuse
each field where it has no effect, naming it, and admit it where it has one (the same cases the
admission table sends to the real API server); and the fields kept while registration is off are named
where the job ends (its Registered condition and its Succeeded event)."""

from __future__ import annotations

import pytest
from tests.support.admission_table import INVALID, VALID
from tests.unit.test_state_advance import PTJ_SUCCEEDED, SUCCEEDED_REGISTERED, World, drive, first, manifest

from kubetune_api.admission import problems
from kubetune_api.rules_ignored import ignored_rules
from kubetune_api.spec import FineTuneJobSpec, LossWatchdog, StorageSpec
from kubetune_operator import state
from kubetune_operator.state import Child, Fact

REFUSED = {
    "data-revision-with-path",
    "data-subset-with-path",
    "data-seed-without-eval-fraction",
    "storage-size-with-existing-claim",
    "storage-access-mode-with-existing-claim",
    "storage-keep-with-existing-claim",
    "warmup-steps-with-constant",
    "warmup-ratio-with-constant",
    "watchdog-settings-while-off",
    "merge-lora-off-with-full",
    "columns-prompt-with-sharegpt",
    "columns-messages-with-alpaca",
    "columns-instruction-native",
    "columns-system-native",
    "roles-with-alpaca",
    "roles-with-text",
    "system-prompt-with-prompt-completion",
}
ADMITTED = {
    "data-seed-with-eval-fraction",
    "data-path-main-revision",
    "storage-existing-claim-defaults",
    "constant-without-warmup",
    "constant-with-warmup",
    "watchdog-off",
    "watchdog-tuned",
    "merge-lora-off-with-lora",
    "registration-off-with-alias-and-gate",
    "layout-sharegpt-mapped",
    "layout-alpaca-mapped",
    "layout-native-renamed",
    "layout-native-roles",
}


@pytest.mark.parametrize("case", [c for c in INVALID if c.id in REFUSED], ids=lambda c: c.id)
def test_a_field_without_effect_is_refused_naming_it(case: object) -> None:
    found = problems(case.manifest("j"))  # type: ignore[attr-defined]
    assert found and all(case.field in p for p in found), found  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", [c for c in VALID if c.id in ADMITTED], ids=lambda c: c.id)
def test_the_same_field_where_it_has_an_effect_is_admitted(case: object) -> None:
    assert problems(case.manifest("j")) == []  # type: ignore[attr-defined]


def test_every_case_is_in_the_table_and_every_rule_has_one() -> None:
    assert {c.id for c in INVALID} >= REFUSED and {c.id for c in VALID} >= ADMITTED
    fields = {c.field for c in INVALID if c.id in REFUSED}
    assert {r.message.split(" ")[0].rstrip(",") for r in ignored_rules()} <= fields | {
        "spec.training.warmupSteps",  # refused at lrScheduler (the field that makes warm-up moot)
        "spec.training.lossWatchdog.spikeFactor",  # refused at lossWatchdog.enabled
    }


def test_the_defaults_the_rules_compare_with_are_the_models_defaults() -> None:
    """A rule refuses a field only when it differs from its default: the two must be the same value."""
    from kubetune_api import rules_ignored as ri

    storage = StorageSpec()
    assert (storage.size, storage.access_mode) == (ri.DEFAULT_STORAGE_SIZE, ri.DEFAULT_ACCESS_MODE)
    watchdog = LossWatchdog().wire()
    assert all(watchdog[k] == d for k, d in ri.WATCHDOG_DEFAULTS)
    spec = FineTuneJobSpec.model_validate(
        {"model": {"name": "m"}, "dataset": {"name": "d"}, "training": {"maxSteps": 1}}
    )
    assert spec.dataset.seed == ri.DEFAULT_DATASET_SEED


def test_registration_fields_kept_while_registration_is_off_are_named_when_the_job_succeeds() -> None:
    obj = manifest(
        status={"phase": "Training"},
        registration={"enabled": False, "alias": "champion", "modelName": "ml.assistant"},
    )
    world = World({(Fact.TRAINING_JOB, "j-train"): PTJ_SUCCEEDED}, {Child.TRAINING_JOB: PTJ_SUCCEEDED})
    _, commit = drive(first(obj), world)
    conditions = {c["type"]: c for c in commit.transition.status["conditions"]}
    assert commit.transition.phase == "Succeeded"
    registered = conditions["Registered"]
    assert registered["reason"] == "RegistrationDisabled"
    assert registered["message"] == (
        "spec.registration.enabled is false; the registration fields set (spec.registration.alias, "
        "spec.registration.modelName) take effect only once it is true"
    )
    assert [(e.type, e.reason, e.message) for e in commit.transition.events] == [
        (
            "Normal",
            "Succeeded",
            "training finished; registration is disabled (spec.registration.alias, spec.registration.modelName "
            "unused)",
        )
    ]
    assert isinstance(commit, state.Commit)


@pytest.mark.parametrize(
    ("alias", "message"),
    [
        (
            "production",
            "alias 'production' not moved: spec.registration.enabled is false (done once it is true)",
        ),
        (None, "alias not removed: spec.registration.enabled is false (done once it is true)"),
    ],
    ids=["changed", "removed"],
)
def test_an_alias_changed_while_registration_is_off_is_held_and_said(alias: str | None, message: str) -> None:
    """Registered, then registration turned off and the alias changed: no alias Job; AliasSynced
    False (RegistrationDisabled) and a Warning say it waits; the phase stays Succeeded."""
    registration: dict[str, object] = {"enabled": False}
    if alias:
        registration["alias"] = alias
    obj = manifest(status=SUCCEEDED_REGISTERED, registration=registration)
    done, commit = drive(first(obj), World())
    assert done == [commit]  # nothing read, nothing created
    assert commit.transition.phase == "Succeeded"
    synced = next(c for c in commit.transition.status["conditions"] if c["type"] == "AliasSynced")
    assert (synced["status"], synced["reason"], synced["message"]) == (
        "False",
        "RegistrationDisabled",
        message,
    )
    assert [(e.type, e.reason, e.message) for e in commit.transition.events] == [
        ("Warning", "RegistrationDisabled", message)
    ]


def test_the_alias_unchanged_while_registration_is_off_says_nothing() -> None:
    obj = manifest(status=SUCCEEDED_REGISTERED, registration={"enabled": False, "alias": "champion"})
    _, commit = drive(first(obj), World())
    assert commit.transition.events == [] and "conditions" not in commit.transition.status
