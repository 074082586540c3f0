"""Where Qwen2-0.5B LoRA's compilation goes: the kubetune case with the LoRA dropout (and inductor's
random-number lowering) changed, compile phases and first-step time printed as JSON.

    python hack/gpu/compile_probe.py DROPOUT [fallback_random]

A diagnostic for the device machine, not a benchmark: the default (dropout 0.1, notebook A's) is
`kubetune bench --cases qwen2-0.5b:kubetune`.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict

from kubetune_trainer import bench


def main() -> None:
    dropout = float(sys.argv[1])
    if "fallback_random" in sys.argv[2:]:
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True
    make = bench._kubetune_config

    def patched(*args, **kwargs):  # type: ignore[no-untyped-def]
        cfg = make(*args, **kwargs)
        cfg.spec.lora.dropout = dropout
        return cfg

    bench._kubetune_config = patched
    r = asdict(
        bench.run_case(
            "qwen2-0.5b:kubetune", warmup=2, steps=3, n_rows=400, memory_cap_gib=None, peak_tflops=None
        )
    )
    keep = ("tokens_per_second", "step_times", "compile_seconds", "compile_cache", "compiled_graphs")
    print(json.dumps({"dropout": dropout, "argv": sys.argv[2:], **{k: r[k] for k in keep}}))


if __name__ == "__main__":
    main()
