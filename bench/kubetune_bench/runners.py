"""One benchmark case, in its own process: the model and data, the case's trainer (TRL's SFTTrainer as
its notebook sets it up, or kubetune's own trainer functions on the notebook's FineTuneJob example),
the measured steps and the result.

Diagnostics change a case through ``CaseHooks``, not by replacing this module's functions: ``timing``
builds the step-timing callback (wrap ``measure.timing_callback`` to act at the measured steps) and
``configure`` edits a kubetune case's resolved trainer config before its plan is made::

    def no_dropout(cfg):  # hack/gpu/compile_probe.py
        cfg.spec.lora.dropout = 0.0

    run_case("qwen2-0.5b:kubetune", CaseOptions(warmup=1, steps=2, rows=400), CaseHooks(configure=no_dropout))
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.tuning import FP8_ENV, GPU_MEMORY_ENV, SHARDING_ENV, TuningConfig

from .cases import (
    CASES,
    LORA,
    MAX_LENGTH,
    MODEL_CONFIGS,
    NOTEBOOK_A,
    NOTEBOOK_B,
    CaseResult,
    apply_training_overrides,
    example_path,
    is_kubetune,
    is_lora,
    max_length_of,
)
from .gpu_profile import profile_summary
from .measure import (
    Meter,
    StepTiming,
    TimingFactory,
    compile_diagnostics,
    compiled_graphs,
    progress_callback,
    timing_callback,
    versions,
)
from .peers import (
    SWEEPS,
    check_measured,
    import_unsloth,
    is_peer,
    is_unsloth,
    step_rows,
    trl_best_settings,
    unsloth_settings,
)
from .workload import epoch_rows, flops_per_token, notebook_step_rows, peak_flops, synthetic_dataset


@dataclass(frozen=True)
class CaseOptions:
    """How one case runs: the options ``kubetune bench`` gives each case's process."""

    warmup: int  # optimizer steps before the measured ones
    steps: int  # optimizer steps measured
    rows: int  # synthetic conversations
    memory_cap_gib: float | None = None  # the GPU held to this many GiB (plan and allocator)
    peak_tflops: float | None = None  # the MFU denominator, instead of the plan's table of GPUs
    compile_model: bool = False  # a kubetune case with torch.compile forced on
    no_compile: bool = False  # ... forced off (the rerun of a case whose compiled run failed)
    epoch_tokens: int | None = None  # one whole epoch of this many tokens instead of warm-up + steps
    profile_path: Path | None = None  # torch.profiler's summary of the measured steps goes here
    notebook_steps: bool = False  # a kubetune case at its notebook's tokens an optimizer step
    training_overrides: tuple[tuple[str, str], ...] = ()  # spec.training fields (camelCase, value)
    examples: Path | None = None  # the folder of the FineTuneJob examples (cases.default_examples_dir)
    peer_batch: int | None = None  # a peer's micro-batch (packed rows; None: the first of its sweep)
    peer_attn: str | None = None  # TRL at its best with this attention (None: the best available)


@dataclass(frozen=True)
class CaseHooks:
    """The public hooks of a case, for diagnostics (``hack/gpu``): the defaults are the benchmark's own.

    ``timing``: builds the callback that times the optimizer steps (``measure.timing_callback``'s
    parameters and result). ``configure``: called with a kubetune case's resolved trainer config
    (``kubetune_api.trainer_config.TrainerConfig``) right after it is made from the example, before
    ``--training``, compilation and the plan; it edits the config in place. Notebook cases have none.
    """

    timing: TimingFactory = timing_callback
    configure: Callable[[Any], None] | None = None


@dataclass(frozen=True)
class _Device:
    """Where this process trains: one GPU (its rank's, under torchrun) or the CPU."""

    cuda: bool
    world: int

    @property
    def kind(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()


@dataclass(frozen=True)
class _Case:
    """One case being run: what it is, where, how, and its scratch folder."""

    case: str
    model: str
    kind: str
    device: _Device
    options: CaseOptions
    hooks: CaseHooks
    tmp: Path

    @property
    def total_steps(self) -> int:
        return self.options.warmup + self.options.steps


@dataclass(frozen=True)
class _Built:
    """A case's trainer, ready to train, and what the result says about its setup."""

    trainer: Any
    plan_info: dict[str, Any]
    packing_check: dict[str, Any] | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # a peer's exact settings
    lacks: list[str] = field(default_factory=list)  # what a peer's best lacked here


@dataclass(frozen=True)
class _Measured:
    """What training a case measured (tokens and context summed over every GPU)."""

    tokens: int
    context_sum: float
    seconds: float
    train_seconds: float
    steps: int
    timing: StepTiming


def _device(memory_cap_gib: float | None) -> _Device:
    """This process's device, held to ``memory_cap_gib`` as the trainer holds it."""
    import torch

    cuda = torch.cuda.is_available()
    if cuda:
        # under torchrun each process trains on its own GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if cuda and memory_cap_gib:
        # the plan and PyTorch's allocator, both held to the cap, as the trainer does it
        from kubetune_trainer.plan.plan import limit_gpu_memory

        os.environ[GPU_MEMORY_ENV] = str(memory_cap_gib)
        limit_gpu_memory()
    return _Device(cuda=cuda, world=int(os.environ.get("WORLD_SIZE", "1")))


def _tokenizer(vocab: int) -> Any:
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
    """The model from its published config with random weights (nothing is downloaded)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kubetune_trainer.training import varlen

    if attn == varlen.NAME:
        varlen.register(TuningConfig.from_env().varlen_kernel)
    config = AutoConfig.for_model(**dict(MODEL_CONFIGS[model_name]))
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn)
    model.config.use_cache = False
    return model


def kubetune_config(
    kind: str,
    model_dir: str,
    data_dir: str,
    steps: int,
    out: str,
    *,
    step_rows: int | None = None,
    examples: Path | None = None,
) -> Any:
    """The notebook's FineTuneJob example, pointed at the benchmark model and data, on one GPU
    (``step_rows``: that many packed rows an optimizer step instead of the example's batch;
    ``examples``: the examples' folder, ``cases.default_examples_dir()`` when None)."""
    from kubetune_api.trainer_config import load_manifest, resolve

    job = load_manifest(example_path(kind, examples))
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


def _case_data(model: str, kind: str, options: CaseOptions) -> tuple[Any, int | None]:
    """The case's synthetic conversations, and its packed rows a step when it takes its notebook's."""
    cut = max_length_of(model)
    rows = epoch_rows(options.epoch_tokens, cut) if options.epoch_tokens else options.rows
    dataset = synthetic_dataset(rows, MODEL_CONFIGS[model]["vocab_size"], seed=0, max_length=cut)
    step_rows = None
    if options.notebook_steps and is_kubetune(kind):
        step_rows = notebook_step_rows(kind, [len(x) for x in dataset["input_ids"]], cut)
    return dataset, step_rows


def _notebook_plan_info(settings: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of a notebook's setup, in the plan's own terms."""
    precision = (
        "fp16-amp/fp32-weights" if settings.get("fp16") else ("bf16" if settings.get("bf16") else "fp32")
    )
    return {
        "precision": precision,
        "packing": False,
        "gradient_checkpointing": True,
        "liger": bool(settings.get("use_liger_kernel")),
        "per_device_batch_size": settings["per_device_train_batch_size"],
        "gradient_accumulation_steps": settings["gradient_accumulation_steps"],
    }


def _notebook_trainer(ctx: _Case, dataset: Any, tokenizer: Any) -> _Built:
    """TRL's SFTTrainer configured exactly as the case's notebook does it."""
    import torch
    from trl import SFTConfig, SFTTrainer

    cuda = ctx.device.cuda
    settings: dict[str, Any] = dict(NOTEBOOK_A if ctx.kind == "notebook-a" else NOTEBOOK_B)
    if not cuda:  # CPU smoke: same shape, no mixed precision or Triton kernels
        settings.update(fp16=False, bf16=False, use_liger_kernel=False)
    # A loads in the default fp32; B asks for bf16 weights.
    dtype = torch.bfloat16 if (ctx.kind == "notebook-b" and cuda) else torch.float32
    model = _build_model(ctx.model, dtype, "sdpa", ctx.device.kind)
    peft = _lora_config(LORA) if is_lora(ctx.kind) else None
    args = SFTConfig(
        output_dir=str(ctx.tmp / "out"),
        max_steps=ctx.total_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        max_length=max_length_of(ctx.model),
        use_cpu=not cuda,
        disable_tqdm=True,
        **settings,
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
    )
    return _Built(trainer, _notebook_plan_info(settings))


def _kubetune_trainer_config(ctx: _Case, dataset: Any, step_rows: int | None) -> Any:
    """The case's resolved trainer config: the example, the hooks' and the call's changes."""
    from kubetune_api.spec import Toggle

    data_dir = ctx.tmp / "data"
    data_dir.mkdir()
    dataset.to_json(str(data_dir / "train.jsonl"))
    options = ctx.options
    tcfg = kubetune_config(
        ctx.kind,
        str(ctx.tmp / "model"),
        str(data_dir),
        ctx.total_steps,
        str(ctx.tmp / "out"),
        step_rows=step_rows,
        examples=options.examples,
    )
    if max_length_of(ctx.model) != MAX_LENGTH:  # the tiny model's shorter conversations
        tcfg.spec.training.max_length = max_length_of(ctx.model)
    if ctx.hooks.configure is not None:
        ctx.hooks.configure(tcfg)
    if options.epoch_tokens:
        tcfg.spec.training.max_steps, tcfg.spec.training.epochs = None, 1
    tcfg.spec.training = apply_training_overrides(tcfg.spec.training, options.training_overrides)
    if options.compile_model:
        tcfg.spec.training.torch_compile = Toggle.ALWAYS
    if options.no_compile:
        tcfg.spec.training.torch_compile = Toggle.NEVER
    return tcfg


def _kubetune_trainer(ctx: _Case, dataset: Any, tokenizer: Any, step_rows: int | None) -> _Built:
    """kubetune's own functions (plan, model dtype and attention, SFT config, trainer) on the example."""
    import torch

    from kubetune_trainer.plan.plan import Hardware, make_plan, shape_from_config
    from kubetune_trainer.training import build as trainer_module

    tcfg = _kubetune_trainer_config(ctx, dataset, step_rows)
    shape = shape_from_config(MODEL_CONFIGS[ctx.model])
    tuning = TuningConfig.from_env()  # the job's own tuning variables (jobs.job_env)
    plan = make_plan(
        tcfg.spec.training, Hardware.detect(tuning), shape=shape, lora=is_lora(ctx.kind), tuning=tuning
    )
    model = _build_model(
        ctx.model, getattr(torch, plan.dtype_name), plan.attn_implementation, ctx.device.kind
    )
    args = trainer_module.build_sft_config(tcfg, plan, has_eval=False, progress_bar=False, tuning=tuning)
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
    packing_check = None
    # (the check's unpacked forward holds all 16 examples' logits at once: a capped case
    # leaves it to its uncapped row, which checks the same packing)
    options = ctx.options
    if ctx.device.cuda and ctx.device.world == 1 and not options.epoch_tokens and not options.memory_cap_gib:
        from kubetune_trainer.training.fast import check_packing_exact

        packing_check = check_packing_exact(trainer.model, dataset[:16]["input_ids"])
    return _Built(trainer, plan.as_dict(), packing_check)


def _peer_example(ctx: _Case) -> tuple[Any, dict[str, Any] | None, int]:
    """What a peer trains: its kubetune case's example (training settings, LoRA, rows a step)."""
    from kubetune_api.trainer_config import load_manifest

    spec = load_manifest(example_path(ctx.kind, ctx.options.examples)).spec
    lora: dict[str, Any] | None = None
    if is_lora(ctx.kind):
        if spec.lora is None:
            raise ValueError(f"{ctx.case}: its example has no spec.lora")
        lora = {
            "r": spec.lora.r,
            "alpha": spec.lora.alpha,
            "dropout": spec.lora.dropout,
            "targets": list(spec.lora.target_modules),
        }
    return spec.training, lora, step_rows(spec.training)


def _peer_plan_info(settings: dict[str, Any]) -> dict[str, Any]:
    """What the table shows of a peer's setup, in the plan's own terms."""
    sft = settings["sft"]
    return {
        "precision": "bf16" if sft.get("bf16") else "fp32",
        "packing": bool(sft.get("packing")),
        "gradient_checkpointing": bool(sft.get("gradient_checkpointing")),
        "liger": bool(sft.get("use_liger_kernel")),
        "per_device_batch_size": sft["per_device_train_batch_size"],
        "gradient_accumulation_steps": sft["gradient_accumulation_steps"],
        "attn_implementation": settings.get("attn_implementation", ""),
    }


def _peer_batch(ctx: _Case) -> int:
    return ctx.options.peer_batch or SWEEPS[ctx.kind][0]


def _trl_best_trainer(ctx: _Case, dataset: Any, tokenizer: Any) -> _Built:
    """TRL's SFTTrainer with every speed option it offers (kubetune_bench.peers.trl_best_settings)."""
    import torch
    from trl import SFTConfig, SFTTrainer

    training, lora, rows = _peer_example(ctx)
    cuda = ctx.device.cuda
    settings = trl_best_settings(
        training,
        batch=_peer_batch(ctx),
        rows=rows,
        max_length=max_length_of(ctx.model),
        attn=ctx.options.peer_attn,
        cuda=cuda,
    )
    model = _build_model(
        ctx.model, getattr(torch, settings["dtype"]), settings["attn_implementation"], ctx.device.kind
    )
    peft = None
    if lora is not None:
        peft = _lora_config(lora)
        settings["lora"] = lora
    args = SFTConfig(
        output_dir=str(ctx.tmp / "out"),
        max_steps=ctx.total_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=not cuda,
        disable_tqdm=True,
        **settings["sft"],
    )
    trainer = SFTTrainer(
        model=model, args=args, train_dataset=dataset, processing_class=tokenizer, peft_config=peft
    )
    return _Built(trainer, _peer_plan_info(settings), settings=settings, lacks=settings.pop("lacks"))


def _unsloth_attention() -> tuple[dict[str, Any], list[str]]:
    """Which attention kernels Unsloth found (its own flags) and which packed backend it picks, and
    what it lacked: FlashAttention-2 (PyPI ships flash-attn's source only) or a loadable xformers."""
    found: dict[str, Any] = {}
    try:
        from unsloth.models import _utils as unsloth_utils  # type: ignore[import-not-found]
        from unsloth.utils import attention_dispatch  # type: ignore[import-not-found]

        found = {
            "flash_attn_2": bool(unsloth_utils.HAS_FLASH_ATTENTION),
            "xformers": bool(attention_dispatch.HAS_XFORMERS),
            "torch_varlen": getattr(attention_dispatch, "_TORCH_VARLEN_ATTN", None) is not None,
            "packed_backend": str(attention_dispatch.select_attention_backend(use_varlen=True)),
        }
    except (ImportError, AttributeError) as err:  # Unsloth's internals: a diagnostic, never a failure
        found = {"unknown": str(err)}
    lacks = []
    if found.get("flash_attn_2") is False:
        lacks.append(
            "FlashAttention-2: flash-attn is not installed (PyPI ships its source only; no build here)"
        )
    if found.get("xformers") is False:
        lacks.append("xformers: not installed or does not load with this torch")
    return found, lacks


def _unsloth_trainer(ctx: _Case, dataset: Any, tokenizer: Any) -> _Built:
    """Unsloth's FastLanguageModel and SFTTrainer at their best here (kubetune_bench.peers.unsloth_settings).

    The model is the same random-weights model as the other cases', saved to the case's scratch
    folder for Unsloth's loader (it loads from a path).
    """
    import torch
    from trl import SFTConfig, SFTTrainer
    from unsloth import FastLanguageModel  # type: ignore[import-not-found]

    cuda = ctx.device.cuda
    training, lora, rows = _peer_example(ctx)
    settings = unsloth_settings(
        training, lora, batch=_peer_batch(ctx), rows=rows, max_length=max_length_of(ctx.model), cuda=cuda
    )
    model_dir = ctx.tmp / "model"
    dtype = getattr(torch, settings["load"]["dtype"])
    base = _build_model(ctx.model, dtype, "sdpa", ctx.device.kind)
    base.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    del base
    if cuda:
        torch.cuda.empty_cache()
    load = dict(settings["load"], dtype=dtype)
    model, _ = FastLanguageModel.from_pretrained(model_name=str(model_dir), **load)
    if settings["peft"] is not None:
        model = FastLanguageModel.get_peft_model(model, **settings["peft"])
    args = SFTConfig(
        output_dir=str(ctx.tmp / "out"),
        max_steps=ctx.total_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=not cuda,
        **settings["sft"],
    )
    trainer = SFTTrainer(model=model, args=args, train_dataset=dataset, processing_class=tokenizer)
    attention, lacks = _unsloth_attention()
    settings["unsloth_attention"] = attention
    settings["attn_implementation"] = f"unsloth {attention.get('packed_backend', '?')}"
    return _Built(trainer, _peer_plan_info(settings), settings=settings, lacks=lacks)


def _profiler(ctx: _Case) -> Any:
    """torch.profiler over the measured steps, when asked (never over a whole epoch)."""
    if ctx.options.profile_path is None or ctx.options.epoch_tokens:
        return None
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.device.cuda else [])
    return profile(activities=activities)


def _train(ctx: _Case, built: _Built) -> _Measured:
    """Train the case, counting real tokens and timing the measured steps (or the whole epoch)."""
    import torch

    options, device = ctx.options, ctx.device
    meter = Meter()
    trained: Any = built.trainer.model
    inner = trained.get_base_model() if hasattr(trained, "get_base_model") else trained
    inner.register_forward_pre_hook(meter.hook, with_kwargs=True)
    profiler = _profiler(ctx)
    timing = ctx.hooks.timing(meter, options.warmup, device.sync, profiler)
    built.trainer.add_callback(timing)
    built.trainer.add_callback(progress_callback(time.perf_counter()))
    if device.cuda:
        torch.cuda.reset_peak_memory_stats()
    if options.epoch_tokens:
        meter.active = True
    train_started = time.perf_counter()
    built.trainer.train()
    device.sync()
    train_seconds = time.perf_counter() - train_started
    counts = torch.tensor([float(meter.tokens), float(meter.context)], device=device.kind)
    if device.world > 1:
        import torch.distributed as dist

        dist.all_reduce(counts)  # every GPU's tokens
    if profiler is not None and options.profile_path is not None and timing.end is not None:
        options.profile_path.write_text(
            profile_summary(profiler, wall=timing.end - (timing.start or timing.end), steps=options.steps)
        )
    if options.epoch_tokens:
        seconds = train_seconds
    else:
        seconds = (timing.end or time.perf_counter()) - (timing.start or time.perf_counter())
    steps = built.trainer.state.global_step if options.epoch_tokens else options.steps
    done = built.trainer.state.global_step - (0 if options.epoch_tokens else options.warmup)
    measured_seconds = seconds if timing.start is not None or options.epoch_tokens else 0.0
    check_measured(ctx.case, tokens=int(counts[0]), steps=max(0, min(done, steps)), seconds=measured_seconds)
    return _Measured(int(counts[0]), float(counts[1]), seconds, train_seconds, steps, timing)


def _label(ctx: _Case, plan_info: dict[str, Any], step_rows: int | None) -> tuple[str, str]:
    """The row's name (the case and what sets it apart from the plain one) and its float8 recipe."""
    options, world, kubetune = ctx.options, ctx.device.world, is_kubetune(ctx.kind)
    label = ctx.case + (f" x{world} GPUs" if world > 1 else "") + (" epoch" if options.epoch_tokens else "")
    if os.environ.get(SHARDING_ENV) and world > 1:
        label += f" ({plan_info.get('sharding')}, forced)"
    if options.no_compile and kubetune:
        label += " (no compile)"
    if step_rows:
        label += f" (notebook's step: {step_rows} rows)"
    if options.training_overrides and kubetune:
        label += " (" + ", ".join(f"{k}={v}" for k, v in options.training_overrides) + ")"
    if is_peer(ctx.kind):
        label += (
            f" (batch {plan_info['per_device_batch_size']} x {plan_info['gradient_accumulation_steps']}, "
            f"{plan_info['attn_implementation']})"
        )
    fp8 = str(plan_info.get("fp8", "off"))
    if fp8 != "off":
        label += f" (fp8 {fp8})"
    elif kubetune and os.environ.get(FP8_ENV, "off") not in ("", "off"):
        fp8 = "asked, off"  # the plan's reason says why; not a bf16 baseline either
        label += " (fp8 asked: off)"
    return label, fp8


def _result(ctx: _Case, built: _Built, measured: _Measured, step_rows: int | None) -> CaseResult:
    """The case's row: throughput, memory, MFU and what the run was."""
    import torch

    options, cuda, world = ctx.options, ctx.device.cuda, ctx.device.world
    tokens, seconds, steps = measured.tokens, measured.seconds, measured.steps
    mean_context = measured.context_sum / tokens if tokens else 0.0
    fpt = flops_per_token(MODEL_CONFIGS[ctx.model], lora=is_lora(ctx.kind), mean_context=mean_context)
    name = torch.cuda.get_device_name(0) if cuda else "cpu"
    peak = peak_flops(name, options.peak_tflops) if cuda else None
    tps = tokens / seconds if seconds > 0 else 0.0
    label, fp8 = _label(ctx, built.plan_info, step_rows)
    return CaseResult(
        case=label,
        model=ctx.model,
        kind=ctx.kind,
        steps_measured=steps,
        seconds=round(seconds, 3),
        tokens=tokens,
        tokens_per_second=round(tps, 1),
        step_seconds=round(seconds / steps, 4),
        peak_memory_gib=round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
        # per GPU: the FLOP/s of all GPUs over all their peaks
        mfu=round(tps * fpt / (peak * world), 4) if peak else None,
        flops_per_token=fpt,
        losses=measured.timing.losses,
        plan=built.plan_info,
        packing_check=built.packing_check,
        memory_cap_gib=options.memory_cap_gib,
        device=name,
        gpus=world,
        sharding=str(built.plan_info.get("sharding", "none")),
        fp8=fp8,
        training_overrides=dict(options.training_overrides) if is_kubetune(ctx.kind) else {},
        step_times=measured.timing.step_times(),
        compiled_graphs=compiled_graphs(),
        **compile_diagnostics(),
        epoch_training_seconds=round(measured.train_seconds, 1) if options.epoch_tokens else None,
        notebook_step_rows=step_rows,
        versions=versions(),
        settings=built.settings,
        lacks=built.lacks,
    )


def run_case(case: str, options: CaseOptions, hooks: CaseHooks | None = None) -> CaseResult:
    """Train one case in this process and measure it (``kubetune bench`` gives each case its own process:
    Liger patches classes, and GPU memory must start empty)."""
    model_name, kind = CASES[case]
    if is_unsloth(kind):
        import_unsloth()  # before transformers, TRL and PEFT: it patches them as it loads
    device = _device(options.memory_cap_gib)
    with tempfile.TemporaryDirectory(prefix="kubetune-bench-") as tmp_name:
        ctx = _Case(case, model_name, kind, device, options, hooks or CaseHooks(), Path(tmp_name))
        tokenizer = _tokenizer(MODEL_CONFIGS[model_name]["vocab_size"])
        dataset, step_rows = _case_data(model_name, kind, options)
        if is_kubetune(kind):
            built = _kubetune_trainer(ctx, dataset, tokenizer, step_rows)
        elif is_unsloth(kind):
            built = _unsloth_trainer(ctx, dataset, tokenizer)
        elif is_peer(kind):
            built = _trl_best_trainer(ctx, dataset, tokenizer)
        else:
            built = _notebook_trainer(ctx, dataset, tokenizer)
        measured = _train(ctx, built)
        return _result(ctx, built, measured, step_rows)


def _lora_config(lora: dict[str, Any]) -> Any:
    """PEFT's LoraConfig for a LoRA shape of the benchmark (``cases.LORA``'s keys)."""
    from peft import LoraConfig, TaskType

    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora["r"],
        lora_alpha=lora["alpha"],
        lora_dropout=lora["dropout"],
        target_modules=lora["targets"],
        bias="none",
    )
