"""The peers: what a user would run instead of kubetune, each at its best, on the same data and GPU.

* ``trl-best``: TRL's ``SFTTrainer`` with every speed option it offers: bf16 weights and autocast,
  padding-free packing (best-fit decreasing, ``padding_free=True``), the fastest variable-length
  attention the installed packages give transformers (FlashAttention-3, then FlashAttention-2, then
  PyTorch's flex attention: ``best_attention``), Liger's fused kernels (``use_liger_kernel=True``),
  fused AdamW (``optim="adamw_torch_fused"``), no recomputation; its micro-batch swept (``SWEEPS``),
  the best kept.
* ``unsloth``: Unsloth's ``FastLanguageModel`` and its patched ``SFTTrainer`` with the same options
  where Unsloth has them. Unsloth pins older TRL and datasets than kubetune, so its case runs in a
  process whose ``PYTHONPATH`` starts with a folder of its own (``unsloth_env``; ``kubetune bench
  --unsloth-site``); nothing else sees that folder.

Both train what kubetune's case trains: the notebook's FineTuneJob example (its LoRA settings, learning
rate, weight decay, maximum length and tokens an optimizer step: batch x accumulation packed rows),
so that the ratios compare speed, not settings. Each case records its exact settings
(``CaseResult.settings``) and what its best lacked on the machine (``CaseResult.lacks``).
"""

from __future__ import annotations

import importlib.util
import os
import tempfile
from pathlib import Path
from typing import Any

TRL_BEST = "trl-best"
UNSLOTH = "unsloth"
UNSLOTH_SITE_ENV = "KUBETUNE_BENCH_UNSLOTH_SITE"

# micro-batches (packed rows of maxLength) tried for each peer: LoRA on Qwen2-0.5B, full on Qwen3-4B;
# each must divide the example's packed rows an optimizer step (32 and 8). TRL's LoRA point is 32
# alone: at 16 its first forward's flex block-mask compilation stayed in ptxas past 210 and 263 s
# (three device calls, H100, torch 2.11, Triton 3.6) and never took a step; 32 trained (2026-12-07).
SWEEPS: dict[str, tuple[int, ...]] = {
    "trl-best-lora": (32,),
    "trl-best-full": (2, 4, 8),
    "unsloth-lora": (16, 32),
    "unsloth-full": (4, 8),
}


def is_peer(kind: str) -> bool:
    """Whether a case kind is a peer (TRL at its best or Unsloth).

    >>> is_peer("trl-best-lora"), is_peer("unsloth-full"), is_peer("kubetune-lora"), is_peer("notebook-a")
    (True, True, False, False)
    """
    return kind.startswith((TRL_BEST, UNSLOTH))


def is_unsloth(kind: str) -> bool:
    return kind.startswith(UNSLOTH)


def peer_name(kind: str) -> str:
    """``trl-best`` or ``unsloth``: the peer a kind belongs to, whatever it trains.

    >>> peer_name("trl-best-full"), peer_name("unsloth-lora")
    ('trl-best', 'unsloth')
    """
    return UNSLOTH if is_unsloth(kind) else TRL_BEST


def best_attention() -> tuple[str, list[str]]:
    """The fastest padding-free attention transformers can use here, and what was missing for better.

    FlashAttention-3 (``flash_attn_interface``) and FlashAttention-2 (``flash_attn``) take the packed
    rows' boundaries as they are; without them, flex attention builds a block mask from the position
    ids (SDPA would get a dense mask over the whole packed batch: one sequence of every row's tokens).
    """
    lacks: list[str] = []
    if importlib.util.find_spec("flash_attn_interface") is not None:
        return "flash_attention_3", lacks
    lacks.append(
        "flash_attention_3: flash_attn_interface is not installed (PyPI has no build for this torch)"
    )
    if importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2", lacks
    lacks.append("flash_attention_2: flash-attn is not installed (PyPI ships its source only; no build here)")
    return "flex_attention", lacks


def step_rows(training: Any) -> int:
    """Packed rows an optimizer step of kubetune's case: the example's batch x accumulation."""
    return int(training.batch_size) * int(training.gradient_accumulation_steps or 1)


def accumulation(rows: int, batch: int) -> int:
    """Micro-steps of ``batch`` rows that make ``rows`` rows an optimizer step.

    >>> accumulation(32, 8)
    4
    >>> accumulation(8, 3)
    Traceback (most recent call last):
    ...
    ValueError: a micro-batch of 3 rows does not divide the 8 packed rows of an optimizer step
    """
    if batch < 1 or rows % batch:
        raise ValueError(
            f"a micro-batch of {batch} rows does not divide the {rows} packed rows of an optimizer step"
        )
    return rows // batch


def _common(training: Any, *, batch: int, rows: int, max_length: int, cuda: bool) -> dict[str, Any]:
    """The SFTConfig settings both peers share with kubetune's case (the example's) and each other."""
    return {
        "per_device_train_batch_size": batch,
        "gradient_accumulation_steps": accumulation(rows, batch),
        "learning_rate": float(training.learning_rate),
        "weight_decay": float(training.weight_decay or 0.0),
        "warmup_steps": int(training.warmup_steps or 0),
        "logging_steps": int(training.logging_steps or 25),
        "max_length": max_length,
        "bf16": cuda,
        "packing": True,
        "packing_strategy": "bfd",
        "padding_free": True,
        "gradient_checkpointing": False,
        "optim": "adamw_torch_fused" if cuda else "adamw_torch",
        "dataloader_pin_memory": cuda,
        "remove_unused_columns": False,
    }


def trl_best_settings(
    training: Any, *, batch: int, rows: int, max_length: int, attn: str | None = None, cuda: bool = True
) -> dict[str, Any]:
    """TRL at its best: ``sft`` (SFTConfig's keyword arguments), ``attn_implementation``, ``dtype``
    (of the weights) and ``lacks`` (what was missing for a faster choice).

    ``attn`` forces an attention implementation (a sweep's point); on the CPU (the smoke run) the
    CUDA-only options are off and attention is SDPA.
    """
    chosen, lacks = best_attention() if attn is None else (attn, [])
    sft = _common(training, batch=batch, rows=rows, max_length=max_length, cuda=cuda)
    sft["use_liger_kernel"] = cuda
    return {
        "sft": sft,
        "attn_implementation": chosen if cuda else "sdpa",
        "dtype": "bfloat16" if cuda else "float32",
        "lacks": lacks,
    }


def unsloth_settings(
    training: Any, lora: dict[str, Any] | None, *, batch: int, rows: int, max_length: int, cuda: bool = True
) -> dict[str, Any]:
    """Unsloth at its best that this machine allows: ``load`` (FastLanguageModel.from_pretrained's
    arguments), ``peft`` (get_peft_model's, None for full fine-tuning) and ``sft`` (SFTConfig's).

    bf16 weights (no 4-bit or 8-bit loading: the peers train what kubetune trains), no recomputation
    (Unsloth's offloaded checkpointing saves memory, not time), padding-free packing (Unsloth picks the
    packed attention itself: FlashAttention-2, xformers or PyTorch's varlen kernel, whichever it finds),
    fused AdamW; Unsloth's own kernels instead of Liger's. LoRA keeps the example's dropout: Unsloth's
    fused LoRA kernels need dropout 0, so with the example's 0.1 they are off, as they would be for a user
    training that job. On the CPU (the smoke run, which Unsloth trains too) fp32 and plain AdamW.
    """
    sft = _common(training, batch=batch, rows=rows, max_length=max_length, cuda=cuda)
    sft["use_liger_kernel"] = False  # Unsloth patches the same layers with its own kernels
    load = {
        "max_seq_length": max_length,
        "dtype": "bfloat16" if cuda else "float32",
        "load_in_4bit": False,
        "load_in_8bit": False,
        "load_in_16bit": lora is not None,  # 16-bit LoRA
        "full_finetuning": lora is None,
        "use_gradient_checkpointing": False,  # (its default is "unsloth": offloaded recomputation)
        "fix_tokenizer": False,  # the benchmark's data is pre-tokenized; its tokenizer has no chat to fix
        "random_state": 0,
    }
    peft = None
    if lora is not None:
        peft = {
            "r": int(lora["r"]),
            "lora_alpha": int(lora["alpha"]),
            "lora_dropout": float(lora["dropout"]),
            "target_modules": list(lora["targets"]),
            "bias": "none",
            "use_gradient_checkpointing": False,
            "random_state": 0,
        }
    return {"load": load, "peft": peft, "sft": sft}


def unsloth_env(env: dict[str, str], site: str) -> dict[str, str]:
    """The Unsloth case's process environment: a copy of ``env`` with ``site`` first on PYTHONPATH
    (its older TRL and datasets win over kubetune's), offline, without Unsloth's usage statistics.

    >>> unsloth_env({"PYTHONPATH": "/k"}, "/u")["PYTHONPATH"]
    '/u:/k'
    """
    isolated = dict(env)
    rest = [part for part in env.get("PYTHONPATH", "").split(os.pathsep) if part and part != site]
    isolated["PYTHONPATH"] = os.pathsep.join([site, *rest])
    isolated["HF_HUB_OFFLINE"] = "1"
    isolated["UNSLOTH_DISABLE_STATISTICS"] = "1"
    # (Unsloth writes the trainer and layers it generates to this folder, by default in the current one)
    isolated.setdefault(
        "UNSLOTH_COMPILE_LOCATION", str(Path(tempfile.gettempdir()) / "unsloth_compiled_cache")
    )
    return isolated


def import_unsloth() -> Any:
    """Import Unsloth before transformers, TRL or PEFT (it patches them as it is imported).

    Fails with the folder to pass when Unsloth is not installed (the case needs its own environment).
    """
    import sys

    if "unsloth" in sys.modules:
        return sys.modules["unsloth"]
    early = [name for name in ("transformers", "trl", "peft") if name in sys.modules]
    if early:
        raise RuntimeError(
            f"Unsloth must be imported before {', '.join(early)} (it patches them as it loads)"
        )
    try:
        import unsloth  # type: ignore[import-not-found]
    except ImportError as err:
        raise RuntimeError(
            f"the Unsloth case needs its own environment ({err}): install unsloth and unsloth-zoo into a folder "
            f"with `pip install --target` and pass it as `kubetune bench --unsloth-site FOLDER` ({UNSLOTH_SITE_ENV})"
        ) from err
    return unsloth


def check_measured(case: str, *, tokens: int, steps: int, seconds: float) -> None:
    """Fail loudly when a case measured nothing: a throughput of zero tokens or steps is no result
    (a trainer that bypasses the model's hooks or stops before the measured steps).

    >>> check_measured("x", tokens=10, steps=1, seconds=0.5)
    >>> check_measured("qwen2-0.5b:unsloth", tokens=0, steps=3, seconds=1.0)
    Traceback (most recent call last):
    ...
    RuntimeError: qwen2-0.5b:unsloth measured nothing: 0 tokens in 3 steps over 1.0 s
    """
    if tokens <= 0 or steps <= 0 or seconds <= 0:
        raise RuntimeError(f"{case} measured nothing: {tokens} tokens in {steps} steps over {seconds} s")
