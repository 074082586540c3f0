"""The packed-attention kernels side by side on the GPU, at the benchmark models' shapes, through
``varlen.varlen_attention_forward`` (the function the models call), one JSON line per shape.

    python hack/gpu/attn_probe.py

For each ``KUBETUNE_VARLEN_KERNEL`` variant: forward and forward+backward time (CUDA events, median
of 20 after 3 warm-up calls) and the largest error of the output and of the query/key/value
gradients against the fp32 example-by-example reference. Rows are packed as the trainer packs
them: Capybara-like examples laid end to end, cut at each 1,024-token row's end. A diagnostic for
the device machine; the verdict on a kernel is the full training step (``kubetune bench``).
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import traceback

import torch

from kubetune_bench import workload
from kubetune_trainer.training import varlen

SHAPES = {
    # name: (rows of 1,024 tokens, query heads, key/value heads, head dim)
    "qwen3-4b": (8, 32, 8, 128),
    "qwen2-0.5b": (32, 14, 2, 64),
}


def packed_boundaries(rows: int, row: int = 1024) -> list[int]:
    lengths = iter(workload.capybara_like_lengths(10 * rows, seed=1))
    cu = [0]
    for r in range(rows):
        end, pos = (r + 1) * row, cu[-1]
        while pos < end:
            pos = min(end, pos + next(lengths))
            cu.append(pos)
    return cu


def timed(fn, warmup: int = 3, iters: int = 20) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def probe(name: str) -> dict[str, object]:
    rows, hq, hkv, dim = SHAPES[name]
    cu_list = packed_boundaries(rows)
    total = cu_list[-1]
    cu = torch.tensor(cu_list, dtype=torch.int32, device="cuda")
    max_len = max(b - a for a, b in itertools.pairwise(cu_list))
    torch.manual_seed(0)
    # transformers hands the attention function (batch, heads, seq, dim) views of (batch, seq, heads, dim)
    base = [
        torch.randn(rows, total // rows, h, dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for h in (hq, hkv, hkv)
    ]
    grad = torch.randn(rows, total // rows, hq, dim, device="cuda", dtype=torch.bfloat16)
    scale = dim**-0.5

    def call() -> torch.Tensor:
        q, k, v = (t.transpose(1, 2) for t in base)
        out, _ = varlen.varlen_attention_forward(
            None, q, k, v, None, scaling=scale, cu_seq_lens_q=cu, max_length_q=max_len
        )
        return out

    # fp32 reference, key/value heads repeated, example by example
    ref_in = [t.detach().float().reshape(total, -1, dim).requires_grad_(True) for t in base]
    kk, vv = (t.repeat_interleave(hq // hkv, dim=1) for t in ref_in[1:])
    ref = varlen.reference(ref_in[0], kk, vv, cu, scale, None)
    ref.backward(grad.float().reshape(total, hq, dim))
    ref_grads = [t.grad for t in ref_in]

    result: dict[str, object] = {
        "shape": name,
        "tokens": total,
        "examples": len(cu_list) - 1,
        "max_len": max_len,
        "heads": [hq, hkv, dim],
    }
    for kernel in varlen.KERNELS:
        varlen.use_kernel(kernel)
        entry: dict[str, object] = {}
        try:

            def fwd() -> None:
                with torch.no_grad():
                    call()

            entry["forward_ms"] = round(timed(fwd), 3)
            for t in base:
                t.grad = None
            out = call()
            out.backward(grad)
            errs = {"out": (out.float().reshape(total, hq, dim) - ref).abs().max().item()}
            for label, t, r in zip("qkv", base, ref_grads, strict=True):
                assert t.grad is not None and r is not None
                scale_r = r.abs().max().item()
                errs["d" + label] = (t.grad.float().reshape(r.shape) - r).abs().max().item() / scale_r
            entry["errors"] = errs

            def fwd_bwd() -> None:
                call().backward(grad)

            entry["forward_backward_ms"] = round(timed(fwd_bwd), 3)
        except Exception as exc:
            entry["error"] = f"{type(exc).__name__}: {exc}"[:600]
            entry["trace"] = traceback.format_exc()[-1500:]
        result[kernel] = entry
    return result


def main() -> int:
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name()}))
    for name in SHAPES:
        print(json.dumps(probe(name)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
