"""The benchmark's ratios: each kubetune row against its notebook, each multi-GPU row against one GPU."""

from __future__ import annotations

from typing import Any

from kubetune_trainer.bench import Job, _ratio_rows


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
    rows = _ratio_rows(
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
    from kubetune_trainer.bench import job_env

    caller = {"PATH": "/bin", "KUBETUNE_FP8": "tensorwise", "KUBETUNE_GPU_MEMORY_GIB": "40"}
    plain = job_env(Job("qwen3-4b:notebook-b"), caller)
    assert "KUBETUNE_FP8" not in plain and "KUBETUNE_GPU_MEMORY_GIB" not in plain
    assert plain["PATH"] == "/bin" and plain["TORCH_LOGS"] == "recompiles"
    assert job_env(Job("qwen3-4b:kubetune", fp8=True), caller)["KUBETUNE_FP8"] == "tensorwise"
    forced = job_env(Job("qwen3-4b:kubetune", gpus=2, sharding="fsdp2"), caller)
    assert forced["KUBETUNE_SHARDING"] == "fsdp2"


def test_a_row_with_the_notebook_s_step_size_is_compared_but_is_nobody_s_baseline() -> None:
    rows = _ratio_rows(
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
    from kubetune_trainer.bench import notebook_step_rows

    # notebook B: 8 sequences a step; at the cap each fills a row, shorter ones share rows
    assert notebook_step_rows("kubetune-full", [1024] * 5) == 8
    assert notebook_step_rows("kubetune-full", [512] * 5) == 4
    assert notebook_step_rows("kubetune-full", [16] * 5) == 1
    # notebook A: 8 x 4 sequences
    assert notebook_step_rows("kubetune-lora", [1024, 512]) == 24
