"""The fast path of the trainer on a GPU: Liger's fused kernels and a loss with no host syncs.

TRL 1.16's ``use_liger_kernel`` applies Liger's layer kernels but computes the loss with TRL's own
chunked LM head, and its ``compute_loss`` reads entropy, accuracy and token counts back to the
host (``.item()``) on every micro-step, which stalls the GPU queue. kubetune instead:

* applies Liger to the model instance itself: RMSNorm, RoPE, SwiGLU and the **fused linear
  cross-entropy** (the logits are never materialized: for a 152k vocabulary that is the largest
  activation of a small model);
* computes the loss as the model's own (Liger) loss, normalised by the tokens of the whole
  optimizer step (``num_items_in_batch``), and leaves every metric on the device until a logging
  step reads it.

The result is the same loss (checked by :func:`check_packing_exact` and the benchmark); only the
per-micro-step entropy/accuracy logs of TRL are gone (the plan logs that).
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .. import settings
from ..plan.plan import FP8_MIN_FEATURES
from . import flce

log = logging.getLogger("kubetune_trainer.fast")


def apply_liger(model: Any, *, layer_kernels: bool = True) -> bool:
    """Liger kernels (fused linear cross-entropy included) on this model instance; False if unsupported.

    ``layer_kernels=False`` keeps only the fused linear cross-entropy: when the decoder layers are
    compiled, inductor fuses RMSNorm, RoPE and SwiGLU itself (and cannot trace Liger's Triton
    kernels), while the loss head stays Liger's, outside the compiled layers.
    """
    from liger_kernel.transformers.monkey_patch import (
        MODEL_TYPE_TO_APPLY_LIGER_FN,
        _apply_liger_kernel_to_instance,
    )

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    model_type = getattr(base.config, "model_type", None)
    if model_type not in MODEL_TYPE_TO_APPLY_LIGER_FN:
        log.warning("Liger has no kernels for model type %s: training without them", model_type)
        return False
    _apply_liger_kernel_to_instance(
        model=base,
        rope=layer_kernels,
        rms_norm=layer_kernels,
        swiglu=layer_kernels,
        fused_linear_cross_entropy=True,
        cross_entropy=False,
    )
    # the loss head without Liger's two host syncs per micro-step (same kernel, same result)
    flce.install()
    return True


def decoder_layers(model: Any) -> list[Any]:
    """The repeated transformer blocks of a causal LM (PEFT-wrapped or not); [] if not found."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def compile_layers(model: Any, *, backend: str = "inductor") -> int:
    """``torch.compile`` each decoder layer in place (regional compilation); the number compiled.

    Every layer runs the same code, so dynamo traces one graph and reuses it for all of them (the
    layers' weights are graph inputs); ``dynamic=True`` keeps one graph across the varying token
    counts of packed micro-steps instead of recompiling per shape. The embedding, the final norm
    and the fused loss head stay eager.

    With frozen embeddings (LoRA) the first layer's input would need no gradient while every
    other layer's does: a second graph, compiled forward and backward, for one layer. The
    embeddings' output is marked as needing a gradient instead (one extra input-gradient product in
    the first layer's backward), so one graph serves all layers and the compilation is paid once.

    Python floats are compiled as constants. Under ``dynamic=True`` dynamo otherwise turns every
    float attribute of a layer (RMSNorm's epsilon, attention scaling, dropout probabilities, each
    LoRA adapter's scaling: 18 in a Qwen2 LoRA layer) into a 0-dim float64 CPU tensor input, and
    inductor then builds a C++ kernel on the host to convert it (measured on the H200: ~10 s of C++
    compilation in the first step). The values are the same in every layer, so one graph still
    serves them all.
    """
    layers = decoder_layers(model)
    if layers:
        import torch._dynamo.config as dynamo_config

        dynamo_config.specialize_float = True
    if layers and backend == "inductor":
        size_compile_workers()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    embeddings = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
    if layers and embeddings is not None and not any(p.requires_grad for p in embeddings.parameters()):
        embeddings.register_forward_hook(_require_grad)
    for layer in layers:
        layer.compile(dynamic=True, backend=backend)
    return len(layers)


def fp8_filter(module: Any, fqn: str) -> bool:
    """Which of a decoder layer's linear layers :func:`apply_fp8` converts: both dimensions multiples of
    16 (float8 products need them) and at least ``FP8_MIN_FEATURES``.

    >>> import torch
    >>> fp8_filter(torch.nn.Linear(2560, 9728), "mlp.up_proj"), fp8_filter(torch.nn.Linear(2560, 1024), "self_attn.k_proj")
    (True, False)
    """
    return all(n % 16 == 0 and n >= FP8_MIN_FEATURES for n in (module.in_features, module.out_features))


def apply_fp8(model: Any, recipe: str) -> int:
    """Swap the linear layers of the decoder layers (the ones :func:`compile_layers` compiles) for
    torchao's ``Float8Linear`` (``recipe``: tensorwise); the number swapped. The LM head, the
    embeddings and anything outside the layers stay as they are. The weights stay the same bf16
    parameters (the optimizer and checkpoints see no difference); each product casts its inputs to
    float8 with dynamic scales, in the forward and in both products of the backward. Call before the
    layers are compiled: inductor fuses the casts.
    """
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    config = Float8LinearConfig.from_recipe_name(recipe)
    layers = decoder_layers(model)
    for layer in layers:
        convert_to_float8_training(layer, module_filter_fn=fp8_filter, config=config)
    linear = [m for layer in layers for m in layer.modules() if isinstance(m, torch.nn.Linear)]
    swapped = sum(isinstance(m, Float8Linear) for m in linear)
    log.info("float8 (%s): %d of the decoder layers' %d linear layers", recipe, swapped, len(linear))
    return swapped


def compile_workers(local_processes: int, *, cpus: int) -> int:
    """Inductor compile workers for each of ``local_processes`` trainer processes sharing ``cpus``.

    >>> compile_workers(1, cpus=16), compile_workers(8, cpus=32), compile_workers(8, cpus=4), compile_workers(1, cpus=128)
    (16, 4, 1, 32)
    """
    return max(1, min(32, cpus // max(1, local_processes)))


def size_compile_workers() -> int:
    """Set inductor's compile-worker count from the pod's CPU request; the count.

    Inductor's default is min(32, the node's CPUs) for every process, each worker ~0.4 GB of host
    memory (measured: 0.37 GB each plus a 0.6 GB sidecar per process): eight ranks on a large node
    would start 256 workers, ~100 GB, whatever the pod asked for. kubetune shares the requested
    CPUs among the ranks of the node. ``TORCHINDUCTOR_COMPILE_THREADS`` wins; without a request
    (``KUBETUNE_CPUS`` unset) the node's CPUs are shared the same way.
    """
    import torch._inductor.config as inductor_config

    env = settings.current()
    if not env.compile_threads_set:
        cpus = env.cpus_requested or len(os.sched_getaffinity(0))
        inductor_config.compile_threads = compile_workers(env.local_world_size, cpus=cpus)
    workers = int(inductor_config.compile_threads or 1)
    log.info("torch.compile: %d compile workers", workers)
    return workers


def _require_grad(module: Any, args: Any, output: Any) -> Any:
    if module.training and not output.requires_grad:
        output.requires_grad_(True)
    return output


def fast_trainer_class(base: Any = None, *, max_length: int | None = None, loss_chunk_factor: int = 1) -> Any:
    """``base`` (TRL's SFTTrainer by default) with the model's own fused loss and no per-micro-step host syncs.

    ``max_length``: the length cap handed to the varlen kernel instead of each micro-step's longest
    example (for compiled layers). ``loss_chunk_factor``: Liger's ``chunk_mem_const`` for the fused
    linear cross-entropy (how many times tokens x hidden logits it may hold at once).
    """
    if base is None:
        from trl import SFTTrainer

        base = SFTTrainer

    class FastSFTTrainer(base):
        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            inputs = dict(inputs)
            inputs["use_cache"] = False
            if max_length is not None and "max_length_q" in inputs:
                # The longest example of a packed micro-step only sizes the varlen kernel's grid: the
                # length cap is as correct, and a constant keeps the compiled layers from specializing.
                inputs["max_length_q"] = inputs["max_length_k"] = max_length
            if "labels" in inputs:
                # Liger's fused linear cross-entropy: loss without logits, in training and evaluation alike
                inputs["skip_logits"] = True
                if loss_chunk_factor > 1:
                    inputs["chunk_mem_const"] = loss_chunk_factor
            if num_items_in_batch is not None:
                inputs["num_items_in_batch"] = num_items_in_batch
            outputs = model(**inputs)
            loss = outputs["loss"] if isinstance(outputs, dict) else outputs[0]
            if self.args.average_tokens_across_devices and num_items_in_batch is not None and model.training:
                # num_items_in_batch counts every rank's tokens; DDP averages gradients across ranks
                loss = loss * self.accelerator.num_processes
            return (loss, outputs) if return_outputs else loss

    return FastSFTTrainer


def check_packing_exact(model: Any, sequences: list[list[int]], *, device: str = "cuda") -> dict[str, float]:
    """Loss of the same sequences padded (SDPA, plain cross-entropy) and packed (kubetune's path).

    The packed loss comes from the model as kubetune trains it (varlen attention, Liger fused
    linear cross-entropy when applied); the padded one from the same weights with SDPA and a
    padding mask. They must agree to within bf16 rounding.
    """
    import torch
    import torch.nn.functional as F

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    was_training = base.training
    base.eval()
    lengths = [len(s) for s in sequences]
    longest = max(lengths)
    with torch.no_grad():
        # packed: one row, positions restart at each example, labels of the first token of each example ignored
        ids = torch.tensor([t for s in sequences for t in s], device=device)[None]
        pos = torch.cat([torch.arange(n, device=device) for n in lengths])[None]
        labels = ids.clone()
        starts = torch.tensor([0, *list(torch.tensor(lengths).cumsum(0)[:-1].tolist())], device=device)
        labels[0, starts] = -100
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        fused = "lce_forward" in getattr(base.forward, "__name__", "")
        packed = base(
            input_ids=ids,
            position_ids=pos,
            labels=labels,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=longest,
            max_length_k=longest,
            **({"skip_logits": True} if fused else {}),
        ).loss
        # padded, with SDPA and the plain loss: the reference
        previous = base.config._attn_implementation
        base.set_attn_implementation("sdpa")
        try:
            batch = torch.zeros(len(sequences), longest, dtype=torch.long, device=device)
            mask = torch.zeros_like(batch)
            for i, s in enumerate(sequences):
                batch[i, : len(s)] = torch.tensor(s, device=device)
                mask[i, : len(s)] = 1
            hidden = base.model(input_ids=batch, attention_mask=mask).last_hidden_state
            logits = base.lm_head(hidden).float()
            target = batch.masked_fill(mask == 0, -100)
            padded = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.size(-1)), target[:, 1:].reshape(-1), ignore_index=-100
            )
        finally:
            base.set_attn_implementation(previous)
    base.train(was_training)
    p, q = float(packed), float(padded)
    return {"packed_loss": p, "padded_loss": q, "relative_difference": abs(p - q) / max(abs(q), 1e-12)}
