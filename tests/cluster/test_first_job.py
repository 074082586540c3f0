"""The first job of docs/getting-started.md, exactly as the page shows it, through the real controllers.

The manifest is the page's YAML block (tests/unit/test_first_job.py holds it to
examples/first-job.yaml); only metadata.namespace is set here. The operator's MLflow is the one a
chart configures (``KUBETUNE_MLFLOW_TRACKING_URI``); the pods are the test cluster's CPU-only
processes with the tiny assets mounted where the trainer image carries them. Then ``kubectl get
ftj`` is compared with every sample of it on the README and the pages.
"""

from __future__ import annotations

import re

import yaml

from kubetune_api.preparation import PreparationReport
from kubetune_cli.report import render_report
from tests.cluster.test_real_controllers import apply_job, versions, wait_phase
from tests.support import docs_samples
from tests.support.cluster import Cluster
from tests.support.mlflow_server import MlflowServer
from tests.support.operator import OperatorProcess


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
