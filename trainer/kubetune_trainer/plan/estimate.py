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
from typing import Any

from kubetune_api.preparation import DataStats, Estimate
from kubetune_api.spec import Method, Toggle
from kubetune_api.trainer_config import TrainerConfig

from .plan import (
    MEMORY_HEADROOM,
    Hardware,
    MethodArgs,
    ModelShape,
    Plan,
    estimate_step_seconds,
    estimate_training_bytes,
    make_plan,
    method_of,
    peak_bf16_flops,
    qlora_refusal,
    training_of,
)

ASSUMED_PRODUCT = "NVIDIA-H100-80GB-HBM3"
# GPU memory (GiB) by the start of the product label; the longest match wins (vendor datasheets).
GPU_MEMORY_GIB = {
    "NVIDIA-H100": 80,
    "NVIDIA-H100-NVL": 94,
    "NVIDIA-H200": 141,
    "NVIDIA-H20": 96,
    "NVIDIA-B200": 180,
    "NVIDIA-B300": 288,
    "NVIDIA-GB200": 186,
    "NVIDIA-GH200": 96,  # its labels' "480GB" counts the CPU's memory too
    "NVIDIA-H800": 80,
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
# Compute capability by the start of the product label, for the GPUs older than Ampere (8.0), which
# have no bf16 compute and so no QLoRA (plan.QLORA_MIN_CAPABILITY); the longest match wins. A product
# not listed is taken as new enough: the trainer still checks the GPU it gets before loading anything.
OLDER_GPU_CAPABILITY = {
    "Tesla-K": (3, 7),
    "Tesla-M": (5, 2),
    "Tesla-P100": (6, 0),
    "Tesla-P4": (6, 1),
    "Tesla-P40": (6, 1),
    "Tesla-V100": (7, 0),
    "Tesla-T4": (7, 5),
    "Quadro": (7, 5),
    "NVIDIA-TITAN-V": (7, 0),
    "NVIDIA-TITAN-RTX": (7, 5),
    "NVIDIA-GeForce-GTX-10": (6, 1),
    "NVIDIA-GeForce-GTX-16": (7, 5),
    "NVIDIA-GeForce-RTX-20": (7, 5),
}
# spec.training.tokensPerStep's bounds (the CRD's)
MIN_TOKENS_PER_STEP, MAX_TOKENS_PER_STEP = 256, 4_194_304
# GPU counts offered when a full fine-tune does not fit (the first that fits is named)
MORE_GPUS = (2, 4, 8, 16, 32, 64, 128, 256)
_GB = re.compile(r"(\d+)GB", re.IGNORECASE)


def product_capability(product: str) -> tuple[int, int] | None:
    """The compute capability of a GPU product label older than Ampere; None: Ampere or newer, or unknown.

    >>> product_capability("Tesla-T4"), product_capability("Tesla-P40"), product_capability("NVIDIA-L4")
    ((7, 5), (6, 1), None)
    """
    matches = [k for k in OLDER_GPU_CAPABILITY if product.upper().startswith(k.upper())]
    return OLDER_GPU_CAPABILITY[max(matches, key=len)] if matches else None


def method_refusal(cfg: TrainerConfig) -> str | None:
    """Why the spec's method cannot run on the GPUs it asks for (QLoRA on a product older than Ampere),
    from the product label alone: checked before anything is downloaded. None: it can, or the job
    trains on CPU (which the API server refuses for QLoRA), or the product is not one kubetune knows."""
    res = cfg.spec.resources
    if not method_of(cfg.spec).get("nf4") or res.gpus_per_node == 0 or res.gpu_product is None:
        return None
    return qlora_refusal(cuda=True, capability=product_capability(res.gpu_product), where=res.gpu_product)


def gpu_hardware(product: str | None, world_size: int) -> tuple[Hardware, str, bool]:
    """The hardware the trainer would detect on ``world_size`` GPUs of ``product``; the product
    used, and whether its memory was assumed (none named, or one this table does not know: then
    :data:`DEFAULT_MEMORY_GIB`, and the estimate refuses nothing on it)."""
    name = product or ASSUMED_PRODUCT
    matches = [k for k in GPU_MEMORY_GIB if name.upper().startswith(k.upper())]
    sized = None if name.upper().startswith("NVIDIA-GH200") else _GB.search(name)
    if sized:
        gib = int(sized.group(1))
    else:
        gib = GPU_MEMORY_GIB[max(matches, key=len)] if matches else DEFAULT_MEMORY_GIB
    assumed = product is None or not (sized or matches)
    hw = Hardware(
        cuda=True,
        bf16=True,
        world_size=world_size,
        gpu_memory_bytes=gib * 2**30,
        flash_attn=True,
        varlen=True,  # the trainer image's torch has PyTorch's varlen attention
        fp8=False,  # opt-in only (KUBETUNE_FP8): the plan never picks it by itself
        peak_flops=peak_bf16_flops(name.replace("-", " ")),
        capability=product_capability(name),
        name=name,
    )
    return hw, name, assumed


def _param_bytes(plan: Plan) -> int:
    return 4 if plan.precision == "fp32" or (plan.precision == "fp16" and not plan.lora) else 2


def _peak(shape: ModelShape, plan: Plan, tokens: int) -> int:
    """The plan's memory model for one micro-step of ``tokens`` tokens in ``plan``'s layout and method."""
    return estimate_training_bytes(
        shape,
        lora=plan.lora,
        tokens=tokens,
        checkpointing=plan.gradient_checkpointing,
        param_bytes=_param_bytes(plan),
        sharding=plan.sharding,
        world_size=plan.world_size,
        nf4=plan.nf4,
        dora=plan.dora,
    )


def gpus(cfg: TrainerConfig) -> int:
    """GPUs the job asks for in all: nodes x gpusPerNode (0: CPU training)."""
    res = cfg.spec.resources
    return res.nodes * res.gpus_per_node


def _plan(
    cfg: TrainerConfig, shape: ModelShape, world: int, *, method: MethodArgs | None = None
) -> tuple[Plan, Hardware, str, bool]:
    """The trainer's plan on ``world`` GPUs of the job's product, for the spec's method or ``method``
    (:func:`~.plan.make_plan`'s ``lora``, ``nf4``, ``dora``). QLoRA on a product older than Ampere:
    :class:`~.plan.MethodNotSupported`, as the trainer would raise on it."""
    hw, product, assumed = gpu_hardware(cfg.spec.resources.gpu_product, world)
    plan = make_plan(training_of(cfg.spec), hw, shape=shape, **(method or method_of(cfg.spec)))
    return plan, hw, product, assumed


def _fits(
    cfg: TrainerConfig, shape: ModelShape, world: int, *, method: MethodArgs | None = None
) -> tuple[bool, Plan]:
    """Whether the plan's own layout on ``world`` GPUs fits MEMORY_HEADROOM of one GPU, and the plan."""
    plan, hw, _, _ = _plan(cfg, shape, world, method=method)
    assert hw.gpu_memory_bytes is not None
    peak = _peak(shape, plan, plan.per_device_batch_size * cfg.spec.training.max_length)
    return peak <= MEMORY_HEADROOM * hw.gpu_memory_bytes, plan


def estimate(cfg: TrainerConfig, shape: ModelShape, data: DataStats) -> Estimate:
    """The estimate for the GPUs the job asks for (nodes x gpusPerNode).

    Steps: ``maxSteps``, or the epochs' rows over the rows of an optimizer step (per-GPU micro-step
    rows x accumulation x GPUs, as the trainer's TRL arguments count them); with packing a row is
    maxLength tokens, so an epoch is ``ceil(tokens / maxLength)`` rows. CPU training (0 GPUs) has
    nothing GPU-sized to estimate: ``ValueError`` (the preparation step reports no estimate then).
    """
    t = cfg.spec.training
    world = gpus(cfg)
    if world < 1:
        raise ValueError("CPU training (gpusPerNode 0): no GPU estimate")
    plan, hw, product, assumed = _plan(cfg, shape, world)
    assert hw.gpu_memory_bytes is not None
    micro_tokens = plan.per_device_batch_size * t.max_length
    peak = _peak(shape, plan, micro_tokens)
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


def _with_training(cfg: TrainerConfig, **update: Any) -> TrainerConfig:
    training = cfg.spec.training.model_copy(update=update)
    return cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"training": training})})


def largest_tokens_per_step(cfg: TrainerConfig, shape: ModelShape) -> int | None:
    """The largest ``spec.training.tokensPerStep`` (maxLength times a power of two, within the spec's
    bounds) whose plan fits the job's GPUs; None without packing (tokensPerStep needs it) or when not
    even one row of maxLength fits."""
    t = cfg.spec.training
    if not t.packing:
        return None
    best = None
    rows = 1
    while rows * t.max_length <= MAX_TOKENS_PER_STEP:
        tokens = max(MIN_TOKENS_PER_STEP, rows * t.max_length)
        fits, _ = _fits(_with_training(cfg, tokens_per_step=tokens), shape, gpus(cfg))
        if not fits:
            break
        best, rows = tokens, rows * 2
    return best


def _alternatives(cfg: TrainerConfig, shape: ModelShape, world: int) -> list[str]:
    """What the plan says would fit instead: each checked with make_plan as the trainer would plan it."""
    t, options = cfg.spec.training, []
    tokens = largest_tokens_per_step(cfg, shape)
    if tokens is not None:
        options.append(
            f"spec.training.tokensPerStep: {tokens} ({tokens // t.max_length} rows of maxLength a micro-step)"
        )
    never = str(t.gradient_checkpointing) == Toggle.NEVER
    if never and _fits(_with_training(cfg, gradient_checkpointing=Toggle.AUTO), shape, world)[0]:
        options.append("spec.training.gradientCheckpointing: auto (recompute activations)")
    if cfg.spec.method == Method.FULL:
        for more in MORE_GPUS:
            if more <= world:
                continue
            fits, wider = _fits(cfg, shape, more)
            if fits:
                options.append(
                    f"{more} GPUs (spec.resources nodes x gpusPerNode; the plan shards with {wider.sharding})"
                )
                break
        if _fits(cfg, shape, world, method={"lora": True})[0]:
            options.append("method: lora instead of full")
            return options  # and so would QLoRA: the plainer change is named
    method = method_of(cfg.spec)
    hw, _, _ = gpu_hardware(cfg.spec.resources.gpu_product, world)
    qlora_runs = qlora_refusal(cuda=True, capability=hw.capability, where="") is None
    qlora: MethodArgs = {**method, "lora": True, "nf4": True}
    # QLoRA: the frozen base in 4 bits (a full fine-tune would become LoRA on top of it)
    if (
        not method.get("nf4")
        and qlora_runs
        and str(t.precision) == "bf16"
        and _fits(cfg, shape, world, method=qlora)[0]
    ):
        lora = "" if method.get("lora") else "method: lora with "
        options.append(f"{lora}spec.lora.quantization: nf4 (QLoRA: 4-bit base weights)")
    return options


def does_not_fit(cfg: TrainerConfig, shape: ModelShape, data: DataStats, est: Estimate) -> str | None:
    """None when the estimate fits; else its peak against the GPU's memory, and what would fit.

    "Fits" is the plan's own layout: where nothing fits, make_plan falls back to one row per
    micro-step with recomputation (auto), and that layout's peak is what is compared.
    """
    if est.fits:
        return None
    message = (
        f"estimated peak {est.peak_memory_gib:.1f} GiB per GPU, above {MEMORY_HEADROOM:.0%} of the "
        f"{est.gpu_memory_gib:.0f} GiB of one {est.gpu_product} ({est.gpus} GPU{'s' if est.gpus != 1 else ''}, "
        f"{est.micro_batch_tokens} tokens a micro-step, "
        f"{'with' if est.gradient_checkpointing else 'without'} recomputation, sharding {est.sharding})"
    )
    options = _alternatives(cfg, shape, est.gpus)
    if options:
        return f"{message}. What would fit: " + "; or ".join(options)
    return (
        f"{message}. Nothing kubetune can plan fits this GPU: a smaller maxLength or a GPU with more memory"
    )
