"""`kubetune bench --smoke`: the benchmark's whole path on the CPU with the tiny model.

Light enough for a busy two-core machine: the tiny model's conversations are cut at 128 tokens, and
each process trains on one thread (``trainer_env``), so that its processes do not thrash each other
or whatever else runs there.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tests.e2e.conftest import REPO, trainer_env

pytestmark = [pytest.mark.e2e, pytest.mark.training]


def test_bench_smoke_writes_table_chart_and_ratios(tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "kubetune_cli.main",
            "bench",
            "--smoke",
            "--out",
            str(out),
            "--warmup",
            "1",
            "--steps",
            "1",
            "--rows",
            "120",
            "--gpus",
            "1,2",
            "--epoch-tokens",
            "20000",
            "--fp8",
        ],
        cwd=REPO,  # the FineTuneJob examples: ./examples by default
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data = json.loads((out / "bench.json").read_text())
    results = {r["case"]: r for r in data["results"]}
    assert set(results) == {
        "tiny:notebook-a",
        "tiny:kubetune-lora",
        "tiny:notebook-b",
        "tiny:kubetune-full",
        # the kubetune cases again through the PyTorchJob's launcher with two processes (gloo here)
        "tiny:kubetune-lora x2 GPUs",
        "tiny:kubetune-full x2 GPUs",
        # one whole epoch
        "tiny:kubetune-lora epoch",
        # KUBETUNE_FP8 asked where the plan cannot honour it (no float8 GPU here), and labelled so
        "tiny:kubetune-full (fp8 asked: off)",
    }
    for r in results.values():
        assert r["tokens"] > 0 and r["tokens_per_second"] > 0 and r["step_seconds"] > 0
        assert r["flops_per_token"] > 0
    # every optimizer step's time, warm-up included (one warm-up and one measured step here)
    assert len(results["tiny:kubetune-full"]["step_times"]) == 2
    # each kubetune case is compared with its notebook on the same model and data
    assert results["tiny:kubetune-lora"]["speedup"] > 0 and results["tiny:kubetune-full"]["speedup"] > 0
    assert results["tiny:kubetune-full"]["plan"]["packing"] is True
    assert results["tiny:notebook-b"]["plan"]["packing"] is False
    two = results["tiny:kubetune-full x2 GPUs"]
    assert two["gpus"] == 2 and two["sharding"] == "ddp" and two["scaling"] > 0
    assert results["tiny:kubetune-lora x2 GPUs"]["sharding"] == "ddp"
    epoch = results["tiny:kubetune-lora epoch"]
    # every token of the epoch was trained (20k asked, in whole conversations of random length)
    assert 16_000 <= epoch["tokens"] < 24_000 and epoch["epoch_training_seconds"] > 0
    table = (out / "bench.md").read_text()
    fp8 = results["tiny:kubetune-full (fp8 asked: off)"]
    assert fp8["fp8"] == "asked, off" and "fp8 tensor cores" in fp8["plan"]["reasons"]["fp8"]
    assert fp8["speedup"] > 0  # against its notebook, like the bf16 row
    assert table.count("\n| tiny:") == 8 and "One epoch of" in table
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
