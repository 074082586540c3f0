"""The benchmark's ratios: each kubetune row against its notebook, each multi-GPU row against one GPU."""

from __future__ import annotations

from typing import Any

from kubetune_bench.cases import Job
from kubetune_bench.report import ratio_rows


def _row(case: str, kind: str, tps: float, **extra: Any) -> dict[str, Any]:
    return {
        "case": case,
        "model": "qwen3-4b",
        "kind": kind,
        "tokens_per_second": tps,
        "peak_memory_gib": 10.0,
        **extra,
    }


def test_a_float8_row_is_compared_with_its_notebook_but_is_nobody_s_baseline() -> None:
    rows = ratio_rows(
        [
            _row("qwen3-4b:kubetune (fp8 tensorwise)", "kubetune-full", 22_000.0, fp8="tensorwise"),
            _row("qwen3-4b:notebook-b", "notebook-b", 2_000.0),
            _row("qwen3-4b:kubetune", "kubetune-full", 20_000.0),
            _row("qwen3-4b:kubetune x2 GPUs", "kubetune-full", 38_000.0, gpus=2),
        ]
    )
    by_case = {r["case"]: r for r in rows}
    assert by_case["qwen3-4b:kubetune (fp8 tensorwise)"]["speedup"] == 11.0
    assert by_case["qwen3-4b:kubetune"]["speedup"] == 10.0
    # two GPUs against the bf16 row, not the float8 one listed first
    assert by_case["qwen3-4b:kubetune x2 GPUs"]["scaling"] == 1.9


def test_float8_jobs_have_their_own_result_files() -> None:
    assert Job("qwen3-4b:kubetune", fp8=True).stem == "qwen3-4b_kubetune_fp8"
    assert Job("qwen3-4b:kubetune", cap=80, fp8=True).stem == "qwen3-4b_kubetune_cap_fp8"


def test_a_job_runs_with_its_own_tuning_variables_only() -> None:
    from kubetune_bench.jobs import job_env

    caller = {"PATH": "/bin", "KUBETUNE_FP8": "tensorwise", "KUBETUNE_GPU_MEMORY_GIB": "40"}
    plain = job_env(Job("qwen3-4b:notebook-b"), caller)
    assert "KUBETUNE_FP8" not in plain and "KUBETUNE_GPU_MEMORY_GIB" not in plain
    assert plain["PATH"] == "/bin" and plain["TORCH_LOGS"] == "recompiles"
    assert job_env(Job("qwen3-4b:kubetune", fp8=True), caller)["KUBETUNE_FP8"] == "tensorwise"
    forced = job_env(Job("qwen3-4b:kubetune", gpus=2, sharding="fsdp2"), caller)
    assert forced["KUBETUNE_SHARDING"] == "fsdp2"


def test_a_row_with_the_notebook_s_step_size_is_compared_but_is_nobody_s_baseline() -> None:
    rows = ratio_rows(
        [
            _row(
                "qwen3-4b:kubetune (notebook's step: 6 rows)", "kubetune-full", 19_000.0, notebook_step_rows=6
            ),
            _row("qwen3-4b:notebook-b", "notebook-b", 2_000.0),
            _row("qwen3-4b:kubetune", "kubetune-full", 20_000.0),
            _row("qwen3-4b:kubetune x2 GPUs", "kubetune-full", 38_000.0, gpus=2),
        ]
    )
    by_case = {r["case"]: r for r in rows}
    assert by_case["qwen3-4b:kubetune (notebook's step: 6 rows)"]["speedup"] == 9.5
    assert by_case["qwen3-4b:kubetune x2 GPUs"]["scaling"] == 1.9
    assert Job("qwen3-4b:kubetune", notebook_steps=True).stem == "qwen3-4b_kubetune_nbsteps"


def test_the_notebook_s_step_in_packed_rows() -> None:
    from kubetune_bench.workload import notebook_step_rows

    # notebook B: 8 sequences a step; at the cap each fills a row, shorter ones share rows
    assert notebook_step_rows("kubetune-full", [1024] * 5) == 8
    assert notebook_step_rows("kubetune-full", [512] * 5) == 4
    assert notebook_step_rows("kubetune-full", [16] * 5) == 1
    # notebook A: 8 x 4 sequences
    assert notebook_step_rows("kubetune-lora", [1024, 512]) == 24


def _jobs(*argv: str) -> list[Job]:
    from kubetune_bench.cases import parse_training_overrides
    from kubetune_bench.cli import build_parser
    from kubetune_bench.jobs import plan_jobs

    args = build_parser().parse_args(list(argv))
    return plan_jobs(args, args.cases.split(","), parse_training_overrides(args.training))


def test_notebook_memory_runs_come_after_the_notebooks_and_name_their_settings() -> None:
    jobs = _jobs(
        "--cases",
        "qwen2-0.5b:notebook-a,qwen2-0.5b:kubetune",
        "--notebook-memory",
        "--training",
        "gradientCheckpointing=always",
    )
    assert [j.stem for j in jobs] == [
        "qwen2-0.5b_notebook-a",  # a notebook runs as its notebook sets it
        "qwen2-0.5b_kubetune_gradientCheckpointing-always",
        "qwen2-0.5b_kubetune_nbmem_gradientCheckpointing-always",
    ]
    # --gpus 0: only the capped runs (their notebooks' results already in --out)
    only = _jobs("--cases", "qwen3-4b:kubetune", "--gpus", "0", "--notebook-memory")
    assert [(j.stem, j.notebook_memory) for j in only] == [("qwen3-4b_kubetune_nbmem", True)]


def test_a_notebook_memory_job_is_capped_at_its_notebook_s_peak_or_fails_without_it(tmp_path: Any) -> None:
    import json

    from kubetune_bench.cases import notebook_of
    from kubetune_bench.jobs import notebook_peak_gib, run_job

    assert notebook_of("qwen3-4b:kubetune") == "qwen3-4b:notebook-b"
    assert notebook_peak_gib(tmp_path, "qwen3-4b:kubetune") is None
    failed = run_job(
        Job("qwen3-4b:kubetune", notebook_memory=True), tmp_path, warmup=1, steps=1, rows=10, extra=[]
    )
    assert "no qwen3-4b:notebook-b result" in failed["error"]
    assert not (tmp_path / "qwen3-4b_kubetune_nbmem.json").exists()
    (tmp_path / "qwen3-4b_notebook-b.json").write_text(json.dumps({"peak_memory_gib": 32.7}))
    assert notebook_peak_gib(tmp_path, "qwen3-4b:kubetune") == 32.7


def test_training_overrides_are_checked_like_the_spec() -> None:
    import pytest

    from kubetune_api.spec import Toggle, TrainingSpec
    from kubetune_bench.cases import apply_training_overrides, parse_training_overrides

    base = TrainingSpec(max_steps=10)
    pairs = parse_training_overrides(["gradientCheckpointing=always", "tokensPerStep=8192"])
    changed = apply_training_overrides(base, pairs)
    assert changed.gradient_checkpointing == Toggle.ALWAYS and changed.tokens_per_step == 8192
    assert base.gradient_checkpointing != Toggle.ALWAYS  # the example's spec is not changed in place
    with pytest.raises(ValueError, match="no field 'gradientCheckpoint'"):
        parse_training_overrides(["gradientCheckpoint=always"])
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_training_overrides(["tokensPerStep"])
    with pytest.raises(ValueError, match="gradientCheckpointing"):
        apply_training_overrides(base, parse_training_overrides(["gradientCheckpointing=sometimes"]))


def test_a_row_with_training_overrides_is_compared_but_is_nobody_s_baseline() -> None:
    rows = ratio_rows(
        [
            _row(
                "qwen3-4b:kubetune (gradientCheckpointing=always)",
                "kubetune-full",
                15_000.0,
                training_overrides={"gradientCheckpointing": "always"},
            ),
            _row("qwen3-4b:notebook-b", "notebook-b", 2_000.0),
            _row("qwen3-4b:kubetune", "kubetune-full", 20_000.0),
            _row("qwen3-4b:kubetune x2 GPUs", "kubetune-full", 38_000.0, gpus=2),
        ]
    )
    by_case = {r["case"]: r for r in rows}
    assert by_case["qwen3-4b:kubetune (gradientCheckpointing=always)"]["speedup"] == 7.5
    assert by_case["qwen3-4b:kubetune x2 GPUs"]["scaling"] == 1.9
