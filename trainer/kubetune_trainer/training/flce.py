"""Fused linear cross-entropy with no host syncs: the loss head of kubetune's fast path.

Liger's fused linear cross-entropy never materializes the logits of the whole micro-step: it
computes them chunk by chunk and turns each chunk into its gradient in place. Liger 0.8.5 also
waits for the GPU twice per micro-step:

* the forward reads the count of non-ignored labels back to the host (``.item()``), which drains
  the GPU's queue at the end of the decoder layers' forward;
* the backward compares the incoming gradient with 1.0 (``torch.equal``), which drains it again at
  the start of the backward.

Each wait leaves the GPU idle while the host queues the next kernels (on an H200, LoRA on
Qwen2-0.5B: four waits a step, two of them these, 23 ms of host waiting in a 0.27 s profiled
step). This module keeps Liger's
cross-entropy kernel and does the rest itself: the sum reduction needs no count on the host, the
mean divides by the count as a device tensor, and the backward always scales by the incoming
gradient (a multiply that Liger also does whenever that gradient is not exactly 1, as under
gradient accumulation).

Unsupported options (class weights, z-loss, label smoothing, token scaling, accuracy outputs)
go to Liger's own function unchanged. On a CPU the chunk loop runs with a PyTorch cross-entropy
step of the same contract, which is how the tests check the loop against plain autograd.
"""

from __future__ import annotations

import math
from typing import Any

_original: Any = None


def _chunk_rows(rows: int, hidden: int, vocab: int, chunk_mem_const: int) -> int:
    """Rows per chunk: logits of at most ``chunk_mem_const`` x rows x hidden elements at once (Liger's rule)."""
    per = max(1, math.ceil(vocab / (max(1, chunk_mem_const) * hidden)))
    size = 1 << max(0, math.ceil(rows / per) - 1).bit_length()
    return max(1, min(size, rows))


def _ce_step_torch(logits: Any, target: Any, ignore_index: int, softcap: float | None) -> Any:
    """Per-row loss (fp32) of a logits chunk; the chunk is overwritten with d(sum of losses)/d(logits)."""
    import torch

    z = logits.to(torch.promote_types(logits.dtype, torch.float32))
    capped = softcap * torch.tanh(z / softcap) if softcap is not None else z
    keep = target != ignore_index
    safe = torch.where(keep, target, torch.zeros_like(target))
    lse = torch.logsumexp(capped, dim=-1)
    loss = (lse - capped.gather(1, safe[:, None]).squeeze(1)) * keep
    grad = torch.softmax(capped, dim=-1)
    grad.scatter_add_(1, safe[:, None], -torch.ones_like(grad[:, :1]))
    if softcap is not None:
        grad = grad * (1 - (capped / softcap) ** 2)
    grad = grad * keep[:, None]
    logits.copy_(grad.to(logits.dtype))
    return loss


def _ce_step_triton(logits: Any, target: Any, ignore_index: int, softcap: float | None, grads: bool) -> Any:
    """The same contract with Liger's Triton cross-entropy kernel (sum reduction: no count needed)."""
    import torch
    import triton
    from liger_kernel.ops.cross_entropy import liger_cross_entropy_kernel
    from liger_kernel.ops.fused_linear_cross_entropy import MAX_FUSED_SIZE

    rows, vocab = logits.shape
    loss = torch.zeros(rows, dtype=torch.float32, device=logits.device)
    liger_cross_entropy_kernel[(rows,)](
        X_ptr=logits,
        X_stride=logits.stride(-2),
        Y_ptr=target,
        Y_stride=target.stride(-1),
        weight_ptr=None,
        loss_ptr=loss,
        z_loss_ptr=None,
        loss_stride=loss.stride(-1),
        token_accuracy_ptr=None,
        token_accuracy_stride=0,
        predicted_tokens_ptr=None,
        predicted_tokens_stride=0,
        n_cols=vocab,
        n_non_ignore=1,
        sum_non_ignore_weight=1,
        weight_sum=0.0,
        ignore_index=ignore_index,
        lse_square_scale=0.0,
        label_smoothing=0.0,
        reduction="sum",
        softcap=softcap,
        RETURN_Z_LOSS=False,
        RETURN_TOKEN_ACCURACY=False,
        RETURN_PREDICTED_TOKENS=False,
        HAS_WEIGHT=False,
        HAS_SOFTCAPPING=softcap is not None,
        HAS_GRADIENTS=grads,
        BLOCK_SIZE=min(MAX_FUSED_SIZE, triton.next_power_of_2(vocab)),
        num_warps=32,
    )
    return loss


def _function() -> Any:
    import torch

    class SyncFreeFusedLinearCrossEntropy(torch.autograd.Function):
        @staticmethod
        def forward(
            ctx: Any,
            x: Any,
            weight: Any,
            target: Any,
            bias: Any,
            ignore_index: int,
            reduction: str,
            softcap: float | None,
            accum_dtype: Any,
            chunk_mem_const: int,
        ) -> Any:
            rows, hidden = x.shape
            vocab = weight.shape[0]
            need_x = ctx.needs_input_grad[0]
            need_w = ctx.needs_input_grad[1]
            need_b = bias is not None and ctx.needs_input_grad[3]
            grads = need_x or need_w or need_b
            grad_x = torch.zeros_like(x) if need_x else None
            grad_w = torch.zeros_like(weight, dtype=accum_dtype or weight.dtype) if need_w else None
            grad_b = torch.zeros_like(bias, dtype=accum_dtype or bias.dtype) if need_b else None
            losses = torch.zeros(rows, dtype=torch.promote_types(x.dtype, torch.float32), device=x.device)
            chunk = _chunk_rows(rows, hidden, vocab, chunk_mem_const)
            for start in range(0, rows, chunk):
                end = min(start + chunk, rows)
                x_c = x[start:end]
                logits = x_c @ weight.t()
                if bias is not None:
                    logits = logits + bias
                logits = logits.contiguous()
                t_c = target[start:end].contiguous()
                if x.is_cuda:
                    losses[start:end] = _ce_step_triton(logits, t_c, ignore_index, softcap, grads)
                else:
                    losses[start:end] = _ce_step_torch(logits, t_c, ignore_index, softcap)
                if grad_x is not None:
                    grad_x[start:end] = logits @ weight
                if grad_w is not None:
                    grad_w.addmm_(logits.t().to(grad_w.dtype), x_c.to(grad_w.dtype))
                if grad_b is not None:
                    grad_b += logits.sum(0).to(grad_b.dtype)
                # freed before the next chunk's product is allocated: one chunk alive, not two
                del logits
            loss = losses.sum()
            if reduction == "mean":
                # the count stays on the device: no wait for the GPU
                count = (target != ignore_index).sum().clamp(min=1).to(losses.dtype)
                loss = loss / count
            else:
                count = None
            ctx.save_for_backward(grad_x, grad_w, grad_b, count)
            ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
            return loss

        @staticmethod
        def backward(ctx: Any, grad_output: Any) -> Any:
            grad_x, grad_w, grad_b, count = ctx.saved_tensors
            scale = grad_output if count is None else grad_output / count
            out = [
                None if g is None else (g * scale.to(g.dtype)).to(dtype)
                for g, dtype in zip((grad_x, grad_w, grad_b), ctx.dtypes, strict=True)
            ]
            return out[0], out[1], None, out[2], None, None, None, None, None

    return SyncFreeFusedLinearCrossEntropy


_FUNCTION: Any = None


def fused_linear_cross_entropy(
    input: Any,
    weight: Any,
    target: Any,
    bias: Any = None,
    ce_weight: Any = None,
    ignore_index: int = -100,
    lse_square_scale: float = 0.0,
    label_smoothing: float = 0.0,
    reduction: str = "mean",
    softcap: float | None = None,
    return_z_loss: bool = False,
    accum_dtype: Any = None,
    use_token_scaling: bool = False,
    return_token_accuracy: bool = False,
    return_predicted_tokens: bool = False,
    chunk_mem_const: int = 1,
) -> Any:
    """Liger's ``liger_fused_linear_cross_entropy`` signature; the loss without host syncs.

    Options beyond plain (optionally soft-capped) cross-entropy with a sum or mean reduction are
    handed to Liger's own function.
    """
    global _FUNCTION
    plain = (
        ce_weight is None
        and lse_square_scale == 0.0
        and label_smoothing == 0.0
        and reduction in ("sum", "mean")
        and not return_z_loss
        and not use_token_scaling
        and not return_token_accuracy
        and not return_predicted_tokens
    )
    if not plain:
        if _original is None:
            raise ValueError("kubetune's fused cross-entropy supports only plain sum/mean cross-entropy")
        return _original(
            input,
            weight,
            target,
            bias=bias,
            ce_weight=ce_weight,
            ignore_index=ignore_index,
            lse_square_scale=lse_square_scale,
            label_smoothing=label_smoothing,
            reduction=reduction,
            softcap=softcap,
            return_z_loss=return_z_loss,
            accum_dtype=accum_dtype,
            use_token_scaling=use_token_scaling,
            return_token_accuracy=return_token_accuracy,
            return_predicted_tokens=return_predicted_tokens,
            chunk_mem_const=chunk_mem_const,
        )
    if _FUNCTION is None:
        _FUNCTION = _function()
    return _FUNCTION.apply(
        input, weight, target, bias, ignore_index, reduction, softcap, accum_dtype, chunk_mem_const
    )


def install() -> bool:
    """Make Liger's loss head (``LigerForCausalLMLoss``) use this function; idempotent. True if installed."""
    global _original
    try:
        from liger_kernel.transformers import functional
    except ImportError:
        return False
    current = functional.liger_fused_linear_cross_entropy
    if current is fused_linear_cross_entropy:
        return True
    _original = current
    functional.liger_fused_linear_cross_entropy = fused_linear_cross_entropy
    return True
