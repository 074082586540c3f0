"""The GPU's measured dense bf16 limit in TFLOP/s (printed alone): the MFU denominator of `hack/gpu/peers.sh`.

    python3 hack/gpu/bf16_peak.py      # e.g. 790

An 8192 x 8192 x 8192 bf16 matrix product on random data, the mean of 20 after 5 warm-ups, timed
with CUDA events: what a dense matmul reaches on this GPU at its current clocks, below the
datasheet's 989.4 TFLOP/s for H100 and H200 SXM.
"""

from __future__ import annotations

import torch


def main() -> None:
    n, runs = 8192, 20
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(runs):
        a @ b
    end.record()
    torch.cuda.synchronize()
    seconds = start.elapsed_time(end) / 1000 / runs
    print(round(2 * n**3 / seconds / 1e12))


if __name__ == "__main__":
    main()
