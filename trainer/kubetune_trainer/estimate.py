"""The preflight estimate: memory, speed, time and GPU-hours of a job on the GPUs it asks for,
computed on a CPU before any GPU is held, with the trainer's own plan (:mod:`.plan`).

The GPU is the one ``spec.resources.gpuProduct`` names (its ``nvidia.com/gpu.product`` label); its
memory comes from :data:`GPU_MEMORY_GIB` (or the label's ``80GB``-style part), its bf16 peak from
the plan's table. No product named: an H100 80GB is assumed and the estimate says so. The plan is
made as the trainer makes it on that GPU (``make_plan`` with the same hardware description), so the
estimate's micro-step layout and recomputation are the ones training will use, and its peak memory
and step time are the plan's own models (``estimate_training_bytes``, ``estimate_step_seconds``).

>>> gpu_hardware("NVIDIA-H200", 8)[0].gpu_memory_bytes // 2**30, gpu_hardware(None, 1)[1:]
(141, ('NVIDIA-H100-80GB-HBM3', True))
"""

from __future__ import annotations

import math
import re
from dataclasses import replace

from kubetune_api.preparation import DataStats, Estimate
from kubetune_api.spec import Method
from kubetune_api.trainer_config import TrainerConfig

from .plan import (
    MEMORY_HEADROOM,
    Hardware,
    ModelShape,
    Plan,
    estimate_step_seconds,
    estimate_training_bytes,
    make_plan,
    peak_bf16_flops,
)

ASSUMED_PRODUCT = "NVIDIA-H100-80GB-HBM3"
# GPU memory (GiB) by the start of the product label; the longest match wins (vendor datasheets).
GPU_MEMORY_GIB = {
    "NVIDIA-H100": 80,
    "NVIDIA-H100-NVL": 94,
    "NVIDIA-H200": 141,
    "NVIDIA-H20": 96,
    "NVIDIA-B200": 180,
    "NVIDIA-A100": 80,
    "NVIDIA-A100-SXM4-40GB": 40,
    "NVIDIA-A100-PCIE-40GB": 40,
    "NVIDIA-L40S": 48,
    "NVIDIA-L40": 48,
    "NVIDIA-L4": 24,
    "NVIDIA-A10G": 24,
    "NVIDIA-A10": 24,
}
DEFAULT_MEMORY_GIB = 80
_GB = re.compile(r"(\d+)GB", re.IGNORECASE)


def gpu_hardware(product: str | None, world_size: int) -> tuple[Hardware, str, bool]:
    """The hardware the trainer would detect on ``world_size`` GPUs of ``product``; the product
    used, and whether it was assumed (none named)."""
    assumed = product is None
    name = product or ASSUMED_PRODUCT
    sized = _GB.search(name)
    if sized:
        gib = int(sized.group(1))
    else:
        matches = [k for k in GPU_MEMORY_GIB if name.upper().startswith(k.upper())]
        gib = GPU_MEMORY_GIB[max(matches, key=len)] if matches else DEFAULT_MEMORY_GIB
    hw = Hardware(
        cuda=True,
        bf16=True,
        world_size=world_size,
        gpu_memory_bytes=gib * 2**30,
        flash_attn=True,
        varlen=True,  # the trainer image's torch has PyTorch's varlen attention
        fp8=False,  # opt-in only (KUBETUNE_FP8): the plan never picks it by itself
        peak_flops=peak_bf16_flops(name.replace("-", " ")),
    )
    return hw, name, assumed


def _param_bytes(plan: Plan) -> int:
    return 4 if plan.precision == "fp32" or (plan.precision == "fp16" and not plan.lora) else 2


def _peak(shape: ModelShape, plan: Plan, tokens: int) -> int:
    return estimate_training_bytes(
        shape,
        lora=plan.lora,
        tokens=tokens,
        checkpointing=plan.gradient_checkpointing,
        param_bytes=_param_bytes(plan),
        sharding=plan.sharding,
        world_size=plan.world_size,
    )


def _plan(
    cfg: TrainerConfig, shape: ModelShape, world: int, *, lora: bool | None = None
) -> tuple[Plan, Hardware, str, bool]:
    res = cfg.spec.resources
    hw, product, assumed = gpu_hardware(res.gpu_product, world)
    use_lora = cfg.spec.method == Method.LORA if lora is None else lora
    return make_plan(cfg.spec.training, hw, shape=shape, lora=use_lora), hw, product, assumed


def estimate(cfg: TrainerConfig, shape: ModelShape, data: DataStats) -> Estimate:
    """The estimate for the GPUs the job asks for (nodes x gpusPerNode, at least one)."""
    res, t = cfg.spec.resources, cfg.spec.training
    world = max(1, res.nodes * res.gpus_per_node)
    plan, hw, product, assumed = _plan(cfg, shape, world)
    micro_tokens = plan.per_device_batch_size * t.max_length
    peak = _peak(shape, plan, micro_tokens)
    assert hw.gpu_memory_bytes is not None
    step_tokens = micro_tokens * plan.gradient_accumulation_steps * world
    if t.max_steps is not None:
        steps = t.max_steps
    else:
        # packed rows of maxLength hold the epoch's tokens (TRL's best-fit packing fills them)
        rows = math.ceil(data.tokens / t.max_length) if t.packing else data.train_examples
        per_step = plan.per_device_batch_size * plan.gradient_accumulation_steps * world
        steps = max(1, math.ceil((t.epochs or 1.0) * rows / per_step))
    step_seconds = estimate_step_seconds(
        shape,
        tokens=micro_tokens,
        micro_steps=plan.gradient_accumulation_steps,
        checkpointing=plan.gradient_checkpointing,
        peak_flops=hw.peak_flops,
    )
    duration = steps * step_seconds
    return Estimate(
        gpu_product=product,
        gpu_product_assumed=assumed,
        gpus=world,
        gpu_memory_gib=round(hw.gpu_memory_bytes / 2**30, 1),
        peak_memory_gib=round(peak / 2**30, 1),
        fits=peak <= MEMORY_HEADROOM * hw.gpu_memory_bytes,
        micro_batch_rows=plan.per_device_batch_size,
        micro_batch_tokens=micro_tokens,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        gradient_checkpointing=plan.gradient_checkpointing,
        sharding=plan.sharding,
        steps=steps,
        tokens_per_second=round(step_tokens / step_seconds, 1),
        duration_seconds=math.ceil(duration),
        gpu_hours=round(world * duration / 3600, 3),
    )


def _largest_fitting_tokens(cfg: TrainerConfig, shape: ModelShape, plan: Plan, budget: float) -> int | None:
    """The largest tokensPerStep (maxLength times a power of two) whose micro-step fits with
    recomputation; None when not even one row does."""
    length = cfg.spec.training.max_length
    lean = replace(plan, gradient_checkpointing=True)
    if _peak(shape, lean, length) > budget:
        return None
    rows = 1
    while rows < 4096 and _peak(shape, lean, 2 * rows * length) <= budget:
        rows *= 2
    return max(256, rows * length)


def does_not_fit(cfg: TrainerConfig, shape: ModelShape, data: DataStats, est: Estimate) -> str | None:
    """None when the estimate fits; else what it needs against what the GPU holds, and what would fit."""
    if est.fits:
        return None
    budget = MEMORY_HEADROOM * est.gpu_memory_gib * 2**30
    res = cfg.spec.resources
    world = max(1, res.nodes * res.gpus_per_node)
    plan, _, _, _ = _plan(cfg, shape, world)
    message = (
        f"estimated peak {est.peak_memory_gib:.0f} GiB per GPU, above {MEMORY_HEADROOM:.0%} of the "
        f"{est.gpu_memory_gib:.0f} GiB of one {est.gpu_product} ({est.micro_batch_tokens} tokens a micro-step, "
        f"{'with' if est.gradient_checkpointing else 'without'} recomputation, sharding {est.sharding})"
    )
    options: list[str] = []
    tokens = _largest_fitting_tokens(cfg, shape, plan, budget)
    if tokens is not None and cfg.spec.training.packing:
        options.append(f"spec.training.tokensPerStep: {tokens} (with gradientCheckpointing: always)")
    if cfg.spec.method == Method.FULL:
        for gpus in (2, 4, 8, 16, 32, 64):
            if gpus <= world:
                continue
            wider, _, _, _ = _plan(cfg, shape, gpus)
            if _peak(shape, wider, wider.per_device_batch_size * cfg.spec.training.max_length) <= budget:
                options.append(
                    f"{gpus} GPUs (resources.nodes x gpusPerNode; {wider.sharding} shards the weights)"
                )
                break
        lora, _, _, _ = _plan(cfg, shape, world, lora=True)
        if _peak(shape, lora, lora.per_device_batch_size * cfg.spec.training.max_length) <= budget:
            options.append("method: lora instead of full")
    if options:
        return f"{message}. What would fit: " + "; or ".join(options)
    return f"{message}. Nothing kubetune can plan fits this GPU: a GPU with more memory is needed"
