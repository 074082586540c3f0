"""Issue 34's GPU measurements: QLoRA on Qwen3-4B within a 24 GiB cap beside plain LoRA and TRL +
bitsandbytes, and a small mixture-of-experts model's measured peak memory and tokens/s against the
preparation's estimate. One case a process (GPU memory starts empty), each writing ``<case>.json``:

    python3 hack/gpu/issue34.py qlora --runner kubetune --quant nf4 --out DIR   # kubetune QLoRA
    python3 hack/gpu/issue34.py qlora --runner kubetune --quant none --out DIR  # kubetune LoRA (bf16 base)
    python3 hack/gpu/issue34.py qlora --runner trl --quant nf4 --out DIR        # TRL + bitsandbytes
    python3 hack/gpu/issue34.py moe --out DIR [--no-compile]                    # the MoE case + its estimate
    python3 hack/gpu/issue34.py report --out DIR                                # table, and the loss figure

The QLoRA cases train ``examples/qwen3-4b-qlora-24gb.yaml`` (LoRA r16/alpha 32/dropout 0.05 on every
linear layer, 2 packed rows x 8 a step of 1,024 tokens) on Qwen3-4B built from its published config with
random weights, saved once as bf16 safetensors and loaded back through the real loading path (kubetune:
``training.build.build_model``, which adds transformers' ``BitsAndBytesConfig``; TRL: ``SFTTrainer`` given
the model's folder and the same ``BitsAndBytesConfig``), the process held to ``--cap-gib`` (24) as the
trainer holds it (``KUBETUNE_GPU_MEMORY_GIB``: the plan and PyTorch's allocator). TRL gets kubetune's
plan's micro-batch, accumulation and recomputation, packing (best-fit, padding-free), Liger, fused AdamW
and SDPA attention. Every case logs the loss at every step (the same host sync in all of them).

The data is learnable, so that the loss curves say something with random weights: each conversation
(Capybara-like lengths) repeats a random motif of 8-63 ids drawn from 4,096 (:func:`motif_rows`). Loss
starts near ln(vocab) and falls as the model learns the narrower unigram and the repetition: a sanity
check that QLoRA trains as LoRA does, not a quality result.

The MoE case is Qwen3-30B-A3B's layer (128 experts, 8 a token, 768 wide, hidden 2048) four layers
deep (:data:`MOE_CONFIG`), full fine-tuning through the benchmark's own kubetune case (the
``qwen3-4b-full.yaml`` example: 1 row x 8 a step), beside
:func:`kubetune_trainer.plan.estimate.estimate` for the same job on this GPU's product label.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

QLORA_EXAMPLE = "qwen3-4b-qlora-24gb.yaml"
MOE_MODEL = "qwen3-moe-a3b-4l"
MOE_CASE = f"{MOE_MODEL}:kubetune"
# Qwen3-30B-A3B's published layer, four layers deep: ~3.1B parameters, ~0.85B active a token
MOE_CONFIG: dict[str, Any] = {
    "model_type": "qwen3_moe",
    "vocab_size": 151936,
    "hidden_size": 2048,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "num_hidden_layers": 4,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "output_router_logits": False,
}
TINY_MOE = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "moe_intermediate_size": 32,
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
}
# what the one-line summary a case prints leaves out (its JSON has them)
LONG_KEYS = (
    "losses",
    "step_times",
    "plan",
    "settings",
    "versions",
    "shape",
    "compile_seconds",
    "compile_cache",
    "lacks",
)
MOTIF_SPAN = 4096  # the ids a motif is drawn from (above the special tokens)
MOTIF_LENGTHS = (8, 64)


def motif_rows(lengths: list[int], *, seed: int = 0, vocab: int = 151936) -> list[list[int]]:
    """One row of ``n`` ids for each length: a random motif (8-63 ids out of :data:`MOTIF_SPAN`, above the
    first 16 ids) repeated to ``n``.

    >>> rows = motif_rows([10, 20], seed=1)
    >>> [len(r) for r in rows], all(16 <= i < 16 + MOTIF_SPAN for r in rows for i in r)
    ([10, 20], True)
    >>> motif_rows([5], seed=1, vocab=512)[0] == motif_rows([5], seed=1, vocab=512)[0]
    True
    """
    rng = random.Random(seed)
    span = min(MOTIF_SPAN, vocab - 16)
    rows = []
    for n in lengths:
        motif = [16 + rng.randrange(span) for _ in range(rng.randrange(*MOTIF_LENGTHS))]
        rows.append([motif[i % len(motif)] for i in range(n)])
    return rows


def trl_settings(
    training: Any, plan: dict[str, Any], *, max_length: int, cuda: bool = True
) -> dict[str, Any]:
    """SFTConfig's arguments for TRL + bitsandbytes with kubetune's plan's layout (micro-batch,
    accumulation, recomputation) and the example's hyperparameters; loss logged every step.

    >>> from types import SimpleNamespace as NS
    >>> t = NS(learning_rate=2e-4, weight_decay=None, warmup_steps=20)
    >>> s = trl_settings(t, {"per_device_batch_size": 2, "gradient_accumulation_steps": 8,
    ...     "gradient_checkpointing": True}, max_length=1024)
    >>> s["per_device_train_batch_size"], s["gradient_accumulation_steps"], s["gradient_checkpointing"], s["padding_free"]
    (2, 8, True, True)
    """
    return {
        "per_device_train_batch_size": int(plan["per_device_batch_size"]),
        "gradient_accumulation_steps": int(plan["gradient_accumulation_steps"]),
        "gradient_checkpointing": bool(plan["gradient_checkpointing"]),
        "gradient_checkpointing_kwargs": {"use_reentrant": False},
        "learning_rate": float(training.learning_rate),
        "weight_decay": float(training.weight_decay or 0.0),
        "warmup_steps": int(training.warmup_steps or 0),
        "logging_steps": 1,
        "max_length": max_length,
        "bf16": cuda,
        "packing": True,
        "packing_strategy": "bfd",
        "padding_free": True,
        "use_liger_kernel": cuda,
        "optim": "adamw_torch_fused" if cuda else "adamw_torch",
        "dataloader_pin_memory": cuda,
        "remove_unused_columns": False,
    }


def relative_error(estimated: float | None, measured: float | None) -> float | None:
    """``estimated / measured - 1`` (positive: the estimate is above), rounded; None without both.

    >>> relative_error(11.5, 10.0), relative_error(None, 3.0), relative_error(1.0, 0.0)
    (0.15, None, None)
    """
    if not estimated or not measured:
        return None
    return round(estimated / measured - 1, 4)


# --- the cases (on the device machine) ----------------------------------------------------------------


def _register_moe() -> None:
    """The MoE model and its kubetune case in the benchmark's tables (this process only)."""
    from kubetune_bench import cases, startup

    cases.MODEL_CONFIGS[MOE_MODEL] = dict(MOE_CONFIG)
    cases.CASES[MOE_CASE] = (MOE_MODEL, "kubetune-full")
    startup.ESTIMATED_CASES[MOE_CASE] = "kubetune-full"


def _qlora_config(model_dir: str, out: str, steps: int, quant: str, examples: Path) -> Any:
    """The QLoRA example pointed at the saved model, ``steps`` optimizer steps, one GPU, LoRA's
    quantization as asked (nf4, or none: plain LoRA on the bf16 base)."""
    from kubetune_api.spec import Quantization
    from kubetune_api.trainer_config import load_manifest, resolve

    job = load_manifest(examples / QLORA_EXAMPLE)
    spec = job.spec.model_copy(deep=True)
    spec.model.name, spec.model.path = None, model_dir
    spec.dataset.name, spec.dataset.path, spec.dataset.eval_fraction = None, out, None
    spec.training.epochs, spec.training.max_steps = None, steps
    spec.training.eval_steps, spec.training.save_steps = None, 10**6
    spec.resources.gpus_per_node = 1
    assert spec.lora is not None
    spec.lora.quantization = Quantization(quant)
    job.spec = spec
    return resolve(job, output_dir=out)


def _model_dir(model: str, folder: Path, tokenizer: Any, device: str) -> Path:
    """The model's random bf16 weights saved once (the first case writes them, the others load them)."""
    from kubetune_bench.startup import save_model

    done = folder / "config.json"
    if not done.is_file():
        save_model(folder, model, tokenizer, device)
        if device == "cuda":
            import torch

            torch.cuda.empty_cache()  # (the bf16 model's blocks: the cap is for training)
    return folder


def run_qlora(args: argparse.Namespace) -> dict[str, Any]:
    """One QLoRA/LoRA case: kubetune's trainer or TRL + bitsandbytes, capped, timed."""
    import tempfile

    import torch

    from kubetune_api.tuning import GPU_MEMORY_ENV, TuningConfig
    from kubetune_bench import runners
    from kubetune_bench.cases import MODEL_CONFIGS, max_length_of
    from kubetune_bench.measure import versions
    from kubetune_bench.workload import scaled_lengths
    from kubetune_trainer.plan import estimate as estimating
    from kubetune_trainer.plan.plan import Hardware, make_plan, method_of, shape_from_config

    cuda = torch.cuda.is_available()
    if cuda and args.cap_gib:
        os.environ[GPU_MEMORY_ENV] = str(args.cap_gib)
    device = runners._device(args.cap_gib if cuda else None)
    model, vocab = args.model, MODEL_CONFIGS[args.model]["vocab_size"]
    cut = max_length_of(model)
    tokenizer = runners._tokenizer(vocab)
    from datasets import Dataset

    dataset = Dataset.from_dict(
        {"input_ids": motif_rows(scaled_lengths(args.rows, seed=0, max_length=cut), seed=0, vocab=vocab)}
    )
    model_dir = _model_dir(model, Path(args.model_dir), tokenizer, device.kind)
    case = f"{model}:{args.runner}-{'qlora' if args.quant == 'nf4' else 'lora'}"
    with tempfile.TemporaryDirectory(prefix="issue34-") as tmp:
        total = args.warmup + args.steps
        tcfg = _qlora_config(str(model_dir), tmp, total, args.quant, Path(args.examples))
        if cut != 1024:
            tcfg.spec.training.max_length = cut
        shape = shape_from_config(dict(MODEL_CONFIGS[model]))
        tuning = TuningConfig.from_env()
        plan = make_plan(
            tcfg.spec.training, Hardware.detect(tuning), shape=shape, tuning=tuning, **method_of(tcfg.spec)
        )
        settings: dict[str, Any] = {}
        if args.runner == "kubetune":
            trainer = _kubetune_trainer(tcfg, plan, dataset, tokenizer, tuning)
            plan_info = plan.as_dict()
        else:
            trainer, settings = _trl_trainer(tcfg, plan, model_dir, dataset, tokenizer, tmp, cut, cuda)
            plan_info = {
                **plan.as_dict(),
                "runner": "trl",
                "attn_implementation": "sdpa",
                "torch_compile": False,
            }
        options = runners.CaseOptions(
            warmup=args.warmup, steps=args.steps, rows=args.rows, memory_cap_gib=args.cap_gib
        )
        ctx = runners._Case(case, model, "kubetune-lora", device, options, runners.CaseHooks(), Path(tmp))
        built = runners._Built(trainer, plan_info, settings=settings)
        measured = runners._train(ctx, built)
        micro = plan.per_device_batch_size * tcfg.spec.training.max_length
        est_peak = estimating._peak(shape, plan, micro)
        est_step = estimating.estimate_step_seconds(
            shape,
            tokens=micro,
            micro_steps=plan.gradient_accumulation_steps,
            checkpointing=plan.gradient_checkpointing,
            peak_flops=Hardware.detect(tuning).peak_flops,
        )
    peak = round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None
    reserved = round(torch.cuda.max_memory_reserved() / 2**30, 2) if cuda else None
    tps = measured.tokens / measured.seconds if measured.seconds else 0.0
    est_tps = micro * plan.gradient_accumulation_steps / est_step
    return {
        "case": case,
        "runner": args.runner,
        "quant": args.quant,
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "cap_gib": args.cap_gib,
        "warmup": args.warmup,
        "steps": args.steps,
        "tokens": measured.tokens,
        "seconds": round(measured.seconds, 3),
        "tokens_per_second": round(tps, 1),
        "peak_memory_gib": peak,
        "peak_reserved_gib": reserved,
        "estimated_peak_gib": round(est_peak / 2**30, 2),
        "estimated_tokens_per_second": round(est_tps, 1),
        "peak_error": relative_error(est_peak / 2**30, peak),
        "losses": measured.timing.losses,
        "step_times": measured.timing.step_times(),
        "plan": plan_info,
        "settings": settings,
        "trainable_params": sum(p.numel() for p in trainer.model.parameters() if p.requires_grad),
        "versions": versions(),
    }


def _kubetune_trainer(tcfg: Any, plan: Any, dataset: Any, tokenizer: Any, tuning: Any) -> Any:
    """kubetune's trainer as a pod builds it (the model through the real loading path), loss every step."""
    from kubetune_trainer.training import build

    net = build.build_model(tcfg, plan, varlen_kernel=tuning.varlen_kernel)
    sft = build.build_sft_config(tcfg, plan, has_eval=False, progress_bar=False, tuning=tuning)
    sft.logging_steps = 1
    peft = build.build_peft_config(tcfg)
    return build.build_trainer(
        net, tokenizer, sft, train=dataset, evaluation=None, peft=peft, callbacks=[], plan=plan
    )


def _trl_trainer(
    tcfg: Any, plan: Any, model_dir: Path, dataset: Any, tokenizer: Any, tmp: str, cut: int, cuda: bool
) -> tuple[Any, dict[str, Any]]:
    """TRL's SFTTrainer given the model's folder, the same BitsAndBytesConfig and LoRA."""
    from trl import SFTConfig, SFTTrainer

    from kubetune_trainer.training import build, quantization

    settings = trl_settings(tcfg.spec.training, plan.as_dict(), max_length=cut, cuda=cuda)
    init = {"dtype": "bfloat16" if cuda else "float32", "attn_implementation": "sdpa", "use_cache": False}
    if cuda:
        init["device_map"] = {"": 0}
    sft = SFTConfig(
        output_dir=str(Path(tmp) / "trl"),
        max_steps=tcfg.spec.training.max_steps,
        save_strategy="no",
        eval_strategy="no",
        report_to="none",
        use_cpu=not cuda,
        disable_tqdm=True,
        model_init_kwargs=init,
        **settings,
    )
    bnb = quantization.bnb_config() if plan.nf4 else None
    trainer = SFTTrainer(
        model=str(model_dir),
        args=sft,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=build.build_peft_config(tcfg),
        quantization_config=bnb,
    )
    return trainer, {
        "sft": settings,
        "model_init_kwargs": {k: str(v) for k, v in init.items()},
        "bnb": bnb is not None,
    }


def run_moe(args: argparse.Namespace) -> dict[str, Any]:
    """The MoE case through the benchmark's kubetune case, and the preparation's estimate of it."""
    from dataclasses import asdict

    _register_moe()
    from kubetune_bench import cases, runners, startup

    if args.tiny:  # a CPU check of the path: the same family, tiny
        cases.MODEL_CONFIGS[MOE_MODEL].update(TINY_MOE)
    from kubetune_trainer.plan.plan import shape_from_config

    options = runners.CaseOptions(
        warmup=args.warmup,
        steps=args.steps,
        rows=args.rows,
        no_compile=args.no_compile,
        examples=Path(args.examples),
    )
    result = asdict(runners.run_case(MOE_CASE, options))
    est = startup.estimate_for(
        MOE_CASE,
        rows=args.rows,
        steps=args.warmup + args.steps,
        product=result["device"].replace(" ", "-") if result["device"] != "cpu" else "NVIDIA-H100-80GB-HBM3",
        examples=Path(args.examples),
    ).wire()
    shape = shape_from_config(dict(cases.MODEL_CONFIGS[MOE_MODEL]))
    return {
        **result,
        "estimate": est,
        "shape": asdict(shape),
        "tokens_per_second_error": relative_error(est["tokensPerSecond"], result["tokens_per_second"]),
        "peak_memory_error": relative_error(est["peakMemoryGib"], result["peak_memory_gib"]),
    }


# --- the report (here or there) -------------------------------------------------------------------------


def report(out: Path, figure: Path | None) -> str:
    """The cases' table (markdown) and, with ``figure``, the loss curves of the QLoRA/LoRA cases."""
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    lines = [
        "| case | tokens/s | peak GiB (reserved) | estimated peak GiB | steps | first/last loss |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    for r in results:
        losses = r.get("losses") or []
        est = r.get("estimated_peak_gib") or (r.get("estimate") or {}).get("peakMemoryGib")
        loss = f"{losses[0]:.3f} / {losses[-1]:.3f}" if losses else "—"
        lines.append(
            f"| {r['case']} | {r['tokens_per_second']:,.0f} | {r.get('peak_memory_gib')} ({r.get('peak_reserved_gib', '—')}) "
            f"| {est} | {r.get('steps') or r.get('steps_measured')} | {loss} |"
        )
    if figure is not None:
        _figure([r for r in results if r.get("runner")], figure)
    return "\n".join(lines) + "\n"


def _figure(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in results:
        losses = r.get("losses") or []
        label = f"{r['case']} ({r['tokens_per_second']:,.0f} tokens/s, peak {r.get('peak_memory_gib')} GiB)"
        ax.plot(range(1, len(losses) + 1), losses, label=label)
    ax.set_xlabel("optimizer step (16 packed rows of 1,024 tokens)")
    ax.set_ylabel("training loss")
    cap = next((r.get("cap_gib") for r in results), None)
    ax.set_title(f"Qwen3-4B (random weights), learnable motif data, {cap} GiB cap")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    sub = p.add_subparsers(dest="what", required=True)
    for name in ("qlora", "moe", "report"):
        s = sub.add_parser(name)
        s.add_argument("--out", type=Path, required=True)
        s.add_argument("--examples", default="examples")
        s.add_argument("--warmup", type=int, default=3)
        s.add_argument("--steps", type=int, default=10)
        s.add_argument("--rows", type=int, default=1500)
    q = sub.choices["qlora"]
    q.add_argument("--runner", choices=["kubetune", "trl"], default="kubetune")
    q.add_argument("--quant", choices=["nf4", "none"], default="nf4")
    q.add_argument("--model", default="qwen3-4b")
    q.add_argument("--model-dir", default="/tmp/issue34-model")
    q.add_argument("--cap-gib", type=float, default=24.0)
    sub.choices["moe"].add_argument("--no-compile", action="store_true")
    sub.choices["moe"].add_argument(
        "--tiny", action="store_true", help="a tiny MoE (a CPU check of the path)"
    )
    sub.choices["report"].add_argument("--figure", type=Path, default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.what == "report":
        print(report(args.out, args.figure))
        return 0
    result = run_qlora(args) if args.what == "qlora" else run_moe(args)
    name = result["case"].split(" ")[0].replace(":", "_") + (
        "_nocompile" if getattr(args, "no_compile", False) else ""
    )
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps({k: v for k, v in result.items() if k not in LONG_KEYS}, default=str))
    print("[issue34] losses", [round(x, 3) for x in result.get("losses") or []])
    return 0


if __name__ == "__main__":
    sys.exit(main())
