"""The preflight estimate (kubetune_trainer.plan.estimate) against the trainer's own plan: the two
examples' manifests as the operator resolves them, the public config numbers of their models, and a
job that cannot fit its GPU, whose refusal names what would."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kubetune_api.preparation import DataStats
from kubetune_api.spec import TrainingSpec
from kubetune_api.trainer_config import TrainerConfig, load_manifest, resolve
from kubetune_trainer.plan.estimate import does_not_fit, estimate, gpu_hardware, largest_tokens_per_step
from kubetune_trainer.plan.plan import (
    MEMORY_HEADROOM,
    Hardware,
    ModelShape,
    estimate_step_seconds,
    estimate_training_bytes,
    make_plan,
    shape_from_config,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
GIB = 2**30

# The models' config.json numbers (Hub, public)
QWEN2_05B = {"hidden_size": 896, "num_hidden_layers": 24, "vocab_size": 151936, "intermediate_size": 4864}
QWEN3_4B = {"hidden_size": 2560, "num_hidden_layers": 36, "vocab_size": 151936, "intermediate_size": 9728}
LLAMA_70B = {"hidden_size": 8192, "num_hidden_layers": 80, "vocab_size": 128256, "intermediate_size": 28672}

DATA = DataStats(
    train_examples=15_000,
    tokens=12_000_000,
    length_p50=600,
    length_p95=2400,
    length_max=9000,
    truncated_fraction=0.1,
    loss_token_fraction=0.4,
)


def example(name: str, **training: object) -> TrainerConfig:
    cfg = resolve(load_manifest(EXAMPLES / name), output_dir="/tmp/kubetune-estimate-test")
    if training:
        t = cfg.spec.training.model_copy(update=training)
        cfg = cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"training": t})})
    return cfg


def with_resources(cfg: TrainerConfig, **resources: object) -> TrainerConfig:
    res = cfg.spec.resources.model_copy(update=resources)
    return cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"resources": res})})


def plan_numbers(
    training: TrainingSpec, hw: Hardware, shape: ModelShape, *, lora: bool
) -> tuple[int, float, int]:
    """The plan's own peak bytes, step seconds and tokens per optimizer step (all GPUs)."""
    plan = make_plan(training, hw, shape=shape, lora=lora)
    tokens = plan.per_device_batch_size * training.max_length
    peak = estimate_training_bytes(
        shape,
        lora=lora,
        tokens=tokens,
        checkpointing=plan.gradient_checkpointing,
        param_bytes=2,  # bf16, as both examples ask
        sharding=plan.sharding,
        world_size=hw.world_size,
    )
    seconds = estimate_step_seconds(
        shape,
        tokens=tokens,
        micro_steps=plan.gradient_accumulation_steps,
        checkpointing=plan.gradient_checkpointing,
        peak_flops=hw.peak_flops,
    )
    return peak, seconds, tokens * plan.gradient_accumulation_steps * hw.world_size


def test_qwen2_lora_on_8_h100s_is_the_plans_own_estimate() -> None:
    cfg = example("qwen2-0.5b-lora-8gpu.yaml")
    shape = shape_from_config(QWEN2_05B)
    est = estimate(cfg, shape, DATA)
    hw = Hardware(
        cuda=True,
        bf16=True,
        world_size=8,
        gpu_memory_bytes=80 * GIB,
        flash_attn=True,
        varlen=True,
        peak_flops=989.4e12,
    )
    peak, seconds, step_tokens = plan_numbers(cfg.spec.training, hw, shape, lora=True)
    assert (est.gpu_product, est.gpu_product_assumed, est.gpus) == ("NVIDIA-H100-80GB-HBM3", False, 8)
    assert est.gpu_memory_gib == 80 and est.fits and est.sharding == "ddp"
    assert est.peak_memory_gib == round(peak / GIB, 1) and peak <= MEMORY_HEADROOM * 80 * GIB
    # epochs 1 of packed 1,024-token rows: ceil(tokens / 1024) rows over the rows of a step
    assert step_tokens == 8 * 4 * 1024 * 8
    assert est.steps == math.ceil(math.ceil(DATA.tokens / 1024) / (8 * 4 * 8))
    assert est.tokens_per_second == pytest.approx(step_tokens / seconds, rel=1e-3)
    assert est.duration_seconds == math.ceil(est.steps * seconds)
    assert est.gpu_hours == pytest.approx(8 * est.steps * seconds / 3600, abs=1e-3)
    assert does_not_fit(cfg, shape, DATA, est) is None


def test_qwen3_full_on_one_h100_is_the_plans_own_estimate() -> None:
    cfg = example("qwen3-4b-full.yaml")
    shape = shape_from_config(QWEN3_4B)
    est = estimate(cfg, shape, DATA)
    hw = gpu_hardware("NVIDIA-H100-80GB-HBM3", 1)[0]
    peak, seconds, step_tokens = plan_numbers(cfg.spec.training, hw, shape, lora=False)
    assert est.gpus == 1 and est.sharding == "none" and est.fits
    assert est.peak_memory_gib == round(peak / GIB, 1)
    assert est.micro_batch_rows * est.gradient_accumulation_steps == 8  # batchSize 1 x accumulation 8
    assert est.steps == 50  # maxSteps
    assert est.duration_seconds == math.ceil(50 * seconds)
    assert est.tokens_per_second == pytest.approx(step_tokens / seconds, rel=1e-3)
    # ~0.5 s a step on an H100 (the step-time model, measured 0.45-0.50 s on an H200)
    assert 0.3 < seconds < 1.0
    assert does_not_fit(cfg, shape, DATA, est) is None


def test_a_70b_full_fine_tune_on_one_gpu_does_not_fit_and_names_what_would() -> None:
    cfg = example("qwen3-4b-full.yaml")
    shape = shape_from_config(LLAMA_70B)
    est = estimate(cfg, shape, DATA)
    assert not est.fits and est.peak_memory_gib > 80
    # the plan's own fallback when nothing fits: one row a micro-step, recomputed
    assert est.micro_batch_rows == 1 and est.gradient_checkpointing
    message = does_not_fit(cfg, shape, DATA, est)
    assert message is not None
    assert f"{est.peak_memory_gib:.1f} GiB" in message and "80 GiB" in message
    # weights and AdamW states alone outgrow one GPU: no tokensPerStep helps, nor LoRA (140 GB of
    # bf16 weights); FSDP2 across enough GPUs does, and so does QLoRA (its weights in 4 bits)
    assert "tokensPerStep" not in message and "method: lora instead of full" not in message
    lora = with_resources(cfg, gpu_product="NVIDIA-H100-80GB-HBM3")
    lora = lora.model_copy(update={"spec": lora.spec.model_copy(update={"method": "lora"})})
    assert not estimate(lora, shape, DATA).fits
    assert "GPUs" in message and "fsdp2" in message
    assert message.endswith("; or method: lora with spec.lora.quantization: nf4 (QLoRA: 4-bit base weights)")
    # the GPU count named is the first the plan fits
    gpus = int(message.split(" GPUs (")[0].rsplit(" ", 1)[-1])
    wider = with_resources(cfg, gpus_per_node=min(gpus, 16), nodes=max(1, gpus // 16))
    assert estimate(wider, shape, DATA).fits
    half = with_resources(cfg, gpus_per_node=min(gpus // 2, 16), nodes=max(1, gpus // 32))
    assert not estimate(half, shape, DATA).fits


def test_a_too_large_tokens_per_step_gets_the_largest_that_fits() -> None:
    shape = shape_from_config(QWEN3_4B)
    cfg = example("qwen3-4b-full.yaml", tokens_per_step=1_048_576, packing=True)
    est = estimate(cfg, shape, DATA)
    assert not est.fits and est.micro_batch_tokens == 1_048_576
    message = does_not_fit(cfg, shape, DATA, est)
    largest = largest_tokens_per_step(cfg, shape)
    assert message is not None and largest is not None
    assert f"spec.training.tokensPerStep: {largest} " in message
    assert estimate(example("qwen3-4b-full.yaml", tokens_per_step=largest, packing=True), shape, DATA).fits
    bigger = example("qwen3-4b-full.yaml", tokens_per_step=2 * largest, packing=True)
    assert not estimate(bigger, shape, DATA).fits


def test_lora_suggested_when_full_does_not_fit_a_small_gpu() -> None:
    cfg = with_resources(example("qwen3-4b-full.yaml"), gpu_product="NVIDIA-L4")
    shape = shape_from_config(QWEN3_4B)
    est = estimate(cfg, shape, DATA)
    assert est.gpu_memory_gib == 24 and not est.fits
    message = does_not_fit(cfg, shape, DATA, est)
    assert message is not None and "method: lora instead of full" in message and "NVIDIA-L4" in message


@pytest.mark.parametrize(
    ("product", "gib", "peak"),
    [
        ("NVIDIA-H100-80GB-HBM3", 80, 989.4e12),
        ("NVIDIA-H200", 141, 989.4e12),
        ("NVIDIA-A100-SXM4-80GB", 80, 312e12),
        ("NVIDIA-A100-SXM4-40GB", 40, 312e12),
        ("NVIDIA-L40S", 48, 362e12),
        ("NVIDIA-L4", 24, 121e12),
        ("NVIDIA-B200", 180, 2250e12),
        ("NVIDIA-A10G", 24, 125e12),
    ],
)
def test_gpu_products(product: str, gib: int, peak: float) -> None:
    hw, used, assumed = gpu_hardware(product, 4)
    assert (used, assumed) == (product, False)
    assert hw.gpu_memory_bytes == gib * GIB and hw.peak_flops == peak
    assert hw.cuda and hw.bf16 and hw.flash_attn and hw.varlen and hw.world_size == 4


def test_no_product_named_assumes_an_h100_and_says_so() -> None:
    hw, used, assumed = gpu_hardware(None, 1)
    assert (used, assumed, hw.gpu_memory_bytes) == ("NVIDIA-H100-80GB-HBM3", True, 80 * GIB)
    cfg = with_resources(example("qwen3-4b-full.yaml"), gpu_product=None)
    est = estimate(cfg, shape_from_config(QWEN3_4B), DATA)
    assert est.gpu_product == "NVIDIA-H100-80GB-HBM3" and est.gpu_product_assumed


def test_cpu_training_has_no_gpu_estimate() -> None:
    cfg = with_resources(example("qwen3-4b-full.yaml"), gpus_per_node=0)
    with pytest.raises(ValueError, match="CPU training"):
        estimate(cfg, shape_from_config(QWEN3_4B), DATA)


@pytest.mark.parametrize(
    ("product", "gib", "assumed"),
    [
        ("NVIDIA-H200", 141, False),
        ("NVIDIA-A100-SXM4-40GB", 40, False),
        ("NVIDIA-GH200-480GB", 96, False),  # the label's 480GB counts the CPU's memory too
        ("NVIDIA-GB200", 186, False),
        ("NVIDIA-B300-SXM6-AC", 288, False),
        ("Tesla-T4", 80, True),  # unknown: 80 GiB assumed, and said so
        (None, 80, True),
    ],
)
def test_gpu_memory_by_product_and_what_is_assumed(product: str | None, gib: int, assumed: bool) -> None:
    from kubetune_trainer.plan.estimate import gpu_hardware

    hw, _name, was_assumed = gpu_hardware(product, 8)
    assert (hw.gpu_memory_bytes // 2**30, was_assumed) == (gib, assumed)
