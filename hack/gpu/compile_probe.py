"""Where Qwen2-0.5B LoRA's compilation goes: the kubetune case with one thing changed, its compile
phases, first-step time and the files inductor generated, printed as JSON.

    python hack/gpu/compile_probe.py DROPOUT [fallback_random] [warm_pool] [cprofile]

``fallback_random``: inductor draws dropout masks with ATen's kernels instead of its own Triton
random lowering. ``warm_pool``: inductor's compile-worker pool is started and waited for before the
first step (inductor otherwise compiles in the training process until its pool is up).
``cprofile``: the Python profile of the whole case, written to ``$PROBE_PROFILE``. ``syncs``: every
host sync in the first two measured steps (``torch.cuda.set_sync_debug_mode``), counted by the
Python call stack that made it.

A diagnostic for the device machine, not a benchmark: the default (dropout 0.1, notebook A's) is
`kubetune bench --cases qwen2-0.5b:kubetune`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
import warnings
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from kubetune_bench import measure, runners


def generated_files(root: Path) -> dict[str, object]:
    """Counts of inductor's generated sources by kind, and the head of every C++ source."""
    kinds: dict[str, int] = {}
    cpp: dict[str, str] = {}
    for f in root.rglob("*"):
        if f.is_file():
            kinds[f.suffix] = kinds.get(f.suffix, 0) + 1
            if f.suffix in (".cpp", ".h") and len(cpp) < 6:
                cpp[str(f.relative_to(root))] = f.read_text(errors="replace")[:1500]
    return {"by_suffix": kinds, "cpp_heads": cpp}


def sync_counting_timing(stacks: Counter[str]) -> measure.TimingFactory:
    """A timing factory (``CaseHooks.timing``) whose callback also counts the host syncs of the first
    two measured steps in ``stacks``, by the Python call stack that made them."""
    import torch

    def record(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
        if "synchronizing" in str(message):
            frames = [f for f in traceback.extract_stack()[:-1] if "/warnings.py" not in f.filename]
            stacks[
                " < ".join(f"{Path(f.filename).name}:{f.lineno}:{f.name}" for f in reversed(frames[-7:]))
            ] += 1

    def timing(meter, warmup, sync, profiler=None):  # type: ignore[no-untyped-def]
        callback = measure.timing_callback(meter, warmup, sync, profiler)
        begin, end = callback.on_step_begin, callback.on_step_end

        def on_step_begin(args, state, control, **kw):  # type: ignore[no-untyped-def]
            begin(args, state, control, **kw)
            if state.global_step == warmup:
                warnings.simplefilter("always")
                warnings.showwarning = record
                torch.cuda.set_sync_debug_mode("warn")

        def on_step_end(args, state, control, **kw):  # type: ignore[no-untyped-def]
            if state.global_step == warmup + 2:
                torch.cuda.set_sync_debug_mode("default")
            end(args, state, control, **kw)

        callback.on_step_begin, callback.on_step_end = on_step_begin, on_step_end
        return callback

    return timing


def main() -> None:
    dropout = float(sys.argv[1])
    import torch._inductor.config as inductor_config

    if "fallback_random" in sys.argv[2:]:
        inductor_config.fallback_random = True
    started = time.perf_counter()
    if "warm_pool" in sys.argv[2:]:
        from torch._inductor.async_compile import AsyncCompile

        AsyncCompile.warm_pool()
        AsyncCompile.wait_pool_ready(timeout=120)
    pool_seconds = time.perf_counter() - started

    def set_dropout(cfg):  # type: ignore[no-untyped-def]
        cfg.spec.lora.dropout = dropout

    syncs: Counter[str] | None = Counter() if "syncs" in sys.argv[2:] else None
    # the benchmark's public hooks: the dropout set on the resolved config, the syncs counted by the timing
    timing = sync_counting_timing(syncs) if syncs is not None else measure.timing_callback
    hooks = runners.CaseHooks(timing=timing, configure=set_dropout)
    profiler = None
    if "cprofile" in sys.argv[2:]:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    options = runners.CaseOptions(
        warmup=int(os.environ.get("PROBE_WARMUP", "1")),
        steps=int(os.environ.get("PROBE_STEPS", "2")),
        rows=400,
    )
    r = asdict(runners.run_case("qwen2-0.5b:kubetune", options, hooks))
    if profiler is not None:
        import io
        import pstats

        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("cumulative").print_stats(70)
        stats.sort_stats("tottime").print_stats(40)
        Path(os.environ.get("PROBE_PROFILE", "/tmp/probe.pstats.txt")).write_text(text.getvalue())
    keep = ("tokens_per_second", "step_times", "compile_seconds", "compile_cache", "compiled_graphs")
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_root"))
    print(
        json.dumps(
            {
                "dropout": dropout,
                "argv": sys.argv[2:],
                "pool_seconds": round(pool_seconds, 1),
                "syncs": None if syncs is None else [[n, stack] for stack, n in syncs.most_common(12)],
                **{k: r[k] for k in keep},
                "generated": generated_files(cache),
            }
        )
    )


if __name__ == "__main__":
    main()
