"""kubetune's packed loss equals the padded loss of the same sequences (CPU: reference attention)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kubetune_trainer import fast, varlen  # noqa: E402


def test_packed_loss_equals_padded_loss() -> None:
    varlen.register()
    cfg = transformers.Qwen2Config(
        vocab_size=101,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, attn_implementation=varlen.NAME, dtype=torch.float32
    )
    seqs = [torch.randint(3, 101, (n,)).tolist() for n in (17, 40, 9, 33)]
    out = fast.check_packing_exact(model, seqs, device="cpu")
    assert out["relative_difference"] < 1e-5, out
    # a packed row without boundaries (one long example) gives a different loss: the check can fail
    merged = fast.check_packing_exact(model, [[t for s in seqs for t in s]], device="cpu")
    assert abs(merged["packed_loss"] - out["packed_loss"]) > 1e-4
