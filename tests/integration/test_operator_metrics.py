"""The operator's /metrics against what happened: one job driven to Succeeded and one to Failed (the
test plays the Training Operator and the Job controller), then the endpoint scraped over HTTP."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from tests.integration.conftest import (
    API_VERSION,
    condition,
    finish_registration_job,
    kopf_runner,
    load_example,
    set_pytorchjob_condition,
    wait_for,
    wait_phase,
)
from tests.support.prometheus import Samples, by_label, scrape, total, value

pytestmark = [pytest.mark.integration, pytest.mark.e2e]

RESULT = {"name": "qwen3_4b_assistant", "version": "1", "uri": "models:/qwen3_4b_assistant/1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture
def metrics_url(operator_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> str:
    port = _free_port()
    monkeypatch.setenv("KUBETUNE_METRICS_PORT", str(port))
    monkeypatch.setenv("KUBETUNE_METRICS_ADDRESS", "127.0.0.1")
    return f"http://127.0.0.1:{port}/metrics"


@pytest.fixture
def operator_with_metrics(metrics_url: str, namespace: str) -> Iterator[str]:
    with kopf_runner(namespace):
        wait_for(lambda: scrape(metrics_url), what="the metrics endpoint")
        yield metrics_url


def _start(kube: Any, namespace: str, name: str) -> str:
    doc = load_example("qwen3-4b-full.yaml", namespace)
    doc["metadata"]["name"] = name
    kube.create(doc)
    ptj = f"{name}-train"
    wait_for(lambda: kube.get("kubeflow.org/v1", "PyTorchJob", namespace, ptj), what=f"{ptj}")
    return ptj


def test_metrics_match_a_succeeded_and_a_failed_job(
    kube: Any, namespace: str, operator_with_metrics: str
) -> None:
    url = operator_with_metrics
    before = scrape(url)
    assert before is not None

    # one job trains (its start observed as queue wait), reports its GPU time, registers, succeeds
    ptj = _start(kube, namespace, "good")
    set_pytorchjob_condition(kube, namespace, ptj, "Running")
    started = wait_phase(kube, namespace, "good", "Training")
    goodput = {"heldGpuSeconds": 7200.0, "productiveGpuSeconds": 5400.0}
    kube.patch(
        API_VERSION, "FineTuneJob", namespace, "good", {"status": {"goodput": goodput}}, subresource="status"
    )
    set_pytorchjob_condition(kube, namespace, ptj, "Succeeded")
    wait_for(lambda: kube.get("batch/v1", "Job", namespace, "good-register"), what="the registration Job")
    finish_registration_job(kube, namespace, "good-register", message=json.dumps(RESULT))
    wait_phase(kube, namespace, "good", "Succeeded")

    # the other fails before its training ever ran: no training start, no queue wait
    ptj = _start(kube, namespace, "bad")
    set_pytorchjob_condition(
        kube, namespace, ptj, "Failed", "PyTorchJob has failed because 1 Master replica(s) failed."
    )
    failed = wait_phase(kube, namespace, "bad", "Failed")
    reason = condition(failed, "Ready")["reason"]
    assert "startTime" not in failed["status"]

    def settled() -> Samples | None:
        s = scrape(url)
        done = s and value(s, "kubetune_finetunejobs", namespace=namespace, phase="Failed") == 1
        return s if done else None

    after = wait_for(settled, what="both jobs in the phase gauge")
    phases = by_label(after, "kubetune_finetunejobs", "phase", namespace=namespace)
    assert phases == {"Succeeded": 1, "Failed": 1}
    failures = by_label(after, "kubetune_finetunejob_failures_total", "reason", namespace=namespace)
    assert failures == {reason: 1}

    def delta(name: str) -> float:
        return total(after, name) - total(before, name)

    assert delta("kubetune_reconcile_duration_seconds_count") > 0
    assert value(after, "kubetune_reconcile_duration_seconds_count", outcome="ok") > 0
    assert delta("kubetune_queue_wait_seconds_count") == 1
    waited = delta("kubetune_queue_wait_seconds_sum")
    assert 0 <= waited <= 120, waited  # creation to startTime, in whole seconds, during this test
    assert started["status"]["startTime"]
    assert value(after, "kubetune_gpu_hours_total", namespace=namespace) == 2.0
    assert value(after, "kubetune_productive_gpu_hours_total", namespace=namespace) == 1.5

    # a deleted job leaves the phase gauge
    kube.delete(API_VERSION, "FineTuneJob", namespace, "good", uid=started["metadata"]["uid"])

    def gone() -> bool:
        s = scrape(url)
        return bool(s) and value(s, "kubetune_finetunejobs", namespace=namespace, phase="Succeeded") == 0

    wait_for(gone, what="the deleted job out of the phase gauge")
