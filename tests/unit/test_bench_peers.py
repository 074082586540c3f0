"""The benchmark's peers: TRL at its best and Unsloth, their settings, their environment, their sweep
and their place in the report (no GPU: the settings and jobs are plain data)."""

from __future__ import annotations

import argparse
import types
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.trainer_config import load_manifest
from kubetune_bench import peers
from kubetune_bench.cases import CASES, EXAMPLES, Job, with_peers
from kubetune_bench.jobs import _command, job_env, plan_jobs, run_job, sweep_point_too_big
from kubetune_bench.report import markdown_table, ratio_rows

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"


def _training(kind: str) -> Any:
    return load_manifest(EXAMPLES_DIR / EXAMPLES[kind]).spec.training


def test_trl_at_its_best_sets_every_speed_option_trl_offers() -> None:
    training = _training("trl-best-lora")
    rows = peers.step_rows(training)
    settings = peers.trl_best_settings(training, batch=16, rows=rows, max_length=1024)
    sft = settings["sft"]
    assert sft["bf16"] is True and settings["dtype"] == "bfloat16"
    assert sft["packing"] is True and sft["padding_free"] is True and sft["packing_strategy"] == "bfd"
    assert sft["use_liger_kernel"] is True
    assert sft["optim"] == "adamw_torch_fused"
    assert sft["gradient_checkpointing"] is False
    # attention that keeps packed sequences apart without a dense mask over the whole packed batch
    assert settings["attn_implementation"] in ("flash_attention_3", "flash_attention_2", "flex_attention")
    # what kubetune's case trains: the example's tokens an optimizer step and its hyperparameters
    assert rows == 32 and sft["per_device_train_batch_size"] * sft["gradient_accumulation_steps"] == 32
    assert sft["learning_rate"] == training.learning_rate and sft["max_length"] == 1024


def test_a_sweep_point_may_force_the_attention_and_the_cpu_smoke_drops_cuda_options() -> None:
    training = _training("trl-best-full")
    forced = peers.trl_best_settings(training, batch=4, rows=8, max_length=1024, attn="sdpa")
    assert forced["attn_implementation"] == "sdpa" and forced["lacks"] == []
    cpu = peers.trl_best_settings(training, batch=4, rows=8, max_length=128, cuda=False)
    assert cpu["sft"]["bf16"] is False and cpu["sft"]["use_liger_kernel"] is False
    assert cpu["sft"]["optim"] == "adamw_torch" and cpu["attn_implementation"] == "sdpa"
    with pytest.raises(ValueError, match="does not divide"):
        peers.trl_best_settings(training, batch=3, rows=8, max_length=1024)


def test_unsloth_trains_what_kubetune_trains_in_bf16_without_recomputation() -> None:
    spec = load_manifest(EXAMPLES_DIR / EXAMPLES["unsloth-lora"]).spec
    assert spec.lora is not None
    lora: dict[str, Any] = {"r": spec.lora.r, "alpha": spec.lora.alpha, "dropout": spec.lora.dropout}
    lora["targets"] = list(spec.lora.target_modules)
    with_lora = peers.unsloth_settings(spec.training, lora, batch=16, rows=32, max_length=1024)
    assert with_lora["load"]["load_in_4bit"] is False and with_lora["load"]["full_finetuning"] is False
    assert with_lora["peft"]["r"] == spec.lora.r and with_lora["peft"]["lora_dropout"] == spec.lora.dropout
    assert with_lora["peft"]["use_gradient_checkpointing"] is False
    assert with_lora["sft"]["padding_free"] is True and with_lora["sft"]["optim"] == "adamw_torch_fused"
    full = peers.unsloth_settings(_training("unsloth-full"), None, batch=4, rows=8, max_length=1024)
    assert full["peft"] is None and full["load"]["full_finetuning"] is True


def test_only_the_unsloth_case_s_process_has_its_folder_on_the_path() -> None:
    caller = {
        "PATH": "/bin",
        "PYTHONPATH": "/kubetune/site:/repo/api",
        peers.UNSLOTH_SITE_ENV: "/unsloth/site",
    }
    unsloth = job_env(Job("qwen2-0.5b:unsloth", peer_batch=16), caller)
    assert unsloth["PYTHONPATH"].split(":") == ["/unsloth/site", "/kubetune/site", "/repo/api"]
    assert unsloth["HF_HUB_OFFLINE"] == "1" and unsloth["UNSLOTH_COMPILE_LOCATION"].endswith(
        "unsloth_compiled_cache"
    )
    for case in ("qwen2-0.5b:trl-best", "qwen2-0.5b:kubetune", "qwen2-0.5b:notebook-a"):
        assert "/unsloth/site" not in job_env(Job(case), caller)["PYTHONPATH"]
    assert caller["PYTHONPATH"] == "/kubetune/site:/repo/api"  # the caller's own environment is untouched
    # its own process: the benchmark's case entry point, started as a subprocess
    cmd = _command(
        Job("qwen2-0.5b:unsloth", peer_batch=16), Path("x.json"), warmup=1, steps=2, rows=10, extra=[]
    )
    assert cmd[1:5] == ["-m", "kubetune_bench", "--one", "qwen2-0.5b:unsloth"] and "--peer-batch" in cmd


def test_an_unsloth_case_without_its_environment_fails_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(peers.UNSLOTH_SITE_ENV, raising=False)
    result = run_job(Job("qwen3-4b:unsloth", peer_batch=4), tmp_path, warmup=1, steps=1, rows=10, extra=[])
    assert "--unsloth-site" in result["error"] and not (tmp_path / "qwen3-4b_unsloth_b4.log").exists()


def test_importing_unsloth_after_transformers_is_refused() -> None:
    import transformers  # noqa: F401 (imported first on purpose)

    with pytest.raises(RuntimeError, match="before transformers"):
        peers.import_unsloth()


def test_a_peer_that_measures_nothing_fails_loudly() -> None:
    import torch

    from kubetune_bench.runners import CaseHooks, CaseOptions, _Built, _Case, _Device, _train

    class NothingTrainer:  # a trainer that never calls the model: no steps, no tokens
        def __init__(self) -> None:
            self.model = torch.nn.Linear(2, 2)
            self.state = types.SimpleNamespace(global_step=0)

        def add_callback(self, callback: Any) -> None:
            pass

        def train(self) -> None:
            pass

    options = CaseOptions(warmup=1, steps=2, rows=10)
    ctx = _Case(
        "tiny:trl-best-lora", "tiny", "trl-best-lora", _Device(False, 1), options, CaseHooks(), Path()
    )
    with pytest.raises(RuntimeError, match="measured nothing: 0 tokens"):
        _train(ctx, _Built(NothingTrainer(), {}))
    with pytest.raises(RuntimeError, match="measured nothing"):
        peers.check_measured("qwen3-4b:trl-best", tokens=4096, steps=0, seconds=1.0)


def test_peers_join_the_call_and_sweep_their_micro_batch() -> None:
    cases = with_peers(["qwen2-0.5b:kubetune", "qwen3-4b:kubetune"])
    assert cases[2:] == ["qwen2-0.5b:trl-best", "qwen2-0.5b:unsloth", "qwen3-4b:trl-best", "qwen3-4b:unsloth"]
    args = argparse.Namespace(
        gpus="1",
        sharding=None,
        memory_cap_gib=None,
        fp8=False,
        notebook_steps=False,
        notebook_memory=False,
        epoch_tokens=None,
        peer_batches=None,
        trl_attn="flex_attention,sdpa",
    )
    stems = [j.stem for j in plan_jobs(args, cases, ())]
    assert stems[:2] == ["qwen2-0.5b_kubetune", "qwen3-4b_kubetune"]
    assert "qwen2-0.5b_trl-best_b32_sdpa" in stems and "qwen3-4b_trl-best_b8_flex_attention" in stems
    assert not [s for s in stems if s.startswith("qwen2-0.5b_trl-best_b16")]  # (peers.SWEEPS says why)
    # the attentions are TRL's sweep only; Unsloth chooses its own
    assert [s for s in stems if "unsloth" in s] == [
        "qwen2-0.5b_unsloth_b16",
        "qwen2-0.5b_unsloth_b32",
        "qwen3-4b_unsloth_b4",
        "qwen3-4b_unsloth_b8",
    ]
    for kind, sizes in peers.SWEEPS.items():  # every default point divides the example's step
        rows = peers.step_rows(_training(kind))
        assert all(peers.accumulation(rows, b) >= 1 for b in sizes), kind
    assert all(c in CASES for c in cases)


def _row(case: str, kind: str, tps: float, mem: float = 10.0, **extra: Any) -> dict[str, Any]:
    return {
        "case": case,
        "model": "qwen3-4b",
        "kind": kind,
        "tokens_per_second": tps,
        "peak_memory_gib": mem,
        "steps_measured": 2,
        "tokens": 2 * tps,
        "step_seconds": 1.0,
        "mfu": 0.4,
        **extra,
    }


def test_kubetune_is_compared_with_each_peer_at_the_best_point_of_its_sweep() -> None:
    rows = ratio_rows(
        [
            _row("qwen3-4b:kubetune", "kubetune-full", 20_000.0, 50.0),
            _row("qwen3-4b:trl-best (batch 2 x 4, flex_attention)", "trl-best-full", 12_000.0),
            _row("qwen3-4b:trl-best (batch 4 x 2, flex_attention)", "trl-best-full", 16_000.0, 25.0),
            _row(
                "qwen3-4b:unsloth (batch 4 x 2, sdpa)", "unsloth-full", 25_000.0, 40.0, lacks=["xformers: x"]
            ),
        ]
    )
    by_case = {r["case"]: r for r in rows}
    kubetune = by_case["qwen3-4b:kubetune"]
    assert kubetune["vs_trl-best"] == 1.25 and kubetune["memory_vs_trl-best"] == 2.0
    assert kubetune["vs_unsloth"] == 0.8  # a peer ahead shows as a ratio under 1
    assert by_case["qwen3-4b:trl-best (batch 4 x 2, flex_attention)"]["sweep_best"] is True
    assert "sweep_best" not in by_case["qwen3-4b:trl-best (batch 2 x 4, flex_attention)"]
    table = markdown_table(rows)
    assert "| vs TRL best | vs Unsloth |" in table and "| 1.25x | 0.8x |" in table
    assert (
        "**batch 4 x 2, flex_attention: 16,000 tokens/s**" in table
        and "unsloth-full lacked: xformers: x" in table
    )


def test_a_sweep_point_out_of_memory_is_no_failure_when_another_point_trained() -> None:
    error = "exit 1: torch.OutOfMemoryError: CUDA out of memory"
    oom = {"case": "qwen3-4b_trl-best_b8", "job": "qwen3-4b:trl-best", "error": error}
    trained = _row("qwen3-4b:trl-best (batch 4 x 2, flex_attention)", "trl-best-full", 16_000.0)
    assert sweep_point_too_big(oom, [oom, trained])
    assert not sweep_point_too_big(oom, [oom])  # no point trained: the peer failed
    crash = {"case": "qwen3-4b_trl-best_b2", "job": "qwen3-4b:trl-best", "error": "exit 1: ValueError"}
    assert not sweep_point_too_big(crash, [crash, trained])
    kubetune = {"case": "qwen3-4b_kubetune", "job": "qwen3-4b:kubetune", "error": error}
    assert not sweep_point_too_big(kubetune, [kubetune, _row("qwen3-4b:kubetune", "kubetune-full", 1.0)])
