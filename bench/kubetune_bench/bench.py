"""Benchmark: the notebooks' configurations against kubetune's defaults, side by side in one run.

    kubetune bench --out bench-out                     # on a GPU: Qwen2-0.5B LoRA and Qwen3-4B full
    kubetune bench --smoke --out bench-out             # CPU smoke: the tiny model, a few steps
    kubetune bench --cases qwen3-4b:kubetune --memory-cap-gib 80
    kubetune bench --cases qwen2-0.5b:notebook-a,qwen2-0.5b:kubetune --notebook-memory  # + held to A's memory

Each case trains the same model (built from its published config with random weights: nothing
is downloaded) on the same synthetic chat data for a few optimizer steps and measures the steps
after the warm-up:

* ``notebook-a`` / ``notebook-b``: TRL's SFTTrainer configured exactly as the notebook does
  (A: fp32 weights + fp16 autocast, batch 8 x accumulation 4, gradient checkpointing, Liger,
  padded batches; B: bf16 weights, batch 1 x accumulation 8, gradient checkpointing, padded);
* ``kubetune``: the real trainer's own functions (``plan.make_plan``, ``train.build_model``'s
  dtype/attention choice, ``train.build_sft_config``, ``train.build_trainer``) on the notebook's
  FineTuneJob example (examples/*.yaml) with its defaults (bf16, padding-free packing with the
  varlen kernel, Liger fused kernels, checkpointing only when the memory plan needs it).

Metrics per case: training tokens/s (real tokens only: no padding), optimizer-step time, peak GPU
memory, and MFU = model FLOPs per second / peak dense bf16 FLOP/s of the GPU, where model FLOPs per
token = m * 2 * N_matmul + a * 4 * L * H * d_head * c (on N GPUs: over N peaks): N_matmul the parameters of every matrix
multiply (LM head included, embeddings excluded), c the mean attended context per token (causal:
(n+1)/2 for an example of n tokens), m = 3 for full fine-tuning and 2 for LoRA (frozen weights get
no weight gradients), a = 3. Recomputation from gradient checkpointing is not counted (model FLOPs,
not hardware FLOPs).

Data: conversations whose token lengths follow a log-normal fitted to Capybara's (median ~850,
cut at 1024, ~39% at the cap), pre-tokenized with uniform random ids over the model's vocabulary.

Each case runs in its own process (Liger patches classes; memory must start empty); results are
written as JSON, a markdown table and a PNG chart.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kubetune_trainer.plan import FP8_ENV, GPU_MEMORY_ENV, SHARDING_ENV, peak_bf16_flops

REPO_EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Published architecture configs (facts: sizes of the public Qwen2-0.5B and Qwen3-4B checkpoints).
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "model_type": "qwen2",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
}

# The notebooks' SFTConfig, as they set it (facts from the two notebooks).
NOTEBOOK_A: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "learning_rate": 1e-3,  # 1e-4 x 10 "for LoRA"
    "warmup_steps": 50,
    "logging_steps": 25,
    "weight_decay": 0.01,
    "dataloader_pin_memory": False,
    "remove_unused_columns": False,
    "use_liger_kernel": True,
    "fp16": True,
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
}
NOTEBOOK_B: dict[str, Any] = {
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 8,
    "learning_rate": 2e-5,
    "warmup_steps": 10,
    "logging_steps": 10,
    "weight_decay": 0.01,
    "dataloader_pin_memory": False,
    "remove_unused_columns": False,
    "bf16": True,
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
}
LORA: dict[str, Any] = {
    "r": 8,
    "alpha": 32,
    "dropout": 0.1,
    "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}

# (model, kind) -> what it is
CASES = {
    "qwen2-0.5b:notebook-a": ("qwen2-0.5b", "notebook-a"),
    "qwen2-0.5b:kubetune": ("qwen2-0.5b", "kubetune-lora"),
    "qwen3-4b:notebook-b": ("qwen3-4b", "notebook-b"),
    "qwen3-4b:kubetune": ("qwen3-4b", "kubetune-full"),
    "tiny:notebook-a": ("tiny", "notebook-a"),
    "tiny:kubetune-lora": ("tiny", "kubetune-lora"),
    "tiny:notebook-b": ("tiny", "notebook-b"),
    "tiny:kubetune-full": ("tiny", "kubetune-full"),
}
GPU_CASES = ["qwen2-0.5b:notebook-a", "qwen2-0.5b:kubetune", "qwen3-4b:notebook-b", "qwen3-4b:kubetune"]
SMOKE_CASES = ["tiny:notebook-a", "tiny:kubetune-lora", "tiny:notebook-b", "tiny:kubetune-full"]
# Which case each kubetune case is compared with.
BASELINE = {"kubetune-lora": "notebook-a", "kubetune-full": "notebook-b"}


MAX_LENGTH = 1024


@dataclass
class CaseResult:
    case: str
    model: str
    kind: str
    steps_measured: int
    seconds: float
    tokens: int
    tokens_per_second: float
    step_seconds: float
    peak_memory_gib: float | None
    mfu: float | None
    flops_per_token: float
    losses: list[float] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    packing_check: dict[str, Any] | None = None
    memory_cap_gib: float | None = None
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    sharding: str = "none"
    # the plan's float8 recipe (KUBETUNE_FP8): such a row is compared with its notebook, but is never
    # the baseline of another
    fp8: str = "off"
    # set when the case trained one whole epoch instead of warm-up + measured steps
    epoch_training_seconds: float | None = None
    # packed rows a step when a kubetune case was given its notebook's tokens a step (--notebook-steps)
    # instead of its example's batch; such a row is compared with its notebook, never a baseline
    notebook_step_rows: int | None = None
    # spec.training fields the call set (--training): such a row is compared with its notebook, never a baseline
    training_overrides: dict[str, str] = field(default_factory=dict)
    compile_error: str | None = None
    step_times: list[float] = field(default_factory=list)
    # graphs dynamo compiled in the process (compiled layers: 1 forward graph when nothing recompiles)
    compiled_graphs: int | None = None
    # where compilation time went (seconds per dynamo/inductor phase, those over 0.5 s) and the
    # compile caches' hits and misses (FX graph and AOT autograd caches)
    compile_seconds: dict[str, float] = field(default_factory=dict)
    compile_cache: dict[str, int] = field(default_factory=dict)


# --- data ------------------------------------------------------------------------------------------


def capybara_like_lengths(
    n: int, *, seed: int = 0, median: float = 850.0, cap: int = MAX_LENGTH
) -> list[int]:
    """Token lengths of chat examples: log-normal with median 850 and P(len >= 1024) ~ 0.39."""
    import random

    rng = random.Random(seed)
    mu = math.log(median)
    # P(X >= cap) = 0.39  ->  (ln cap - mu) / sigma = z(0.61) = 0.2793
    sigma = (math.log(cap) - mu) / 0.2793
    return [max(16, min(cap, round(rng.lognormvariate(mu, sigma)))) for _ in range(n)]


def synthetic_dataset(n: int, vocab: int, *, seed: int = 0) -> Any:
    """Pre-tokenized rows (``input_ids``) with Capybara-like lengths; ids avoid the special tokens."""
    import torch
    from datasets import Dataset

    gen = torch.Generator().manual_seed(seed)
    lengths = capybara_like_lengths(n, seed=seed)
    low = min(16, vocab // 4)
    rows = [torch.randint(low, vocab, (length,), generator=gen).tolist() for length in lengths]
    return Dataset.from_dict({"input_ids": rows})


def notebook_step_rows(kind: str, lengths: list[int], max_length: int = MAX_LENGTH) -> int:
    """Packed rows of ``max_length`` that hold about as many tokens as an optimizer step of the
    kubetune case's notebook: its sequences a step (batch x accumulation, unpacked) times the data's
    mean sequence length. With packing, the trainer's batch counts rows of up to maxLength tokens
    (several short sequences share a row), so the examples' batch holds more tokens a step than the
    notebook's unpacked one; this gives the kubetune case the notebook's step size instead.

    >>> notebook_step_rows("kubetune-full", [779] * 10)  # notebook B: 1 x 8 sequences
    6
    >>> notebook_step_rows("kubetune-lora", [779] * 10)  # notebook A: 8 x 4 sequences
    24
    """
    notebook = NOTEBOOK_A if BASELINE[kind] == "notebook-a" else NOTEBOOK_B
    sequences = notebook["per_device_train_batch_size"] * notebook["gradient_accumulation_steps"]
    mean = sum(lengths) / len(lengths)
    return max(1, round(sequences * mean / max_length))


# --- FLOPs -----------------------------------------------------------------------------------------


def matmul_params(cfg: dict[str, Any]) -> int:
    """Parameters of every matrix multiply per token: attention + MLP projections + the LM head."""
    h, layers = cfg["hidden_size"], cfg["num_hidden_layers"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    attn = h * heads * d * 2 + h * kv * d * 2  # q, o and k, v
    mlp = 3 * h * cfg["intermediate_size"]
    return layers * (attn + mlp) + cfg["vocab_size"] * h


def flops_per_token(cfg: dict[str, Any], *, lora: bool, mean_context: float) -> float:
    heads = cfg["num_attention_heads"]
    d = cfg.get("head_dim") or cfg["hidden_size"] // heads
    linear = (2 if lora else 3) * 2 * matmul_params(cfg)
    attention = 3 * 4 * cfg["num_hidden_layers"] * heads * d * mean_context
    return float(linear + attention)


def peak_flops(device_name: str, override: float | None) -> float | None:
    """The MFU denominator: ``--peak-tflops``, else the plan's table of dense bf16 peaks by GPU name."""
    if override:
        return override * 1e12
    return peak_bf16_flops(device_name)


# --- one case (in its own process) -----------------------------------------------------------------


class _Meter:
    """Counts real tokens and attended context on the device (no host sync) during measured steps."""

    def __init__(self) -> None:
        self.active = False
        self.tokens: Any = 0
        self.context: Any = 0

    def hook(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
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


def _timing_callback(meter: _Meter, warmup: int, sync: Any, profiler: Any = None) -> Any:
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


def _tokenizer(tmp: Path, vocab: int) -> Any:
    """A processing class for the trainers: the data is pre-tokenized, only pad/eos ids matter."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab_map = {f"t{i}": i for i in range(vocab)}
    tok = Tokenizer(models.WordLevel(vocab=vocab_map, unk_token="t0"))  # noqa: S106 (token names)
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t1", eos_token="t2", unk_token="t0")  # noqa: S106
    fast.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    return fast


def _build_model(model_name: str, dtype: Any, attn: str, device: str) -> Any:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kubetune_trainer import varlen

    if attn == varlen.NAME:
        varlen.register()
    cfg = dict(MODEL_CONFIGS[model_name])
    config = AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.config.use_cache = False
    return model


def _kubetune_config(
    kind: str, model_dir: str, data_dir: str, steps: int, out: str, *, step_rows: int | None = None
) -> Any:
    """The notebook's FineTuneJob example, pointed at the benchmark model and data, on one GPU
    (``step_rows``: that many packed rows an optimizer step instead of the example's batch)."""
    from kubetune_api.trainer_config import load_manifest, resolve

    example = "qwen2-0.5b-lora-8gpu.yaml" if kind == "kubetune-lora" else "qwen3-4b-full.yaml"
    job = load_manifest(REPO_EXAMPLES / example)
    spec = job.spec.model_copy(deep=True)
    spec.model.name, spec.model.path = None, model_dir
    spec.dataset.name, spec.dataset.path, spec.dataset.eval_fraction = None, data_dir, None
    spec.training.epochs, spec.training.max_steps = None, steps
    spec.training.eval_steps = None
    spec.training.save_steps = 10**6
    spec.resources.gpus_per_node = 1
    if step_rows:
        spec.training.batch_size, spec.training.gradient_accumulation_steps = step_rows, 1
    job.spec = spec
    return resolve(job, output_dir=out)


def run_case(
    case: str,
    *,
    compile_model: bool = False,
    no_compile: bool = False,
    epoch_tokens: int | None = None,
    warmup: int,
    steps: int,
    n_rows: int,
    memory_cap_gib: float | None,
    peak_tflops: float | None,
    profile_path: Path | None = None,
    notebook_steps: bool = False,
    training_overrides: tuple[tuple[str, str], ...] = (),
) -> CaseResult:
    import torch
    import transformers
    import trl

    from kubetune_api.spec import Toggle

    model_name, kind = CASES[case]
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if cuda:
        # under torchrun each process trains on its own GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if cuda and memory_cap_gib:
        # the plan and PyTorch's allocator, both held to the cap, as the trainer does it
        from kubetune_trainer.plan import limit_gpu_memory

        os.environ[GPU_MEMORY_ENV] = str(memory_cap_gib)
        limit_gpu_memory()
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    cfg = MODEL_CONFIGS[model_name]
    lora = kind in ("notebook-a", "kubetune-lora")
    total_steps = warmup + steps

    with tempfile.TemporaryDirectory(prefix="kubetune-bench-") as tmp_name:
        tmp = Path(tmp_name)
        tokenizer = _tokenizer(tmp, cfg["vocab_size"])
        if epoch_tokens:
            # a whole epoch of this many real tokens (Capybara: ~12M)
            mean = sum(capybara_like_lengths(2000, seed=1)) / 2000
            n_rows = math.ceil(epoch_tokens / mean)
        dataset = synthetic_dataset(n_rows, cfg["vocab_size"], seed=0)
        step_rows = (
            notebook_step_rows(kind, [len(x) for x in dataset["input_ids"]])
            if notebook_steps and kind.startswith("kubetune")
            else None
        )
        plan_info: dict[str, Any] = {}
        packing_check = None

        if kind.startswith("notebook"):
            from peft import LoraConfig, TaskType
            from trl import SFTConfig, SFTTrainer

            settings: dict[str, Any] = dict(NOTEBOOK_A if kind == "notebook-a" else NOTEBOOK_B)
            if not cuda:  # CPU smoke: same shape, no mixed precision or Triton kernels
                settings.update(fp16=False, bf16=False, use_liger_kernel=False)
            # A loads in the default fp32; B asks for bf16 weights.
            dtype = torch.bfloat16 if (kind == "notebook-b" and cuda) else torch.float32
            model = _build_model(model_name, dtype, "sdpa", device)
            peft = None
            if lora:
                peft = LoraConfig(
                    task_type=TaskType.CAUSAL_LM,
                    r=LORA["r"],
                    lora_alpha=LORA["alpha"],
                    lora_dropout=LORA["dropout"],
                    target_modules=LORA["targets"],
                    bias="none",
                )
            args = SFTConfig(
                output_dir=str(tmp / "out"),
                max_steps=total_steps,
                save_strategy="no",
                eval_strategy="no",
                report_to="none",
                max_length=MAX_LENGTH,
                use_cpu=not cuda,
                disable_tqdm=True,
                **settings,
            )
            trainer = SFTTrainer(
                model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
            )
            plan_info = {
                "precision": "fp16-amp/fp32-weights"
                if settings.get("fp16")
                else ("bf16" if settings.get("bf16") else "fp32"),
                "packing": False,
                "gradient_checkpointing": True,
                "liger": bool(settings.get("use_liger_kernel")),
                "per_device_batch_size": settings["per_device_train_batch_size"],
                "gradient_accumulation_steps": settings["gradient_accumulation_steps"],
            }
        else:
            from kubetune_trainer import train as trainer_module
            from kubetune_trainer.plan import Hardware, make_plan

            data_dir = tmp / "data"
            data_dir.mkdir()
            dataset.to_json(str(data_dir / "train.jsonl"))
            tcfg = _kubetune_config(
                kind, str(tmp / "model"), str(data_dir), total_steps, str(tmp / "out"), step_rows=step_rows
            )
            if epoch_tokens:
                tcfg.spec.training.max_steps, tcfg.spec.training.epochs = None, 1
            tcfg.spec.training = apply_training_overrides(tcfg.spec.training, training_overrides)
            if compile_model:
                tcfg.spec.training.torch_compile = Toggle.ALWAYS
            if no_compile:
                tcfg.spec.training.torch_compile = Toggle.NEVER
            shape = trainer_module.shape_from_config(MODEL_CONFIGS[model_name])
            plan = make_plan(tcfg.spec.training, Hardware.detect(), shape=shape, lora=lora)
            model = _build_model(
                model_name, getattr(torch, plan.dtype_name), plan.attn_implementation, device
            )
            args = trainer_module.build_sft_config(tcfg, plan, has_eval=False, progress_bar=False)
            trainer = trainer_module.build_trainer(
                model,
                tokenizer,
                args,
                train=dataset,
                evaluation=None,
                peft=trainer_module.build_peft_config(tcfg),
                callbacks=[],
                plan=plan,
            )
            plan_info = plan.as_dict()
            # (the check's unpacked forward holds all 16 examples' logits at once: a capped case
            # leaves it to its uncapped row, which checks the same packing)
            if cuda and world == 1 and not epoch_tokens and not memory_cap_gib:
                from kubetune_trainer.fast import check_packing_exact

                packing_check = check_packing_exact(trainer.model, dataset[:16]["input_ids"])

        meter = _Meter()
        trained: Any = trainer.model
        inner = trained.get_base_model() if hasattr(trained, "get_base_model") else trained
        inner.register_forward_pre_hook(meter.hook, with_kwargs=True)
        profiler = None
        if profile_path is not None and not epoch_tokens:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            profiler = profile(activities=activities)
        timing = _timing_callback(meter, warmup, sync, profiler)
        trainer.add_callback(timing)
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        if epoch_tokens:
            meter.active = True
        train_started = time.perf_counter()
        trainer.train()
        sync()
        train_seconds = time.perf_counter() - train_started
        counts = torch.tensor([float(meter.tokens), float(meter.context)], device=device)
        if world > 1:
            import torch.distributed as dist

            dist.all_reduce(counts)  # every GPU's tokens
        tokens, context_sum = int(counts[0]), float(counts[1])
        if profiler is not None and profile_path is not None and timing.end is not None:
            profile_path.write_text(
                profile_summary(profiler, wall=timing.end - (timing.start or timing.end), steps=steps)
            )
        if epoch_tokens:
            seconds = train_seconds
        else:
            seconds = (timing.end or time.perf_counter()) - (timing.start or time.perf_counter())
        steps = trainer.state.global_step if epoch_tokens else steps
        mean_context = context_sum / tokens if tokens else 0.0
        fpt = flops_per_token(cfg, lora=lora, mean_context=mean_context)
        name = torch.cuda.get_device_name(0) if cuda else "cpu"
        peak = peak_flops(name, peak_tflops) if cuda else None
        tps = tokens / seconds if seconds > 0 else 0.0
        label = case + (f" x{world} GPUs" if world > 1 else "") + (" epoch" if epoch_tokens else "")
        if os.environ.get(SHARDING_ENV) and world > 1:
            label += f" ({plan_info.get('sharding')}, forced)"
        if no_compile and kind.startswith("kubetune"):
            label += " (no compile)"
        if step_rows:
            label += f" (notebook's step: {step_rows} rows)"
        if training_overrides and kind.startswith("kubetune"):
            label += " (" + ", ".join(f"{k}={v}" for k, v in training_overrides) + ")"
        fp8 = str(plan_info.get("fp8", "off"))
        if fp8 != "off":
            label += f" (fp8 {fp8})"
        elif kind.startswith("kubetune") and os.environ.get(FP8_ENV, "off") not in ("", "off"):
            fp8 = "asked, off"  # the plan's reason says why; not a bf16 baseline either
            label += " (fp8 asked: off)"
        return CaseResult(
            case=label,
            model=model_name,
            kind=kind,
            steps_measured=steps,
            seconds=round(seconds, 3),
            tokens=tokens,
            tokens_per_second=round(tps, 1),
            step_seconds=round(seconds / steps, 4),
            peak_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
            # per GPU: the FLOP/s of all GPUs over all their peaks
            mfu=round(tps * fpt / (peak * world), 4) if peak else None,
            flops_per_token=fpt,
            losses=timing.losses,
            plan=plan_info,
            packing_check=packing_check,
            memory_cap_gib=memory_cap_gib,
            device=name,
            gpus=world,
            sharding=str(plan_info.get("sharding", "none")),
            fp8=fp8,
            training_overrides=dict(training_overrides) if kind.startswith("kubetune") else {},
            step_times=timing.step_times(),
            compiled_graphs=_compiled_graphs(),
            **_compile_diagnostics(),
            epoch_training_seconds=round(train_seconds, 1) if epoch_tokens else None,
            notebook_step_rows=step_rows,
            versions={
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "trl": trl.__version__,
                **_liger_version(),
            },
        )


def _merged(spans: list[tuple[float, float]]) -> list[list[float]]:
    """[start, end) intervals merged where they overlap or touch, in time order."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (overlaps count once)."""
    return sum(end - start for start, end in _merged(spans))


def idle_gaps(
    kernels: list[tuple[float, float]], host: list[tuple[float, float, str]], *, min_gap_us: float = 20.0
) -> tuple[list[tuple[float, float]], dict[str, dict[str, float]]]:
    """The GPU's idle gaps (between the union of its kernels' intervals, at least ``min_gap_us``) and,
    for each, the host events in flight at its middle: the time of the gaps by the outermost (longest)
    and by the innermost (shortest) of them, i.e. what the host was doing while the GPU waited."""
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(_merged(kernels)) if b[0] - a[1] >= min_gap_us]
    by: dict[str, dict[str, float]] = {"outermost": defaultdict(float), "innermost": defaultdict(float)}
    events = sorted(host)
    active: list[tuple[float, float, float, str]] = []  # (end, -length, start, name): a heap by end
    i = 0
    for g0, g1 in gaps:  # gaps come in time order
        mid = (g0 + g1) / 2
        while i < len(events) and events[i][0] <= mid:
            start, end, name = events[i]
            heapq.heappush(active, (end, start - end, start, name))
            i += 1
        while active and active[0][0] <= mid:
            heapq.heappop(active)
        if not active:
            by["outermost"]["(nothing recorded)"] += g1 - g0
            by["innermost"]["(nothing recorded)"] += g1 - g0
            continue
        outer = min(active, key=lambda e: e[1])  # longest
        inner = max(active, key=lambda e: e[1])  # shortest
        by["outermost"][outer[3]] += g1 - g0
        by["innermost"][inner[3]] += g1 - g0
    return gaps, by


def profile_summary(profiler: Any, *, wall: float, steps: int) -> str:
    """What the GPU did during the measured steps: busy fraction, then the costliest kernels and ops.

    Busy time is the union of the device kernels' intervals (overlapping streams count once), so
    ``1 - busy / wall`` is the time the GPU waited for the host. Under DDP/FSDP the computation's
    own union (every kernel but NCCL's) is given too: busy minus it is communication nothing hid,
    and the computation's summed time against one GPU's shows what sharing the SMs cost it.
    """
    from torch.autograd import DeviceType

    events = [e for e in profiler.events() if e.time_range.end > e.time_range.start]
    kernels = [
        (e.time_range.start, e.time_range.end, "nccl" in e.name.lower())
        for e in events
        if e.device_type == DeviceType.CUDA
    ]
    busy_s = _union_us([(a, b) for a, b, _ in kernels]) / 1e6
    compute_s = _union_us([(a, b) for a, b, comm in kernels if not comm]) / 1e6
    compute_sum_s = sum(b - a for a, b, comm in kernels if not comm) / 1e6
    per = max(steps, 1)
    head = (
        f"measured steps: {steps}, wall {wall:.3f} s ({wall / per:.3f} s/step), "
        f"GPU kernels {len(kernels)} ({len(kernels) / per:.0f}/step), "
        f"busy {busy_s:.3f} s = {busy_s / wall:.1%} of wall\n"
        f"per step: computation (kernels other than NCCL's) busy {compute_s / per * 1e3:.1f} ms "
        f"(their summed time {compute_sum_s / per * 1e3:.1f} ms), communication alone "
        f"{(busy_s - compute_s) / per * 1e3:.1f} ms, GPU idle {(wall - busy_s) / per * 1e3:.1f} ms\n\n"
        if wall > 0
        else ""
    )
    host = [(e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CPU]
    gaps, by = idle_gaps([(a, b) for a, b, _ in kernels], host)
    idle = (
        f"GPU idle gaps of 20 us or more: {len(gaps) / per:.0f}/step, "
        f"{sum(b - a for a, b in gaps) / per / 1e3:.1f} ms/step; the host meanwhile (ms/step):\n"
    )
    for kind, spent in by.items():
        top = sorted(spent.items(), key=lambda kv: -kv[1])[:12]
        idle += f"  by the {kind} host event in flight:\n" + "".join(
            f"    {us / per / 1e3:8.2f}  {name[:110]}\n" for name, us in top
        )
    averages = profiler.key_averages()
    by_device = averages.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90)
    by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=90)
    return head + idle + "\nby device time\n" + by_device + "\n\nby host time\n" + by_cpu + "\n"


def _compile_diagnostics() -> dict[str, Any]:
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


def _compiled_graphs() -> int | None:
    try:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])
    except Exception:  # a private counter: a diagnostic, never a failure
        return None


def _liger_version() -> dict[str, str]:
    try:
        from importlib.metadata import version

        return {"liger-kernel": version("liger-kernel")}
    except Exception:
        return {}


# --- the whole benchmark ---------------------------------------------------------------------------


def _ratio_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kubetune row against its notebook (one GPU each) and each multi-GPU row against one GPU."""

    def plain(r: dict[str, Any]) -> bool:
        return (
            r.get("gpus", 1) == 1
            and not r.get("epoch_training_seconds")
            and not r.get("memory_cap_gib")
            and r.get("fp8", "off") == "off"
            and not r.get("notebook_step_rows")
            and not r.get("training_overrides")
        )

    rows = []
    for r in results:
        row = dict(r)
        if r.get("gpus", 1) > 1:
            single = next(
                (
                    b
                    for b in results
                    if plain(b)
                    and b["model"] == r["model"]
                    and b["kind"] == r["kind"]
                    and b["tokens_per_second"]
                ),
                None,
            )
            if single:
                row["scaling"] = round(r["tokens_per_second"] / single["tokens_per_second"], 2)
        elif not r.get("epoch_training_seconds"):
            base_kind = BASELINE.get(r["kind"])
            base = next(
                (b for b in results if plain(b) and b["model"] == r["model"] and b["kind"] == base_kind), None
            )
            if base and base["tokens_per_second"]:
                row["speedup"] = round(r["tokens_per_second"] / base["tokens_per_second"], 2)
                if base.get("peak_memory_gib") and r.get("peak_memory_gib"):
                    row["memory_ratio"] = round(r["peak_memory_gib"] / base["peak_memory_gib"], 2)
        rows.append(row)
    return rows


def markdown_table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| case | GPUs | tokens/s | tokens a step (all GPUs) | step s | peak GiB (per GPU) | MFU | vs notebook "
        "| memory vs notebook | vs 1 GPU |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]

    def ratio(value: Any) -> str:
        return f"{value}x" if value else "—"

    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "n/a"
        cap = f" (cap {r['memory_cap_gib']:g} GiB)" if r.get("memory_cap_gib") else ""
        per_step = f"{r['tokens'] / r['steps_measured']:,.0f}" if r.get("steps_measured") else "n/a"
        lines.append(
            f"| {r['case']}{cap} | {r.get('gpus', 1)} | {r['tokens_per_second']:,.0f} | {per_step} "
            f"| {r['step_seconds']:.3f} "
            f"| {mem} | {mfu} | {ratio(r.get('speedup'))} | {ratio(r.get('memory_ratio'))} "
            f"| {ratio(r.get('scaling'))} |"
        )
    for r in rows:
        if r.get("epoch_training_seconds"):
            lines.append(
                f"\nOne epoch of {r['tokens']:,} tokens ({r['case']}): {r['steps_measured']} optimizer steps "
                f"in {r['epoch_training_seconds']:.1f} s of training (trainer.train(), compilation included)."
            )
        if r.get("compile_error"):
            lines.append(
                f"\n{r['case']}: the compiled run failed ({r['compile_error']}); measured uncompiled."
            )
    return "\n".join(lines) + "\n"


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        r["case"] + (f"\n(cap {r['memory_cap_gib']:g} GiB)" if r.get("memory_cap_gib") else "") for r in rows
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = ["#999999" if r["kind"].startswith("notebook") else "#2a7ab9" for r in rows]
    ax1.bar(range(len(rows)), [r["tokens_per_second"] for r in rows], color=colors)
    ax1.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("training tokens / s (real tokens)")
    for i, r in enumerate(rows):
        if r.get("speedup"):
            ax1.text(i, r["tokens_per_second"], f"{r['speedup']}x", ha="center", va="bottom", fontsize=9)
    ax2.bar(range(len(rows)), [r.get("peak_memory_gib") or 0 for r in rows], color=colors)
    ax2.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("peak GPU memory (GiB)")
    fig.suptitle("kubetune defaults (blue) vs the notebooks' configurations (grey), same GPU, model and data")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


@dataclass(frozen=True)
class Job:
    """One benchmark process: a case, optionally capped, on ``gpus`` GPUs, or one whole epoch."""

    case: str
    cap: float | None = None
    gpus: int = 1
    epoch_tokens: int | None = None
    sharding: str | None = None  # forced (KUBETUNE_SHARDING) instead of the plan's choice
    fp8: bool = False  # KUBETUNE_FP8=tensorwise (opt-in float8 products)
    notebook_steps: bool = False  # the notebook's tokens an optimizer step (notebook_step_rows)
    # capped at the peak memory its notebook case reached in the same output folder
    notebook_memory: bool = False
    # spec.training fields set for a kubetune case (camelCase name, value), e.g. gradientCheckpointing
    training: tuple[tuple[str, str], ...] = ()

    @property
    def stem(self) -> str:
        name = self.case.replace(":", "_")
        name += "_nbmem" if self.notebook_memory else ("_cap" if self.cap else "")
        name += f"_x{self.gpus}" if self.gpus > 1 else ""
        name += f"_{self.sharding}" if self.sharding else ""
        name += "_fp8" if self.fp8 else ""
        name += "_nbsteps" if self.notebook_steps else ""
        name += "".join(f"_{key}-{value}" for key, value in self.training)
        return name + ("_epoch" if self.epoch_tokens else "")


def notebook_of(case: str) -> str:
    """The notebook case a kubetune case is compared with: ``qwen3-4b:kubetune`` -> ``qwen3-4b:notebook-b``."""
    model, kind = CASES[case]
    return next(c for c, (m, k) in CASES.items() if m == model and k == BASELINE[kind])


def notebook_peak_gib(out: Path, case: str) -> float | None:
    """The peak GPU memory (GiB) the case's notebook reached in ``out`` (its JSON), or None."""
    path = out / f"{notebook_of(case).replace(':', '_')}.json"
    if not path.exists():
        return None
    peak = json.loads(path.read_text()).get("peak_memory_gib")
    return float(peak) if peak else None


def parse_training_overrides(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--training KEY=VALUE`` items, each checked against the FineTuneJob's ``spec.training`` fields.

    >>> parse_training_overrides(["gradientCheckpointing=always", "tokensPerStep=32768"])
    (('gradientCheckpointing', 'always'), ('tokensPerStep', '32768'))
    >>> parse_training_overrides(["batch=3"])
    Traceback (most recent call last):
    ...
    ValueError: --training batch=3: spec.training has no field 'batch'
    """
    from kubetune_api.spec import TrainingSpec

    fields = {f.alias or name for name, f in TrainingSpec.model_fields.items()}
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"--training {item}: expected KEY=VALUE (a spec.training field, camelCase)")
        if key not in fields:
            raise ValueError(f"--training {item}: spec.training has no field {key!r}")
        pairs.append((key, value))
    return tuple(pairs)


def apply_training_overrides(training: Any, pairs: tuple[tuple[str, str], ...]) -> Any:
    """A copy of ``training`` (a TrainingSpec) with the pairs set, validated as the API server would."""
    from kubetune_api.spec import TrainingSpec

    if not pairs:
        return training
    data = training.model_dump(by_alias=True, exclude_none=True)
    data.update(dict(pairs))
    return TrainingSpec.model_validate(data)


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _command(job: Job, target: Path, *, warmup: int, steps: int, rows: int, extra: list[str]) -> list[str]:
    one = ["--one", job.case, "--json", str(target), "--warmup", str(warmup), "--steps", str(steps)]
    one += ["--rows", str(rows), *extra]
    if job.cap:
        one += ["--memory-cap-gib", str(job.cap)]
    if job.epoch_tokens:
        one += ["--epoch-tokens", str(job.epoch_tokens)]
    if job.notebook_steps:
        one += ["--notebook-steps"]
    for key, value in job.training:
        one += ["--training", f"{key}={value}"]
    if job.gpus == 1:
        return [sys.executable, "-m", "kubetune_bench", *one]
    # exactly as a PyTorchJob pod starts the trainer: the launcher (torchrun in process)
    launch = [sys.executable, "-m", "kubetune_trainer.launch", "--nproc_per_node", str(job.gpus)]
    launch += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    return [*launch, "-m", "kubetune_bench", *one]


def job_env(job: Job, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a job's process: the caller's, with the job's own tuning variables.

    A float8 setting or memory cap left in the caller's environment would change every row (and
    drop their baselines without a word): only the jobs that ask for them get them (the capped
    job's process sets its cap itself, from ``--memory-cap-gib``).
    """
    env = dict(os.environ if base is None else base)
    # dynamo says in the case's log why it recompiled, if it does
    env.setdefault("TORCH_LOGS", "recompiles")
    env.pop(FP8_ENV, None)
    env.pop(GPU_MEMORY_ENV, None)
    if job.sharding:
        env[SHARDING_ENV] = job.sharding
    if job.fp8:
        env[FP8_ENV] = "tensorwise"
    return env


def run_job(job: Job, out: Path, *, warmup: int, steps: int, rows: int, extra: list[str]) -> dict[str, Any]:
    """Run one job in its own process(es); a kubetune case whose compiled run fails is rerun uncompiled."""
    target = out / f"{job.stem}.json"
    log_path = out / f"{job.stem}.log"
    print(f"[bench] {job.stem}", flush=True)
    started = time.monotonic()
    if job.notebook_memory:
        cap = notebook_peak_gib(out, job.case)
        if cap is None:
            failure = f"no {notebook_of(job.case)} result with a peak memory in {out}: run that case first"
            print(f"[bench] {job.stem} failed ({failure})", flush=True)
            return {"case": job.stem, "error": failure, "memory_cap_gib": None}
        job = replace(job, cap=cap)
    attempts = [extra]
    # (uncompiled, a float8 case would run without float8: the plan needs compiled layers)
    if CASES[job.case][1].startswith("kubetune") and "--compile" not in extra and not job.fp8:
        attempts.append([*extra, "--no-compile"])
    failure = ""
    for attempt in attempts:
        with log_path.open("a") as log:
            cmd = _command(job, target, warmup=warmup, steps=steps, rows=rows, extra=attempt)
            proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=job_env(job))
        if proc.returncode == 0 and target.exists():
            result: dict[str, Any] = json.loads(target.read_text())
            if failure:
                result["compile_error"] = failure
                target.write_text(json.dumps(result, indent=2))
            print(
                f"[bench] {job.stem}: {result['tokens_per_second']:,.0f} tokens/s, "
                f"{result['peak_memory_gib']} GiB, MFU {result['mfu']} ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            return result
        tail = log_path.read_text().strip().splitlines()[-3:]
        failure = f"exit {proc.returncode}: " + " | ".join(tail)
        print(f"[bench] {job.stem} failed ({failure})", flush=True)
        if "OutOfMemoryError" in failure:
            break  # memory, not compilation: uncompiled it would not fit either
    return {"case": job.stem, "error": failure, "memory_cap_gib": job.cap}


def report(out: Path, failed: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """bench.json, bench.md and bench.png from every case result in ``out`` (one run, possibly on several GPUs)."""
    results = [
        json.loads(p.read_text())
        for p in sorted(out.glob("*.json"))
        if p.name != "bench.json" and p.name.startswith(tuple(c.replace(":", "_") for c in CASES))
    ]
    order = {c: i for i, c in enumerate(CASES)}
    results.sort(key=lambda r: (order.get(r["case"].split(" ")[0], 99), r.get("gpus", 1), r["case"]))
    rows_out = _ratio_rows(results)
    (out / "bench.json").write_text(json.dumps({"results": rows_out, "failed": failed or []}, indent=2))
    (out / "bench.md").write_text(markdown_table(rows_out))
    if rows_out:
        chart(rows_out, out / "bench.png")
    print(markdown_table(rows_out))
    return rows_out


def run_all(
    jobs: list[Job],
    out: Path,
    *,
    warmup: int,
    steps: int,
    rows: int,
    compile_model: bool = False,
    peak_tflops: float | None,
    profile: bool = False,
) -> list[dict[str, Any]]:
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--compile"] if compile_model else []
    extra += ["--profile"] if profile else []
    if peak_tflops:
        extra += ["--peak-tflops", str(peak_tflops)]
    results = [run_job(job, out, warmup=warmup, steps=steps, rows=rows, extra=extra) for job in jobs]
    failed = [r for r in results if "error" in r]
    ok = report(out, failed)
    return ok if not failed else []


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kubetune bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for bench.json/.md/.png")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run on the tiny model")
    p.add_argument("--cases", help=f"comma-separated cases (default: {','.join(GPU_CASES)})")
    p.add_argument("--warmup", type=int, default=None, help="optimizer steps before measuring")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps measured")
    p.add_argument("--rows", type=int, default=None, help="synthetic conversations")
    p.add_argument(
        "--memory-cap-gib",
        type=float,
        default=None,
        help="also run the kubetune full case with the GPU capped at this many GiB",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s for MFU")
    p.add_argument("--compile", action="store_true", help="kubetune cases with torch.compile forced on")
    p.add_argument("--no-compile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--gpus",
        default="1",
        help="comma-separated GPU counts to run the cases on (kubetune cases on N > 1 GPUs go through the "
        "PyTorchJob's torchrun launcher; notebook cases run on 1); 0: only the --memory-cap-gib runs (in "
        "float8 too with --fp8), the --notebook-memory runs and the --epoch-tokens run",
    )
    p.add_argument(
        "--epoch-tokens",
        type=int,
        default=None,
        help="also train Qwen2-0.5B LoRA (kubetune) for one whole epoch of this many tokens (Capybara: 12000000)",
    )
    p.add_argument("--report-only", action="store_true", help="only rebuild bench.json/.md/.png from --out")
    p.add_argument(
        "--sharding",
        choices=["ddp", "fsdp2"],
        default=None,
        help="force the multi-GPU strategy of the --gpus N > 1 runs (default: the plan's choice)",
    )
    p.add_argument(
        "--fp8",
        action="store_true",
        help="also run the kubetune full-fine-tuning cases with KUBETUNE_FP8=tensorwise (one GPU; with "
        "--memory-cap-gib, capped too)",
    )
    p.add_argument(
        "--notebook-steps",
        action="store_true",
        help="also run each kubetune case (one GPU) with its notebook's tokens an optimizer step: as many "
        "packed rows as the notebook's unpacked sequences fill (the examples' batch counts packed rows)",
    )
    p.add_argument(
        "--notebook-memory",
        action="store_true",
        help="also run each kubetune case (one GPU) with the GPU capped at the peak memory its notebook case "
        "reached in --out (run the notebook cases first, in this call or an earlier one into the same --out)",
    )
    p.add_argument(
        "--training",
        action="append",
        metavar="KEY=VALUE",
        help="set a spec.training field (camelCase) in every kubetune case of this call, e.g. "
        "gradientCheckpointing=always or tokensPerStep=32768 (repeatable; the rows are named after them)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="write <case>.profile.txt per case (and rank): torch.profiler over the measured steps",
    )
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def plan_jobs(args: argparse.Namespace, cases: list[str], training: tuple[tuple[str, str], ...]) -> list[Job]:
    """The processes a ``kubetune bench`` call runs, in order (notebook cases before the kubetune
    cases capped at their memory, when both are asked in one call and listed in that order)."""
    kubetune = [c for c in cases if CASES[c][1].startswith("kubetune")]

    def job(case: str, **kw: Any) -> Job:
        # the overrides are kubetune settings: a notebook case runs as its notebook sets it
        return Job(case, training=training if case in kubetune else (), **kw)

    counts = sorted({int(n) for n in str(args.gpus).split(",") if n.strip()})
    jobs = [job(c) for c in cases] if 1 in counts else []
    jobs += [job(c, gpus=n, sharding=args.sharding) for n in counts if n > 1 for c in kubetune]
    full = [c for c in kubetune if CASES[c][1] == "kubetune-full"]
    if args.memory_cap_gib:
        jobs += [job(c, cap=args.memory_cap_gib) for c in full]
    if args.fp8:
        jobs += [job(c, fp8=True) for c in full if 1 in counts]
        jobs += [job(c, cap=args.memory_cap_gib, fp8=True) for c in full if args.memory_cap_gib]
    if args.notebook_steps:
        jobs += [job(c, notebook_steps=True) for c in kubetune if 1 in counts]
    if args.notebook_memory:
        jobs += [job(c, notebook_memory=True) for c in kubetune]
    if args.epoch_tokens:
        jobs += [job(c, epoch_tokens=args.epoch_tokens) for c in kubetune if CASES[c][1] == "kubetune-lora"]
    return jobs


def run_from_args(args: argparse.Namespace) -> int:
    if args.one:
        result = run_case(
            args.one,
            compile_model=args.compile,
            no_compile=args.no_compile,
            epoch_tokens=args.epoch_tokens,
            warmup=args.warmup,
            steps=args.steps,
            n_rows=args.rows,
            memory_cap_gib=args.memory_cap_gib,
            peak_tflops=args.peak_tflops,
            profile_path=args.json.with_name(
                args.json.stem
                + (f".rank{os.environ.get('RANK', '0')}" if "RANK" in os.environ else "")
                + ".profile.txt"
            )
            if args.profile
            else None,
            notebook_steps=args.notebook_steps,
            training_overrides=parse_training_overrides(args.training),
        )
        if int(os.environ.get("RANK", "0")) == 0:
            args.json.write_text(json.dumps(asdict(result), indent=2))
        from kubetune_trainer.train import close_process_group

        close_process_group()
        return 0
    if args.report_only:
        return 0 if report(args.out) else 1
    smoke = args.smoke
    cases = args.cases.split(",") if args.cases else (SMOKE_CASES if smoke else GPU_CASES)
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    warmup = args.warmup if args.warmup is not None else (1 if smoke else 2)
    steps = args.steps if args.steps is not None else (2 if smoke else 4)
    rows = args.rows if args.rows is not None else (300 if smoke else 1500)
    try:
        training = parse_training_overrides(args.training)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    jobs = plan_jobs(args, cases, training)
    results = run_all(
        jobs,
        args.out,
        warmup=warmup,
        steps=steps,
        rows=rows,
        peak_tflops=args.peak_tflops,
        compile_model=args.compile,
        profile=args.profile,
    )
    return 0 if len(results) == len(jobs) else 1


if __name__ == "__main__":
    sys.exit(main())
