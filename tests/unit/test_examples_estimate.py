"""The preflight estimate of the examples (Qwen2-0.5B LoRA on 8 GPUs, Qwen3-4B full, DoRA and QLoRA on
1 GPU, the QLoRA one of 24 GiB): what
``status.preparation.estimate`` says for them, checked against the plan's own numbers, and the
numbers their comments show (regenerate: KUBETUNE_UPDATE_EXAMPLES=1 pytest this file).

The data is Capybara-like (kubetune_bench.workload: Capybara's 15,806 training conversations less the
10% held out, with its length distribution, P(length >= 1024) ~ 0.39): the Hub cannot be reached
here to tokenize the real one. The model shapes are the public configs' numbers.
"""

from __future__ import annotations

import math
import os
import sys

import pytest
from tests.support.controlplane import REPO

from kubetune_api.preparation import DataStats, Estimate
from kubetune_api.spec import Method
from kubetune_api.trainer_config import TrainerConfig, load_manifest, resolve

sys.path.insert(0, str(REPO / "bench"))

SHAPES = {
    "Qwen/Qwen2-0.5B": {
        "hidden_size": 896,
        "num_hidden_layers": 24,
        "vocab_size": 151936,
        "intermediate_size": 4864,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
    },
    "Qwen/Qwen3-4B": {
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "vocab_size": 151936,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    },
}
CAPYBARA_TRAIN = 15_806
MARK = "# preflight:"


def capybara_like(cfg: TrainerConfig) -> DataStats:
    from kubetune_bench.workload import capybara_like_lengths

    held_out = math.ceil(CAPYBARA_TRAIN * (cfg.spec.dataset.eval_fraction or 0))
    n = CAPYBARA_TRAIN - held_out
    limit = cfg.spec.training.max_length
    lengths = sorted(capybara_like_lengths(n, cap=limit))
    return DataStats(
        train_examples=n,
        eval_examples=held_out,
        tokens=sum(lengths),
        length_p50=lengths[n // 2],
        length_p95=lengths[int(0.95 * (n - 1))],
        length_max=lengths[-1],
        truncated_fraction=round(sum(x >= limit for x in lengths) / n, 4),
        loss_token_fraction=1.0,
    )


def example_estimate(name: str) -> tuple[TrainerConfig, DataStats, Estimate]:
    from kubetune_trainer.plan.estimate import estimate
    from kubetune_trainer.plan.plan import shape_from_config

    cfg = resolve(load_manifest(REPO / "examples" / name))
    assert cfg.spec.model.name is not None
    data = capybara_like(cfg)
    return cfg, data, estimate(cfg, shape_from_config(SHAPES[cfg.spec.model.name]), data)


def comment(data: DataStats, e: Estimate) -> list[str]:
    return [
        f"{MARK} kubetune prepare (status.preparation) for Capybara-like data: {data.train_examples:,} "
        f"conversations, {data.tokens:,} tokens,",
        f"{MARK} {100 * data.truncated_fraction:.0f}% cut at maxLength. Estimate on {e.gpus} x {e.gpu_product}: "
        f"peak {e.peak_memory_gib:.0f} of {e.gpu_memory_gib:.0f} GiB per GPU,",
        f"{MARK} {e.micro_batch_rows} packed rows x {e.gradient_accumulation_steps} micro-step(s), "
        f"{'with' if e.gradient_checkpointing else 'no'} recomputation, {e.sharding}; ~{e.tokens_per_second:,.0f} "
        f"tokens/s, {e.steps} steps, {e.duration_seconds} s, {e.gpu_hours:.3f} GPU-hours",
    ]


EXAMPLES = [
    "qwen2-0.5b-lora-8gpu.yaml",
    "qwen3-4b-full.yaml",
    "qwen3-4b-dora.yaml",
    "qwen3-4b-qlora-24gb.yaml",
]


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_estimate_is_the_plans_own(name: str) -> None:
    from kubetune_trainer.plan.estimate import gpu_hardware
    from kubetune_trainer.plan.plan import (
        estimate_step_seconds,
        estimate_training_bytes,
        make_plan,
        method_of,
        shape_from_config,
    )

    cfg, data, e = example_estimate(name)
    res, t = cfg.spec.resources, cfg.spec.training
    world = res.nodes * res.gpus_per_node
    assert e.gpus == world and e.gpu_product == res.gpu_product and not e.gpu_product_assumed
    hw, _, _ = gpu_hardware(res.gpu_product, world)
    shape = shape_from_config(SHAPES[str(cfg.spec.model.name)])
    plan = make_plan(t, hw, shape=shape, **method_of(cfg.spec))
    assert (plan.lora, plan.nf4, plan.dora) == (
        cfg.spec.method == Method.LORA,
        cfg.spec.lora_settings().quantization == "nf4",
        cfg.spec.lora_settings().dora,
    )
    assert (e.micro_batch_rows, e.gradient_accumulation_steps) == (
        plan.per_device_batch_size,
        plan.gradient_accumulation_steps,
    )
    assert e.gradient_checkpointing == plan.gradient_checkpointing and e.sharding == plan.sharding
    tokens = plan.per_device_batch_size * t.max_length
    peak = estimate_training_bytes(
        shape,
        lora=plan.lora,
        tokens=tokens,
        checkpointing=plan.gradient_checkpointing,
        sharding=plan.sharding,
        world_size=world,
        nf4=plan.nf4,
        dora=plan.dora,
    )
    assert e.peak_memory_gib == pytest.approx(peak / 2**30, abs=0.05)
    assert e.fits and e.peak_memory_gib < e.gpu_memory_gib
    seconds = estimate_step_seconds(
        shape,
        tokens=tokens,
        micro_steps=plan.gradient_accumulation_steps,
        checkpointing=plan.gradient_checkpointing,
        peak_flops=hw.peak_flops,
    )
    assert e.tokens_per_second == pytest.approx(
        tokens * plan.gradient_accumulation_steps * world / seconds, rel=1e-3
    )
    if t.max_steps:
        assert e.steps == t.max_steps
    else:  # one epoch of packed rows of maxLength
        rows = math.ceil(data.tokens / t.max_length)
        assert e.steps == math.ceil(
            rows / (plan.per_device_batch_size * plan.gradient_accumulation_steps * world)
        )
    assert e.gpu_hours == pytest.approx(world * e.steps * seconds / 3600, rel=1e-2, abs=1e-3)


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_comments_show_the_estimate(name: str) -> None:
    _, data, e = example_estimate(name)
    path = REPO / "examples" / name
    lines = path.read_text().splitlines()
    wanted = comment(data, e)
    kept = [line for line in lines if not line.startswith(MARK)]
    if os.environ.get("KUBETUNE_UPDATE_EXAMPLES"):
        at = next(i for i, line in enumerate(kept) if not line.startswith("#"))
        path.write_text("\n".join(kept[:at] + wanted + kept[at:]) + "\n")
        lines = path.read_text().splitlines()
    assert [line for line in lines if line.startswith(MARK)] == wanted, "\n".join(wanted)


def test_the_preparation_pages_gpu_sample_is_the_cli_s_report_of_this_estimate() -> None:
    """docs/preparation.md ends its sample report with the estimate of qwen3-4b-full.yaml on this data."""
    from tests.support import docs_samples

    from kubetune_cli.report import render_estimate

    _, _, e = example_estimate("qwen3-4b-full.yaml")
    (block,) = [
        b for b in docs_samples.code_blocks(REPO / "docs" / "preparation.md") if b.text.startswith("  GPUs ")
    ]
    assert block.text.splitlines() == render_estimate(e)
