"""A real CUDA out-of-memory error and kubetune's retry, on one GPU (used on the device machine).

    python hack/gpu/oom.py OUT_DIR [--cap-gib 1]

The tiny model (full fine-tune) with a micro-step far too big for a GPU memory cap
(``KUBETUNE_GPU_MEMORY_GIB``, which the trainer enforces with PyTorch's allocator): 256 packed
rows of 1,024 tokens per micro-step. The trainer's own launcher (the PyTorchJob's container
command) is run again after each retryable exit, as the Training Operator does under
``restartPolicy: ExitCode``, until it exits 0 or with a final failure. Then the same job without
the cap, in its first layout, as the reference loss curve. Prints one JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from kubetune_api.failures import EXIT_RETRY, parse_failure
from kubetune_api.trainer_config import load_manifest, resolve
from kubetune_trainer import tiny_data
from kubetune_trainer.tiny import TINY_MODEL, ensure_tiny_assets
from kubetune_trainer.training.oom import MEMORY_FILE

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--cap-gib", type=float, default=1.0)
parser.add_argument("--max-attempts", type=int, default=7)
args = parser.parse_args()
out: Path = args.out
assets = ensure_tiny_assets(out / "tiny")
data = tiny_data.write_jsonl(tiny_data.conversations(count=24000), out / "data.jsonl")


def config(name: str) -> Path:
    job = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "tiny-local.yaml")
    job.spec.model.path = str(assets / TINY_MODEL)
    job.spec.dataset.path = str(data)
    job.spec.method = "full"
    job.spec.lora = None
    t = job.spec.training
    t.max_steps, t.batch_size, t.gradient_accumulation_steps = 4, 256, 1
    t.max_length, t.tokens_per_step = 1024, 262144
    t.logging_steps, t.save_steps, t.eval_steps = 1, 2, None
    t.oom_retries, t.learning_rate, t.warmup_steps = 5, 3e-3, 0
    t.torch_compile = "never"  # attempts start in seconds; the layout is what is tested
    t.gradient_checkpointing = "never"  # else the plan recomputes and 256 rows fit the cap
    job.spec.dataset.eval_fraction = None
    cfg = resolve(job, output_dir=str(out / name))
    path = out / f"{name}.yaml"
    path.write_text(cfg.to_yaml())
    return path


def attempt(cfg: Path, name: str, env: dict[str, str]) -> dict[str, object]:
    term = out / f"{name}.termination-log"
    cmd = [sys.executable, "-m", "kubetune_trainer.launch", "--nproc_per_node", "1",
           "-m", "kubetune_trainer.train", "--config", str(cfg), "--termination-log", str(term)]  # fmt: skip
    with (out / f"{name}.log").open("w") as log:
        code = subprocess.call(cmd, env={**os.environ, **env},
                               stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    failure = parse_failure(term.read_text() if term.exists() else "")
    return {"exit": code, "failure": failure.wire() if failure else None}


capped = config("capped")
attempts = []
for i in range(args.max_attempts):
    attempts.append(attempt(capped, f"capped-{i}", {"KUBETUNE_GPU_MEMORY_GIB": str(args.cap_gib)}))
    print(json.dumps(attempts[-1]), flush=True)
    if attempts[-1]["exit"] != EXIT_RETRY:
        break
reference = attempt(config("reference"), "reference", {})


def result(name: str) -> dict[str, object]:
    path = out / name / "train-result.json"
    return json.loads(path.read_text()) if path.exists() else {}


got, want = result("capped"), result("reference")
summary = {
    "cap_gib": args.cap_gib,
    "attempts": attempts,
    "memory_retries": json.loads((out / "capped" / MEMORY_FILE).read_text()) if (out / "capped" / MEMORY_FILE).exists() else None,
    "capped_layout": {k: (got.get("plan") or {}).get(k) for k in ("per_device_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")},
    "reference_layout": {k: (want.get("plan") or {}).get(k) for k in ("per_device_batch_size", "gradient_accumulation_steps", "gradient_checkpointing")},
    "capped_losses": got.get("losses"),
    "reference_losses": want.get("losses"),
    "reference_exit": reference["exit"],
}  # fmt: skip
print(json.dumps(summary, indent=1))
