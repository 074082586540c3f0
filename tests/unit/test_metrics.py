"""The operator's metrics (kubetune_operator.metrics): what a written status records, the phase gauge,
refused API requests, the setting that turns the endpoint on, and the endpoint itself.

The whole flow (a job to Succeeded and one to Failed, scraped) is tests/integration/test_operator_metrics.py."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest
from prometheus_client import REGISTRY

from kubetune_operator import kube, metrics
from kubetune_operator.settings import Settings


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def job(namespace: str, status: dict[str, Any] | None = None) -> dict[str, Any]:
    meta = {"namespace": namespace, "name": "j", "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"metadata": meta, "status": status or {}}


def failed(reason: str) -> dict[str, Any]:
    return {"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "reason": reason}]}


def test_a_failure_is_counted_once_by_its_reason() -> None:
    ns = "unit-failures"
    metrics.status_written(job(ns, {"phase": "Training"}), failed("TrainingFailed"))
    # the same status written again (a later pass that saw Failed already) adds nothing
    metrics.status_written(job(ns, failed("TrainingFailed")), failed("TrainingFailed"))
    assert value("kubetune_finetunejob_failures_total", namespace=ns, reason="TrainingFailed") == 1
    # a reason outside the API's closed set never becomes a label value of its own
    metrics.status_written(job(ns, {"phase": "Training"}), failed("made-up"))
    assert value("kubetune_finetunejob_failures_total", namespace=ns, reason="Other") == 1
    assert value("kubetune_finetunejob_failures_total", namespace=ns, reason="made-up") == 0


def test_queue_wait_is_observed_when_training_starts() -> None:
    before = value("kubetune_queue_wait_seconds_count")
    before_sum = value("kubetune_queue_wait_seconds_sum")
    started = {"phase": "Training", "startTime": "2026-01-01T00:01:30Z"}
    metrics.status_written(job("unit-queue", {"phase": "Pending"}), started)
    metrics.status_written(job("unit-queue", started), {**started, "phase": "Registering"})
    assert value("kubetune_queue_wait_seconds_count") == before + 1
    assert value("kubetune_queue_wait_seconds_sum") == pytest.approx(before_sum + 90)


def test_gpu_hours_come_from_the_trainers_goodput_at_the_end() -> None:
    ns = "unit-gpu"
    goodput = {"heldGpuSeconds": 7200.0, "productiveGpuSeconds": 5400.0}
    registering = {"phase": "Registering", "goodput": goodput}
    metrics.status_written(job(ns, {"phase": "Training", "goodput": goodput}), {"phase": "Registering"})
    assert value("kubetune_gpu_hours_total", namespace=ns) == 0  # not at the end yet
    metrics.status_written(job(ns, registering), {"phase": "Succeeded"})
    metrics.status_written(job(ns, {**registering, "phase": "Succeeded"}), {"phase": "Succeeded"})
    assert value("kubetune_gpu_hours_total", namespace=ns) == 2.0
    assert value("kubetune_productive_gpu_hours_total", namespace=ns) == 1.5


def test_the_phase_gauge_counts_each_job_once_in_its_last_phase() -> None:
    ns = "unit-phase"
    metrics.saw(ns, "a", "Pending")
    metrics.saw(ns, "b", "Pending")
    metrics.saw(ns, "a", "Training")
    metrics.saw(ns, "a", "Training")
    assert value("kubetune_finetunejobs", namespace=ns, phase="Pending") == 1
    assert value("kubetune_finetunejobs", namespace=ns, phase="Training") == 1
    metrics.saw(ns, "a", None)  # deleted
    metrics.saw(ns, "c", None)  # never seen: nothing to take away
    assert value("kubetune_finetunejobs", namespace=ns, phase="Training") == 0
    assert value("kubetune_finetunejobs", namespace=ns, phase="Pending") == 1


def test_refused_requests_are_counted_by_verb_and_class_but_a_missing_read_is_not() -> None:
    def count(verb: str, code_class: str) -> float:
        return value("kubetune_api_errors_total", verb=verb, code_class=code_class)

    before = {k: count(*k) for k in [("GET", "4xx"), ("PATCH", "4xx"), ("POST", "5xx"), ("GET", "none")]}
    kube._refused("GET", kube.ApiError(404, "Not Found", ""))
    kube._refused("patch", kube.ApiError(409, "Conflict", ""))
    kube._refused("POST", kube.ApiError(503, "Service Unavailable", ""))
    kube._refused("GET", kube.ApiError(0, "NoResponse", "ConnectionRefusedError"))
    after = {k: count(*k) for k in before}
    assert {k: after[k] - before[k] for k in before} == {
        ("GET", "4xx"): 0,
        ("PATCH", "4xx"): 1,
        ("POST", "5xx"): 1,
        ("GET", "none"): 1,
    }


def test_the_metrics_port_setting() -> None:
    assert Settings.from_env({}).metrics_port == 0  # off unless asked
    on = Settings.from_env({"KUBETUNE_METRICS_PORT": "9100", "KUBETUNE_METRICS_ADDRESS": "127.0.0.1"})
    assert (on.metrics_port, on.metrics_address) == (9100, "127.0.0.1")
    for bad in ("http", "70000", "-1"):
        with pytest.raises(ValueError, match="KUBETUNE_METRICS_PORT"):
            Settings.from_env({"KUBETUNE_METRICS_PORT": bad})


def test_the_endpoint_serves_every_declared_metric() -> None:
    metrics.pass_done("ok", 0.01)
    metrics.saw("unit-serve", "j", "Pending")
    server = metrics.serve(0, "127.0.0.1")  # port 0: a free one
    try:
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            text = resp.read().decode()
    finally:
        metrics.stop(server)
    declared = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE kubetune_")}
    # counters are declared without _total in TYPE lines; their samples carry it
    exposed = {n if n in metrics.NAMES else f"{n}_total" for n in declared}
    assert exposed == set(metrics.NAMES)
    assert 'kubetune_finetunejobs{namespace="unit-serve",phase="Pending"} 1.0' in text
    assert 'kubetune_reconcile_duration_seconds_count{outcome="ok"}' in text


def test_a_process_serves_its_metrics_once_and_again_after_stopping() -> None:
    """A replica that waits for the leader Lease serves /metrics before kopf starts; kopf's startup
    then finds them served and serves nothing more (and stops nothing at cleanup)."""
    first = metrics.serve(0, "127.0.0.1")
    try:
        assert first is not None
        assert metrics.serve(0, "127.0.0.1") is None
        metrics.leading(False)
        url = f"http://127.0.0.1:{first.server_port}/metrics"
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert "kubetune_leader 0.0" in resp.read().decode()
        metrics.leading(True)
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert "kubetune_leader 1.0" in resp.read().decode()
    finally:
        metrics.stop(first)
    again = metrics.serve(0, "127.0.0.1")
    assert again is not None
    metrics.stop(again)
