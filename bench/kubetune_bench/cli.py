"""``kubetune bench`` (and ``python -m kubetune_bench``): the options, and one call's run.

The same options start each case's own process (``--one CASE --json PATH``, hidden), which trains the
case and writes its result; the call itself plans the jobs, runs them and writes the report.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from .cases import CASES, GPU_CASES, SMOKE_CASES, parse_training_overrides, with_peers
from .jobs import plan_jobs, run_all
from .peers import UNSLOTH_SITE_ENV
from .report import report


@dataclass(frozen=True)
class Defaults:
    """Warm-up and measured steps and synthetic conversations when the call does not set them."""

    warmup: int
    steps: int
    rows: int


GPU_DEFAULTS = Defaults(warmup=2, steps=4, rows=1500)
SMOKE_DEFAULTS = Defaults(warmup=1, steps=2, rows=300)


def build_parser() -> argparse.ArgumentParser:
    from . import __doc__ as package_doc

    p = argparse.ArgumentParser(prog="kubetune bench", description=(package_doc or "").split("\n")[0])
    add_arguments(p)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Every ``kubetune bench`` option (the CLI's subcommand and ``python -m kubetune_bench`` share them)."""
    _add_run_arguments(p)
    _add_row_arguments(p)


def _add_run_arguments(p: argparse.ArgumentParser) -> None:
    """What a call runs and how: the cases, their steps and data, where the results go."""
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for bench.json/.md/.png")
    p.add_argument("--smoke", action="store_true", help="CPU smoke run on the tiny model")
    p.add_argument("--cases", help=f"comma-separated cases (default: {','.join(GPU_CASES)})")
    p.add_argument("--warmup", type=int, default=None, help="optimizer steps before measuring")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps measured")
    p.add_argument("--rows", type=int, default=None, help="synthetic conversations")
    p.add_argument(
        "--examples",
        type=Path,
        default=None,
        help="folder of the FineTuneJob examples the kubetune cases train (qwen2-0.5b-lora-8gpu.yaml, "
        "qwen3-4b-full.yaml); default: the copy an installed wheel carries, else ./examples",
    )
    p.add_argument("--peak-tflops", type=float, default=None, help="peak dense bf16 TFLOP/s for MFU")
    p.add_argument("--compile", action="store_true", help="kubetune cases with torch.compile forced on")
    p.add_argument("--no-compile", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--report-only", action="store_true", help="only rebuild bench.json/.md/.png from --out")
    p.add_argument(
        "--profile",
        action="store_true",
        help="write <case>.profile.txt per case (and rank): torch.profiler over the measured steps",
    )
    p.add_argument(
        "--startup",
        metavar="PARTS",
        help="issue 22's benchmark instead of the cases (kubetune_bench.startup): restart, scaling, estimate "
        "(comma-separated)",
    )
    p.add_argument(
        "--peers",
        action="store_true",
        help="also run the peers (TRL at its best, Unsloth) of each model of the call's kubetune cases",
    )
    p.add_argument(
        "--peer-batches",
        help="comma-separated micro-batches (packed rows) each peer case sweeps (default: kubetune_bench.peers.SWEEPS)",
    )
    p.add_argument(
        "--trl-attn",
        help="comma-separated attention implementations TRL at its best sweeps (default: the best available)",
    )
    p.add_argument(
        "--unsloth-site",
        type=Path,
        default=None,
        help="folder holding Unsloth's own environment (pip install --target), first on PYTHONPATH for its "
        "cases only (default: $KUBETUNE_BENCH_UNSLOTH_SITE)",
    )
    p.add_argument("--peer-batch", type=int, help=argparse.SUPPRESS)
    p.add_argument("--peer-attn", help=argparse.SUPPRESS)
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--json", type=Path, help=argparse.SUPPRESS)


def _add_row_arguments(p: argparse.ArgumentParser) -> None:
    """The rows a call adds beside the plain cases: capped, on several GPUs, float8, one epoch..."""
    p.add_argument(
        "--memory-cap-gib",
        type=float,
        default=None,
        help="also run the kubetune full case with the GPU capped at this many GiB",
    )
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_from_args(args)


def run_from_args(args: argparse.Namespace) -> int:
    """One ``kubetune bench`` call: a case's own process (``--one``), the report alone, or the whole run."""
    if args.one:
        return _run_one(args)
    if args.startup:
        from .startup import run_from_args as run_startup

        return run_startup(args)
    if args.report_only:
        return 0 if report(args.out) else 1
    return _run_all(args)


def _profile_path(json_path: Path) -> Path:
    """``<case>.profile.txt`` beside the case's JSON; under torchrun, one per rank."""
    rank = f".rank{os.environ.get('RANK', '0')}" if "RANK" in os.environ else ""
    return json_path.with_name(json_path.stem + rank + ".profile.txt")


def _run_one(args: argparse.Namespace) -> int:
    """A case's own process: train it, write its JSON (rank 0), leave the process group cleanly.

    A case stopped from outside (``timeout`` in ``hack/gpu/peers.sh`` sends SIGTERM) first writes
    every thread's Python stack into its log, so a case that ran out of time says where it was.
    """
    import faulthandler
    import signal

    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    from .peers import import_unsloth, is_unsloth

    if is_unsloth(CASES[args.one][1]):
        import_unsloth()  # before anything imports transformers, TRL or PEFT
    from kubetune_trainer.training.train import close_process_group

    from .runners import CaseOptions, run_case

    options = CaseOptions(
        warmup=args.warmup,
        steps=args.steps,
        rows=args.rows,
        memory_cap_gib=args.memory_cap_gib,
        peak_tflops=args.peak_tflops,
        compile_model=args.compile,
        no_compile=args.no_compile,
        epoch_tokens=args.epoch_tokens,
        profile_path=_profile_path(args.json) if args.profile else None,
        notebook_steps=args.notebook_steps,
        training_overrides=parse_training_overrides(args.training),
        examples=args.examples,
        peer_batch=args.peer_batch,
        peer_attn=args.peer_attn,
    )
    result = run_case(args.one, options)
    if int(os.environ.get("RANK", "0")) == 0:
        args.json.write_text(json.dumps(asdict(result), indent=2))
    close_process_group()
    return 0


def _run_all(args: argparse.Namespace) -> int:
    """The whole call: its cases, and the rows its options add, each in its own process; then the report."""
    cases = args.cases.split(",") if args.cases else (SMOKE_CASES if args.smoke else GPU_CASES)
    if args.peers:
        cases = with_peers(cases)
    if args.unsloth_site is not None:
        os.environ[UNSLOTH_SITE_ENV] = str(args.unsloth_site.resolve())
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; known: {sorted(CASES)}", file=sys.stderr)
        return 2
    defaults = SMOKE_DEFAULTS if args.smoke else GPU_DEFAULTS
    try:
        training = parse_training_overrides(args.training)
    except ValueError as err:
        print(err, file=sys.stderr)
        return 2
    jobs = plan_jobs(args, cases, training)
    results = run_all(
        jobs,
        args.out,
        warmup=args.warmup if args.warmup is not None else defaults.warmup,
        steps=args.steps if args.steps is not None else defaults.steps,
        rows=args.rows if args.rows is not None else defaults.rows,
        peak_tflops=args.peak_tflops,
        compile_model=args.compile,
        profile=args.profile,
        examples=args.examples,
    )
    return 0 if results else 1  # (run_all: [] when a job failed; a peer's sweep point out of memory is none)
