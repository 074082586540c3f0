"""The run plan: what this machine can do with this spec (precision, kernels, checkpointing, packing).

Every choice the spec leaves to kubetune (``precision`` on a CPU, ``liger`` without CUDA,
``gradientCheckpointing: auto``, ``packing`` without a varlen kernel, the micro-batch from
``tokensPerStep``) is made here, in one pure function, and each comes with a reason that the
trainer logs and writes into ``train-result.json``. The performance work (a memory-fit plan for
tokens per step, varlen FlashAttention registered in transformers' attention registry) changes
this module, not the training loop.

>>> from kubetune_api.spec import TrainingSpec
>>> p = make_plan(TrainingSpec(max_steps=10), Hardware(cuda=False, bf16=False, world_size=1))
>>> p.precision, p.liger, p.gradient_checkpointing, p.padding_free
('fp32', False, False, True)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypedDict

from kubetune_api.spec import Precision, Toggle, TrainingSpec
from kubetune_api.tuning import (
    DATALOADER_WORKERS_ENV,
    FP8_ENV,
    SHARDING_ENV,
    TuningConfig,
)

from .. import settings
from .params import count_params, num_experts

# The attention implementation of packed rows without padding (the name that
# kubetune_trainer.training.varlen registers its kernel under in transformers).
VARLEN = "kubetune_varlen"

# Data-loader worker processes per GPU process (each keeps prefetch_factor=2 micro-steps ready).
DATALOADER_WORKERS = 2
# overrides it (0: collate in the training process, e.g. in a pod with few CPUs)

# Logits the fused loss head may hold at once (elements; bf16: 1 GiB). Liger's default keeps them
# to tokens x hidden, which cuts a 152k vocabulary into chunks of ~256 tokens: dozens of small
# matrix products per micro-step (and a narrow one accumulating the LM head's gradient per chunk).
LOSS_CHUNK_ELEMENTS = 2**29
# and at least this many (128 MiB in bf16), also when the memory plan leaves nothing spare
MIN_LOSS_CHUNK_ELEMENTS = 2**26

# Fraction of GPU memory the plan may fill before it turns gradient checkpointing on (auto).
MEMORY_HEADROOM = 0.85

# The step-time model that picks micro-steps and recomputation when the whole step does not fit
# (measured on an H200, docs/benchmarks-history.md "small memory budgets"): every micro-step costs at least
# MICRO_STEP_SECONDS of host work (the training loop and the launch of its kernels; 0.12 s for
# Qwen2-0.5B LoRA with 1-row micro-steps and for Qwen3-4B full with 2-row ones, compiled), and
# otherwise 6 x parameters x tokens FLOPs (a mixture of experts: its active parameters) at
# SUSTAINED_FRACTION of the GPU's dense bf16 peak (Qwen3-4B full: ~500 of 989 TFLOP/s),
# RECOMPUTE_COST times that with gradient checkpointing (one more forward pass).
MICRO_STEP_SECONDS = 0.12
SUSTAINED_FRACTION = 0.5
RECOMPUTE_COST = 4 / 3
# The MLP width (intermediate / hidden) the activation constants of estimate_training_bytes were
# calibrated on (Qwen3-4B: 9728 / 2560); a mixture of experts whose top-k experts are wider keeps more.
DENSE_MLP_RATIO = 3.8

# QLoRA (spec.lora.quantization nf4): bitsandbytes' 4-bit NormalFloat stores each weight of a decoder
# layer's linear layers in 4 bits plus its blocks' scales: one per 64 weights, themselves quantized to
# 8 bits with an fp32 scale per 256 of them (double quantization): 4 + 8/64 + 32/(64 x 256) bits.
NF4_BYTES_PER_PARAM = (4 + 8 / 64 + 32 / (64 * 256)) / 8
# bf16 compute (the dtype QLoRA's products run in here) needs compute capability 8.0 (Ampere) or newer;
# bitsandbytes' NF4 layers themselves run from 6.0 (Pascal) on, but not in bf16 there.
QLORA_MIN_CAPABILITY = (8, 0)
# DoRA keeps, per token and adapted layer, two bf16 copies of the layer's output (the base layer's
# result and the adapter's, for the magnitudes' gradient): 2 x 2 bytes per output feature.
DORA_ACTIVATION_BYTES = 4
# Trained parameters in fp32 with their gradient and AdamW's two moments: 16 bytes each.
TRAINED_PARAM_BYTES = 16

# Dense bf16 (= fp16) tensor FLOP/s by GPU name (vendor datasheets; SXM parts where there are two);
# the longest matching name wins ("L40S" before "L4"). A GPU not listed plans with an A100's.
PEAK_BF16_FLOPS = {
    "H100": 989.4e12,
    "H200": 989.4e12,
    "H20": 148e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A10": 125e12,
    "L40S": 362e12,
    "L4": 121e12,
}
DEFAULT_PEAK_FLOPS = 312e12


def peak_bf16_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name, or None when it is not listed.

    >>> peak_bf16_flops("NVIDIA H200"), peak_bf16_flops("NVIDIA L40S"), peak_bf16_flops("NVIDIA L4")
    (989400000000000.0, 362000000000000.0, 121000000000000.0)
    >>> peak_bf16_flops("NVIDIA A100-SXM4-80GB"), peak_bf16_flops("Quadro RTX 8000") is None
    (312000000000000.0, True)
    """
    matches = [key for key in PEAK_BF16_FLOPS if key in device_name]
    return PEAK_BF16_FLOPS[max(matches, key=len)] if matches else None


@dataclass(frozen=True)
class Hardware:
    """What the process runs on."""

    cuda: bool
    bf16: bool
    world_size: int = 1
    gpu_memory_bytes: int | None = None
    flash_attn: bool = False
    # PyTorch's own variable-length FlashAttention (torch.nn.attention.varlen, torch >= 2.10)
    varlen: bool = False
    # float8 matrix products: a GPU with fp8 tensor cores (compute capability 8.9+) and torchao
    fp8: bool = False
    # the GPU's dense bf16 peak (PEAK_BF16_FLOPS), for the step-time model; None: not listed
    peak_flops: float | None = None
    # the GPU's compute capability (major, minor); None: no GPU, or not known
    capability: tuple[int, int] | None = None
    # the GPU's name (torch's, or the product label the estimate plans for); None: no GPU
    name: str | None = None

    @staticmethod
    def detect(tuning: TuningConfig | None = None) -> Hardware:
        """This process's hardware; a GPU memory cap in ``tuning`` (default: from the environment) counts."""
        import torch

        world = settings.current().world_size
        if torch.cuda.is_available():
            total = torch.cuda.get_device_properties(0).total_memory
            # A GPU shared or capped (KUBETUNE_GPU_MEMORY_GIB, which limit_gpu_memory enforces; or
            # an 80 GiB plan rehearsed on a bigger card) plans with what it may use.
            cap = (tuning or settings.current().tuning()).gpu_memory_cap_bytes
            if cap:
                total = min(total, cap)
            return Hardware(
                cuda=True,
                bf16=torch.cuda.is_bf16_supported(),
                world_size=world,
                gpu_memory_bytes=int(total),
                flash_attn=_has_module("flash_attn"),
                varlen=_has_module("torch.nn.attention.varlen"),
                # the package is found, not imported (importing torchao takes seconds)
                fp8=torch.cuda.get_device_capability(0) >= (8, 9) and _has_module("torchao"),
                peak_flops=peak_bf16_flops(torch.cuda.get_device_name(0)),
                capability=torch.cuda.get_device_capability(0),
                name=torch.cuda.get_device_name(0),
            )
        return Hardware(cuda=False, bf16=cpu_has_native_bf16(), world_size=world)


def limit_gpu_memory(tuning: TuningConfig | None = None) -> float | None:
    """Hold PyTorch's allocator on this process's GPU to ``KUBETUNE_GPU_MEMORY_GIB``; the fraction set.

    The plan fits micro-steps and recomputation into the cap; this makes the process keep to it (an
    allocation past it fails with an out-of-memory error in this process instead of taking memory
    from whatever shares the GPU). None: no cap, or no GPU.
    """
    cap = (tuning or settings.current().tuning()).gpu_memory_cap_bytes
    if cap is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    device = settings.current().local_rank
    fraction = min(1.0, cap / torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction


def _has_module(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is not None


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bf16 natively (AVX512-BF16 or AMX); elsewhere it is emulated and slow."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@dataclass(frozen=True)
class ModelShape:
    """The few numbers of a model config the memory estimate needs.

    ``params`` is every parameter the GPU holds (a mixture of experts: all experts);
    ``active_params`` those one token's forward pass uses (top-k routed experts, shared experts and
    everything dense), None for a dense model (all of ``params``). Memory is planned with ``params``,
    compute (FLOPs) with :attr:`flops_params`.
    """

    params: int
    hidden_size: int
    num_layers: int
    vocab_size: int
    active_params: int | None = None
    # mixture of experts: routed experts per token, MoE layers, routed experts per MoE layer, and the
    # intermediate units a token passes through in a MoE layer (k x expert width + shared experts')
    experts_per_token: int = 0
    moe_layers: int = 0
    num_experts: int = 0
    routed_width: int = 0
    # the output features of one decoder layer's seven projections (attention q, k, v, o; MLP gate,
    # up, down): what DoRA keeps a magnitude and a copy of the output of; 0: not known (then
    # :attr:`adapted_outputs` assumes q, k, v and o of hidden_size, and an MLP DENSE_MLP_RATIO wide)
    adapted_width: int = 0
    # a mixture of experts: the routed experts' parameters (transformers keeps them as 3-D tensors,
    # not linear layers, so bitsandbytes leaves them unquantized under QLoRA)
    expert_params: int = 0

    @property
    def flops_params(self) -> int:
        """The parameters whose products one token computes: the active ones."""
        return self.params if self.active_params is None else self.active_params

    @property
    def adapted_outputs(self) -> int:
        """:attr:`adapted_width`, or its estimate from the hidden size."""
        return self.adapted_width or int((5 + 2 * DENSE_MLP_RATIO) * self.hidden_size)


def shape_from_config(conf: dict[str, Any]) -> ModelShape:
    """The plan's model shape from a (text) model config as a dict.

    A mixture of experts (a config naming routed experts) is counted as its model class builds it
    (:func:`.params.count_params`: all experts' weights, and the active ones a token uses). A dense
    model keeps the plan's first approximation, on which its memory model was calibrated: per layer
    4 h^2 of attention and a gated MLP, plus an input embedding and an LM head (counted twice
    even when tied: an over-count of vocab x hidden for tied models, on the safe side).

    >>> moe = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
    ...     "vocab_size": 32000, "intermediate_size": 14336, "num_local_experts": 8,
    ...     "num_experts_per_tok": 2, "num_attention_heads": 32, "num_key_value_heads": 8}
    >>> s = shape_from_config(moe)
    >>> round(s.params / 1e9, 1), round(s.flops_params / 1e9, 1), s.experts_per_token, s.moe_layers
    (46.7, 12.9, 2, 32)
    """
    adapted = _adapted_width(conf)
    if num_experts(conf):
        count = count_params(conf)
        if count.moe:
            return ModelShape(
                params=count.total,
                hidden_size=int(conf.get("hidden_size") or 0),
                num_layers=int(conf.get("num_hidden_layers") or 0),
                vocab_size=int(conf.get("vocab_size") or 0),
                active_params=count.active,
                experts_per_token=count.experts_per_token,
                moe_layers=count.moe_layers,
                num_experts=count.num_experts,
                routed_width=count.routed_width,
                adapted_width=adapted,
                expert_params=count.experts,
            )
    hidden = int(conf.get("hidden_size") or 0)
    layers = int(conf.get("num_hidden_layers") or 0)
    vocab = int(conf.get("vocab_size") or 0)
    inter = int(conf.get("intermediate_size") or 4 * hidden)
    # Attention (4 h^2) + gated MLP (3 h i) per layer, plus embeddings: close enough for a plan.
    params = layers * (4 * hidden * hidden + 3 * hidden * inter) + 2 * vocab * hidden
    return ModelShape(
        params=params, hidden_size=hidden, num_layers=layers, vocab_size=vocab, adapted_width=adapted
    )


def _adapted_width(conf: dict[str, Any]) -> int:
    """The output features of a layer's q, k, v, o, gate, up and down projections (0: no hidden size).

    >>> _adapted_width({"hidden_size": 2560, "num_attention_heads": 32, "num_key_value_heads": 8,
    ...     "head_dim": 128, "intermediate_size": 9728})  # Qwen3-4B: 4096 + 2 x 1024 + 2560 + 2 x 9728 + 2560
    30720
    """
    hidden = int(conf.get("hidden_size") or 0)
    if not hidden:
        return 0
    heads = int(conf.get("num_attention_heads") or 1)
    head_dim = int(conf.get("head_dim") or hidden // heads)
    kv_heads = int(conf.get("num_key_value_heads") or heads)
    inter = int(conf.get("intermediate_size") or DENSE_MLP_RATIO * hidden)
    return heads * head_dim + 2 * kv_heads * head_dim + hidden + 2 * inter + hidden


@dataclass
class Plan:
    precision: str  # bf16 | fp16 | fp32: what the run actually uses
    liger: bool
    gradient_checkpointing: bool
    packing: bool
    padding_free: bool
    attn_implementation: str
    per_device_batch_size: int
    gradient_accumulation_steps: int
    torch_compile: bool
    device: str
    world_size: int
    reasons: dict[str, str] = field(default_factory=dict)
    # none (one process) | ddp (a full replica per GPU) | fsdp2 (parameters, gradients and optimizer
    # state sharded across the GPUs)
    sharding: str = "none"

    lora: bool = True
    # processes that collate the next micro-steps while the GPU trains (0: the training process does)
    dataloader_workers: int = 0
    # Liger's fused linear cross-entropy computes the logits chunk by chunk, at most this many times
    # (tokens x hidden) elements at once (its chunk_mem_const; 1 = Liger's default, the leanest)
    loss_chunk_factor: int = 1
    # off | tensorwise: the decoder layers' large linear layers compute in float8 (torchao's
    # tensorwise recipe; opt-in through KUBETUNE_FP8, full fine-tuning on a GPU with fp8 tensor cores)
    fp8: str = "off"
    # QLoRA: the frozen base's decoder layers in 4-bit NF4 (bitsandbytes), LoRA on top
    nf4: bool = False
    # DoRA: a trained magnitude per output feature of each adapted layer
    dora: bool = False

    @property
    def dtype_name(self) -> str:
        """The dtype the weights are loaded in.

        bf16 loads bf16 weights (as notebook B does). fp16 is mixed precision with a gradient
        scaler, which refuses fp16 gradients: full fine-tuning keeps fp32 master weights, while a
        LoRA base is frozen and may stay in fp16 (the adapter is fp32).
        """
        if self.precision == "fp16":
            return "float16" if self.lora else "float32"
        return {"bf16": "bfloat16", "fp32": "float32"}[self.precision]

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def estimate_training_bytes(
    shape: ModelShape,
    *,
    lora: bool,
    tokens: int,
    checkpointing: bool,
    param_bytes: int = 2,
    sharding: str = "none",
    world_size: int = 1,
    nf4: bool = False,
    dora: bool = False,
) -> int:
    """A rough upper bound of GPU memory for one micro-step, in bytes (AdamW, packed rows).

    Weights ``param_bytes`` per parameter (2 for bf16); full fine-tuning adds gradients and AdamW's
    two moments, which torch keeps in the parameters' dtype (4 x param_bytes in all). A mixture of
    experts holds all of it for every expert (``shape.params``: a token uses a few experts, the
    step's tokens use them all; LoRA's frozen base is every expert too). Activations
    per token per hidden unit per layer: ~36 bytes for full fine-tuning and ~70 for LoRA (dropout
    keeps a copy of every adapted layer's input) without checkpointing, ~2 with it; a MoE layer
    adds its routed copies (:func:`moe_activation_bytes`). Multi-GPU full
    fine-tuning adds DDP's gradient buckets, or divides the states by the GPUs under FSDP2. Calibrated on
    an H200: Qwen3-4B full with 8k-token micro-steps peaked at 56 GiB, Qwen2-0.5B LoRA r8 with
    32k-token micro-steps at 46 GiB (Liger, varlen attention, fused cross-entropy: no logits).

    LoRA's variants (:func:`adapter_method_bytes`): QLoRA (``nf4``) holds the decoder layers' weights
    in 4 bits instead of ``param_bytes``, DoRA (``dora``) adds its magnitudes and the outputs it keeps.
    """
    if nf4 or dora:
        return adapter_method_bytes(
            shape, tokens=tokens, checkpointing=checkpointing, param_bytes=param_bytes, nf4=nf4, dora=dora
        )
    weights = param_bytes * shape.params
    optimizer = 0 if lora else 3 * param_bytes * shape.params
    if not lora and sharding == "ddp":
        optimizer += param_bytes * shape.params  # DDP's gradient buckets: one more copy of the gradients
    elif not lora and sharding == "fsdp2":
        # FSDP2 keeps fp32 master weights, gradients and moments (16 bytes a parameter), sharded;
        # a layer's full bf16 weights exist only while it runs
        weights = 16 * shape.params // max(1, world_size) + 2 * shape.params // max(1, shape.num_layers)
        optimizer = 0
    full_layer = 70 if lora else 36
    routed = moe_activation_bytes(shape)
    if checkpointing:
        # each layer's input kept, and one layer's activations while its backward recomputes it
        activations = tokens * (shape.hidden_size * (2 * shape.num_layers + full_layer) + routed)
    else:
        activations = tokens * (shape.hidden_size * shape.num_layers * full_layer + shape.moe_layers * routed)
    return weights + optimizer + activations


def adapter_method_bytes(
    shape: ModelShape, *, tokens: int, checkpointing: bool, param_bytes: int = 2, nf4: bool, dora: bool
) -> int:
    """LoRA's memory (:func:`estimate_training_bytes`) with 4-bit base weights (QLoRA) and/or DoRA.

    QLoRA: the decoder layers' linear weights (all but the input embedding and the output head,
    counted as ``2 x vocab x hidden``, and a mixture of experts' routed experts, which are no linear
    layers and stay bf16) at :data:`NF4_BYTES_PER_PARAM`, one layer's of them dequantized to bf16 at
    a time; the embedding and the head stay unquantized and, prepared for k-bit training as PEFT does
    (``prepare_model_for_kbit_training``), in fp32, as are the norms: the hidden states between the
    layers are fp32 too, so each layer's input kept for the backward pass costs 4 bytes a unit, not 2.

    DoRA: a magnitude per output feature of each adapted layer (:attr:`ModelShape.adapted_outputs`,
    all seven projections: an upper bound when fewer are adapted), trained in fp32
    (:data:`TRAINED_PARAM_BYTES`); per token, two bf16 copies of each adapted layer's output
    (:data:`DORA_ACTIVATION_BYTES`), kept for every layer, or with recomputation for the one layer
    recomputed; and, while a layer runs, its widest weight and the adapter's product of that size in
    bf16 (the weight's norm). Neither is yet measured on a GPU (issue 34 item 2).

    >>> qwen3 = ModelShape(params=4_020_000_000, hidden_size=2560, num_layers=36, vocab_size=151_936,
    ...     adapted_width=30720)
    >>> lora = estimate_training_bytes(qwen3, lora=True, tokens=4096, checkpointing=True)
    >>> qlora = estimate_training_bytes(qwen3, lora=True, tokens=4096, checkpointing=True, nf4=True)
    >>> dora = estimate_training_bytes(qwen3, lora=True, tokens=4096, checkpointing=True, dora=True)
    >>> [round(b / 2**30, 2) for b in (lora, qlora, dora)]
    [8.87, 6.73, 9.45]
    """
    embeddings = 2 * shape.vocab_size * shape.hidden_size
    layers = max(0, shape.params - embeddings - shape.expert_params)
    if nf4:
        weights = int(NF4_BYTES_PER_PARAM * layers) + 4 * embeddings + 2 * shape.expert_params
        weights += 2 * layers // max(1, shape.num_layers)  # one layer dequantized while it runs
        between = 4  # fp32 hidden states between the layers
    else:
        weights, between = param_bytes * shape.params, 2
    full_layer = 70 + (between - 2)
    routed = moe_activation_bytes(shape)
    if checkpointing:
        activations = tokens * (shape.hidden_size * (between * shape.num_layers + full_layer) + routed)
    else:
        activations = tokens * (shape.hidden_size * shape.num_layers * full_layer + shape.moe_layers * routed)
    if dora:
        outputs = shape.adapted_outputs
        weights += TRAINED_PARAM_BYTES * outputs * shape.num_layers
        kept_layers = 1 if checkpointing else shape.num_layers
        activations += tokens * DORA_ACTIVATION_BYTES * outputs * kept_layers
        widest = max(shape.hidden_size, (outputs - 5 * shape.hidden_size) // 2)
        activations += 2 * 2 * shape.hidden_size * widest
    return weights + activations


def moe_activation_bytes(shape: ModelShape) -> int:
    """What a mixture-of-experts layer keeps for the backward pass per token, beyond a dense layer's
    (0 for a dense model): bf16 copies of the token's hidden state for each of its ``k`` routed
    experts (the gathered input, and the expert's output kept for its routing weight's gradient:
    2 k hidden), the intermediates of the experts it passes through (gate, up and their product)
    beyond those of the calibration's MLP (:data:`DENSE_MLP_RATIO` x hidden), and the router's fp32
    probabilities over all experts. Not yet measured on a GPU.

    >>> qwen3_30b_a3b = ModelShape(params=30_532_122_624, hidden_size=2048, num_layers=48,
    ...     vocab_size=151_936, active_params=3_353_032_704, experts_per_token=8, moe_layers=48,
    ...     num_experts=128, routed_width=6144)
    >>> moe_activation_bytes(qwen3_30b_a3b)  # 2 x (2 x 8 x 2048) + 4 x 128; 6144 < 3.8 x 2048
    66048
    """
    if not shape.moe_layers:
        return 0
    copies = 2 * shape.experts_per_token * shape.hidden_size
    wider = max(0, shape.routed_width - int(DENSE_MLP_RATIO * shape.hidden_size))
    return 2 * (copies + 3 * wider) + 4 * shape.num_experts


def estimate_step_seconds(
    shape: ModelShape, *, tokens: int, micro_steps: int, checkpointing: bool, peak_flops: float | None
) -> float:
    """The step-time model (MICRO_STEP_SECONDS, SUSTAINED_FRACTION, RECOMPUTE_COST) of one optimizer step.

    It only ranks the micro-step layouts that fit; measured on an H200: Qwen2-0.5B LoRA, 32 rows of
    1,024 tokens in 1-row micro-steps, 3.9 s a step (the model: 3.84 s); Qwen3-4B full, 8 rows
    without recomputation in 2-row micro-steps 0.45 s (0.48 s), in one with recomputation 0.50 s (0.53 s).

    >>> qwen3 = ModelShape(params=4_020_000_000, hidden_size=2560, num_layers=36, vocab_size=151_936)
    >>> round(estimate_step_seconds(qwen3, tokens=2048, micro_steps=4, checkpointing=False, peak_flops=989.4e12), 2)
    0.48
    """
    rate = SUSTAINED_FRACTION * (peak_flops or DEFAULT_PEAK_FLOPS)
    # a mixture of experts computes with the experts each token goes to: its active parameters
    compute = 6 * shape.flops_params * tokens / rate * (RECOMPUTE_COST if checkpointing else 1.0)
    return micro_steps * max(MICRO_STEP_SECONDS, compute)


# no tuning variable set: the plan decides everything
NO_TUNING = TuningConfig()


def make_plan(
    training: TrainingSpec,
    hw: Hardware,
    *,
    shape: ModelShape | None = None,
    lora: bool = True,
    tuning: TuningConfig = NO_TUNING,
    nf4: bool = False,
    dora: bool = False,
) -> Plan:
    """Decide how to train on ``hw``; pure (it reads no environment: the tuning variables come in
    ``tuning``, read once where the process starts), so that every branch is unit-tested. Each
    decision writes why into the plan's ``reasons``. ``lora``, ``nf4`` and ``dora``: the method
    (:func:`method_of`); QLoRA (``nf4``) where it cannot run raises :class:`MethodNotSupported`."""
    reasons: dict[str, str] = {}
    _method(training, hw, lora=lora, nf4=nf4, dora=dora, reasons=reasons)
    precision = _precision(training, hw, reasons)
    liger = _liger(training, hw, reasons)
    attn = _attention(training, hw, reasons)
    # fp32 weights: fp32 runs, and fp16 mixed precision of a full fine-tune (fp32 master weights)
    param_bytes = 4 if precision == "fp32" or (precision == "fp16" and not lora) else 2
    budget = int(hw.gpu_memory_bytes * MEMORY_HEADROOM) if hw.gpu_memory_bytes else None
    sharding = _sharding(
        hw, shape, lora=lora, param_bytes=param_bytes, budget=budget, forced=tuning.sharding, reasons=reasons
    )
    memory = _Memory(shape, lora, param_bytes, sharding, hw.world_size, budget, nf4=nf4, dora=dora)
    batch, accumulation, planned_recompute = _micro_steps(training, hw, memory, reasons)
    tokens = batch * training.max_length
    checkpointing = _checkpointing(training, hw, memory, tokens, planned_recompute, reasons)
    torch_compile = _compile(training, hw, attn, reasons, nf4=nf4)
    loss_chunk_factor = _loss_chunks(liger, memory, tokens, checkpointing, reasons)
    workers = _workers(tuning, hw, reasons)
    fp8 = _fp8(
        hw, shape, lora=lora, precision=precision, compiled=torch_compile, asked=tuning.fp8, reasons=reasons
    )
    return Plan(
        precision=precision,
        liger=liger,
        gradient_checkpointing=checkpointing,
        packing=bool(training.packing),
        padding_free=bool(training.packing),
        attn_implementation=attn,
        per_device_batch_size=batch,
        gradient_accumulation_steps=accumulation,
        torch_compile=torch_compile,
        device="cuda" if hw.cuda else "cpu",
        world_size=hw.world_size,
        reasons=reasons,
        lora=lora,
        sharding=sharding,
        dataloader_workers=workers,
        loss_chunk_factor=loss_chunk_factor,
        fp8=fp8,
        nf4=nf4,
        dora=dora,
    )


class MethodNotSupported(ValueError):  # noqa: N818  a refusal of the spec, named as the others
    """The spec's method cannot run on this hardware (QLoRA without a GPU of compute capability 8.0+)."""


class MethodArgs(TypedDict, total=False):
    """:func:`make_plan`'s method arguments."""

    lora: bool
    nf4: bool
    dora: bool


def training_of(spec: Any) -> TrainingSpec:
    """spec.training as the plan reads it: for preference pairs (objective dpo or orpo) without packing,
    Liger or compiled layers, which are SFT's (TRL's preference trainers pad the pairs and take both
    answers' logits from the model's own head). The memory of the pair's second sequence and of DPO's
    frozen reference (full fine-tuning) is not yet counted."""
    training: TrainingSpec = spec.training
    if str(getattr(spec, "objective", "sft")) == "sft":
        return training
    return training.model_copy(update={"packing": False, "liger": False, "torch_compile": Toggle.NEVER})


def method_of(spec: Any) -> MethodArgs:
    """:func:`make_plan`'s method arguments for a FineTuneJob spec: LoRA or full, QLoRA, DoRA."""
    lora = str(spec.method) == "lora"
    adapter = spec.lora_settings() if lora else None
    return {
        "lora": lora,
        "nf4": adapter is not None and str(adapter.quantization) == "nf4",
        "dora": adapter is not None and bool(adapter.dora),
    }


def qlora_refusal(*, cuda: bool, capability: tuple[int, int] | None, where: str) -> str | None:
    """Why QLoRA cannot run on ``where`` (None: it can; an unknown capability is not refused here).

    >>> qlora_refusal(cuda=True, capability=(7, 5), where="Tesla-T4")[:70]
    'spec.lora.quantization nf4 (QLoRA) cannot run on Tesla-T4: compute cap'
    >>> qlora_refusal(cuda=True, capability=(9, 0), where="this GPU") is None
    True
    """
    if not cuda:
        return (
            f"spec.lora.quantization nf4 (QLoRA) cannot run on {where}: it has no GPU, and bitsandbytes' 4-bit "
            "layers train on NVIDIA GPUs only; run it on a GPU, or set quantization: none"
        )
    if capability is not None and tuple(capability) < QLORA_MIN_CAPABILITY:
        major, minor = capability
        need = ".".join(map(str, QLORA_MIN_CAPABILITY))
        return (
            f"spec.lora.quantization nf4 (QLoRA) cannot run on {where}: compute capability {major}.{minor}, "
            f"and QLoRA's bf16 compute needs {need} or newer (Ampere: A10, A100, L4, L40S, H100, ...); "
            "choose such a GPU (spec.resources.gpuProduct), or set quantization: none"
        )
    return None


def _method(
    training: TrainingSpec, hw: Hardware, *, lora: bool, nf4: bool, dora: bool, reasons: dict[str, str]
) -> None:
    """LoRA, QLoRA (refused where it cannot run), DoRA, rsLoRA: what the memory model counts."""
    if not lora:
        reasons["method"] = "full fine-tuning: every weight trained"
        return
    if nf4:
        refused = qlora_refusal(cuda=hw.cuda, capability=hw.capability, where=hw.name or "this machine")
        if refused is None and str(training.precision) != Precision.BF16:
            refused = (
                "spec.lora.quantization nf4 (QLoRA) computes in bf16: spec.training.precision must be bf16"
            )
        if refused is not None:
            raise MethodNotSupported(refused)
    what = "QLoRA: LoRA on 4-bit NF4 base weights (double quantization, bf16 compute)" if nf4 else "LoRA"
    if dora:
        what += ", with DoRA's magnitudes (more memory and time a step)"
    reasons["method"] = what


def _precision(training: TrainingSpec, hw: Hardware, reasons: dict[str, str]) -> str:
    """What was asked, unless the hardware cannot do it."""
    precision = str(training.precision)
    if precision == Precision.BF16 and not hw.bf16:
        reasons["precision"] = (
            "bf16 asked, but this CPU has no native bf16 (AVX512-BF16/AMX): fp32"
            if not hw.cuda
            else "bf16 asked, but this GPU does not support it: fp32"
        )
        return "fp32"
    if precision == Precision.FP16 and not hw.cuda:
        reasons["precision"] = "fp16 mixed precision needs a GPU: fp32"
        return "fp32"
    reasons["precision"] = f"{precision} as asked"
    return precision


def _liger(training: TrainingSpec, hw: Hardware, reasons: dict[str, str]) -> bool:
    """Liger's kernels are Triton kernels: CUDA only."""
    liger = bool(training.liger and hw.cuda)
    if training.liger and not hw.cuda:
        reasons["liger"] = "Liger kernels are Triton (CUDA) kernels: off on CPU"
    else:
        reasons["liger"] = "on" if liger else "off as asked"
    return liger


def _attention(training: TrainingSpec, hw: Hardware, reasons: dict[str, str]) -> str:
    """The attention implementation. Packing, padding-free: sequences are concatenated with
    position_ids restarting at 0 and no attention mask. FlashAttention-2's varlen kernel uses the
    boundaries directly; kubetune_varlen too (on the CPU: SDPA over runs of whole examples); SDPA
    and eager get a block-diagonal causal mask that transformers builds from the position_ids over
    the whole batch. Either way no token attends across examples."""
    packing = bool(training.packing)
    if packing and hw.cuda and hw.varlen:
        reasons["packing"] = "padding-free packing, PyTorch varlen FlashAttention (kubetune_varlen)"
        return VARLEN
    if packing and not hw.cuda:
        reasons["packing"] = (
            "padding-free packing, SDPA over runs of whole examples (kubetune_varlen on the CPU: "
            "no attention to other examples computed)"
        )
        return VARLEN
    if packing and hw.flash_attn:
        reasons["packing"] = "padding-free packing, FlashAttention-2 varlen kernel"
        return "flash_attention_2"
    reasons["packing"] = (
        "padding-free packing with SDPA and a block-diagonal mask from position_ids "
        "(no varlen kernel here: exact, but slower than FlashAttention)"
        if packing
        else "off as asked: padded batches"
    )
    return "sdpa"


@dataclass(frozen=True)
class _Memory:
    """What the memory estimate of a micro-step needs; ``budget`` None: no estimate (no GPU size)."""

    shape: ModelShape | None
    lora: bool
    param_bytes: int
    sharding: str
    world_size: int
    budget: int | None
    nf4: bool = False
    dora: bool = False

    @property
    def known(self) -> bool:
        return self.shape is not None and self.budget is not None

    def need(self, tokens: int, recompute: bool) -> int:
        assert self.shape is not None
        return estimate_training_bytes(
            self.shape,
            lora=self.lora,
            tokens=tokens,
            checkpointing=recompute,
            param_bytes=self.param_bytes,
            sharding=self.sharding,
            world_size=self.world_size,
            nf4=self.nf4,
            dora=self.dora,
        )

    def fits(self, tokens: int, recompute: bool) -> bool:
        assert self.budget is not None
        return self.need(tokens, recompute) <= self.budget


def _micro_steps(
    training: TrainingSpec, hw: Hardware, memory: _Memory, reasons: dict[str, str]
) -> tuple[int, int, bool | None]:
    """(rows per micro-step, micro-steps per optimizer step, recomputation if the memory plan chose it).

    An optimizer step keeps the rows the spec asks for (batchSize x gradientAccumulationSteps per
    GPU, each up to maxLength tokens: with packing a row holds one or more whole sequences, as in
    TRL). With packing on a GPU the plan regroups them into as few micro-steps as memory allows
    without recomputation: big micro-steps keep the GPU busy, and the optimizer still sees the same
    rows per step."""
    rows_per_step = training.batch_size * training.gradient_accumulation_steps
    if training.packing and training.tokens_per_step:
        batch = max(1, training.tokens_per_step // training.max_length)
        accumulation = max(1, -(-rows_per_step // batch))
        reasons["batch"] = (
            f"tokensPerStep {training.tokens_per_step} / maxLength {training.max_length} = {batch} packed rows "
            f"x {accumulation} micro-steps"
        )
        return batch, accumulation, None
    toggle = str(training.gradient_checkpointing)
    if training.packing and hw.cuda and memory.known and toggle != Toggle.ALWAYS:
        planned = _memory_plan(training, hw, memory, reasons)
        if planned is not None:
            return planned
    return training.batch_size, training.gradient_accumulation_steps, None


def _memory_plan(
    training: TrainingSpec, hw: Hardware, memory: _Memory, reasons: dict[str, str]
) -> tuple[int, int, bool] | None:
    """Every layout of the step's rows into equal micro-steps that fits, without recomputation and
    (auto) with it; the one the step-time model makes fastest. The whole step in one micro-step
    without recomputation, where it fits, is always that one. None: nothing fits and recomputation
    is not the plan's to choose."""
    assert memory.shape is not None and memory.budget is not None
    shape, length = memory.shape, training.max_length
    rows_per_step = training.batch_size * training.gradient_accumulation_steps
    auto = str(training.gradient_checkpointing) == Toggle.AUTO
    divisors = [r for r in range(rows_per_step, 0, -1) if rows_per_step % r == 0]
    options = [(r, False) for r in divisors if memory.fits(r * length, recompute=False)]
    if auto:
        options += [(r, True) for r in divisors if memory.fits(r * length, recompute=True)]

    def seconds(option: tuple[int, bool]) -> float:
        rows, recompute = option
        return estimate_step_seconds(
            shape,
            tokens=rows * length,
            micro_steps=rows_per_step // rows,
            checkpointing=recompute,
            peak_flops=hw.peak_flops,
        )

    step = (
        f"(= batchSize {training.batch_size} x gradientAccumulationSteps "
        f"{training.gradient_accumulation_steps} packed rows per step) in a {memory.budget / 2**30:.0f} GiB budget"
    )
    if not options:
        if not auto:
            return None
        reasons["batch"] = (
            f"memory plan: not even 1 packed row of {length} tokens fits by the estimate "
            f"(~{memory.need(length, True) / 2**30:.1f} GiB) "
            f"{step}: 1 row x {rows_per_step} micro-steps with recomputation, the leanest layout"
        )
        return 1, rows_per_step, True
    # ties: no recomputation, then the bigger micro-step
    best = min(options, key=lambda o: (round(seconds(o), 4), o[1], -o[0]))
    batch, recompute = best
    reasons["batch"] = (
        f"memory plan: {batch} packed rows of {length} tokens x {rows_per_step // batch} micro-steps "
        f"{'with' if recompute else 'without'} recomputation {step}"
    )
    if len(options) > 1:
        runner_up = min((o for o in options if o != best), key=seconds)
        reasons["batch"] += (
            f"; estimated {seconds(best):.2f} s a step against {seconds(runner_up):.2f} s for "
            f"{runner_up[0]} rows x {rows_per_step // runner_up[0]} "
            f"{'with' if runner_up[1] else 'without'} recomputation"
        )
    return batch, rows_per_step // batch, recompute


def _checkpointing(
    training: TrainingSpec,
    hw: Hardware,
    memory: _Memory,
    tokens: int,
    planned: bool | None,
    reasons: dict[str, str],
) -> bool:
    """Gradient checkpointing: always/never as asked; auto only when the estimate does not fit."""
    toggle = str(training.gradient_checkpointing)
    if toggle == Toggle.ALWAYS:
        checkpointing, why = True, "always, as asked"
    elif toggle == Toggle.NEVER:
        checkpointing, why = False, "never, as asked"
    elif not hw.cuda:
        checkpointing, why = False, "auto on CPU: off (memory is not the limit, time is)"
    elif not memory.known:
        checkpointing, why = True, "auto without a memory estimate: on (safe)"
    elif planned is not None:
        checkpointing, why = planned, f"auto: {'on' if planned else 'off'}, by the memory plan"
    else:
        assert memory.budget is not None
        without = memory.need(tokens, False)
        checkpointing = without > memory.budget
        why = (
            f"auto: ~{without / 2**30:.1f} GiB needed without it vs {memory.budget / 2**30:.1f} GiB budget: "
            + ("on" if checkpointing else "off")
        )
    reasons["gradient_checkpointing"] = why
    return checkpointing


def _compile(
    training: TrainingSpec, hw: Hardware, attn: str, reasons: dict[str, str], *, nf4: bool = False
) -> bool:
    """torch.compile, per decoder layer (kubetune_trainer.training.fast.compile_layers): inductor fuses the
    norms, rotary embedding, SwiGLU, residual adds and LoRA adapters that otherwise run as many
    small kernels. Auto: on a GPU with the varlen kernel and no recomputation (the pair measured)."""
    toggle = str(training.torch_compile)
    if toggle == Toggle.ALWAYS:
        compiled, why = True, "always, as asked: decoder layers compiled"
    elif toggle == Toggle.NEVER:
        compiled, why = False, "never, as asked"
    elif not hw.cuda:
        compiled, why = False, "auto on CPU: off (compilation would outlast the run)"
    elif attn != VARLEN:
        compiled, why = False, "auto: off (measured only with the varlen kernel)"
    elif nf4:
        compiled, why = False, "auto: off (not yet measured with bitsandbytes' 4-bit layers)"
    else:
        # with recomputation too: measured working on an H200 (Qwen2-0.5B LoRA held to 3.6 GiB,
        # Qwen3-4B full at 32.7 and 48 GiB; docs/benchmarks-history.md), where its fused element-wise
        # kernels run twice; not yet timed side by side against uncompiled recomputation
        compiled, why = True, "auto: decoder layers compiled (GPU, varlen attention)"
    reasons["torch_compile"] = why
    return compiled


def _loss_chunks(
    liger: bool, memory: _Memory, tokens: int, checkpointing: bool, reasons: dict[str, str]
) -> int:
    """The fused loss head's chunks: ~1 GiB of logits at a time instead of Liger's tokens x hidden."""
    shape, budget = memory.shape, memory.budget
    if not (liger and shape is not None and shape.hidden_size and budget is not None):
        return 1
    # within what the micro-step leaves of the budget: a chunk of n elements can take ~4n bytes
    # (bf16, rounded up to a power of two of rows); MIN_LOSS_CHUNK_ELEMENTS at the least, so
    # that a squeezed plan does not split its LM head into dozens of thin products
    spare = budget - memory.need(tokens, checkpointing)
    elements = min(LOSS_CHUNK_ELEMENTS, max(MIN_LOSS_CHUNK_ELEMENTS, spare // 4))
    factor = max(1, elements // (tokens * shape.hidden_size))
    reasons["loss_chunks"] = (
        f"fused linear cross-entropy holds up to {factor} x tokens x hidden logits at once "
        f"(~{min(factor * tokens * shape.hidden_size, LOSS_CHUNK_ELEMENTS) * 2 / 2**30:.1f} GiB): "
        "few large matrix products instead of dozens of small ones"
    )
    return factor


def _workers(tuning: TuningConfig, hw: Hardware, reasons: dict[str, str]) -> int:
    """Data loading: on a GPU the collation of the next micro-step (packing, position ids, pinning)
    runs in worker processes, so it overlaps training instead of leaving the GPU idle between steps."""
    if tuning.dataloader_workers is not None:
        reasons["dataloader"] = f"{tuning.dataloader_workers} worker processes, from {DATALOADER_WORKERS_ENV}"
        return tuning.dataloader_workers
    if hw.cuda:
        reasons["dataloader"] = (
            f"{DATALOADER_WORKERS} worker processes prepare the next micro-steps while the GPU trains"
        )
        return DATALOADER_WORKERS
    reasons["dataloader"] = "CPU: batches collated in the training process"
    return 0


# float8 pays only for large products: a linear layer with fewer features than this on either side
# stays bf16 (its casts and scales cost about what the faster product saves: torchao's H100 tables)
FP8_MIN_FEATURES = 2048


def _fp8(
    hw: Hardware,
    shape: ModelShape | None,
    *,
    lora: bool,
    precision: str,
    compiled: bool,
    asked: str,
    reasons: dict[str, str],
) -> str:
    """The float8 recipe for the decoder layers' matrix products: off unless ``KUBETUNE_FP8`` asks.

    Off by default: float8 rounds each product's inputs to 3 mantissa bits and its gradients to 2
    (e4m3 and e5m2, one dynamic scale per tensor), a numerical change a user opts into. Measured on
    an H200, side by side (docs/benchmarks-history.md): Qwen3-4B full 22.2k tokens/s and 50 GiB against
    bf16's 20.5k and 56 GiB; torchao's rowwise recipe ran at 4.7k and is not offered.

    Only where it can pay: full fine-tuning (a LoRA base is frozen and its adapters' products are
    small), a GPU with fp8 tensor cores and torchao, bf16 weights, compiled layers (uncompiled, the
    scaling and casting kernels cost more than the products save), and layers of at least
    ``FP8_MIN_FEATURES`` features (smaller ones would all stay bf16). Multi-GPU runs (DDP, FSDP2)
    are allowed but not yet measured.
    """
    why_not = None
    if asked == "off":
        reasons["fp8"] = f"off ({FP8_ENV} unset or off)"
        return "off"
    if lora:
        why_not = "LoRA trains small adapters on a frozen base"
    elif not hw.fp8:
        why_not = "it needs a GPU with fp8 tensor cores (compute capability 8.9+) and torchao"
    elif precision != "bf16":
        why_not = f"it needs bf16 weights, the run is {precision}"
    elif not compiled:
        why_not = "it needs compiled decoder layers (torchCompile)"
    elif shape is None or shape.hidden_size < FP8_MIN_FEATURES:
        size = "unknown" if shape is None else str(shape.hidden_size)
        why_not = f"the model's hidden size ({size}) is below {FP8_MIN_FEATURES}, where float8 does not pay"
    if why_not:
        reasons["fp8"] = f"{FP8_ENV}={asked} asked, but {why_not}: off"
        return "off"
    reasons["fp8"] = (
        f"{asked} float8 matrix products in the decoder layers (torchao), from {FP8_ENV}; "
        "the LM head, norms, attention and optimizer stay bf16"
    )
    return asked


def _sharding(  # noqa: PLR0911  one return per rule, in the order they apply
    hw: Hardware,
    shape: ModelShape | None,
    *,
    lora: bool,
    param_bytes: int,
    budget: int | None,
    forced: str | None,
    reasons: dict[str, str],
) -> str:
    """How several processes share the work: DDP replicas, or FSDP2 shards for what does not fit.

    LoRA: DDP (the trainable adapter is tiny; every GPU keeps the frozen base). Full fine-tuning:
    DDP while a whole replica (weights, gradients, AdamW moments, DDP's buckets) and a one-sequence
    micro-step fit the GPU: one gradient all-reduce per step, overlapped with the backward pass;
    otherwise FSDP2, which shards the states across the GPUs at the cost of gathering each layer's
    weights in the forward and backward passes. ``KUBETUNE_SHARDING=ddp|fsdp2`` overrides (benchmarks).
    """
    if hw.world_size <= 1:
        reasons["sharding"] = "one process: none"
        return "none"
    if forced is not None and (hw.cuda or forced == "ddp"):
        reasons["sharding"] = f"{forced}, from {SHARDING_ENV}"
        return forced
    if lora:
        reasons["sharding"] = f"LoRA on {hw.world_size} processes: DDP (the frozen base is replicated)"
        return "ddp"
    if not hw.cuda:
        # accelerate shards with FSDP on GPUs only; on CPUs it runs DDP whatever it is asked
        reasons["sharding"] = f"full fine-tuning on {hw.world_size} CPU processes: DDP (FSDP needs GPUs)"
        return "ddp"
    if shape is None or budget is None:
        reasons["sharding"] = (
            f"full fine-tuning on {hw.world_size} processes, no memory estimate: FSDP2 (safe)"
        )
        return "fsdp2"
    replica = estimate_training_bytes(
        shape, lora=False, tokens=1024, checkpointing=True, param_bytes=param_bytes, sharding="ddp"
    )
    if replica <= budget:
        reasons["sharding"] = (
            f"full fine-tuning: a replica needs ~{replica / 2**30:.0f} GiB of {budget / 2**30:.0f} GiB: DDP"
        )
        return "ddp"
    reasons["sharding"] = (
        f"full fine-tuning: a replica needs ~{replica / 2**30:.0f} GiB, more than {budget / 2**30:.0f} GiB: "
        f"FSDP2 across {hw.world_size} processes"
    )
    return "fsdp2"
