"""The pure state machine: observations in, status and events out."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.support.state_obs import T0, T1, obs

from kubetune_api.status import FineTuneJobStatus
from kubetune_operator import observations, state
from kubetune_operator.state import RegistrationObservation, TrainingObservation


def training(condition: str | None, message: str = "") -> TrainingObservation:
    return TrainingObservation(exists=True, condition=condition, message=message)


def status_of(t: state.Transition) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(t.status)


def cond(t: state.Transition, type_: str) -> dict[str, Any]:
    return next(c for c in t.status["conditions"] if c["type"] == type_)


def ptj(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {
        "status": {"conditions": [{"type": t, "status": s, "reason": t, "message": t} for t, s in conditions]}
    }


@pytest.mark.parametrize(
    ("conditions", "expected"),
    [
        ((), None),
        ((("Created", "True"),), "Created"),
        ((("Created", "True"), ("Running", "True")), "Running"),
        ((("Created", "True"), ("Running", "False"), ("Restarting", "True")), "Restarting"),
        ((("Created", "True"), ("Running", "False"), ("Succeeded", "True")), "Succeeded"),
        ((("Created", "True"), ("Running", "True"), ("Failed", "True")), "Failed"),
        ((("Created", "True"), ("Suspended", "True")), "Suspended"),
        ((("Created", "True"), ("Suspended", "False"), ("Running", "True")), "Running"),
    ],
)
def test_training_observation_precedence(
    conditions: tuple[tuple[str, str], ...], expected: str | None
) -> None:
    assert observations.training_observation(ptj(*conditions)).condition == expected


def test_no_pytorchjob_yet() -> None:
    assert observations.training_observation(None) == TrainingObservation()


def test_the_happy_path() -> None:
    t = state.transition(None, obs(training=training(None)))
    assert t.phase == "Pending"
    assert cond(t, "Training")["reason"] == state.Reason.WAITING_FOR_TRAINING_OPERATOR
    assert cond(t, "ChildrenReady") == {
        "type": "ChildrenReady",
        "status": "True",
        "reason": "ChildrenCreated",
        "message": "checkpoint volume, trainer config and PyTorchJob exist",
        "lastTransitionTime": T0,
        "observedGeneration": 1,
    }
    assert t.events == []

    t = state.transition(status_of(t), obs(now=T1, training=training("Running")))
    assert t.phase == "Training"
    assert t.status["startTime"] == T1
    assert cond(t, "Training")["status"] == "True"
    assert cond(t, "ChildrenReady")["lastTransitionTime"] == T0  # unchanged status keeps its time
    assert [e.reason for e in t.events] == ["TrainingStarted"]

    t = state.transition(status_of(t), obs(training=training("Succeeded")))
    assert t.phase == "Registering"
    assert cond(t, "Registered")["reason"] == state.Reason.REGISTRATION_PENDING
    assert [e.reason for e in t.events] == ["RegistrationStarted"]
    assert "startTime" not in t.status  # set once, never again

    running = RegistrationObservation(exists=True, state="Running")
    t = state.transition(status_of(t), obs(training=training("Succeeded"), registration=running))
    assert t.phase == "Registering"
    assert cond(t, "Registered")["reason"] == state.Reason.REGISTRATION_RUNNING
    assert t.events == []

    result = {"name": "m", "version": 4, "uri": "models:/m/4", "run_id": "abc", "alias": "champion"}
    done = RegistrationObservation(exists=True, state="Complete", result=result)
    t = state.transition(status_of(t), obs(training=training("Succeeded"), registration=done))
    assert t.phase == "Succeeded"
    assert t.status["registeredModel"] == {
        "name": "m",
        "version": "4",
        "uri": "models:/m/4",
        "alias": "champion",
        "runId": "abc",  # the run it was logged from
    }
    assert "mlflow" not in t.status  # the trainer's (kubetune_api.ownership)
    assert t.status["completionTime"] == T0
    assert cond(t, "Ready")["status"] == "True"
    assert cond(t, "Registered")["reason"] == state.Reason.MODEL_REGISTERED
    assert [(e.type, e.reason) for e in t.events] == [("Normal", "Succeeded")]

    # Final: nothing changes any more, whatever the children say.
    after = state.transition(status_of(t), obs(generation=2, training=training("Failed")))
    assert after.phase == "Succeeded"
    assert after.events == []
    assert after.status["observedGeneration"] == 2


def test_status_never_carries_trainer_fields() -> None:
    t = state.transition(None, obs(training=training("Running")))
    assert not {"progress", "checkpoints"} & set(t.status)


def test_training_failed_is_actionable() -> None:
    prev = status_of(state.transition(None, obs(training=training("Running"))))
    t = state.transition(prev, obs(training=training("Failed", "1 Master replica(s) failed.")))
    assert t.phase == "Failed"
    ready = cond(t, "Ready")
    assert ready["reason"] == state.Reason.TRAINING_FAILED
    assert "1 Master replica(s) failed." in ready["message"]
    assert "kubectl logs -n ml -l training.kubeflow.org/job-name=j-train" in ready["message"]
    assert "re-create" in ready["message"]
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "TrainingFailed")]
    assert t.status["completionTime"] == T0


def test_registration_failed_is_actionable() -> None:
    failed = RegistrationObservation(
        exists=True, state="Failed", message="BackoffLimitExceeded: ...; last output: 401"
    )
    t = state.transition(None, obs(training=training("Succeeded"), registration=failed))
    assert t.phase == "Failed"
    ready = cond(t, "Ready")
    assert ready["reason"] == state.Reason.REGISTRATION_FAILED
    assert "401" in ready["message"]
    # the remedy names the annotation that retries (deleting the Job alone does not)
    assert (
        'kubectl annotate ftj -n ml j kubetune.io/retry-registration="$(date +%s)" --overwrite'
        in ready["message"]
    )


def test_registration_disabled_succeeds_after_training() -> None:
    t = state.transition(None, obs(training=training("Succeeded"), registration_enabled=False))
    assert t.phase == "Succeeded"
    assert cond(t, "Registered")["reason"] == state.Reason.REGISTRATION_DISABLED
    assert "registeredModel" not in t.status


def test_registration_turned_off_after_its_job_was_created_is_followed_to_its_end() -> None:
    off = {"training": training("Succeeded"), "registration_enabled": False}
    running = state.transition(
        None, obs(registration=RegistrationObservation(exists=True, state="Running"), **off)
    )
    assert running.phase == "Registering"
    assert "turned off after it was created" in cond(running, "Registered")["message"]
    result = {"name": "m", "version": "3", "source": "runs:/r/model", "runId": "r"}
    done = RegistrationObservation(exists=True, state="Complete", result=result)
    t = state.transition(None, obs(registration=done, **off))
    assert t.phase == "Succeeded" and t.status["registeredModel"]["version"] == "3"
    failed = RegistrationObservation(exists=True, state="Failed", message="401")
    t = state.transition(None, obs(registration=failed, **off))
    assert t.phase == "Failed"
    assert "to finish without registering" in cond(t, "Ready")["message"]


def test_complete_without_result_waits() -> None:
    done = RegistrationObservation(exists=True, state="Complete", result=None)
    t = state.transition(None, obs(training=training("Succeeded"), registration=done))
    assert t.phase == "Registering"
    assert t.waiting
    assert cond(t, "Registered")["reason"] == state.Reason.REGISTRATION_RESULT_PENDING


def test_suspend_and_resume() -> None:
    prev = status_of(state.transition(None, obs(training=training("Running"))))
    t = state.transition(prev, obs(generation=2, suspend=True, training=training("Running")))
    assert t.phase == "Suspended"
    assert cond(t, "Suspended")["status"] == "True"
    assert cond(t, "Suspended")["observedGeneration"] == 2
    assert [e.reason for e in t.events] == [state.Reason.SUSPENDED_BY_USER]

    t2 = state.transition(status_of(t), obs(generation=3, training=training("Suspended")))
    assert t2.phase == "Pending"
    assert cond(t2, "Suspended")["reason"] == state.Reason.RESUMING
    assert [e.reason for e in t2.events] == [state.EventReason.RESUMED]

    t3 = state.transition(status_of(t2), obs(generation=3, training=training("Running")))
    assert t3.phase == "Training"
    assert cond(t3, "Suspended")["status"] == "False"


def test_suspended_before_training_ends_only() -> None:
    t = state.transition(None, obs(suspend=True, training=training("Succeeded")))
    assert t.phase == "Registering"  # suspend stops training; it does not hold back registration


def test_queued_by_kueue() -> None:
    t = state.transition(None, obs(queued_by_kueue=True, training=training("Suspended")))
    assert t.phase == "Pending"
    assert cond(t, "Suspended")["reason"] == state.Reason.QUEUED
    assert cond(t, "Ready")["reason"] == state.Reason.QUEUED


def test_restarting_warns_once() -> None:
    prev = status_of(state.transition(None, obs(training=training("Running"))))
    t = state.transition(prev, obs(training=training("Restarting", "pod exited with 143")))
    assert t.phase == "Training"
    assert [(e.type, e.reason) for e in t.events] == [("Warning", state.Reason.TRAINING_RESTARTING)]
    again = state.transition(status_of(t), obs(training=training("Restarting", "pod exited with 143")))
    assert again.events == []


def test_conflict_keeps_pending_and_warns_once() -> None:
    t = state.transition(None, obs(conflict="ConfigMap j-config already exists ..."))
    assert t.phase == "Pending"
    assert t.waiting
    assert cond(t, "ChildrenReady")["reason"] == state.Reason.CHILD_CONFLICT
    assert [(e.type, e.reason) for e in t.events] == [("Warning", state.Reason.CHILD_CONFLICT)]
    assert state.transition(status_of(t), obs(conflict="ConfigMap j-config already exists ...")).events == []


def test_invalid_spec_fails() -> None:
    t = state.transition(None, obs(invalid_spec="the spec cannot be used: training: ..."))
    assert t.phase == "Failed"
    assert cond(t, "Ready")["reason"] == state.Reason.INVALID_SPEC


def _pod(uid: str, exit_code: int, message: str, created: str = T0) -> dict[str, Any]:
    return {
        "metadata": {"creationTimestamp": created, "ownerReferences": [{"uid": uid}]},
        "status": {
            "containerStatuses": [
                {"name": "register", "state": {"terminated": {"exitCode": exit_code, "message": message}}}
            ]
        },
    }


def _job(*conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"uid": "job-uid"},
        "status": {
            "conditions": [{"type": c, "status": "True", "reason": "R", "message": "M"} for c in conditions]
        },
    }


def test_registration_result_from_the_termination_message() -> None:
    result = {"name": "m", "version": "2", "uri": "models:/m/2", "run_id": "r", "alias": None}
    pods = [
        _pod("job-uid", 1, "Traceback ...\nConnectionError: mlflow unreachable"),
        _pod("job-uid", 0, json.dumps(result), created=T1),
        _pod("other-job", 0, json.dumps({**result, "version": "99"})),  # a stranger's pod
    ]
    o = observations.registration_observation(_job("SuccessCriteriaMet", "Complete"), pods, "register")
    assert o.state == "Complete"
    assert o.result == result


def test_registration_result_survives_log_tail() -> None:
    message = "merging adapter...\nlogging model...\n" + json.dumps({"name": "m", "version": "3"})
    assert observations.parse_registration_result(message) == {"name": "m", "version": "3"}
    assert observations.parse_registration_result("no json here") is None
    assert observations.parse_registration_result('{"name": "m"}') is None  # no version: not a result


def test_registration_failure_message_carries_the_log_tail() -> None:
    pods = [_pod("job-uid", 1, "mlflow.exceptions.MlflowException: 401 Unauthorized")]
    o = observations.registration_observation(_job("FailureTarget", "Failed"), pods, "register")
    assert o.state == "Failed"
    assert "401 Unauthorized" in o.message
    assert observations.registration_observation(_job(), [], "register").state == "Running"
    assert observations.registration_observation(None, [], "register") == RegistrationObservation()


def test_a_registration_job_whose_pod_skipped() -> None:
    pods = [_pod("job-uid", 0, json.dumps({"skipped": "registration.enabled is false"}))]
    o = observations.registration_observation(_job("SuccessCriteriaMet", "Complete"), pods, "register")
    assert o.state == "Skipped" and o.result is None
    done = {"training": training("Succeeded"), "registration": o}
    t = state.transition(None, obs(registration_enabled=False, **done))
    assert t.phase == "Succeeded" and "registeredModel" not in t.status
    assert cond(t, "Registered")["reason"] == state.Reason.REGISTRATION_DISABLED
    assert "ended without registering" in cond(t, "Registered")["message"]
    # turned on again while that pod ran: nothing is registered, and the annotation retries
    t = state.transition(None, obs(**done))
    assert t.phase == "Failed" and cond(t, "Ready")["reason"] == state.Reason.REGISTRATION_FAILED
    assert (
        "To register: kubectl annotate ftj -n ml j kubetune.io/retry-registration"
        in cond(t, "Ready")["message"]
    )


def test_registration_failure_json_becomes_the_message() -> None:
    message = json.dumps({"error": "MLflow refused: 403 PERMISSION_DENIED", "reason": "MlflowRefused"})
    o = observations.registration_observation(_job("Failed"), [_pod("job-uid", 3, message)], "register")
    assert o.message.endswith("last output: MlflowRefused: MLflow refused: 403 PERMISSION_DENIED")


def _succeeded(alias: str | None, conditions: list[dict[str, Any]] | None = None) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(
        {
            "phase": "Succeeded",
            "conditions": conditions or [],
            "registeredModel": {"name": "m", "version": "3", "uri": "models:/m/3", "alias": alias},
        }
    )


def test_an_alias_move_in_progress_keeps_the_job_succeeded_and_says_so_once() -> None:
    running = RegistrationObservation(True, "Running")
    t = state.alias_transition(_succeeded("champion"), "production", running, now="t1", generation=2)
    assert t.phase == "Succeeded" and t.waiting and "registeredModel" not in t.status
    (cond,) = [c for c in t.status["conditions"] if c["type"] == "AliasSynced"]
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == ("False", "MovingAlias", 2)
    assert [e.reason for e in t.events] == ["MovingAlias"]
    # the next pass, same situation: no second event, the transition time stays
    again = state.alias_transition(
        _succeeded("champion", t.status["conditions"]), "production", running, now="t2", generation=2
    )
    assert again.events == [] and again.status["conditions"][-1]["lastTransitionTime"] == "t1"


def test_a_finished_alias_move_updates_the_registered_model_and_a_failure_keeps_it() -> None:
    done = RegistrationObservation(True, "Complete", "", {"name": "m", "version": "3", "alias": "production"})
    t = state.alias_transition(_succeeded("champion"), "production", done, now="t", generation=2)
    assert t.status["registeredModel"] == {
        "name": "m",
        "version": "3",
        "uri": "models:/m/3",
        "alias": "production",
    }
    assert t.status["conditions"][-1]["status"] == "True" and not t.waiting
    failed = RegistrationObservation(True, "Failed", "BackoffLimitExceeded: MLflow refused")
    f = state.alias_transition(_succeeded("champion"), "production", failed, now="t", generation=2)
    assert "registeredModel" not in f.status and f.events[0].type == "Warning"
    assert "MLflow refused" in f.status["conditions"][-1]["message"]
