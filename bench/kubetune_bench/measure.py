"""What a case measures while it trains: real tokens and attended context, each optimizer step's time,
and the compiler's own counters.

``timing_callback`` is the default of ``CaseHooks.timing`` (``kubetune_bench.runners``): a diagnostic
that wants to act at the measured steps (``hack/gpu/compile_probe.py`` counts host syncs there) wraps
it and passes its own factory, with the same parameters.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any, Protocol


class Meter:
    """Counts real tokens and attended context on the device (no host sync) during measured steps."""

    def __init__(self) -> None:
        self.active = False
        self.tokens: Any = 0
        self.context: Any = 0

    def hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        """A forward pre-hook (``with_kwargs=True``) on the trained model."""
        if not self.active or not module.training:
            return
        mask = kwargs.get("attention_mask")
        pos = kwargs.get("position_ids")
        ids = kwargs.get("input_ids")
        if mask is not None and mask.dim() == 2:
            self.tokens = self.tokens + mask.sum()
            self.context = self.context + (mask.cumsum(-1) * mask).sum()
        elif pos is not None:
            self.tokens = self.tokens + pos.numel()
            self.context = self.context + (pos + 1).sum()
        elif ids is not None:
            self.tokens = self.tokens + ids.numel()


class StepTiming(Protocol):
    """What the case reads back from its timing callback (a ``transformers.TrainerCallback``)."""

    start: float | None
    end: float | None
    losses: list[float]

    def step_times(self) -> list[float]: ...


# (meter, warm-up steps, the device's synchronize, a torch.profiler.profile or None) -> the callback
TimingFactory = Callable[[Meter, int, Callable[[], None], Any], StepTiming]


def timing_callback(meter: Meter, warmup: int, sync: Callable[[], None], profiler: Any = None) -> StepTiming:
    """Times every optimizer step; ``profiler`` (a torch.profiler.profile) runs over the measured ones.

    The host waits for the GPU only where the measured window begins and ends. Each step's own time
    comes from CUDA events read after training (``step_times()``): a wait at every step would
    drain the GPU's queue and add the data loading between steps to every step, which a training
    job does not do.
    """
    import torch
    from transformers import TrainerCallback

    cuda = torch.cuda.is_available()

    class Timing(TrainerCallback):
        def __init__(self) -> None:
            self.start: float | None = None
            self.end: float | None = None
            self.losses: list[float] = []
            self._marks: list[tuple[Any, Any]] = []

        def _now(self) -> Any:
            if not cuda:
                return time.perf_counter()
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event

        def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if state.global_step == warmup:
                sync()
                meter.active = True
                if profiler is not None:
                    profiler.start()
                self.start = time.perf_counter()
            self._marks.append((self._now(), None))

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            began, _ = self._marks[-1]
            self._marks[-1] = (began, self._now())
            if state.global_step == state.max_steps and self.start is not None:
                sync()
                self.end = time.perf_counter()
                meter.active = False
                if profiler is not None:
                    profiler.stop()

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                self.losses.append(float(logs["loss"]))

        def step_times(self) -> list[float]:
            """Every optimizer step's time in seconds, warm-up included (the first holds the compilation)."""
            sync()
            done = [(a, b) for a, b in self._marks if b is not None]
            if cuda:
                return [round(a.elapsed_time(b) / 1000, 4) for a, b in done]
            return [round(b - a, 4) for a, b in done]

    return Timing()


def progress_callback(started: float) -> Any:
    """Prints ``[case] HH:MM:SS step N of M ended, S s into training`` after every optimizer step
    (host clock since ``started``, no GPU sync: the GPU may still be working on it), so that a case's
    log says how far it got and how long its first steps (the compilation) took."""
    from transformers import TrainerCallback

    def say(what: str) -> None:
        stamp = time.strftime("%H:%M:%S", time.gmtime())
        print(f"[case] {stamp} {what}, {time.perf_counter() - started:.1f} s into training", flush=True)

    class Progress(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            say("training begins")

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            say(f"step {state.global_step} of {state.max_steps} ended")

    return Progress()


def compile_diagnostics() -> dict[str, Any]:
    """Compilation time by phase and cache hits: private dynamo counters, a diagnostic, never a failure."""
    try:
        from torch._dynamo.utils import compile_times, counters

        table: Any = compile_times(repr="csv", aggregate=True)
        names, values = table
        seconds = {n: round(float(v), 1) for n, v in zip(names, values, strict=False) if float(v) >= 0.5}
        cache = {
            k: int(v)
            for group in ("inductor", "aot_autograd")
            for k, v in counters[group].items()
            if "cache" in k
        }
        return {"compile_seconds": seconds, "compile_cache": cache}
    except Exception:
        return {}


def compiled_graphs() -> int | None:
    """Graphs dynamo compiled in this process (a private counter: None when it cannot be read)."""
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: a diagnostic, never a failure
        return None


def versions() -> dict[str, str]:
    """The versions of what the cases train with."""
    from importlib.metadata import PackageNotFoundError, version

    import torch
    import transformers
    import trl

    found = {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__}
    for name in OPTIONAL_PACKAGES:
        with contextlib.suppress(PackageNotFoundError):  # (not installed: no row in the versions)
            found[name] = version(name)
    return found


# the packages a case may train with, recorded when installed (the peers' own among them)
OPTIONAL_PACKAGES = (
    "liger-kernel",
    "peft",
    "datasets",
    "accelerate",
    "unsloth",
    "unsloth_zoo",
    "xformers",
    "bitsandbytes",
    "flash-attn",
    "cut-cross-entropy",
)
