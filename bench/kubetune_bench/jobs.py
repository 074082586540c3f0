"""The benchmark's processes: which jobs a call runs, each in its own process (through the
PyTorchJob's launcher on several GPUs), with its own tuning variables, and the report at the end."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubetune_api.tuning import FP8_ENV, GPU_MEMORY_ENV, SHARDING_ENV

from .cases import CASES, Job, is_kubetune, notebook_of
from .peers import SWEEPS, UNSLOTH_SITE_ENV, is_peer, is_unsloth, unsloth_env
from .report import report


def notebook_peak_gib(out: Path, case: str) -> float | None:
    """The peak GPU memory (GiB) the case's notebook reached in ``out`` (its JSON), or None."""
    path = out / f"{notebook_of(case).replace(':', '_')}.json"
    if not path.exists():
        return None
    peak = json.loads(path.read_text()).get("peak_memory_gib")
    return float(peak) if peak else None


def free_port() -> int:
    """A TCP port free on this machine now (the launcher's rendezvous on several GPUs)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _command(job: Job, target: Path, *, warmup: int, steps: int, rows: int, extra: list[str]) -> list[str]:
    """The command line of a job's process: ``python -m kubetune_bench --one CASE ...``."""
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
    if job.peer_batch:
        one += ["--peer-batch", str(job.peer_batch)]
    if job.peer_attn:
        one += ["--peer-attn", job.peer_attn]
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
    if is_unsloth(CASES[job.case][1]):
        site = env.get(UNSLOTH_SITE_ENV)
        if not site:
            raise RuntimeError(
                f"{job.case} runs in Unsloth's own environment: pass --unsloth-site FOLDER ({UNSLOTH_SITE_ENV})"
            )
        env = unsloth_env(env, site)
    return env


def run_job(job: Job, out: Path, *, warmup: int, steps: int, rows: int, extra: list[str]) -> dict[str, Any]:
    """Run one job in its own process(es); a kubetune case whose compiled run fails is rerun uncompiled."""
    target = out / f"{job.stem}.json"
    log_path = out / f"{job.stem}.log"
    print(f"[bench] {job.stem} starts at {time.strftime('%H:%M:%S', time.gmtime())} UTC", flush=True)
    started = time.monotonic()
    if job.notebook_memory:
        cap = notebook_peak_gib(out, job.case)
        if cap is None:
            failure = f"no {notebook_of(job.case)} result with a peak memory in {out}: run that case first"
            print(f"[bench] {job.stem} failed ({failure})", flush=True)
            return {"case": job.stem, "error": failure, "memory_cap_gib": None}
        job = replace(job, cap=cap)
    try:
        env = job_env(job)
    except RuntimeError as err:
        print(f"[bench] {job.stem} failed ({err})", flush=True)
        return {"case": job.stem, "job": job.case, "error": str(err), "memory_cap_gib": job.cap}
    attempts = [extra]
    # (uncompiled, a float8 case would run without float8: the plan needs compiled layers)
    if is_kubetune(CASES[job.case][1]) and "--compile" not in extra and not job.fp8:
        attempts.append([*extra, "--no-compile"])
    failure = ""
    for attempt in attempts:
        with log_path.open("a") as log:
            cmd = _command(job, target, warmup=warmup, steps=steps, rows=rows, extra=attempt)
            proc = subprocess.run(cmd, check=False, stdout=log, stderr=subprocess.STDOUT, env=env)
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
    return {"case": job.stem, "job": job.case, "error": failure, "memory_cap_gib": job.cap}


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
    examples: Path | None = None,
) -> list[dict[str, Any]]:
    """Every job in turn, then the report of every result in ``out``; the results, or [] if one failed."""
    out.mkdir(parents=True, exist_ok=True)
    extra = ["--compile"] if compile_model else []
    extra += ["--profile"] if profile else []
    if peak_tflops:
        extra += ["--peak-tflops", str(peak_tflops)]
    if examples is not None:
        extra += ["--examples", str(examples.resolve())]
    results = [run_job(job, out, warmup=warmup, steps=steps, rows=rows, extra=extra) for job in jobs]
    failed = [r for r in results if "error" in r]
    ok = report(out, failed)
    return ok if not [r for r in failed if not sweep_point_too_big(r, results)] else []


def sweep_point_too_big(failure: dict[str, Any], results: list[dict[str, Any]]) -> bool:
    """Whether a failed job is a peer's sweep point that ran out of memory while another point of the
    same peer trained: that micro-batch is too big, the sweep found its best elsewhere (listed, not a failure)."""
    case = failure.get("job", "")
    if "OutOfMemoryError" not in failure.get("error", "") or not is_peer(CASES.get(case, ("", ""))[1]):
        return False
    return any("error" not in r and r.get("case", "").split(" ")[0] == case for r in results)


def plan_jobs(args: argparse.Namespace, cases: list[str], training: tuple[tuple[str, str], ...]) -> list[Job]:
    """The processes a ``kubetune bench`` call runs, in order (notebook cases before the kubetune
    cases capped at their memory, when both are asked in one call and listed in that order)."""
    kubetune = [c for c in cases if is_kubetune(CASES[c][1])]

    def _sweep(args: argparse.Namespace, case: str) -> list[Job]:
        """One job, or a peer's sweep: each micro-batch (and, for TRL, each attention asked for)."""
        kind = CASES[case][1]
        if not is_peer(kind):
            return [job(case)]
        batches = getattr(args, "peer_batches", None)
        sizes = [int(b) for b in batches.split(",")] if batches else list(SWEEPS[kind])
        attn = getattr(args, "trl_attn", None)
        attns: list[str | None] = attn.split(",") if attn and not is_unsloth(kind) else [None]
        return [Job(case, peer_batch=b, peer_attn=a) for b in sizes for a in attns]

    def job(case: str, **kw: Any) -> Job:
        # the overrides are kubetune settings: a notebook case runs as its notebook sets it
        return Job(case, training=training if case in kubetune else (), **kw)

    counts = sorted({int(n) for n in str(args.gpus).split(",") if n.strip()})
    jobs = [j for c in cases for j in _sweep(args, c)] if 1 in counts else []
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
