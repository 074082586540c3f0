"""The state machine's decisions when the API server refuses a child: what each answer means, what
the status and the events say, and how a job failed by a refused child is reopened by a new spec."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tests.support.state_obs import T0, T1, obs

from kubetune_api.status import FineTuneJobStatus
from kubetune_operator import observations, state
from kubetune_operator.kube import ApiError, Kube
from kubetune_operator.state import ChildError, Observation, TrainingObservation

QUOTA = (
    'persistentvolumeclaims "j-ckpt" is forbidden: exceeded quota: no-pvcs, requested: '
    "persistentvolumeclaims=1, used: persistentvolumeclaims=0, limited: persistentvolumeclaims=0"
)
INVALID = (
    'PyTorchJob.kubeflow.org "j-train" is invalid: spec.pytorchReplicaSpecs.Master.template.spec.'
    "tolerations[0].operator: Invalid value: \"Exists\": value must be empty when `operator` is 'Exists'"
)


def rejected(attempts: int = 1) -> ChildError:
    return ChildError("create", "PyTorchJob", "j-train", 422, "Invalid", INVALID, attempts)


def forbidden(attempts: int = 1) -> ChildError:
    return ChildError("create", "PersistentVolumeClaim", "j-ckpt", 403, "Forbidden", QUOTA, attempts)


def unavailable(attempts: int) -> ChildError:
    return ChildError(
        "create",
        "PyTorchJob",
        "j-train",
        500,
        "InternalError",
        'Internal error occurred: failed calling webhook "deny.example.com": connection refused',
        attempts,
    )


def cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def parsed(t: state.Transition) -> FineTuneJobStatus:
    return FineTuneJobStatus.model_validate(t.status)


def then(t: state.Transition) -> FineTuneJobStatus:
    """The status after ``t`` was merge-patched onto an empty one (None values dropped)."""
    return FineTuneJobStatus.model_validate({k: v for k, v in t.status.items() if v is not None})


# --- what an answer means --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("verb", "code", "expected"),
    [
        ("create", 422, "rejected"),  # Invalid: the object as the spec builds it
        ("create", 400, "rejected"),  # BadRequest
        ("create", 413, "rejected"),  # RequestEntityTooLarge
        ("create", 403, "forbidden"),  # quota, RBAC, a policy answering Forbidden
        ("get", 403, "forbidden"),
        ("list", 403, "forbidden"),
        ("update", 403, "forbidden"),
        ("create", 429, "transient"),  # throttled
        ("create", 500, "transient"),  # a webhook that cannot be reached
        ("create", 503, "transient"),
        ("create", 504, "transient"),
        ("create", 0, "transient"),  # no answer at all
        ("create", 404, "transient"),  # the kind's CRD is missing (Training Operator not installed)
        ("update", 422, "transient"),  # only creating from the spec is refused for good
        ("get", 400, "transient"),
    ],
)
def test_verdict_by_verb_and_status(verb: str, code: int, expected: str) -> None:
    assert observations.verdict(verb, code) == expected


@pytest.mark.parametrize(
    ("attempts", "expected"), [(1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (9, 60.0), (1000, 60.0)]
)
def test_retry_delay_doubles_up_to_its_cap(attempts: int, expected: float) -> None:
    assert observations.retry_delay(attempts, 1.0, 60.0) == expected


def test_api_error_reads_the_status_objects_reason_and_message() -> None:
    body = json.dumps(
        {"kind": "Status", "status": "Failure", "reason": "Forbidden", "code": 403, "message": QUOTA}
    )
    e = ApiError(403, "Forbidden", body)
    assert (e.status_reason, e.message) == ("Forbidden", QUOTA)
    plain = ApiError(502, "Bad Gateway", "<html>upstream down</html>")
    assert (plain.status_reason, plain.message) == ("Bad Gateway", "<html>upstream down</html>")


def test_no_answer_from_the_api_server_is_an_api_error_with_status_0() -> None:
    from kubernetes import client
    from tests.support.controlplane import free_port

    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    cfg.retries = 0
    with pytest.raises(ApiError) as e:
        Kube(client.ApiClient(cfg), timeout=5).get("v1", "ConfigMap", "ml", "j-config")
    assert e.value.status == 0 and e.value.status_reason == "NoResponse"
    assert observations.verdict("create", e.value.status) == "transient"


def test_describe_names_the_request_the_child_and_the_answer() -> None:
    assert rejected().describe() == f"creating PyTorchJob j-train: 422 Invalid: {INVALID}"
    silent = ChildError("get", "ConfigMap", "j-config", 0, "NoResponse", "ConnectionRefusedError: refused")
    assert silent.describe() == (
        "reading ConfigMap j-config: no answer from the API server (NoResponse): ConnectionRefusedError: refused"
    )


# --- rejected: Failed within the pass ------------------------------------------------------------


def test_a_rejected_child_fails_a_new_job_with_the_api_servers_message() -> None:
    t = state.transition(None, obs(child_error=rejected()))
    assert t.phase == "Failed" and not t.waiting
    for type_ in (state.ConditionType.READY, state.ConditionType.CHILDREN_READY):
        c = cond(t.status, type_)
        assert (c["status"], c["reason"]) == ("False", "ChildRejected")
        assert "creating PyTorchJob j-train: 422 Invalid" in c["message"]
        assert INVALID in c["message"]
        assert "kubectl replace --force -f" in c["message"]
    assert t.status["completionTime"] == T0
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "ChildRejected")]
    assert INVALID in t.events[0].message
    assert state.rejected_child(parsed(t))


def test_a_rejected_registration_job_fails_a_trained_job() -> None:
    trained = state.transition(None, obs(training=TrainingObservation(True, "Succeeded")))
    assert trained.phase == "Registering"
    refused = ChildError("create", "Job", "j-register", 422, "Invalid", "Job.batch is invalid: denied")
    t = state.transition(then(trained), obs(now=T1, child_error=refused))
    assert t.phase == "Failed"
    assert cond(t.status, state.ConditionType.READY)["reason"] == "ChildRejected"
    # training stays known as finished: a reopened job registers, it does not train again
    assert state.training_succeeded(parsed(t))


# --- forbidden and transient: shown, retried, never failed ------------------------------------------


def test_a_forbidden_child_shows_at_once_and_keeps_the_job_pending() -> None:
    t = state.transition(None, obs(child_error=forbidden()))
    assert (t.phase, t.waiting) == ("Pending", True)
    for type_ in (state.ConditionType.READY, state.ConditionType.CHILDREN_READY):
        c = cond(t.status, type_)
        assert (c["status"], c["reason"]) == ("False", "ChildForbidden")
        assert f"creating PersistentVolumeClaim j-ckpt: 403 Forbidden: {QUOTA}" in c["message"]
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "ChildForbidden")]
    assert cond(t.status, state.ConditionType.TRAINING)["reason"] == "ChildForbidden"
    # the next refused pass says the attempt, and emits no second event
    again = state.transition(then(t), obs(now=T1, child_error=forbidden(2)))
    assert again.phase == "Pending" and again.events == []
    children = cond(again.status, state.ConditionType.CHILDREN_READY)
    assert "attempt 2" in children["message"] and children["lastTransitionTime"] == T0


@pytest.mark.parametrize("attempts", [1, 2])
def test_a_transient_error_is_not_shown_before_a_few_attempts(attempts: int) -> None:
    t = state.transition(None, obs(child_error=unavailable(attempts)))
    assert (t.phase, t.waiting, t.events) == ("Pending", True, [])
    assert cond(t.status, state.ConditionType.CHILDREN_READY)["reason"] == "CreatingChildren"
    assert cond(t.status, state.ConditionType.READY)["reason"] == "NotReady"


def test_a_transient_error_is_shown_after_a_few_attempts_without_failing() -> None:
    first = state.transition(None, obs(child_error=unavailable(1)))
    t = state.transition(then(first), obs(now=T1, child_error=unavailable(state.SHOW_TRANSIENT_AFTER)))
    assert (t.phase, t.waiting) == ("Pending", True)
    children = cond(t.status, state.ConditionType.CHILDREN_READY)
    assert (children["status"], children["reason"]) == ("False", "ChildApiError")
    assert "500 InternalError" in children["message"] and "failed calling webhook" in children["message"]
    assert f"{state.SHOW_TRANSIENT_AFTER} attempts in a row" in children["message"]
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "ChildApiError")]
    # Training has not started because of it, and says so (not "waiting for the Training Operator")
    assert cond(t.status, state.ConditionType.TRAINING)["reason"] == "ChildApiError"


def test_a_missing_pytorchjob_kind_hints_at_the_training_operator() -> None:
    missing = ChildError(
        "create", "PyTorchJob", "j-train", 404, "NotFound", "the server could not find it", 3
    )
    t = state.transition(None, obs(child_error=missing))
    assert "Kubeflow Training Operator" in cond(t.status, state.ConditionType.CHILDREN_READY)["message"]


def test_a_refusal_while_training_keeps_the_phase_and_the_training_condition() -> None:
    running = state.transition(None, obs(training=TrainingObservation(True, "Running", message="training")))
    assert running.phase == "Training"
    refused = ChildError(
        "update", "ConfigMap", "j-config", 503, "ServiceUnavailable", "etcd leader changed", 3
    )
    t = state.transition(then(running), obs(now=T1, child_error=refused))
    assert t.phase == "Training"
    assert [(e.type, e.reason) for e in t.events] == [("Warning", "ChildApiError")]
    assert cond(t.status, state.ConditionType.TRAINING)["reason"] == "TrainingRunning"
    assert cond(t.status, state.ConditionType.READY)["reason"] == "TrainingRunning"
    assert cond(t.status, state.ConditionType.CHILDREN_READY)["reason"] == "ChildApiError"
    assert "startTime" not in t.status  # kept from the first pass (a merge patch leaves it)


def test_a_forbidden_child_that_is_allowed_again_goes_on() -> None:
    held = state.transition(None, obs(child_error=forbidden()))
    t = state.transition(then(held), obs(now=T1, training=TrainingObservation(True, "Created")))
    assert t.phase == "Pending" and not t.waiting
    children = cond(t.status, state.ConditionType.CHILDREN_READY)
    assert (children["status"], children["reason"]) == ("True", "ChildrenCreated")
    assert cond(t.status, state.ConditionType.TRAINING)["reason"] == "TrainingCreated"


# --- leaving Failed: a new spec generation reopens a rejected child ----------------------------------


def failed_by_rejection() -> FineTuneJobStatus:
    return then(state.transition(None, obs(child_error=rejected())))


def test_the_same_generation_stays_failed() -> None:
    t = state.transition(failed_by_rejection(), obs(now=T1))
    assert t.phase == "Failed" and t.events == []
    assert state.reopens(failed_by_rejection(), 1) is False


def test_a_new_generation_starts_over_and_clears_the_completion_time() -> None:
    previous = failed_by_rejection()
    assert state.reopens(previous, 2)
    t = state.transition(previous, obs(generation=2, now=T1, training=TrainingObservation(True, "Created")))
    assert t.phase == "Pending"
    assert t.status["completionTime"] is None  # merge patch: removed
    assert cond(t.status, state.ConditionType.CHILDREN_READY)["reason"] == "ChildrenCreated"
    assert cond(t.status, state.ConditionType.READY)["observedGeneration"] == 2
    assert [(e.type, e.reason) for e in t.events] == [("Normal", "ChildrenRetried")]


def test_a_new_generation_refused_again_fails_again_with_an_event() -> None:
    t = state.transition(failed_by_rejection(), obs(generation=2, now=T1, child_error=rejected()))
    assert t.phase == "Failed"
    assert t.status["completionTime"] == T1
    assert cond(t.status, state.ConditionType.READY)["observedGeneration"] == 2
    assert [e.reason for e in t.events] == ["ChildrenRetried", "ChildRejected"]
    assert state.reopens(then(t), 2) is False  # settled for generation 2


def test_a_new_generation_then_forbidden_is_pending_not_failed() -> None:
    t = state.transition(failed_by_rejection(), obs(generation=2, now=T1, child_error=forbidden()))
    assert (t.phase, t.waiting) == ("Pending", True)
    assert t.status["completionTime"] is None
    assert [e.reason for e in t.events] == ["ChildrenRetried", "ChildForbidden"]


@pytest.mark.parametrize(
    "failure",
    [
        obs(training=TrainingObservation(True, "Failed", "BackoffLimit", "1 Master replica(s) failed")),
        obs(invalid_spec="the spec cannot be used: spec.model: required"),
    ],
    ids=["training-failed", "invalid-spec"],
)
def test_other_failures_stay_failed_on_a_new_generation(failure: Observation) -> None:
    failed = then(state.transition(None, failure))
    assert failed.phase == "Failed"
    assert state.reopens(failed, 2) is False
    t = state.transition(failed, obs(generation=2, now=T1, training=TrainingObservation(True, "Created")))
    assert t.phase == "Failed" and t.events == []
