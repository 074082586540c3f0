"""What the cases train on and what that costs: Capybara-like synthetic data and model FLOPs per token."""

from __future__ import annotations

import math
from typing import Any

from kubetune_trainer.plan.plan import peak_bf16_flops

from .cases import BASELINE, MAX_LENGTH, NOTEBOOK_A, NOTEBOOK_B

# --- data ------------------------------------------------------------------------------------------


def capybara_like_lengths(
    n: int, *, seed: int = 0, median: float = 850.0, cap: int = MAX_LENGTH
) -> list[int]:
    """Token lengths of chat examples: log-normal with median 850 and P(len >= 1024) ~ 0.39."""
    import random

    rng = random.Random(seed)
    mu = math.log(median)
    # P(X >= cap) = 0.39  ->  (ln cap - mu) / sigma = z(0.61) = 0.2793
    sigma = (math.log(cap) - mu) / 0.2793
    return [max(16, min(cap, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def scaled_lengths(n: int, *, seed: int = 0, max_length: int = MAX_LENGTH) -> list[int]:
    """Capybara-like lengths for conversations cut at ``max_length``: the median scaled with the cut.

    >>> scaled_lengths(5, seed=0) == capybara_like_lengths(5, seed=0)
    True
    >>> max(scaled_lengths(1000, max_length=128))
    128
    """
    return capybara_like_lengths(n, seed=seed, median=850.0 * max_length / MAX_LENGTH, cap=max_length)


def synthetic_dataset(n: int, vocab: int, *, seed: int = 0, max_length: int = MAX_LENGTH) -> Any:
    """Pre-tokenized rows (``input_ids``) with Capybara-like lengths; ids avoid the special tokens."""
    import torch
    from datasets import Dataset

    gen = torch.Generator().manual_seed(seed)
    lengths = scaled_lengths(n, seed=seed, max_length=max_length)
    low = min(16, vocab // 4)
    rows = [torch.randint(low, vocab, (length,), generator=gen).tolist() for length in lengths]
    return Dataset.from_dict({"input_ids": rows})


def epoch_rows(epoch_tokens: int, max_length: int = MAX_LENGTH) -> int:
    """Conversations that hold about ``epoch_tokens`` real tokens (Capybara: ~12M in one epoch)."""
    mean = sum(scaled_lengths(2000, seed=1, max_length=max_length)) / 2000
    return math.ceil(epoch_tokens / mean)


def notebook_step_rows(kind: str, lengths: list[int], max_length: int = MAX_LENGTH) -> int:
    """Packed rows of ``max_length`` that hold about as many tokens as an optimizer step of the
    kubetune case's notebook: its sequences a step (batch x accumulation, unpacked) times the data's
    mean sequence length. With packing, the trainer's batch counts rows of up to maxLength tokens
    (several short sequences share a row), so the examples' batch holds more tokens a step than the
    notebook's unpacked one; this gives the kubetune case the notebook's step size instead.

    >>> notebook_step_rows("kubetune-full", [779] * 10)  # notebook B: 1 x 8 sequences
    6
    >>> notebook_step_rows("kubetune-lora", [779] * 10)  # notebook A: 8 x 4 sequences
    24
    """
    notebook = NOTEBOOK_A if BASELINE[kind] == "notebook-a" else NOTEBOOK_B
    sequences = notebook["per_device_train_batch_size"] * notebook["gradient_accumulation_steps"]
    mean = sum(lengths) / len(lengths)
    return max(1, round(sequences * mean / max_length))


# --- FLOPs -----------------------------------------------------------------------------------------


def matmul_params(cfg: dict[str, Any]) -> int:
    """Parameters of every matrix multiply per token: attention + MLP projections + the LM head."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    attn = h * heads * d * 2 + h * kv * d * 2  # q, o and k, v
    mlp = 3 * h * cfg["intermediate_size"]
    return layers * (attn + mlp) + cfg["vocab_size"] * h


def flops_per_token(cfg: dict[str, Any], *, lora: bool, mean_context: float) -> float:
    """Model FLOPs a trained token: m * 2 * N_matmul + 3 * 4 * L * H * d_head * c (the package docstring)."""
    heads = cfg["num_attention_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    linear = (2 if lora else 3) * 2 * matmul_params(cfg)
    attention = 3 * 4 * cfg["num_hidden_layers"] * heads * d * mean_context
    return float(linear + attention)


def peak_flops(device_name: str, override: float | None) -> float | None:
    """The MFU denominator: ``--peak-tflops``, else the plan's table of dense bf16 peaks by GPU name."""
    if override:
        return override * 1e12
    return peak_bf16_flops(device_name)
