"""Small random-weight models for tests that need real layer shapes (no download)."""

from __future__ import annotations

from typing import Any


def fp8_sized_llama(device: str = "cpu") -> Any:
    """A two-layer Llama, bf16, whose q, o, gate, up and down projections are large enough for
    KUBETUNE_FP8 (2,048 features or more on both sides) and whose k and v (512 out) are not."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=2048,
        intermediate_size=4096,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=4,
        head_dim=128,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16, attn_implementation="sdpa")


def one_layer_qwen2(dtype: Any) -> Any:
    """A one-layer Qwen2 of hidden size 32 (every projection kind present), random weights in ``dtype``."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        vocab_size=64,
    )
    return Qwen2ForCausalLM(config).to(dtype)
