"""QLoRA: the frozen base model in 4-bit NormalFloat through bitsandbytes, LoRA on top.

The plan decides (``Plan.nf4``, from ``spec.lora.quantization: nf4``) and refuses by name where it
cannot run, before anything is loaded: no GPU, or a GPU older than compute capability 8.0
(:func:`kubetune_trainer.plan.plan.qlora_refusal`); the trainer refuses a process without bitsandbytes
(:func:`missing_library`). This module loads as the plan says: transformers' ``BitsAndBytesConfig``
(NF4, double quantization, bf16 compute) for ``from_pretrained``, each process's copy on its own
GPU, then PEFT's ``prepare_model_for_kbit_training`` (the base frozen, its unquantized weights in
fp32, gradient checkpointing as the plan says) before TRL puts the adapter on.

bitsandbytes is imported by transformers only while such a model loads: never on a CPU (refused
first), never in the development environment, which does not have it (it is in the trainer image,
from the ``trainer-gpu`` group of ``pyproject.toml``).

>>> load_kwargs(nf4=False, local_rank=0)
{}
"""

from __future__ import annotations

import importlib.util
from typing import Any

LIBRARY = "bitsandbytes"


def bnb_config() -> Any:
    """transformers' bitsandbytes settings of QLoRA: 4-bit NF4 weights, their block scales quantized
    again (double quantization), products computed in bf16."""
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch.bfloat16,
    )


def load_kwargs(*, nf4: bool, local_rank: int) -> dict[str, Any]:
    """What ``from_pretrained`` adds for the plan: none without QLoRA; with it the 4-bit settings, and
    the whole model on this process's GPU (4-bit weights are quantized as they reach the GPU, and a
    DDP replica per process holds them all)."""
    if not nf4:
        return {}
    return {"quantization_config": bnb_config(), "device_map": {"": local_rank}}


def missing_library() -> str | None:
    """Why QLoRA cannot load here for want of bitsandbytes; None when it is installed (found, not imported)."""
    if importlib.util.find_spec(LIBRARY) is not None:
        return None
    return (
        f"spec.lora.quantization nf4 (QLoRA) needs {LIBRARY}, which this environment lacks: the trainer "
        "image has it; elsewhere install the trainer-gpu group (uv sync --all-extras --group trainer-gpu)"
    )


def prepare(model: Any, *, nf4: bool, gradient_checkpointing: bool) -> Any:
    """A 4-bit model made ready for training its adapter, as PEFT prepares k-bit models; others as they are."""
    if not nf4:
        return model
    from peft import prepare_model_for_kbit_training

    return prepare_model_for_kbit_training(
        model,
        use_gradient_checkpointing=gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
    )
