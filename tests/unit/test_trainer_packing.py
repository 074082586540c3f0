"""Padding-free packing on CPU keeps documents apart: the packed forward equals separate forwards.

The trainer packs examples into one row with ``position_ids`` restarting at 0 and no attention mask
(TRL's padding-free collator). With SDPA, transformers turns those position_ids into a
block-diagonal causal mask; if it did not, tokens would attend across examples and the logits of
the second example would change. This is the guarantee the plan relies on when there is no varlen
FlashAttention kernel.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")


def _tiny_model(attn: str) -> Any:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=97,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    config._attn_implementation = attn
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_forward_matches_separate_forwards(attn: str) -> None:
    model = _tiny_model(attn)
    docs = [torch.tensor([5, 6, 7, 8, 9]), torch.tensor([10, 11, 12]), torch.tensor([13, 14, 15, 16])]
    with torch.no_grad():
        separate = [model(input_ids=d[None]).logits[0] for d in docs]
        packed_ids = torch.cat(docs)[None]
        position_ids = torch.cat([torch.arange(len(d)) for d in docs])[None]
        # use_cache=False as in training: with a KV cache transformers skips the packed-sequence mask.
        packed = model(input_ids=packed_ids, position_ids=position_ids, use_cache=False).logits[0]
        # Without the boundaries (plain causal), the later documents see the earlier ones.
        leaky = model(input_ids=packed_ids, use_cache=False).logits[0]
    torch.testing.assert_close(packed, torch.cat(separate), rtol=1e-4, atol=1e-4)
    assert not torch.allclose(leaky[5:], torch.cat(separate[1:]), atol=1e-4)
