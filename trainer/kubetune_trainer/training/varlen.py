"""Padding-free attention for packed rows: PyTorch's variable-length FlashAttention kernel.

Packing puts several examples in one row with no pad tokens; attention must then stay inside each
example. ``register()`` adds an attention implementation named ``kubetune_varlen`` to transformers'
attention registry:

* on CUDA it calls ``torch.nn.attention.varlen.varlen_attn`` (FlashAttention inside PyTorch, no
  extra package), with the cumulative sequence lengths either handed in by the collator
  (``cu_seq_lens_q`` / ``max_length_q``, no host sync) or derived once per forward from
  ``position_ids`` (a position of 0 starts an example);
* on the CPU it runs SDPA over runs of whole examples (:func:`by_runs`): consecutive examples up to
  :data:`RUN_TOKENS` tokens at a time, each run with a block-diagonal causal mask of its own. The
  dense alternative (transformers' SDPA with one block-diagonal mask over the whole packed batch)
  multiplies queries by keys of every example of the batch only to mask them: for the tiny model's
  batch of 8 rows of 256 tokens, the runs cost an eighth of its attention, which was most of a
  training step's time on two cores (docs/contributing.md, "Where the time goes").

Grouped-query attention: the kernel gets the key/value heads as they are (FlashAttention-2 maps
each query head to its group itself; measured on an H200 with the same results, bit for bit, as
repeating the heads first, the same step time and 2.2-3.4 GiB less memory). ``KUBETUNE_VARLEN_KERNEL``
overrides this on CUDA: ``flash-repeat`` repeats the key/value heads to the query head count first
(the earlier behaviour, kept as a fallback); anything else is an error naming the variable. cuDNN's
ragged attention (``aten._cudnn_attention_forward`` with sequence offsets, torch 2.11, cuDNN 9.19)
was measured as a third choice and left out: about 70 ms a layer's forward against FlashAttention's
0.4 ms, and wrong gradients.

    >>> from kubetune_trainer.training import varlen
    >>> varlen.register()
    'kubetune_varlen'
"""

from __future__ import annotations

import itertools
from typing import Any

from ..plan.plan import VARLEN

NAME = VARLEN  # the name the plan chooses (kubetune_trainer.plan.plan.VARLEN)
KERNEL_ENV = "KUBETUNE_VARLEN_KERNEL"
KERNELS = ("flash", "flash-repeat")
_registered = False


def use_kernel(name: str | None = None) -> str:
    """Choose the CUDA kernel variant the attention function runs (None: ``flash``, the default);
    the trainer passes ``KUBETUNE_VARLEN_KERNEL`` from its tuning config, probes pass each in turn.

    >>> use_kernel(), use_kernel("flash-repeat"), use_kernel(None)
    ('flash', 'flash-repeat', 'flash')
    """
    global _kernel
    chosen = name or KERNELS[0]
    if chosen not in KERNELS:
        raise ValueError(f"{KERNEL_ENV} must be one of {', '.join(KERNELS)}, got {chosen!r}")
    _kernel = chosen
    return chosen


def cu_seqlens_from_position_ids(position_ids: Any) -> tuple[Any, int]:
    """Cumulative example boundaries of a packed batch, flattened across rows, and the longest example."""
    import torch

    flat = position_ids.reshape(-1)
    starts = torch.nonzero(flat == 0, as_tuple=False).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        # a row that does not start at position 0 still starts an example
        starts = torch.cat([torch.zeros(1, dtype=starts.dtype, device=starts.device), starts])
    # every row starts a new example too (rows of a batch are independent)
    row = position_ids.shape[-1]
    row_starts = torch.arange(0, flat.numel(), row, device=flat.device, dtype=starts.dtype)
    starts = torch.unique(torch.cat([starts, row_starts]))
    total = torch.tensor([flat.numel()], device=flat.device, dtype=starts.dtype)
    cu = torch.cat([starts, total]).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max())
    return cu, max_len


_cache: dict[str, Any] = {"key": None, "value": None}
_kernel = KERNELS[0]


def _boundaries(kwargs: dict[str, Any], batch: int, seq: int, device: Any) -> tuple[Any, int]:
    import torch

    cu = kwargs.get("cu_seq_lens_q")
    if cu is not None:
        max_len = kwargs.get("max_length_q")
        return cu.to(device=device, dtype=torch.int32), int(max_len if max_len is not None else seq)
    position_ids = kwargs.get("position_ids")
    if position_ids is None:
        # plain rows: each row is one example
        cu = torch.arange(0, (batch + 1) * seq, seq, device=device, dtype=torch.int32)
        return cu, seq
    # one host sync per forward, not per layer: every layer sees the same position_ids tensor
    key = (position_ids.data_ptr(), position_ids.shape, getattr(position_ids, "_version", 0))
    if _cache["key"] != key:
        _cache["key"], _cache["value"] = key, cu_seqlens_from_position_ids(position_ids)
    cached: tuple[Any, int] = _cache["value"]
    return cached


def varlen_attention_forward(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    dropout: float = 0.0,
    scaling: float | None = None,
    sliding_window: int | None = None,
    **kwargs: Any,
) -> tuple[Any, None]:
    """transformers attention-interface signature: q/k/v are (batch, heads, seq, dim)."""
    batch, q_heads, seq, dim = query.shape
    kv_heads = key.shape[1]
    cu, max_len = _boundaries(kwargs, batch, seq, query.device)
    q = query.transpose(1, 2).reshape(batch * seq, q_heads, dim)
    k = key.transpose(1, 2).reshape(batch * seq, kv_heads, dim)
    v = value.transpose(1, 2).reshape(batch * seq, kv_heads, dim)
    variant = _kernel if query.is_cuda else "flash-repeat"
    if kv_heads != q_heads and variant == "flash-repeat":
        k = k.repeat_interleave(q_heads // kv_heads, dim=1)
        v = v.repeat_interleave(q_heads // kv_heads, dim=1)
    window = (-1, 0) if not sliding_window else (sliding_window - 1, 0)
    if query.is_cuda:
        from torch.nn.attention.varlen import varlen_attn

        # FlashAttention takes bf16/fp16 only; QLoRA's hidden states are fp32 (the norms PEFT's k-bit
        # preparation keeps in fp32), so q, k and v arrive in fp32: computed in bf16 and the output
        # cast back, as transformers' FlashAttention integration does
        wide = _narrow_dtype(query)
        if wide is not None:
            q, k, v = q.to(wide[1]), k.to(wide[1]), v.to(wide[1])
        out: Any = varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scaling, window_size=window)
        if wide is not None:
            out = out.to(wide[0])
    else:
        out = by_runs(q, k, v, cu, scaling, sliding_window)
    return out.reshape(batch, seq, q_heads, dim), None


def _narrow_dtype(query: Any) -> tuple[Any, Any] | None:
    """(fp32, the dtype to compute in) when ``query`` is fp32: autocast's, else bf16; None otherwise."""
    import torch

    if query.dtype != torch.float32:
        return None
    target = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else torch.bfloat16
    return query.dtype, target


def reference(q: Any, k: Any, v: Any, cu: Any, scaling: float | None, sliding_window: int | None) -> Any:
    """Example-by-example causal SDPA: the exact semantics of the varlen kernel (the tests' yardstick
    for :func:`by_runs`)."""
    import torch
    import torch.nn.functional as F

    out = torch.empty_like(q)
    bounds = cu.tolist()
    for start, end in itertools.pairwise(bounds):
        if end <= start:
            continue
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        mask = None
        if sliding_window:
            n = end - start
            i = torch.arange(n, device=q.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < sliding_window)
        out[start:end] = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=scaling
        ).transpose(0, 1)
    return out


# Tokens of consecutive examples that the CPU path attends over at once (one example longer than
# this is a run of its own): the packed rows' length in the tiny model's jobs (maxLength 256)
RUN_TOKENS = 256


def runs(bounds: list[int], limit: int = RUN_TOKENS) -> list[tuple[int, int, list[int]]]:
    """Consecutive examples grouped into runs of at most ``limit`` tokens: each run's start, end,
    and its examples' lengths.

    >>> runs([0, 100, 200, 300, 700, 710], limit=256)
    [(0, 200, [100, 100]), (200, 300, [100]), (300, 700, [400]), (700, 710, [10])]
    """
    out: list[tuple[int, int, list[int]]] = []
    for start, end in itertools.pairwise(bounds):
        if end <= start:
            continue
        if out and end - out[-1][0] <= limit:
            first, _, lengths = out[-1]
            out[-1] = (first, end, [*lengths, end - start])
        else:
            out.append((start, end, [end - start]))
    return out


def by_runs(
    q: Any,
    k: Any,
    v: Any,
    cu: Any,
    scaling: float | None,
    sliding_window: int | None,
    limit: int = RUN_TOKENS,
) -> Any:
    """The varlen semantics (:func:`reference`) with SDPA over runs of whole examples (:func:`runs`,
    ``limit`` tokens), each with the block-diagonal causal mask of its examples; q/k/v are (tokens,
    heads, dim), k/v with as many heads as q."""
    import torch
    import torch.nn.functional as F

    outs = []
    for start, end, lengths in runs(cu.tolist(), limit):
        n = end - start
        example = torch.repeat_interleave(
            torch.arange(len(lengths), device=q.device), torch.tensor(lengths, device=q.device)
        )
        i = torch.arange(n, device=q.device)
        mask = (example[:, None] == example[None, :]) & (i[None, :] <= i[:, None])
        if sliding_window:
            mask &= i[:, None] - i[None, :] < sliding_window
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (q, k, v))
        outs.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, scale=scaling).transpose(0, 1))
    return torch.cat(outs) if outs else torch.empty_like(q)


def register(kernel: str | None = None) -> str:
    """Register the attention function with transformers; idempotent.

    No mask builder is registered on purpose: the kernel needs no mask (the boundaries come from
    cu_seqlens), and for an attention function without one transformers skips mask preparation
    altogether. With a builder registered, even one returning None, transformers first scans the
    position ids for packed sequences and reads the result back to the host: a wait for the GPU at
    the start of every forward (found on the H200 with ``torch.cuda.set_sync_debug_mode``).
    """
    global _registered
    use_kernel(kernel)
    if not _registered:
        from transformers import AttentionInterface

        AttentionInterface.register(NAME, varlen_attention_forward)
        _registered = True
    return NAME
