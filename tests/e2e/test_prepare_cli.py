"""``kubetune prepare job.yaml`` on this machine: the tiny model and data, the report's numbers as the
run folder's report.json has them, the estimate for the GPUs the manifest asks for (computed on
this CPU), and the refusals (empty data, a job that does not fit its GPU) with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import REPO, TINY_DATA, trainer_env

from kubetune_api.preparation import HINTS, REPORT_FILE, PreparationReport, Refusal

pytestmark = [pytest.mark.e2e]


def manifest(tmp_path: Path, *, data: Path = TINY_DATA, **resources: Any) -> Path:
    """examples/tiny-local.yaml with this data file and these resources."""
    job = yaml.safe_load((REPO / "examples" / "tiny-local.yaml").read_text())
    job["spec"]["dataset"]["path"] = str(data)
    job["spec"]["resources"].update(resources)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def prepare(tmp_path: Path, job: Path) -> subprocess.CompletedProcess[str]:
    env = trainer_env()
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_DATASETS_OFFLINE"] = "1"
    env["KUBETUNE_CACHE"] = str(tmp_path.parent / "cache")  # the tiny model, built once for the module
    return subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "prepare", str(job), "--output-dir", str(tmp_path / "out")],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_report_with_the_estimate_for_the_gpus_asked(tmp_path: Path) -> None:
    proc = prepare(tmp_path, manifest(tmp_path, gpusPerNode=2, gpuProduct="NVIDIA-L40S"))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    report = PreparationReport.model_validate_json((tmp_path / "out" / REPORT_FILE).read_text())
    d, e = report.data, report.estimate
    assert e is not None and e.gpus == 2 and e.gpu_product == "NVIDIA-L40S" and e.fits
    assert d.train_examples == 288 and d.eval_examples == 32  # 320 rows, evalFraction 0.1
    out = proc.stdout
    for text in (
        f"{d.train_examples:,} training, {d.eval_examples:,} evaluation",
        f"{d.tokens:,} an epoch",
        f"p50 {d.length_p50:,}  p95 {d.length_p95:,}  max {d.length_max:,}",
        f"{100 * d.truncated_fraction:.1f}% of the examples",
        f"{100 * d.loss_token_fraction:.1f}% of the tokens",
        "2 x NVIDIA-L40S",
        f"{e.peak_memory_gib:.1f} of 48 GiB per GPU (peak estimate, fits)",
        f"sharding {e.sharding}",
        f"{e.tokens_per_second:,.0f} tokens/s",
        f"for {e.steps:,} steps",
        f"{e.gpu_hours:,.2f} GPU-hours",
    ):
        assert text in out, (text, out)


def test_cpu_training_reports_the_data_without_an_estimate(tmp_path: Path) -> None:
    proc = prepare(tmp_path, manifest(tmp_path))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "288 training" in proc.stdout and "estimate        none (CPU training" in proc.stdout
    report = json.loads((tmp_path / "out" / REPORT_FILE).read_text())
    assert "estimate" not in report


def test_empty_data_is_refused_with_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    proc = prepare(tmp_path, manifest(tmp_path, data=empty))
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert f"refused: {Refusal.DATASET_EMPTY}" in proc.stderr
    assert str(empty) in proc.stderr or "empty" in proc.stderr
    assert "prepared in" not in proc.stdout and not (tmp_path / "out" / REPORT_FILE).exists()


def test_a_job_too_big_for_its_gpu_is_refused_with_what_would_fit(tmp_path: Path) -> None:
    # the tiny model's rows at 4M tokens a micro-step do not fit a 24 GiB L4; a smaller tokensPerStep does
    job = manifest(tmp_path, gpusPerNode=1, gpuProduct="NVIDIA-L4")
    spec = yaml.safe_load(job.read_text())
    spec["spec"]["training"]["tokensPerStep"] = 4_194_304
    spec["spec"]["training"]["maxLength"] = 4096
    job.write_text(yaml.safe_dump(spec))
    proc = prepare(tmp_path, job)
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert f"refused: {Refusal.DOES_NOT_FIT}" in proc.stderr
    assert "24 GiB of one NVIDIA-L4" in proc.stderr and "spec.training.tokensPerStep: " in proc.stderr
    assert HINTS[Refusal.DOES_NOT_FIT] in proc.stderr


def test_run_local_prepares_first_and_stops_at_a_refusal(tmp_path: Path) -> None:
    # the tiny data's median example is ~36 tokens: at maxLength 16 most are cut, which only the
    # preparation step (tokenized lengths) can see; training never starts
    job = manifest(tmp_path)
    spec = yaml.safe_load(job.read_text())
    spec["spec"]["training"]["maxLength"] = 16
    job.write_text(yaml.safe_dump(spec))
    env = trainer_env()
    env["HF_HUB_OFFLINE"] = "1"
    env["KUBETUNE_CACHE"] = str(tmp_path.parent / "cache")
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "run", str(job), "--local", "--output-dir", str(out)],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr[-3000:]
    assert (
        f"refused: {Refusal.MOSTLY_TRUNCATED}" in proc.stderr
        and HINTS[Refusal.MOSTLY_TRUNCATED] in proc.stderr
    )
    assert "kubetune: training" not in proc.stderr and not (out / "checkpoints").exists()
