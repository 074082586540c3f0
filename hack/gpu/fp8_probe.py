"""Where float8's time goes: Qwen3-4B decoder layers (the published shapes, random weights) on one
packed micro-step, forward and backward, compiled per layer as the trainer compiles them, under
float8 variants side by side. One JSON line per variant; a diagnostic for the device machine (the
verdict on a variant is the full training step, ``kubetune bench``).

    python hack/gpu/fp8_probe.py [variant ...]
    python hack/gpu/fp8_probe.py curve    # bf16 against float8 loss curves on learnable data
    python hack/gpu/fp8_probe.py text     # the same on real text, the whole Qwen3-4B depth
    python hack/gpu/fp8_probe.py chart LOG JSON PNG   # the text run's log as JSON and a chart

Variants: bf16; fp8 (torchao tensorwise, as ``KUBETUNE_FP8=tensorwise`` runs it); fp8-tiled (the
same with inductor's N-d tiling and tiled reductions, for the transposed float8 copies the weight
gradient needs); fp8-fwd-dgrad (float8 for the forward and the input gradient, the weight gradient
in bf16: no transposed activation copies); fp8-fastacc (fast accumulation in all three products);
fp8-static (static shapes: what dynamic shapes cost); fp8-kv (k and v projections converted too);
bf16-auto, fp8-auto (dynamo's automatic dynamic shapes instead of ``dynamic=True``: only the sizes
that changed between calls become symbolic; each variant runs one shorter micro-step first);
bf16-static (whether the bf16 default would gain from fixed token counts too).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
from pathlib import Path
from typing import Any

import torch
from attn_probe import timed

from kubetune_bench import cases, workload
from kubetune_trainer.plan import plan
from kubetune_trainer.training import fast, varlen

LAYERS = 4
ROWS, ROW = 8, 1024  # notebook B's eight sequences, packed as the trainer packs them
VARIANTS = (
    "bf16",
    "fp8",
    "fp8-tiled",
    "fp8-fwd-dgrad",
    "fp8-fastacc",
    "fp8-static",
    "fp8-kv",
    "bf16-auto",
    "fp8-auto",
    "bf16-static",
)


def packed(position_ids: torch.Tensor) -> dict[str, Any]:
    """The packed-batch keyword arguments the trainer's collator hands the model."""
    cu, max_len = varlen.cu_seqlens_from_position_ids(position_ids)
    return {
        "position_ids": position_ids,
        "cu_seq_lens_q": cu,
        "cu_seq_lens_k": cu,
        "max_length_q": max_len,
        "max_length_k": max_len,
    }


def packed_position_ids() -> torch.Tensor:
    """Position ids of eight 1,024-token rows of Capybara-like examples; a row's last example is cut."""
    lengths = iter(workload.capybara_like_lengths(10 * ROWS, seed=1))
    positions: list[int] = []
    for _ in range(ROWS):
        row: list[int] = []
        while len(row) < ROW:
            row.extend(range(next(lengths)))
        positions.extend(row[:ROW])
    return torch.tensor(positions, dtype=torch.long).view(1, -1).cuda()


def build(variant: str) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    varlen.register()
    cfg = dict(cases.MODEL_CONFIGS["qwen3-4b"], num_hidden_layers=LAYERS)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**cfg), dtype=torch.bfloat16, attn_implementation=varlen.NAME
        )
    model.config.use_cache = False
    torch._dynamo.reset()
    import torch._inductor.config as inductor

    inductor.triton.prefer_nd_tiling = variant == "fp8-tiled"
    inductor.triton.tile_reductions = variant == "fp8-tiled"
    if not variant.startswith("bf16"):
        from torchao.float8 import CastConfig, Float8LinearConfig, ScalingType, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name("tensorwise")
        if variant == "fp8-fwd-dgrad":
            off = CastConfig(scaling_type=ScalingType.DISABLED)
            config = dataclasses.replace(
                config, cast_config_input_for_grad_weight=off, cast_config_grad_output_for_grad_weight=off
            )
        if variant == "fp8-fastacc":
            fastacc = dataclasses.replace(config.gemm_config_output, use_fast_accum=True)
            config = dataclasses.replace(
                config, gemm_config_grad_input=fastacc, gemm_config_grad_weight=fastacc
            )
        minimum = 1024 if variant == "fp8-kv" else plan.FP8_MIN_FEATURES

        def keep(module: Any, fqn: str) -> bool:
            return all(n % 16 == 0 and n >= minimum for n in (module.in_features, module.out_features))

        for layer in fast.decoder_layers(model):
            convert_to_float8_training(layer, module_filter_fn=keep, config=config)
    for layer in fast.decoder_layers(model):
        # -auto: dynamo's automatic dynamic shapes (static first, then only what changed is dynamic)
        layer.compile(
            dynamic=False if variant.endswith("-static") else None if variant.endswith("-auto") else True
        )
    return model


def probe(variant: str, position_ids: torch.Tensor) -> dict[str, Any]:
    torch.cuda.reset_peak_memory_stats()
    model = build(variant)
    base = model.model
    embeds = torch.randn(1, ROWS * ROW, 2560, device="cuda", dtype=torch.bfloat16) * 0.02
    embeds.requires_grad_(True)
    full = packed(position_ids)

    def step(tokens: int | None = None) -> torch.Tensor:
        x, kwargs = embeds, full
        if tokens is not None:  # a shorter micro-step, as the trainer's vary
            x, kwargs = embeds[:, :tokens], packed(position_ids[:, :tokens])
        out = base(inputs_embeds=x, **kwargs).last_hidden_state
        loss = out.float().pow(2).mean()
        loss.backward()
        return loss

    first = step()  # compiles
    step(ROWS * ROW - 528)  # another token count: -auto recompiles with the token count dynamic
    ms = timed(step, warmup=3, iters=10)
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    kernels = sorted(
        ((e.key, e.device_time_total / 1000) for e in prof.key_averages() if e.device_time_total > 0),
        key=lambda kv: -kv[1],
    )
    top = [
        [k[:90], round(t, 3)]
        for k, t in kernels
        if not k.startswith("aten::") and not k.startswith("nvjet") and "Command Buffer" not in k
    ][:8]
    return {
        "variant": variant,
        "ms_per_layer": round(ms / LAYERS, 3),
        "step_ms": round(ms, 2),
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "first_loss": float(first),
        "top_other_kernels_ms": top,
    }


CURVE_LAYERS, CURVE_VOCAB, CURVE_STEPS = 8, 4096, 200


def learnable_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One packed micro-step of learnable data, the same for every variant: each example is a random
    motif of 8-32 tokens repeated to a Capybara-like length (a model learns to copy it in context)."""
    g = torch.Generator().manual_seed(1000 + step)
    lengths = iter(workload.capybara_like_lengths(64, seed=step))
    ids: list[int] = []
    positions: list[int] = []
    while len(ids) < ROWS * ROW:
        n = next(lengths)
        m = int(torch.randint(8, 33, (1,), generator=g))
        motif = torch.randint(0, CURVE_VOCAB, (m,), generator=g).tolist()
        ids.extend((motif * (n // m + 1))[:n])
        positions.extend(range(n))
    cut = ROWS * ROW
    return (
        torch.tensor(ids[:cut]).view(1, -1).cuda(),
        torch.tensor(positions[:cut]).view(1, -1).cuda(),
    )


def curve_model(variant: str, lr: float, warmup: int, **overrides: Any) -> tuple[Any, int, Any, Any]:
    """A Qwen3-4B-shaped model (``overrides``: its config's changes) from fixed initial weights,
    bf16 or float8 (the trainer's own apply_fp8 and compile_layers), with fused AdamW and a linear
    warm-up: (model, linear layers converted, optimizer, schedule)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    varlen.register()
    torch._dynamo.reset()
    torch.cuda.reset_peak_memory_stats()  # each variant's own peak (the runs share one process)
    cfg = dict(cases.MODEL_CONFIGS["qwen3-4b"], **overrides)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**cfg), dtype=torch.bfloat16, attn_implementation=varlen.NAME
        )
    model.config.use_cache = False
    converted = fast.apply_fp8(model, "tensorwise") if variant == "fp8" else 0
    fast.compile_layers(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, fused=True)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup))
    return model, converted, optimizer, schedule


def optimizer_step(model: Any, optimizer: Any, schedule: Any, loss: torch.Tensor) -> None:
    """Backward, clip at 1.0, step the optimizer and the schedule, drop the gradients."""
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)


def curve(variant: str) -> dict[str, Any]:
    """bf16 or fp8 (the trainer's own apply_fp8 and compile_layers): the loss of each of
    CURVE_STEPS optimizer steps from the same initial weights on the same batches."""
    model, converted, optimizer, schedule = curve_model(
        variant, 3e-4, 20, num_hidden_layers=CURVE_LAYERS, vocab_size=CURVE_VOCAB
    )
    losses = []
    for step in range(CURVE_STEPS):
        ids, pos = learnable_batch(step)
        loss = model(input_ids=ids, labels=ids, **packed(pos)).loss
        optimizer_step(model, optimizer, schedule, loss)
        losses.append(loss.detach())
    values = [float(x) for x in torch.stack(losses).cpu()]
    return {"variant": f"curve-{variant}", "converted": converted, "losses": [round(v, 4) for v in values]}


def curves() -> dict[str, Any]:
    runs = {v: curve(v)["losses"] for v in ("bf16", "fp8")}
    a, b = runs["bf16"], runs["fp8"]
    marks = [0, 9, 24, 49, 99, 149, CURVE_STEPS - 1]
    tail = range(CURVE_STEPS - 50, CURVE_STEPS)
    return {
        "curve": f"{CURVE_LAYERS} Qwen3-4B layers, vocab {CURVE_VOCAB}, {CURVE_STEPS} steps of {ROWS * ROW} tokens",
        "steps": [m + 1 for m in marks],
        "bf16": [a[m] for m in marks],
        "fp8": [b[m] for m in marks],
        "last50_mean": [round(sum(a[i] for i in tail) / 50, 4), round(sum(b[i] for i in tail) / 50, 4)],
        "last50_mean_abs_rel_diff": round(sum(abs(a[i] - b[i]) / a[i] for i in tail) / 50, 5),
        "all": runs,
    }


TEXT_STEPS, TEXT_LR, TEXT_VOCAB, TEXT_EVAL_EVERY = 300, 2e-4, 512, 25


def text_batches() -> tuple[list[tuple[torch.Tensor, ...]], list[tuple[torch.Tensor, ...]]]:
    """Real text that a random-initialised model learns from in a few hundred steps: the bytes of
    the Python standard library's modules (the device machine has nothing else), cut into
    documents of Capybara-like lengths, shuffled with a fixed seed, every 20th held out; packed
    into micro-steps of ROWS * ROW tokens as the trainer packs them (no label at a document's
    first token, so nothing is predicted across documents). (input ids, labels, position ids)."""
    import pathlib
    import random
    import sysconfig

    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if not {"test", "tests", "site-packages"} & set(p.parts))
    data = b"".join(p.read_bytes() for p in files)
    lengths = workload.capybara_like_lengths(len(data) // 700, seed=7)
    docs, at = [], 0
    for n in lengths:
        if at + n > len(data):
            break
        docs.append(list(data[at : at + n]))
        at += n
    random.Random(7).shuffle(docs)
    held = docs[::20]
    train = [d for i, d in enumerate(docs) if i % 20]

    def pack(pool: list[list[int]], count: int) -> list[tuple[torch.Tensor, ...]]:
        out, it = [], iter(pool)
        for _ in range(count):
            ids: list[int] = []
            labels: list[int] = []
            positions: list[int] = []
            while len(ids) < ROWS * ROW:
                doc = next(it)
                ids += doc
                labels += [-100, *doc[1:]]
                positions += range(len(doc))
            cut = ROWS * ROW
            out.append(tuple(torch.tensor(x[:cut]).view(1, -1) for x in (ids, labels, positions)))
        return out

    return pack(train, TEXT_STEPS), pack(held, 4)


def text_curve(variant: str, train: list[Any], held: list[Any]) -> dict[str, Any]:
    """The whole Qwen3-4B depth (vocabulary cut to TEXT_VOCAB for the bytes), bf16 or float8 (the
    trainer's own apply_fp8 and compile_layers), TEXT_STEPS AdamW steps on real text from the same
    initial weights and batches; training loss per step, held-out loss every TEXT_EVAL_EVERY."""
    model, converted, optimizer, schedule = curve_model(variant, TEXT_LR, 30, vocab_size=TEXT_VOCAB)

    def loss_of(batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        ids, labels, pos = (x.cuda(non_blocking=True) for x in batch)
        return model(input_ids=ids, labels=labels, **packed(pos)).loss

    def held_out() -> torch.Tensor:
        with torch.no_grad():
            return torch.stack([loss_of(b) for b in held]).mean()

    losses, evals = [], [held_out()]
    for step, batch in enumerate(train):
        loss = loss_of(batch)
        optimizer_step(model, optimizer, schedule, loss)
        losses.append(loss.detach())
        if (step + 1) % TEXT_EVAL_EVERY == 0:
            evals.append(held_out())
    return {
        "variant": f"text-{variant}",
        "converted": converted,
        "losses": [round(float(x), 4) for x in torch.stack(losses).cpu()],
        "held_out": [round(float(x), 4) for x in torch.stack(evals).cpu()],
        "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
    }


def text_curves() -> dict[str, Any]:
    train, held = text_batches()
    runs = {}
    for v in ("bf16", "fp8"):
        runs[v] = text_curve(v, train, held)
        print(json.dumps(runs[v]), flush=True)
        torch.cuda.empty_cache()
    a, b = runs["bf16"]["losses"], runs["fp8"]["losses"]
    ha, hb = runs["bf16"]["held_out"], runs["fp8"]["held_out"]
    tail = range(TEXT_STEPS - 50, TEXT_STEPS)
    return {
        "text": f"Qwen3-4B depth, byte vocabulary, {TEXT_STEPS} steps of {ROWS * ROW} tokens, lr {TEXT_LR}",
        "held_out_steps": [i * TEXT_EVAL_EVERY for i in range(len(ha))],
        "held_out_bf16": ha,
        "held_out_fp8": hb,
        "held_out_max_abs_rel_diff": round(max(abs(x - y) / x for x, y in zip(ha, hb, strict=True)), 5),
        "last50_mean": [round(sum(a[i] for i in tail) / 50, 4), round(sum(b[i] for i in tail) / 50, 4)],
        "last50_mean_abs_rel_diff": round(sum(abs(a[i] - b[i]) / a[i] for i in tail) / 50, 5),
    }


def chart_text(log: str, json_path: str, png: str) -> None:
    """The text run's JSON lines (both variants, then the summary) as one JSON file and a chart:
    training loss (25-step means) and held-out loss, bf16 against float8."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lines = [json.loads(x) for x in Path(log).read_text().splitlines() if x.startswith("{") and '"text' in x]
    runs = {r["variant"]: r for r in lines if "losses" in r}
    summary = next(r for r in lines if "held_out_steps" in r)
    Path(json_path).write_text(json.dumps({"summary": summary, "runs": runs}, indent=1) + "\n")
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for name, color in (("text-bf16", "#2a7ab9"), ("text-fp8", "#d9822b")):
        losses = runs[name]["losses"]
        means = [sum(losses[i : i + 25]) / 25 for i in range(0, len(losses), 25)]
        ax1.plot([i + 25 for i in range(0, len(losses), 25)], means, marker="o", color=color, label=name[5:])
        ax2.plot(summary["held_out_steps"], runs[name]["held_out"], marker="o", color=color, label=name[5:])
    ax1.set_title("training loss, 25-step means")
    ax2.set_title("held-out loss (4 micro-steps)")
    for ax in (ax1, ax2):
        ax.set_xlabel("optimizer step")
        ax.set_ylim(1.2, 4.6)
        ax.legend()
    fig.suptitle(summary["text"] + ": bf16 against float8 products (tensorwise)")
    fig.tight_layout()
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "chart":
        chart_text(*argv[1:])
        return 0
    if argv == ["curve"]:
        print(json.dumps(curves()), flush=True)
        return 0
    if argv == ["text"]:
        print(json.dumps(text_curves()), flush=True)
        return 0
    names = argv or list(VARIANTS)
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "layers": LAYERS}))
    position_ids = packed_position_ids()
    for name in names:
        try:
            print(json.dumps(probe(name, position_ids)), flush=True)
        except Exception as exc:
            print(
                json.dumps(
                    {
                        "variant": name,
                        "error": f"{type(exc).__name__}: {exc}"[:500],
                        "trace": traceback.format_exc()[-1200:],
                    }
                ),
                flush=True,
            )
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
