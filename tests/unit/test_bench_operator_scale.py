"""hack/bench_operator_scale.py's own logic: the stages each job is counted through, the verdict that
fails a run where jobs stopped, the early stop when nothing progresses, and that a preparation pod
the stand-in ends (the pod runner's exit status with the real report) is one the operator reads as
prepared."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.support.podrunner import TERMINATION_LOG_MAX, exit_status

from kubetune_api.preparation import DataStats, PreparationReport, termination_message
from kubetune_operator import builders
from kubetune_operator.observations import preparation_observation

REPO = Path(__file__).resolve().parents[2]


def _bench() -> ModuleType:
    name = "bench_operator_scale"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / "bench_operator_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _rows_of_one_job(job: str, t0: float) -> list[dict[str, Any]]:
    """The watch events of one job that goes all the way, in order."""
    pod = f"{job}-prepare-abcde"
    prep = {"kind": "Pod", "name": pod, "component": "preparation", "job": job, "role": None}
    return [
        {"t": t0, "kind": "FineTuneJob", "type": "ADDED", "name": job, "phase": None},
        {**prep, "t": t0 + 1, "type": "ADDED", "phase": "Pending", "node": None},
        {**prep, "t": t0 + 2, "type": "MODIFIED", "phase": "Pending", "node": "gpu-node-0"},
        {**prep, "t": t0 + 3, "type": "MODIFIED", "phase": "Running", "node": "gpu-node-0"},
        {**prep, "t": t0 + 13, "type": "MODIFIED", "phase": "Succeeded", "node": "gpu-node-0"},
        {
            "t": t0 + 14,
            "kind": "Job",
            "type": "MODIFIED",
            "name": f"{job}-prepare",
            "job": job,
            "component": "preparation",
            "complete": True,
            "failed": False,
        },
        {
            "t": t0 + 15,
            "kind": "PyTorchJob",
            "type": "ADDED",
            "name": f"{job}-train",
            "job": job,
            "suspend": True,
        },
        {
            "t": t0 + 17,
            "kind": "PyTorchJob",
            "type": "MODIFIED",
            "name": f"{job}-train",
            "job": job,
            "suspend": False,
        },
        {
            "t": t0 + 20,
            "kind": "Pod",
            "type": "MODIFIED",
            "name": f"{job}-train-master-0",
            "ptj": f"{job}-train",
            "role": "master",
            "phase": "Running",
            "node": "gpu-node-1",
            "component": "training",
            "job": job,
        },
    ]


def test_each_stage_is_counted_and_timed_from_the_apply() -> None:
    bench = _bench()
    rows = _rows_of_one_job("bench-0000", 100.0) + _rows_of_one_job("bench-0001", 100.5)[:5]
    a = bench.analyse(rows, {"bench-0000", "bench-0001"})
    assert a["stages"] == {
        "applied": 2,
        "preparation_pod_created": 2,
        "preparation_pod_running": 2,
        "preparation_pod_succeeded": 2,
        "preparation_complete": 1,
        "training_child_created": 1,
        "admitted_by_kueue": 1,
        "master_pod_running": 1,
    }
    assert a["ptj_s"]["p50"] == 15.0
    assert a["prepared_to_ptj_s"]["p50"] == 1.0
    assert a["to_preparation_running_s"]["count"] == 2
    # both waited for a node at once (t 1 to 2, 1.5 to 2.5), then ran at once (3 to 13, 3.5 to 13.5)
    assert a["preparation_pods_at_once"] == {"bound": 2, "unscheduled": 2}


def test_events_of_other_jobs_are_not_counted() -> None:
    a = _bench().analyse(_rows_of_one_job("someone-else", 0.0), {"bench-0000"})
    assert set(a["stages"].values()) == {0}


def test_the_verdict_names_the_first_stage_jobs_stopped_at() -> None:
    bench = _bench()
    everyone = dict.fromkeys(bench.STAGES, 500) | {"admitted_by_kueue": 32, "master_pod_running": 32}
    assert bench.verdict(everyone, 500) == []
    # the outside check at head: every job Preparing, no PyTorchJob
    stuck = dict.fromkeys(bench.STAGES, 0) | {
        "applied": 500,
        "preparation_pod_created": 500,
        "preparation_pod_running": 192,
    }
    assert bench.verdict(stuck, 500) == [
        "only 192 of 500 jobs reached preparation_pod_running",
        "Kueue admitted no job",
    ]
    late = everyone | {"master_pod_running": 30}
    assert bench.verdict(late, 500) == ["only 30 of the 32 jobs Kueue admitted had their master pod Running"]


def test_a_run_stops_early_when_no_training_child_comes_or_nothing_moves() -> None:
    stalled = _bench().stalled
    stages = {"applied": 500, "training_child_created": 0}
    bounds = {"first_child_within": 300.0, "stall_after": 120.0}
    assert stalled(1250.0, 1000.0, stages, 1200.0, **bounds) is None
    why = stalled(1301.0, 1000.0, stages, 1250.0, **bounds)
    assert why is not None and why.startswith("no job reached its training child within 300 s")
    moving = {"applied": 500, "training_child_created": 10}
    assert stalled(5000.0, 1000.0, moving, 4900.0, **bounds) is None
    why = stalled(5000.0, 1000.0, moving, 4870.0, **bounds)
    assert why is not None and why.startswith("no job reached a further stage for 120 s")


def test_a_preparation_pod_the_stand_in_ends_is_prepared_for_the_operator() -> None:
    """The pod runner's exit status with a report as the termination message, on a pod of a Job the
    Job controller marked Complete: the operator reads the report."""
    report = PreparationReport(
        tokenized_key="0123456789abcdef",
        tokenized_hash="f" * 64,
        dataset_hash="e" * 64,
        data=DataStats(
            train_examples=90,
            eval_examples=10,
            tokens=9000,
            length_p50=100,
            length_p95=150,
            length_max=200,
            truncated_fraction=0.0,
            loss_token_fraction=0.4,
        ),
    )
    message = termination_message(report)
    body = exit_status(
        [(builders.PREPARE_CONTAINER, "ghcr.io/kubetune/trainer:bench")],
        0,
        message,
        started="2026-12-07T08:00:00Z",
    )
    assert body["status"]["phase"] == "Succeeded"
    pod = {"metadata": {"name": "j-prepare-x", "ownerReferences": [{"uid": "u1"}]}, **body}
    job = {
        "metadata": {"name": "j-prepare", "uid": "u1"},
        "status": {"conditions": [{"type": "Complete", "status": "True"}]},
    }
    seen = preparation_observation(job, [pod], builders.PREPARE_CONTAINER)
    assert seen.state == "Succeeded" and seen.report == report
    # a message past the kubelet's limit keeps its tail, as the kubelet does
    long = exit_status([("c", "i")], 1, "x" * 5000 + "end", started="t")
    terminated = long["status"]["containerStatuses"][0]["state"]["terminated"]
    assert len(terminated["message"]) == TERMINATION_LOG_MAX and terminated["message"].endswith("end")
    assert terminated["reason"] == "Error" and long["status"]["phase"] == "Failed"


def test_the_labels_it_follows_are_the_operators() -> None:
    bench = _bench()
    assert bench.LABEL_JOB == builders.LABEL_JOB
    assert bench.LABEL_COMPONENT == builders.LABEL_COMPONENT
    assert bench.PREPARATION == builders.COMPONENT_PREPARATION


def test_the_operator_s_errors_are_read_from_its_json_log_apart_from_retries() -> None:
    log = "\n".join(
        [
            '{"message": "Handler \'finetunejob_changed\' succeeded.", "severity": "info"}',
            '{"message": "Handler \'finetunejob_changed\' failed temporarily: waiting", "severity": "error"}',
            '{"message": "Handler \'pytorchjob_event\' failed with an exception.", "severity": "error"}',
            "Traceback (most recent call last):",
        ]
    )
    errors, temporary = _bench().log_errors(log)
    assert temporary == 1
    assert len(errors) == 2 and "failed with an exception" in errors[0]


def test_the_steady_state_counts_only_the_events_of_its_window(tmp_path: Path) -> None:
    import json
    import os
    import threading

    bench = _bench()
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"t": 1.0, "kind": "PyTorchJob"}) + "\n")  # before the window

    def during() -> None:
        with events.open("a") as f:
            f.write(json.dumps({"t": 2.0, "kind": "FineTuneJob"}) + "\n")

    timer = threading.Timer(0.1, during)
    timer.start()
    steady = bench.steady_state(os.getpid(), events, {"a", "b"}, 0.5)
    timer.join()
    assert steady["jobs"] == 2
    assert steady["watch_events_in_window"] == {"FineTuneJob": 1}
    assert steady["window_s"] >= 0.5
    assert steady["cpu_s_per_minute"] >= 0
