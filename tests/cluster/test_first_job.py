"""The first job of docs/getting-started.md, exactly as the page shows it, through the real controllers.

The manifest is the page's YAML block (tests/unit/test_first_job.py holds it to
examples/first-job.yaml); only metadata.namespace is set here. The operator's MLflow is the one a
chart configures (``KUBETUNE_MLFLOW_TRACKING_URI``); the pods are the test cluster's CPU-only
processes with the tiny assets mounted where the trainer image carries them. Then ``kubectl get
ftj`` is compared with every sample of it on the README and the pages, the operator's ``/metrics``
with what the job did, and the training run's MLflow system metrics are read back.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import Any

import pytest
import yaml

from kubetune_api.preparation import PreparationReport
from kubetune_cli.report import render_report
from tests.cluster.conftest import wait_for
from tests.cluster.test_real_controllers import apply_job, versions, wait_phase
from tests.support import docs_samples
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess
from tests.support.prometheus import Samples, by_label, scrape, total, value


def test_the_first_job_of_getting_started_succeeds_and_prints_as_the_pages_show(
    cluster: Cluster, mlflow_server: MlflowServer, ns: str, operator: OperatorProcess
) -> None:
    doc = yaml.safe_load(docs_samples.first_job_on_the_page())
    assert set(doc["metadata"]) == {"name"}, "the page's manifest names no namespace"
    doc["metadata"]["namespace"] = ns
    name = doc["metadata"]["name"]
    apply_job(cluster, doc)

    status = wait_phase(cluster, ns, name, "Succeeded")
    model = doc["spec"]["registration"]["modelName"]
    assert status["registeredModel"] == {**status["registeredModel"], "name": model, "version": "1"}
    assert [v.version for v in versions(mlflow_server, model)] == ["1"]
    job = json.loads(cluster.kubectl("-n", ns, "get", "ftj", name, "-o", "json").stdout)
    _assert_the_metrics_tell_what_happened(operator, ns, job)
    _assert_the_run_has_system_metrics(mlflow_server, status)

    # the preparation report, as `kubetune prepare` prints it, is docs/preparation.md's sample
    (sample,) = [
        b
        for b in docs_samples.code_blocks(docs_samples.REPO / "docs" / "preparation.md")
        if b.text.startswith("$ kubetune prepare examples/first-job.yaml")
    ]
    _, took, *report = sample.text.splitlines()
    assert re.fullmatch(r"prepared in \d+\.\ds", took), took
    assert render_report(PreparationReport.model_validate(status["preparation"]))[1:] == report

    printed = cluster.kubectl("-n", ns, "get", "ftj").stdout
    header, rows = docs_samples.table(printed)
    (row,) = rows
    samples = docs_samples.get_ftj_samples()
    assert samples, "no kubectl get ftj sample on the pages"
    for sample in samples:
        at = f"{sample.path.name}:{sample.line}"
        sample_header, sample_rows = docs_samples.table(sample.text)
        assert sample_header == header, (at, printed)
        (shown,) = sample_rows
        # what is the same on every run
        for column in ("NAME", "PHASE", "PROGRESS", "TOKENS", "EST-GPU-H", "MODEL", "VERSION"):
            assert shown[column] == row[column], (at, column, printed)
        # what varies: the same shape
        assert re.fullmatch(r"\d+\.\d+", row["LOSS"]) and re.fullmatch(r"\d+\.\d+", shown["LOSS"]), printed
        assert 0 < float(row["LOSS"]) < 7, printed  # the random base starts near ln(vocab) ~ 7
        assert re.fullmatch(docs_samples.KUBECTL_AGE, row["AGE"]) and re.fullmatch(
            docs_samples.KUBECTL_AGE, shown["AGE"]
        ), printed


def _assert_the_metrics_tell_what_happened(operator: OperatorProcess, ns: str, job: dict[str, Any]) -> None:
    """The operator's /metrics (this operator watched this namespace only, this one job in it) against
    the job: one Succeeded in the phase gauge and nothing else, no failure, passes for every phase it
    went through, its queue wait observed once (creation to status.startTime), and its GPU-hours held
    and productive as status.goodput says."""
    url = f"http://127.0.0.1:{operator.env['KUBETUNE_METRICS_PORT']}/metrics"

    def settled() -> Samples | None:
        samples = scrape(url)
        done = samples and value(samples, "kubetune_finetunejobs", namespace=ns, phase="Succeeded") == 1
        return samples if done else None

    samples = wait_for(settled, 60, "the Succeeded job in the phase gauge")
    assert by_label(samples, "kubetune_finetunejobs", "phase", namespace=ns) == {"Succeeded": 1}
    assert by_label(samples, "kubetune_finetunejob_failures_total", "reason", namespace=ns) == {}

    # a pass wrote each phase after Pending (Preparing, Training, Registering, Succeeded); none invalid
    passes = by_label(samples, "kubetune_reconcile_duration_seconds_count", "outcome")
    assert sum(passes.values()) >= 4 and passes.get("ok", 0) >= 1 and "invalid" not in passes, passes
    assert total(samples, "kubetune_reconcile_duration_seconds_sum") > 0

    status = job["status"]
    waited = _seconds(status["startTime"]) - _seconds(job["metadata"]["creationTimestamp"])
    assert value(samples, "kubetune_queue_wait_seconds_count") == 1, samples
    assert abs(value(samples, "kubetune_queue_wait_seconds_sum") - waited) < 1e-6, (waited, status)

    # the trainer's ledger counts its processes (world size) as the devices held: one on this CPU job
    goodput = status["goodput"]
    held, productive = goodput["heldGpuSeconds"], goodput["productiveGpuSeconds"]
    assert held >= productive > 0, goodput
    assert value(samples, "kubetune_gpu_hours_total", namespace=ns) == pytest.approx(held / 3600), goodput
    productive_hours = value(samples, "kubetune_productive_gpu_hours_total", namespace=ns)
    assert productive_hours == pytest.approx(productive / 3600), goodput


def _seconds(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def _assert_the_run_has_system_metrics(mlflow_server: MlflowServer, status: dict[str, Any]) -> None:
    """The training pod logged MLflow's system metrics of its machine into the job's run (no GPU)."""
    from mlflow.tracking import MlflowClient

    metrics = MlflowClient(mlflow_server.uri).get_run(status["mlflow"]["runId"]).data.metrics
    system = {key: v for key, v in metrics.items() if key.startswith("system/")}
    assert 0 <= system["system/cpu_utilization_percentage"] <= 100, system
    assert system["system/system_memory_usage_megabytes"] > 0, system
    assert not [key for key in system if key.startswith("system/gpu_")], system
