"""Parameter counts from a model's config alone (no weights, no torch): all of them, and the ones one
token's forward pass uses, for the decoder families the trainer loads with ``AutoModelForCausalLM``.

A mixture-of-experts layer holds every expert's weights but sends each token through only
``num_experts_per_tok`` of them (plus its shared experts, where the family has some). Memory is
planned with the **total** (full fine-tuning keeps the gradients and AdamW moments of every expert;
LoRA's frozen base is every expert too); compute with the **active** parameters (:mod:`.plan`).

What is counted, on purpose:

* **Tied embeddings** once: with ``tie_word_embeddings`` the LM head is the input embedding's matrix,
  one tensor in memory. A config that does not say is counted untied (the families below all
  default to untied; counting the head on its own can only over-state memory).
* **Active** parameters include both the input embedding and the LM head (Qwen's and Mistral's
  published "activated" counts do; OpenAI's gpt-oss model card leaves the input embedding out).
* **Vision towers are not counted**: the count is the text model's (``text_config`` where the config
  has one). The trainer loads ``AutoModelForCausalLM``, which for most multimodal checkpoints is the
  text model alone (Llama 4) or nothing (Qwen-VL); where it does build a vision tower (Gemma 3), that
  tower's weights are missing from the count.
* DeepSeek-V3's multi-token-prediction layer (``num_nextn_predict_layers``) is not counted:
  transformers does not build it. Router buffers (DeepSeek's score correction bias) are not
  parameters and are not counted; the routers' weights are.

The families: Qwen3-MoE (``num_experts``, ``moe_intermediate_size``, ``decoder_sparse_step``,
``mlp_only_layers``), Qwen2-MoE (its gated shared expert), Mixtral (``num_local_experts`` experts of
``intermediate_size``), gpt-oss (biased experts and router, attention sinks), DeepSeek-V3 (latent
attention, ``n_shared_experts`` shared experts, the first ``first_k_dense_replace`` layers dense);
and dense Llama-style models (Llama, Mistral, Qwen2, Qwen3). The experts' layout is read from the
keys a config has (``first_k_dense_replace``, ``decoder_sparse_step``, ``n_shared_experts``,
``shared_expert_intermediate_size``); the attention's from its family. Another family is counted
as a Llama-style one with the experts its config names: an approximation, checked for none.

>>> qwen3_moe = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48,
...     "vocab_size": 151936, "intermediate_size": 6144, "moe_intermediate_size": 768,
...     "num_experts": 128, "num_experts_per_tok": 8, "num_attention_heads": 32,
...     "num_key_value_heads": 4, "head_dim": 128, "tie_word_embeddings": False}
>>> c = count_params(qwen3_moe)
>>> round(c.total / 1e9, 2), round(c.active / 1e9, 2), c.moe_layers, c.routed_width
(30.53, 3.35, 48, 6144)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# head_dim where a family's config class has its own default (else hidden_size / heads)
_HEAD_DIM_DEFAULTS = {"qwen3": 128, "qwen3_moe": 128, "gpt_oss": 64}
# families whose attention normalizes each head's queries and keys (one RMSNorm weight of head_dim each)
_QK_NORM = frozenset({"qwen3", "qwen3_moe", "qwen3_vl", "qwen3_vl_moe"})
# families whose q/k/v projections always carry a bias (Qwen2's is not in its config)
_QKV_BIAS = frozenset({"qwen2"})


@dataclass(frozen=True)
class ParamCount:
    """A model's parameters, as ``sum(p.numel() for p in model.parameters())`` counts them."""

    total: int
    # one token's forward: everything but the routed experts it is not sent to
    active: int
    # the input embedding and the LM head (once when tied)
    embeddings: int
    # the routed experts' weights, all of them (0: a dense model)
    experts: int = 0
    # routed experts per MoE layer, how many a token goes to, and the MoE layers
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    # intermediate units a token passes through in a MoE layer: top-k routed experts' and the
    # shared experts' (k x moe_intermediate_size + shared)
    routed_width: int = 0

    @property
    def moe(self) -> bool:
        return self.num_experts > 0


def _int(conf: Mapping[str, Any], *keys: str, default: int = 0) -> int:
    """The first of ``keys`` the config sets (not None)."""
    for key in keys:
        value = conf.get(key)
        if value is not None:
            return int(value)
    return default


def num_experts(conf: Mapping[str, Any]) -> int:
    """Routed experts per MoE layer (0: dense), by any of the names the families give them.

    >>> num_experts({"num_local_experts": 8}), num_experts({"n_routed_experts": 256}), num_experts({})
    (8, 256, 0)
    """
    return _int(conf, "num_local_experts", "num_experts", "n_routed_experts")


def _linear(inputs: int, outputs: int, bias: bool = False) -> int:
    return inputs * outputs + (outputs if bias else 0)


def _attention(conf: Mapping[str, Any], family: str, hidden: int) -> int:
    """One layer's attention projections (and their norms)."""
    heads = _int(conf, "num_attention_heads", default=1)
    if family == "deepseek_v3":
        # multi-head latent attention: queries and keys/values through low-rank latents
        nope, rope = _int(conf, "qk_nope_head_dim"), _int(conf, "qk_rope_head_dim")
        v_dim, kv_rank = _int(conf, "v_head_dim"), _int(conf, "kv_lora_rank")
        q_rank = conf.get("q_lora_rank")
        bias = bool(conf.get("attention_bias", False))
        if q_rank:
            q = _linear(hidden, int(q_rank), bias) + int(q_rank) + _linear(int(q_rank), heads * (nope + rope))
        else:
            q = _linear(hidden, heads * (nope + rope))
        kv = _linear(hidden, kv_rank + rope, bias) + kv_rank + _linear(kv_rank, heads * (nope + v_dim))
        return q + kv + _linear(heads * v_dim, hidden, bias)
    kv_heads = _int(conf, "num_key_value_heads", default=heads)
    head_dim = _int(conf, "head_dim", default=_HEAD_DIM_DEFAULTS.get(family, hidden // heads))
    bias = bool(conf.get("attention_bias", False))
    qkv_bias = bias or family in _QKV_BIAS or (family == "qwen2_moe" and bool(conf.get("qkv_bias", True)))
    params = _linear(hidden, heads * head_dim, qkv_bias) + 2 * _linear(hidden, kv_heads * head_dim, qkv_bias)
    params += _linear(heads * head_dim, hidden, bias)
    if family in _QK_NORM:
        params += 2 * head_dim
    if family == "gpt_oss":
        params += heads  # attention sinks: one learned logit per head
    return params


def _gated_mlp(hidden: int, width: int, bias: bool = False) -> int:
    """gate, up and down projections of a SwiGLU MLP of ``width`` intermediate units."""
    return 2 * _linear(hidden, width, bias) + _linear(width, hidden, bias)


def _is_moe_layer(conf: Mapping[str, Any], layer: int) -> bool:
    """By the keys the config has: DeepSeek's first dense layers, Qwen's sparse step and dense
    layers, or (Mixtral, gpt-oss) every layer."""
    if "first_k_dense_replace" in conf:
        return layer >= _int(conf, "first_k_dense_replace")
    step = _int(conf, "decoder_sparse_step", default=1)
    return layer not in (conf.get("mlp_only_layers") or []) and (layer + 1) % max(1, step) == 0


def count_params(conf: Mapping[str, Any]) -> ParamCount:
    """The parameters the model class builds from ``conf`` (a text model's config as a dict:
    ``config.json`` as published, or ``PretrainedConfig.to_dict()``), and those one token uses."""
    # a multimodal model's text part counts as its family (qwen3_vl_moe_text: qwen3_vl_moe)
    family = str(conf.get("model_type") or "").removesuffix("_text")
    hidden = _int(conf, "hidden_size")
    layers = _int(conf, "num_hidden_layers")
    vocab = _int(conf, "vocab_size")
    dense_width = _int(conf, "intermediate_size", default=4 * hidden)
    experts = num_experts(conf)
    top_k = _int(conf, "num_experts_per_tok", "experts_per_token", default=1) if experts else 0

    embeddings = vocab * hidden * (1 if conf.get("tie_word_embeddings", False) else 2)
    norms = 2 * hidden  # before attention and before the MLP
    layer_base = _attention(conf, family, hidden) + norms

    # one routed expert, its router's share, and a MoE layer's shared experts
    # Mixtral and gpt-oss size their experts with intermediate_size (they have no dense layers)
    expert_width = _int(conf, "moe_intermediate_size", default=dense_width)
    if family == "gpt_oss":
        expert, router = _gated_mlp(hidden, expert_width, bias=True), _linear(hidden, experts, bias=True)
    else:
        expert, router = _gated_mlp(hidden, expert_width), _linear(hidden, experts)
    # shared experts every token goes through: DeepSeek's n_shared_experts of the routed experts'
    # width, or Qwen2-MoE's one of its own width with a sigmoid gate (hidden -> 1)
    shared_width = expert_width * _int(conf, "n_shared_experts")
    gated_width = _int(conf, "shared_expert_intermediate_size")
    shared = _gated_mlp(hidden, shared_width) if shared_width else 0
    if gated_width:
        shared += _gated_mlp(hidden, gated_width) + hidden
        shared_width += gated_width

    moe_layers = sum(1 for i in range(layers) if experts and _is_moe_layer(conf, i))
    dense_layers = layers - moe_layers
    dense_mlp = _gated_mlp(hidden, dense_width, bias=bool(conf.get("mlp_bias", False)))
    fixed = embeddings + hidden + layers * layer_base + dense_layers * dense_mlp  # + the final norm
    moe_fixed = moe_layers * (router + shared)
    total = fixed + moe_fixed + moe_layers * experts * expert
    active = fixed + moe_fixed + moe_layers * top_k * expert
    return ParamCount(
        total=total,
        active=active,
        embeddings=embeddings,
        experts=moe_layers * experts * expert,
        num_experts=experts if moe_layers else 0,
        experts_per_token=top_k if moe_layers else 0,
        moe_layers=moe_layers,
        routed_width=top_k * expert_width + shared_width if moe_layers else 0,
    )
