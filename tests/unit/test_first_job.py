"""The first cluster job of docs/getting-started.md, short of a cluster (tests/cluster/test_first_job.py
runs it through the real controllers).

- The trainer image builds the tiny assets where the manifests and the cluster tests find them:
  ``kubetune_trainer.tiny.TINY_ROOT``, the one place that path is written in code.
- The page shows ``examples/first-job.yaml`` as it is, with the commands that run and follow it;
  the job asks for no GPU, no Hub download and no secret.
- Every ``kubectl get ftj`` sample on the README and the pages has the CRD's columns and is that
  job's output (the cluster test compares it with what kubectl printed).
"""

from __future__ import annotations

import re
import shlex
from typing import Any

import yaml
from tests.support import docs_samples
from tests.support.controlplane import REPO

from kubetune_api.crd import PRINTER_COLUMNS
from kubetune_api.spec import FineTuneJob
from kubetune_trainer.tiny import TINY_DATA, TINY_MODEL, TINY_ROOT

DOCKERFILE = REPO / "images" / "trainer" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    """The Dockerfile's instructions (keyword, arguments), continuation lines joined, comments out."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in text.splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        keyword, _, args = current.strip().partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        current = ""
    return out


def test_the_trainer_image_builds_the_tiny_assets_where_the_manifests_name_them() -> None:
    steps = instructions(DOCKERFILE.read_text())
    build = [
        i
        for i, (kw, args) in enumerate(steps)
        if kw == "RUN" and "python -m kubetune_trainer.tiny --assets" in args
    ]
    assert len(build) == 1, "the trainer image must build the tiny assets with kubetune_trainer.tiny"
    (at,) = build
    command = steps[at][1]
    words = shlex.split(command)
    assert words[words.index("--assets") + 1] == TINY_ROOT
    # readable by the pods' non-root user, whatever the build's umask
    assert f"chmod -R a+rX {TINY_ROOT}" in command
    # after the trainer's code is in the image, before the image drops to the non-root user
    copies = [i for i, (kw, args) in enumerate(steps) if kw == "COPY" and "trainer/kubetune_trainer" in args]
    user = [i for i, (kw, _) in enumerate(steps) if kw == "USER"]
    assert copies and copies[0] < at < user[0]
    assert "PYTHONPATH=/opt/kubetune" in DOCKERFILE.read_text()


def test_the_cluster_tests_and_the_local_run_use_the_image_path() -> None:
    from tests.cluster import conftest

    from kubetune_cli import run

    assert conftest.TINY_IMAGE_DIR == TINY_ROOT
    assert run.TINY_ROOT == TINY_ROOT


def manifest(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / name).read_text())
    return doc


def test_the_tiny_examples_name_the_assets_the_image_carries() -> None:
    for name in ("tiny-local.yaml", "first-job.yaml"):
        spec = manifest(name)["spec"]
        assert spec["model"]["path"] == f"{TINY_ROOT}/{TINY_MODEL}", name
        assert spec["dataset"]["path"] == f"{TINY_ROOT}/{TINY_DATA}/tiny-chat.jsonl", name


def test_the_first_job_needs_no_gpu_no_hub_and_no_secret() -> None:
    doc = manifest("first-job.yaml")
    job = FineTuneJob.model_validate(doc)  # what the API server's schema accepts, in the typed models
    assert job.metadata.name == "first-job"
    spec = doc["spec"]
    assert spec["resources"]["gpusPerNode"] == 0
    assert "gpuProduct" not in spec["resources"]
    assert "name" not in spec["model"] and "name" not in spec["dataset"]  # no Hub id
    assert "secrets" not in spec
    # registered into the MLflow the chart configures, not one named here
    assert "trackingUri" not in spec["registration"]
    assert (
        spec["registration"]["modelName"] == "demo.tiny"
    )  # in namespace demo, as the chart's registry tenancy wants
    # a few steps: minutes on a CPU
    assert spec["training"]["maxSteps"] <= 50


def test_getting_started_shows_the_first_job_as_it_is_and_how_to_run_it() -> None:
    assert docs_samples.first_job_on_the_page() == docs_samples.FIRST_JOB.read_text()
    page = docs_samples.GETTING_STARTED.read_text()
    for command in (
        "kubectl -n demo apply -f examples/first-job.yaml",
        "kubectl -n demo get ftj -w",
        "kubetune watch first-job -n demo",
    ):
        assert command in page, command


def test_every_get_ftj_sample_has_the_crds_columns_and_is_the_first_jobs_output() -> None:
    samples = docs_samples.get_ftj_samples()
    where = {s.path.name for s in samples}
    assert {"README.md", "index.md", "getting-started.md"} <= where, where
    # what kubectl prints for the CRD (columns of priority 0; NAME first)
    columns = ["NAME", *(c["name"].upper() for c in PRINTER_COLUMNS if not c.get("priority"))]
    for sample in samples:
        at = f"{sample.path.name}:{sample.line}"
        header, rows = docs_samples.table(sample.text)
        assert header == columns, at
        assert [r["NAME"] for r in rows] == ["first-job"], at
        (row,) = rows
        assert row["PHASE"] == "Succeeded" and row["PROGRESS"] == "100", at
        assert row["MODEL"] == "demo.tiny" and row["VERSION"] == "1", at
        assert re.fullmatch(r"\d+\.\d+", row["LOSS"]), at
        assert re.fullmatch(r"\d+", row["TOKENS"]), at
        assert row["EST-GPU-H"] == "", at  # a CPU job: nothing GPU-sized to estimate
        assert re.fullmatch(docs_samples.KUBECTL_AGE, row["AGE"]), at
    # one run's output, the same wherever it is shown
    assert len({s.text for s in samples}) == 1, [f"{s.path.name}:{s.line}" for s in samples]
