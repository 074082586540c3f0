"""The config-only parameter counts (kubetune_trainer.plan.params) against what transformers' model
classes really build: each family's config class with shrunk sizes (a few layers, a small hidden
size), the model built on the meta device (no memory, no weights), ``sum(p.numel())`` compared with
the formula's count, to the parameter. Active parameters: the total less the routed experts a token
is not sent to, read from the built model's own expert modules.

Imports torch and transformers: out of the fast lane, in the whole suite.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kubetune_trainer.plan.params import count_params, num_experts  # noqa: E402
from kubetune_trainer.plan.plan import shape_from_config  # noqa: E402

SMALL = {"vocab_size": 320, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}

# (model type, the shrunk config's values): every MoE family's own knobs set away from its defaults
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3-moe": (
        "qwen3_moe",
        {
            **SMALL,
            "num_hidden_layers": 4,
            "head_dim": 24,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [1],  # one dense layer among the MoE ones
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-moe-sparse-step-tied": (
        "qwen3_moe",
        {
            **SMALL,
            "num_hidden_layers": 4,
            "head_dim": 16,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "num_experts": 6,
            "num_experts_per_tok": 3,
            "decoder_sparse_step": 2,  # layers 1 and 3 MoE, 0 and 2 dense
            "tie_word_embeddings": True,
        },
    ),
    "qwen2-moe-shared-expert": (
        "qwen2_moe",
        {
            **SMALL,
            "num_hidden_layers": 3,
            "intermediate_size": 96,
            "moe_intermediate_size": 32,
            "shared_expert_intermediate_size": 80,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": False,
        },
    ),
    "mixtral": (
        "mixtral",
        {
            **SMALL,
            "num_hidden_layers": 3,
            "intermediate_size": 112,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "tie_word_embeddings": False,
        },
    ),
    "gpt-oss": (
        "gpt_oss",
        {
            **SMALL,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 48,
            "num_local_experts": 8,
            "num_experts_per_tok": 2,
            "attention_bias": True,
            "layer_types": ["sliding_attention", "full_attention"],
            "tie_word_embeddings": False,
        },
    ),
    "deepseek-v3-shared-experts": (
        "deepseek_v3",
        {
            **SMALL,
            "num_key_value_heads": 4,
            "num_hidden_layers": 4,
            "intermediate_size": 128,
            "moe_intermediate_size": 24,
            "n_routed_experts": 8,
            "n_shared_experts": 2,
            "num_experts_per_tok": 2,
            "n_group": 2,
            "topk_group": 1,
            "first_k_dense_replace": 1,
            "q_lora_rank": 48,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "tie_word_embeddings": False,
        },
    ),
    "deepseek-v3-no-query-latent": (
        "deepseek_v3",
        {
            **SMALL,
            "num_key_value_heads": 4,
            "num_hidden_layers": 2,
            "intermediate_size": 128,
            "moe_intermediate_size": 24,
            "n_routed_experts": 4,
            "n_shared_experts": 1,
            "num_experts_per_tok": 2,
            "n_group": 1,
            "topk_group": 1,
            "first_k_dense_replace": 0,
            "q_lora_rank": None,
            "kv_lora_rank": 32,
            "qk_nope_head_dim": 16,
            "qk_rope_head_dim": 8,
            "v_head_dim": 16,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-dense": (
        "qwen3",
        {
            **SMALL,
            "num_hidden_layers": 3,
            "head_dim": 24,
            "intermediate_size": 96,
            "tie_word_embeddings": False,
        },
    ),
    "qwen3-dense-tied": (
        "qwen3",
        {
            **SMALL,
            "num_hidden_layers": 2,
            "head_dim": 16,
            "intermediate_size": 96,
            "tie_word_embeddings": True,
        },
    ),
    "qwen2-dense-tied": (
        "qwen2",
        {**SMALL, "num_hidden_layers": 2, "intermediate_size": 96, "tie_word_embeddings": True},
    ),
    "llama-dense": (
        "llama",
        {**SMALL, "num_hidden_layers": 2, "intermediate_size": 96, "tie_word_embeddings": False},
    ),
}


def _built(model_type: str, values: dict[str, Any]) -> tuple[Any, Any]:
    config = transformers.AutoConfig.for_model(model_type, **values)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return config, model


def _inactive_experts(model: Any, config: Any) -> int:
    """Parameters of the routed experts a token is not sent to, from the built modules: each
    layer's expert module (its 3-D tensors hold every expert) less top-k experts' share."""
    routed = num_experts(config.to_dict())
    if not routed:
        return 0
    top_k = config.num_experts_per_tok
    inactive = 0
    for module in model.modules():
        if type(module).__name__.endswith("Experts"):
            weights = sum(p.numel() for p in module.parameters())
            inactive += weights * (routed - top_k) // routed
    return inactive


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_count_is_what_the_model_class_builds(name: str) -> None:
    model_type, values = CONFIGS[name]
    config, model = _built(model_type, values)
    built = sum(p.numel() for p in model.parameters())  # a tied matrix once
    as_published = count_params({"model_type": model_type, **values})
    as_loaded = count_params(config.to_dict())  # the trainer's path: AutoConfig's dict
    assert as_published.total == built, (as_published, built)
    assert as_loaded == as_published
    assert as_published.active == built - _inactive_experts(model, config)
    # the plan's shape: a MoE model plans with the exact counts, a dense one as before
    shape = shape_from_config(config.to_dict())
    if as_published.moe:
        assert (shape.params, shape.active_params) == (built, as_published.active)
    else:
        assert shape.active_params is None and as_published.active == as_published.total


def test_tied_embeddings_are_one_matrix_in_the_count_and_in_the_model() -> None:
    _, values = CONFIGS["qwen3-dense-tied"]
    untied = {**values, "tie_word_embeddings": False}
    _, model = _built("qwen3", untied)
    difference = (
        sum(p.numel() for p in model.parameters()) - count_params({"model_type": "qwen3", **values}).total
    )
    assert difference == values["vocab_size"] * values["hidden_size"]  # the LM head's own matrix


def test_a_moe_families_expert_modules_are_found() -> None:
    """The active count's check above reads the expert modules by name: it must find them."""
    for name, (model_type, values) in CONFIGS.items():
        config, model = _built(model_type, values)
        found = [m for m in model.modules() if type(m).__name__.endswith("Experts")]
        assert len(found) == count_params(config.to_dict()).moe_layers, name


def test_a_multimodal_models_count_is_its_text_models_and_leaves_the_vision_tower_out() -> None:
    """Qwen3-VL-MoE: the count of its text_config is the language model and LM head, to the
    parameter; the vision tower is not counted (on purpose: kubetune_trainer.plan.params)."""
    _, text = CONFIGS["qwen3-moe"]
    vision = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 64, "out_hidden_size": 64}
    config = transformers.AutoConfig.for_model("qwen3_vl_moe", text_config=text, vision_config=vision)
    with torch.device("meta"):
        model = transformers.AutoModelForImageTextToText.from_config(config)
    language = sum(p.numel() for p in model.model.language_model.parameters())
    language += sum(p.numel() for p in model.lm_head.parameters())
    count = count_params(config.to_dict()["text_config"])
    assert count.total == language < sum(p.numel() for p in model.parameters())
    assert shape_from_config(config.to_dict()["text_config"]).params == language
