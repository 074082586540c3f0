"""The preparation step in the one state machine: Preparing while its Job runs, Failed with the
refusal's named reason (or PreparationFailed after a crash) before any GPU pod, and on success the
report in ``status.preparation`` and training from there; and how its Job and pods are read."""

from __future__ import annotations

from typing import Any

import pytest
from tests.support.state_obs import T0, T1, obs

from kubetune_api.preparation import (
    HINTS,
    DataStats,
    Estimate,
    PreparationRefusal,
    PreparationReport,
    Refusal,
    parse_termination_message,
    termination_message,
)
from kubetune_api.status import ConditionType, EventReason, FineTuneJobStatus, Phase, Reason
from kubetune_operator import state
from kubetune_operator.observations import PreparationObservation, preparation_observation
from kubetune_operator.state import TrainingObservation

REPORT = PreparationReport(
    model_revision="a" * 40,
    tokenized_key="0123456789abcdef",
    data=DataStats(
        train_examples=1800,
        eval_examples=200,
        tokens=912_000,
        length_p50=410,
        length_p95=1020,
        length_max=3900,
        truncated_fraction=0.04,
        loss_token_fraction=0.38,
    ),
    estimate=Estimate(
        gpu_product="NVIDIA-H100-80GB-HBM3",
        gpus=8,
        gpu_memory_gib=80,
        peak_memory_gib=41.5,
        fits=True,
        micro_batch_rows=8,
        micro_batch_tokens=8192,
        gradient_accumulation_steps=1,
        gradient_checkpointing=False,
        sharding="ddp",
        steps=14,
        tokens_per_second=250_000,
        duration_seconds=4,
        gpu_hours=0.01,
    ),
)
PREPARING = PreparationObservation(True, "Running")
NOT_STARTED = TrainingObservation()


def conditions(transition: state.Transition) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in transition.status["conditions"]}


def test_a_new_job_prepares_first() -> None:
    t = state.transition(None, obs(preparation=PREPARING, training=NOT_STARTED))
    assert t.phase == Phase.PREPARING
    c = conditions(t)
    assert c[ConditionType.PREPARED]["status"] == "False"
    assert c[ConditionType.PREPARED]["reason"] == Reason.PREPARING
    assert c[ConditionType.TRAINING]["reason"] == Reason.PREPARING
    assert c[ConditionType.READY]["reason"] == Reason.PREPARING
    assert "preparation" not in t.status
    assert [e.reason for e in t.events] == [EventReason.PREPARATION_STARTED]


def test_a_preparation_pod_that_cannot_be_created_says_why() -> None:
    blocked = PreparationObservation(
        True, "Running", message='pods "j-prepare-x" is forbidden: exceeded quota: cpu-quota'
    )
    t = state.transition(None, obs(preparation=blocked, preparation_job_name="j-prepare"))
    assert t.phase == Phase.PREPARING and t.waiting
    prepared = conditions(t)[ConditionType.PREPARED]
    assert prepared["reason"] == Reason.PODS_NOT_CREATED
    assert "exceeded quota: cpu-quota" in prepared["message"] and "j-prepare" in prepared["message"]


@pytest.mark.parametrize("reason", list(Refusal))
def test_each_refusal_fails_the_job_with_its_reason_and_remedy(reason: Refusal) -> None:
    refusal = PreparationRefusal.of(reason, "data/chat.jsonl line 3: what is wrong")
    before = state.transition(None, obs(preparation=PREPARING))
    previous = FineTuneJobStatus.model_validate(before.status)
    t = state.transition(previous, obs(preparation=PreparationObservation(True, "Failed", refusal=refusal)))
    assert t.phase == Phase.FAILED
    c = conditions(t)
    for ctype in (ConditionType.PREPARED, ConditionType.READY):
        assert c[ctype]["reason"] == reason.value
        assert "data/chat.jsonl line 3: what is wrong" in c[ctype]["message"]
        assert HINTS[reason] in c[ctype]["message"]
    assert t.status["completionTime"] == T0
    failed = [e for e in t.events if e.type == "Warning"]
    assert [e.reason for e in failed] == [reason.value]


def test_a_crash_fails_with_the_log_tail_and_where_to_look() -> None:
    crash = PreparationObservation(
        True, "Failed", message="BackoffLimitExceeded: ...; last output: MemoryError"
    )
    t = state.transition(None, obs(preparation=crash, preparation_job_name="j-prepare"))
    assert t.phase == Phase.FAILED
    ready = conditions(t)[ConditionType.READY]
    assert ready["reason"] == Reason.PREPARATION_FAILED
    assert "MemoryError" in ready["message"] and "kubectl logs -n ml job/j-prepare" in ready["message"]


def test_prepared_the_report_goes_into_the_status_and_training_begins() -> None:
    before = state.transition(None, obs(preparation=PREPARING))
    previous = FineTuneJobStatus.model_validate(before.status)
    done = PreparationObservation(True, "Succeeded", report=REPORT)
    t = state.transition(previous, obs(now=T1, preparation=done, training=TrainingObservation(True, None)))
    assert t.phase == Phase.PENDING
    assert t.status["preparation"] == REPORT.wire()
    prepared = conditions(t)[ConditionType.PREPARED]
    assert prepared["status"] == "True" and prepared["reason"] == Reason.PREPARED
    assert "1,800 training examples" in prepared["message"] and "0.0 GPU-hours" in prepared["message"]
    assert EventReason.PREPARED in [e.reason for e in t.events]
    # the next passes do not read the preparation Job again: the condition is kept as it was
    previous = FineTuneJobStatus.model_validate({**t.status, "preparation": REPORT.wire()})
    assert not state.preparation_needed(previous)
    later = state.transition(previous, obs(training=TrainingObservation(True, "Running")))
    assert later.phase == Phase.TRAINING
    assert conditions(later)[ConditionType.PREPARED] == prepared
    assert EventReason.PREPARED not in [e.reason for e in later.events]


def test_no_prepared_condition_without_a_preparation_step() -> None:
    t = state.transition(None, obs(training=TrainingObservation(True, "Running")))
    assert ConditionType.PREPARED not in conditions(t)


def test_jobs_that_trained_before_preparation_existed_are_not_held() -> None:
    for phase in (Phase.TRAINING, Phase.SUSPENDED, Phase.REGISTERING):
        assert not state.preparation_needed(FineTuneJobStatus(phase=phase))
    assert state.preparation_needed(FineTuneJobStatus())
    assert state.preparation_needed(FineTuneJobStatus(phase=Phase.PENDING))


# --- the Job and its pods, as the API server returns them ----------------------------------------


def prep_job(*conditions: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "j-prepare", "uid": "u1"},
        "status": {
            "conditions": [{"type": c, "status": "True", "reason": c, "message": ""} for c in conditions]
        },
    }


def pod(exit_code: int, message: str, *, owner: str = "u1") -> dict[str, Any]:
    return {
        "metadata": {"name": "j-prepare-x", "ownerReferences": [{"uid": owner}], "creationTimestamp": T0},
        "status": {
            "containerStatuses": [
                {"name": "prepare", "state": {"terminated": {"exitCode": exit_code, "message": message}}}
            ]
        },
    }


def test_observation_of_a_report_a_refusal_and_a_crash() -> None:
    assert preparation_observation(None, [], "prepare") == PreparationObservation()
    running = preparation_observation(prep_job(), [], "prepare")
    assert running.state == "Running"
    ok = preparation_observation(prep_job("Complete"), [pod(0, termination_message(REPORT))], "prepare")
    assert ok.state == "Succeeded" and ok.report == REPORT
    refusal = PreparationRefusal.of(Refusal.MODEL_GATED, "401 from the Hub for org/model")
    refused = preparation_observation(prep_job("Failed"), [pod(2, termination_message(refusal))], "prepare")
    assert refused.state == "Failed" and refused.refusal == refusal
    crash = preparation_observation(prep_job("Failed"), [pod(1, "Traceback ...\nMemoryError")], "prepare")
    assert crash.state == "Failed" and crash.refusal is None and "MemoryError" in crash.message
    oom = pod(137, "")
    oom["status"]["containerStatuses"][0]["state"]["terminated"]["reason"] = "OOMKilled"
    killed = preparation_observation(prep_job("Failed"), [oom], "prepare")
    assert killed.state == "Failed" and "OOMKilled, exit code 137" in killed.message
    # a stranger's pod with the same labels says nothing about this Job
    stranger = preparation_observation(
        prep_job("Complete"), [pod(0, termination_message(REPORT), owner="u2")], "prepare"
    )
    assert stranger.state == "Succeeded" and stranger.report is None
    # complete, its pod's status not yet terminated: wait for the report
    lagging = {"metadata": {"ownerReferences": [{"uid": "u1"}]}, "status": {"containerStatuses": []}}
    assert preparation_observation(prep_job("Complete"), [lagging], "prepare").state == "Running"


def test_termination_message_round_trip_and_limit() -> None:
    assert parse_termination_message(termination_message(REPORT)) == REPORT
    long = PreparationRefusal.of(Refusal.DATASET_SCHEMA, "x" * 10_000)
    text = termination_message(long)
    assert len(text.encode()) <= 4096
    parsed = parse_termination_message(text)
    assert isinstance(parsed, PreparationRefusal) and parsed.reason == Refusal.DATASET_SCHEMA
    assert parse_termination_message("Traceback (most recent call last): ...") is None
    assert parse_termination_message('{"report": {"tokenizedKey": 3}}') is None
