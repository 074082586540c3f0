"""Chained jobs (spec.model.fromJob), operator side: the parent decision, the state machine's
ParentReady condition, and what the children mount and read once the parent Succeeded."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import yaml

from kubetune_api.spec import FineTuneJob, parse_job
from kubetune_api.status import FineTuneJobStatus, Phase, Reason
from kubetune_api.trainer_config import TrainerConfig
from kubetune_operator import builders, parent, state
from kubetune_operator.settings import Settings
from kubetune_operator.state import chaining

SETTINGS = Settings(trainer_image="registry.example.com/kubetune/trainer:1.2.3")
NOW = "2026-12-03T17:00:00Z"


def manifest(
    name: str, model: dict[str, Any], *, status: dict[str, Any] | None = None, **spec: Any
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "model": model,
            "dataset": {"name": "trl-lib/Capybara"},
            "training": {"maxSteps": 60},
            **spec,
        },
    }
    if status is not None:
        obj["status"] = status
    return obj


def from_job(name: str, parent_name: str, checkpoint: str = "final", **kw: Any) -> dict[str, Any]:
    return manifest(name, {"fromJob": {"name": parent_name, "checkpoint": checkpoint}}, **kw)


SUCCEEDED = {
    "phase": "Succeeded",
    "mlflow": {"runId": "run-a"},
    "registeredModel": {"name": "a", "version": "3", "uri": "models:/a/3"},
    "children": {"checkpointClaim": "a-ckpt"},
    "checkpoints": {"bestStep": 40, "latestStep": 60},
}


def reader(*objs: dict[str, Any]) -> chaining.Reader:
    by_name = {o["metadata"]["name"]: o for o in objs}
    return lambda name: copy.deepcopy(by_name.get(name))


def job_of(obj: dict[str, Any]) -> FineTuneJob:
    return parse_job(obj)


def test_no_parent_job_means_no_say() -> None:
    job = job_of(manifest("b", {"name": "Qwen/Qwen2-0.5B"}))
    assert chaining.observe(job, reader()) is None


def test_a_parent_never_seen_is_waited_for() -> None:
    found = chaining.observe(job_of(from_job("b", "a")), reader())
    assert found is not None and found.state == "waiting"
    assert found.reason == Reason.WAITING_FOR_PARENT
    assert "FineTuneJob a" in found.message and "does not exist yet" in found.message


@pytest.mark.parametrize("phase", [None, "Pending", "Preparing", "Training", "Registering", "Suspended"])
def test_a_running_parent_is_waited_for_with_its_phase(phase: str | None) -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status={"phase": phase} if phase else None)
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and (found.state, found.reason) == ("waiting", Reason.WAITING_FOR_PARENT)
    assert f"now {phase or 'Pending'}" in found.message


def test_a_failed_parent_fails_the_child_with_its_reason() -> None:
    ready = {"type": "Ready", "status": "False", "reason": "DatasetEmpty", "message": "no rows left"}
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status={"phase": "Failed", "conditions": [ready]})
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and (found.state, found.reason) == ("failed", Reason.PARENT_FAILED)
    assert "DatasetEmpty: no rows left" in found.message and "FineTuneJob a" in found.message


def test_a_succeeded_lora_parent_gives_its_final_model_and_base() -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED, method="lora")
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and (found.state, found.reason) == ("ready", Reason.PARENT_SUCCEEDED)
    assert found.status is not None
    assert found.status.wire() == {
        "job": "a",
        "uid": "uid-a",
        "runId": "run-a",
        "modelUri": "models:/a/3",
        "path": "final",
        "claim": "a-ckpt",
        "method": "lora",
        "base": "/var/lib/kubetune-parent/prepared/model",
    }


def test_a_parent_whose_trainer_never_reported_a_run_gives_its_registered_versions_run() -> None:
    # status.mlflow is the trainer's; the registration's run is kept with the version (registeredModel)
    status = {**SUCCEEDED, "registeredModel": {**SUCCEEDED["registeredModel"], "runId": "run-r"}}
    del status["mlflow"]
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=status, method="lora")
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and found.status is not None
    assert found.status.run_id == "run-r"


def test_a_full_parent_needs_no_base_and_its_existing_claim_is_read() -> None:
    status = {**SUCCEEDED, "children": {}}
    a = manifest(
        "a", {"name": "Qwen/Qwen2-0.5B"}, status=status, method="full", storage={"existingClaim": "shared"}
    )
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and found.status is not None
    assert (found.status.claim, found.status.method, found.status.base) == ("shared", "full", None)


def test_best_eval_is_the_best_checkpoint_or_what_the_parent_selected() -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED)
    found = chaining.observe(job_of(from_job("b", "a", "bestEval")), reader(a))
    assert found is not None and found.status is not None
    assert found.status.path == "checkpoints/checkpoint-40"
    # a parent that registered by bestEval chose among its checkpoints and final/ (final here)
    chosen = {**SUCCEEDED, "evaluation": {"selected": "final", "evalLoss": 1.2}}
    a = manifest(
        "a",
        {"name": "Qwen/Qwen2-0.5B"},
        status=chosen,
        dataset={"name": "d", "evalFraction": 0.1},
        registration={"select": "bestEval"},
    )
    found = chaining.observe(job_of(from_job("b", "a", "bestEval")), reader(a))
    assert found is not None and found.status is not None and found.status.path == "final"


def test_best_eval_of_a_parent_without_eval_losses_fails_naming_the_fix() -> None:
    status = {**SUCCEEDED, "checkpoints": {"latestStep": 60}}
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=status)
    found = chaining.observe(job_of(from_job("b", "a", "bestEval")), reader(a))
    assert found is not None and (found.state, found.reason) == ("failed", Reason.PARENT_MISSING)
    assert "no checkpoint with an eval loss" in found.message and "checkpoint: final" in found.message


def test_a_lora_parent_on_a_model_volume_mounts_that_volume_too() -> None:
    model = {"path": "/models/qwen", "volume": {"claimName": "models", "subPath": "qwen"}}
    a = manifest("a", model, status=SUCCEEDED, method="lora")
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert found is not None and found.status is not None
    child = parent.with_recorded(job_of(from_job("b", "a")), found.status)
    vols, mounts = parent.volumes(child)
    assert {"name": "parent-base", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in vols
    assert {"name": "parent-base", "mountPath": "/models/qwen", "readOnly": True, "subPath": "qwen"} in mounts


def recorded_child(uid: str = "uid-a", phase: str = "Training") -> dict[str, Any]:
    status = {
        "phase": phase,
        "parent": {"job": "a", "uid": uid, "path": "final", "claim": "a-ckpt", "method": "full"},
    }
    return from_job("b", "a", status=status)


def test_a_parent_seen_then_deleted_or_replaced_is_missing() -> None:
    found = chaining.observe(job_of(recorded_child()), reader())
    assert found is not None and (found.state, found.reason) == ("failed", Reason.PARENT_MISSING)
    assert "was deleted" in found.message
    other = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED)
    other["metadata"]["uid"] = "uid-a2"
    found = chaining.observe(job_of(recorded_child()), reader(other))
    assert found is not None and found.reason == Reason.PARENT_MISSING and "re-created" in found.message
    deleting = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED)
    deleting["metadata"]["deletionTimestamp"] = NOW
    found = chaining.observe(job_of(recorded_child()), reader(deleting))
    assert found is not None and found.reason == Reason.PARENT_MISSING


def test_a_recorded_parent_is_kept_and_once_trained_not_needed() -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status={"phase": "Registering"})
    found = chaining.observe(job_of(recorded_child()), reader(a))  # registering again: still the same job
    assert found is not None and found.state == "ready" and found.status is not None
    assert found.status.uid == "uid-a"
    found = chaining.observe(job_of(recorded_child(phase="Registering")), reader(), trained=True)
    assert found is not None and found.state == "ready"


@pytest.mark.parametrize(
    ("links", "expected"),
    [
        ({"a": "b", "b": "a"}, "a -> b -> a"),
        ({"a": "b", "b": "c", "c": "a"}, "a -> b -> c -> a"),
    ],
)
def test_a_cycle_fails_naming_the_chain(links: dict[str, str], expected: str) -> None:
    objs = [from_job(n, p) for n, p in links.items()]
    found = chaining.observe(job_of(objs[0]), reader(*objs))
    assert found is not None and (found.state, found.reason) == ("failed", Reason.PARENT_CYCLE)
    assert expected in found.message


def test_a_cycle_further_up_is_not_this_jobs() -> None:
    # c -> a -> b -> a: a and b fail with ParentCycle; c waits and then sees a Failed
    objs = [from_job("c", "a"), from_job("a", "b"), from_job("b", "a")]
    found = chaining.observe(job_of(objs[0]), reader(*objs))
    assert found is not None and found.state == "waiting"


# --- the state machine ------------------------------------------------------------------------------


def advance(
    obj: dict[str, Any], found: chaining.ParentObservation | None, prev: dict[str, Any] | None = None
):
    previous = FineTuneJobStatus.model_validate(prev) if prev else None
    return state.transition(previous, state.Observation(generation=1, now=NOW, parent=found, job_name="b"))


def conditions(transition: state.Transition) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in transition.status["conditions"]}


def test_waiting_is_pending_with_parent_ready_false_and_one_event() -> None:
    found = chaining.observe(job_of(from_job("b", "a")), reader())
    t = advance(from_job("b", "a"), found)
    assert t.phase == Phase.PENDING and not t.waiting
    c = conditions(t)
    assert c["ParentReady"] == ("False", "WaitingForParent")
    assert c["Ready"] == ("False", "WaitingForParent") and c["ChildrenReady"] == ("False", "WaitingForParent")
    assert [e.reason for e in t.events] == ["WaitingForParent"]
    assert "parent" not in t.status
    again = advance(from_job("b", "a"), found, prev=t.status)
    assert again.events == []


def test_a_failed_parent_ends_the_child_failed() -> None:
    found = chaining.ParentObservation(
        "failed", Reason.PARENT_CYCLE, "spec.model.fromJob makes a cycle: b -> a -> b"
    )
    t = advance(from_job("b", "a"), found)
    assert t.phase == Phase.FAILED and conditions(t)["ParentReady"] == ("False", "ParentCycle")
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "ParentCycle")]
    assert "completionTime" in t.status


def test_a_parent_gone_after_the_start_fails_the_job_and_keeps_its_children() -> None:
    found = chaining.observe(job_of(recorded_child()), reader())
    assert chaining.started_from(found) and not chaining.lets_start(found)
    prev = {
        "phase": "Training",
        "conditions": [
            {
                "type": "ChildrenReady",
                "status": "True",
                "reason": "ChildrenCreated",
                "lastTransitionTime": NOW,
            }
        ],
    }
    t = advance(recorded_child(), found, prev=prev)
    assert t.phase == Phase.FAILED
    c = conditions(t)
    assert c["ChildrenReady"] == ("True", "ChildrenCreated") and c["Training"] == ("False", "ParentMissing")


def test_a_succeeded_parent_is_recorded_and_the_job_goes_on() -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED)
    found = chaining.observe(job_of(from_job("b", "a")), reader(a))
    t = advance(from_job("b", "a"), found)
    assert conditions(t)["ParentReady"] == ("True", "ParentSucceeded")
    assert t.status["parent"]["uid"] == "uid-a" and t.status["parent"]["path"] == "final"
    assert "ParentSucceeded" in [e.reason for e in t.events]
    assert t.phase != Phase.FAILED


def test_jobs_without_a_parent_show_no_parent_condition() -> None:
    t = advance(manifest("b", {"name": "Qwen/Qwen2-0.5B"}), None)
    assert "ParentReady" not in conditions(t)


# --- what the children mount and read ---------------------------------------------------------------


def test_children_mount_the_parent_volume_and_the_config_names_the_model() -> None:
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED, method="lora")
    child = job_of(from_job("b", "a", "bestEval"))
    child, found = chaining.for_pass(child, reader(a), True, False)
    assert chaining.lets_start(found)
    want_volume = {"name": "parent", "persistentVolumeClaim": {"claimName": "a-ckpt", "readOnly": True}}
    want_mount = {"name": "parent", "mountPath": "/var/lib/kubetune-parent", "readOnly": True}
    prep = builders.build_preparation_job(child, SETTINGS)["spec"]["template"]["spec"]
    train = builders.build_pytorchjob(child, SETTINGS)["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "spec"
    ]
    for pod in (prep, train):
        assert want_volume in pod["volumes"]
        assert want_mount in pod["containers"][0]["volumeMounts"]
    registration = builders.build_registration_job(child, SETTINGS)["spec"]["template"]["spec"]
    assert want_volume not in registration["volumes"]
    config = TrainerConfig.model_validate(yaml.safe_load(builders.trainer_config_yaml(child, SETTINGS)))
    assert config.parent is not None
    assert config.parent.path == "/var/lib/kubetune-parent/checkpoints/checkpoint-40"
    assert (config.parent.job, config.parent.uid, config.parent.run_id) == ("a", "uid-a", "run-a")
    assert (config.parent.method, config.parent.base_path) == (
        "lora",
        "/var/lib/kubetune-parent/prepared/model",
    )
    assert config.parent.model_uri == "models:/a/3"


def test_nothing_is_mounted_before_the_parent_succeeded() -> None:
    child, found = chaining.for_pass(job_of(from_job("b", "a")), reader(), True, False)
    assert not chaining.lets_start(found)
    pod = builders.build_pytorchjob(child, SETTINGS)["spec"]["pytorchReplicaSpecs"]["Master"]["template"][
        "spec"
    ]
    assert all(v["name"] != "parent" for v in pod["volumes"])
    config = TrainerConfig.model_validate(yaml.safe_load(builders.trainer_config_yaml(child, SETTINGS)))
    assert config.parent is None


def test_a_parent_deleted_while_the_child_waits_fails_the_child() -> None:
    """The job records which parent it waits for (name and uid); that parent deleted, or deleted and
    re-created, before it Succeeded ends the job Failed with ParentMissing instead of waiting on."""
    a = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status={"phase": "Training"})
    waiting = chaining.observe(job_of(from_job("b", "a")), reader(a))
    assert waiting is not None and waiting.state == "waiting" and waiting.status is not None
    assert (waiting.status.job, waiting.status.uid, waiting.status.path) == ("a", "uid-a", None)
    t = advance(from_job("b", "a"), waiting)
    assert t.phase == Phase.PENDING and t.status["parent"] == {"job": "a", "uid": "uid-a"}
    child = from_job("b", "a", status=t.status)
    still = chaining.observe(job_of(child), reader(a))  # the same parent, still training
    assert still is not None and still.state == "waiting"
    assert parent.trainer_parent(job_of(child)) is None and parent.volumes(job_of(child)) == ([], [])
    gone = chaining.observe(job_of(child), reader())
    assert gone is not None and (gone.state, gone.reason) == ("failed", Reason.PARENT_MISSING)
    assert "was deleted before it Succeeded" in gone.message
    assert not chaining.started_from(gone)
    ended = advance(child, gone, prev=t.status)
    assert ended.phase == Phase.FAILED and conditions(ended)["ParentReady"] == ("False", "ParentMissing")
    other = manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED)
    other["metadata"]["uid"] = "uid-a2"
    replaced = chaining.observe(job_of(child), reader(other))
    assert (
        replaced is not None and replaced.reason == Reason.PARENT_MISSING and "re-created" in replaced.message
    )
    # the same parent Succeeded: the child starts from it, its folder recorded
    done = chaining.observe(
        job_of(child), reader(manifest("a", {"name": "Qwen/Qwen2-0.5B"}, status=SUCCEEDED))
    )
    assert (
        done is not None and done.state == "ready" and done.status is not None and done.status.path == "final"
    )


def test_the_checkpoints_pages_sample_message_is_the_operators() -> None:
    from tests.support import docs_samples
    from tests.support.controlplane import REPO

    (block,) = [
        b for b in docs_samples.code_blocks(REPO / "docs" / "checkpoints.md") if "ParentReady" in b.text
    ]
    command, shown = block.text.splitlines()
    assert command.startswith("$ kubectl get ftj assistant-polish -o jsonpath=")
    sft = manifest("assistant-sft", {"name": "Qwen/Qwen2-0.5B"}, status={"phase": "Training"})
    found = chaining.observe(job_of(from_job("assistant-polish", "assistant-sft")), reader(sft))
    assert found is not None and shown == found.message
