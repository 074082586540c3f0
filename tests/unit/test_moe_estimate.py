"""Architecture-aware planning (issue 34 item 4): a mixture of experts is counted as its model class
builds it (all experts in memory, the top-k and shared ones in compute), from the published
config.json values of each family, against the published totals; and the preflight refuses a
30B-total / 3B-active model that the dense count said would fit.

The counts against what transformers really builds (shrunk configs on the meta device) are in
tests/unit/test_params_built.py (imports torch: out of the fast lane).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from tests.unit.test_estimate import DATA  # the same data set as the dense estimates

from kubetune_api.trainer_config import TrainerConfig, load_manifest, resolve
from kubetune_trainer.plan.estimate import does_not_fit, estimate
from kubetune_trainer.plan.params import count_params
from kubetune_trainer.plan.plan import (
    ModelShape,
    estimate_step_seconds,
    estimate_training_bytes,
    moe_activation_bytes,
    shape_from_config,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# config.json as published on the Hub (the keys the count reads)
QWEN3_30B_A3B = {
    "model_type": "qwen3_moe",
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "tie_word_embeddings": False,
}
QWEN3_235B_A22B = {
    **QWEN3_30B_A3B,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "moe_intermediate_size": 1536,
    "num_hidden_layers": 94,
    "num_attention_heads": 64,
    "num_key_value_heads": 4,
}
MIXTRAL_8X7B = {
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "tie_word_embeddings": False,
}
GPT_OSS_20B = {
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "attention_bias": True,
    "vocab_size": 201088,
    "tie_word_embeddings": False,
}
DEEPSEEK_V3 = {
    "model_type": "deepseek_v3",
    "hidden_size": 7168,
    "intermediate_size": 18432,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 3,
    "num_attention_heads": 128,
    "num_key_value_heads": 128,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "num_nextn_predict_layers": 1,
    "vocab_size": 129280,
    "tie_word_embeddings": False,
}
QWEN3_4B = {"hidden_size": 2560, "num_hidden_layers": 36, "vocab_size": 151936, "intermediate_size": 9728}
QWEN3_4B_PUBLISHED = {
    **QWEN3_4B,
    "model_type": "qwen3",
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "tie_word_embeddings": True,
}
QWEN3_06B = {  # tied embeddings: a quarter of its parameters
    "model_type": "qwen3",
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
}


def qwen3_example(product: str, method: str) -> TrainerConfig:
    """examples/qwen3-4b-full.yaml on one GPU of ``product``, ``method`` full or lora."""
    cfg = resolve(load_manifest(EXAMPLES / "qwen3-4b-full.yaml"), output_dir="/tmp/kubetune-moe-test")
    res = cfg.spec.resources.model_copy(update={"gpu_product": product})
    return cfg.model_copy(update={"spec": cfg.spec.model_copy(update={"resources": res, "method": method})})


@pytest.mark.parametrize(
    ("conf", "total", "active"),
    [
        # Qwen's model cards: 30.5B total, 3.3B activated; 235B total, 22B activated
        (QWEN3_30B_A3B, 30.5e9, 3.3e9),
        (QWEN3_235B_A22B, 235e9, 22e9),
        # Mistral: 46.7B total, 12.9B active
        (MIXTRAL_8X7B, 46.7e9, 12.9e9),
        # OpenAI's model card: 20.91B total, 3.61B active without the input embedding (201,088 x 2,880
        # = 0.58B), which kubetune's active count includes
        (GPT_OSS_20B, 20.91e9, 3.61e9 + 201_088 * 2880),
        # DeepSeek-V3: 671B total (685B with its multi-token-prediction module, which transformers
        # does not build), 37B activated
        (DEEPSEEK_V3, 671e9, 37e9),
        # dense: Qwen3-4B 4.0B, Qwen3-0.6B 0.6B (tied embeddings counted once)
        (QWEN3_4B_PUBLISHED, 4.02e9, 4.02e9),
        (QWEN3_06B, 0.6e9, 0.6e9),
    ],
    ids=[
        "qwen3-30b-a3b",
        "qwen3-235b-a22b",
        "mixtral-8x7b",
        "gpt-oss-20b",
        "deepseek-v3",
        "qwen3-4b",
        "qwen3-0.6b",
    ],
)
def test_published_configs_count_their_published_totals(
    conf: dict[str, Any], total: float, active: float
) -> None:
    count = count_params(conf)
    assert count.total == pytest.approx(total, rel=0.015)
    assert count.active == pytest.approx(active, rel=0.025)
    assert count.moe == (count.active < count.total)


def test_the_dense_count_saw_a_tenth_of_qwen3_30b_a3b() -> None:
    """The bug: intermediate_size (the dense layers' width, none of which this model has) counted as
    the MLP, and the 128 experts not at all."""
    legacy = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    dense_count = shape_from_config(legacy)
    shape = shape_from_config(QWEN3_30B_A3B)
    assert dense_count.params < 0.11 * shape.params
    assert shape.params == count_params(QWEN3_30B_A3B).total
    assert shape.flops_params == count_params(QWEN3_30B_A3B).active
    assert (shape.experts_per_token, shape.moe_layers, shape.num_experts, shape.routed_width) == (
        8,
        48,
        128,
        6144,
    )


def test_dense_shapes_are_what_they_were() -> None:
    """A dense config plans as before this change (the memory model was calibrated on it)."""
    for conf in (QWEN3_4B, QWEN3_4B_PUBLISHED, QWEN3_06B):
        shape = shape_from_config(conf)
        h, layers, vocab, inter = (
            conf[k] for k in ("hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size")
        )
        # DoRA's adapted width (issue 34 item 2) is new, and used by DoRA's memory only
        assert shape.adapted_width > 0
        assert replace(shape, adapted_width=0) == ModelShape(
            params=layers * (4 * h * h + 3 * h * inter) + 2 * vocab * h,
            hidden_size=h,
            num_layers=layers,
            vocab_size=vocab,
        )
        assert shape.active_params is None and shape.flops_params == shape.params
        assert moe_activation_bytes(shape) == 0


def test_memory_holds_every_expert_and_compute_uses_the_active_ones() -> None:
    moe = shape_from_config(QWEN3_30B_A3B)
    as_dense = ModelShape(params=moe.params, hidden_size=2048, num_layers=48, vocab_size=151936)
    small = ModelShape(params=moe.flops_params, hidden_size=2048, num_layers=48, vocab_size=151936)
    kwargs: dict[str, Any] = {"tokens": 8192, "checkpointing": False}
    # weights, gradients and moments of all 30.5B parameters: as a dense model of that size, plus
    # the routed copies of each token's hidden state
    for lora in (False, True):
        moe_bytes = estimate_training_bytes(moe, lora=lora, **kwargs)
        dense_bytes = estimate_training_bytes(as_dense, lora=lora, **kwargs)
        assert moe_bytes - dense_bytes == 8192 * 48 * moe_activation_bytes(moe) > 0
    # FLOPs of the 3.3B active parameters: the step time of a dense 3.3B model
    timing: dict[str, Any] = {
        "tokens": 8192,
        "micro_steps": 4,
        "checkpointing": False,
        "peak_flops": 989.4e12,
    }
    assert estimate_step_seconds(moe, **timing) == estimate_step_seconds(small, **timing)
    assert estimate_step_seconds(moe, **timing) < estimate_step_seconds(as_dense, **timing) / 5
    # with recomputation one layer's activations (a MoE layer's) at a time
    with_recompute = estimate_training_bytes(moe, lora=False, tokens=8192, checkpointing=True)
    dense_recompute = estimate_training_bytes(as_dense, lora=False, tokens=8192, checkpointing=True)
    assert with_recompute - dense_recompute == 8192 * moe_activation_bytes(moe)


@pytest.mark.parametrize(
    ("product", "gib", "method"), [("NVIDIA-L4", 24, "lora"), ("NVIDIA-H100-80GB-HBM3", 80, "full")]
)
def test_qwen3_30b_a3b_does_not_fit_where_the_dense_count_said_it_would(
    product: str, gib: int, method: str
) -> None:
    """On a 24 GiB L4 even LoRA's frozen bf16 base (61 GB) does not fit; on an 80 GiB H100 a full
    fine-tune (16 bytes for each of 30.5B parameters) does not. Counted as dense, both "fit"."""
    cfg = qwen3_example(product, method)
    legacy = shape_from_config({k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"})
    assert estimate(cfg, legacy, DATA).fits  # what the preflight said before: the job then died of OOM
    shape = shape_from_config(QWEN3_30B_A3B)
    est = estimate(cfg, shape, DATA)
    assert not est.fits and est.gpu_memory_gib == gib
    assert (
        est.peak_memory_gib > 0.85 * gib
        and est.peak_memory_gib > 2 * estimate(cfg, legacy, DATA).peak_memory_gib
    )
    message = does_not_fit(cfg, shape, DATA, est)
    assert message is not None and f"{gib} GiB" in message
    if method == "full":
        # LoRA's frozen base (57 GiB) fits one 80 GiB GPU; so do enough GPUs sharding the states
        assert "method: lora instead of full" in message and "fsdp2" in message
    else:
        assert "Nothing kubetune can plan fits this GPU" in message


def test_qwen3_30b_a3b_lora_fits_an_80_gib_gpu_and_runs_at_its_active_size() -> None:
    cfg = qwen3_example("NVIDIA-H100-80GB-HBM3", "lora")
    shape = shape_from_config(QWEN3_30B_A3B)
    moe = estimate(cfg, shape, DATA)
    assert moe.fits and moe.peak_memory_gib > 57  # the whole bf16 base is on the GPU
    # a dense model of its 30.5B parameters computes 9 times as much a token
    as_dense = ModelShape(params=shape.params, hidden_size=2048, num_layers=48, vocab_size=151936)
    dense = estimate(cfg, as_dense, DATA)
    assert moe.tokens_per_second > 5 * dense.tokens_per_second


@pytest.mark.parametrize("product", ["NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"])
def test_the_preparation_refuses_qwen3_30b_a3b_from_its_config_json(tmp_path: Path, product: str) -> None:
    """Where DoesNotFit is decided (the preparation step, from the downloaded config.json): LoRA on a
    24 GiB L4, a full fine-tune on an 80 GiB H100; the same config read as dense passed both."""
    import json

    from kubetune_api.preparation import Refusal
    from kubetune_trainer.preparation.prepare import Refused, _estimate

    cfg = qwen3_example(product, "lora" if product == "NVIDIA-L4" else "full")
    dense = {k: v for k, v in QWEN3_30B_A3B.items() if k != "num_experts"}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen3MoeForCausalLM"], **dense}))
    assert _estimate(cfg, tmp_path, DATA).fits
    (tmp_path / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3MoeForCausalLM"], **QWEN3_30B_A3B})
    )
    with pytest.raises(Refused) as refused:
        _estimate(cfg, tmp_path, DATA)
    assert refused.value.refusal.reason == Refusal.DOES_NOT_FIT
