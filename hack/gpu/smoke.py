"""GPU smoke run of the real trainer entry point on the tiny model (used on the device machine).

    python hack/gpu/smoke.py OUT_DIR                      # one process
    python hack/gpu/smoke.py OUT_DIR --nproc 2 --preempt  # the PyTorchJob's launcher on 2 GPUs,
                                                          # SIGTERM after the first checkpoint, resume

Builds the tiny assets, resolves examples/tiny-local.yaml (LoRA, Liger, bf16, packing) against
them with a local output folder, and runs ``python -m kubetune_trainer.train --config`` (or, with
``--nproc``, ``python -m kubetune_trainer.launch --nproc_per_node N -m kubetune_trainer.train``).
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from kubetune_api.trainer_config import load_manifest, resolve
from kubetune_trainer import tiny_data
from kubetune_trainer.tiny import TINY_DATA, TINY_MODEL, ensure_tiny_assets

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--nproc", type=int, default=1)
parser.add_argument("--preempt", action="store_true", help="SIGTERM once the first checkpoint is complete")
args = parser.parse_args()

out: Path = args.out
assets = ensure_tiny_assets(out / "tiny")
job = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "tiny-local.yaml")
job.spec.model.path = str(assets / TINY_MODEL)
job.spec.dataset.path = str(assets / TINY_DATA / tiny_data.FILE_NAME)
cfg = resolve(job, output_dir=str(out / "run"))
(out / "config.yaml").write_text(cfg.to_yaml())
train = ["-m", "kubetune_trainer.train", "--config", str(out / "config.yaml")]
if args.nproc > 1:
    cmd = [sys.executable, "-m", "kubetune_trainer.launch", "--nproc_per_node", str(args.nproc), *train]
else:
    cmd = [sys.executable, *train]

codes = []
if args.preempt:
    first = out / "run" / "checkpoints" / "checkpoint-20" / "COMPLETE"
    proc = subprocess.Popen(cmd)
    while not first.exists() and proc.poll() is None:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    codes.append(proc.wait())
    print(f"preempted attempt exited {codes[-1]}", flush=True)
codes.append(subprocess.call(cmd))
result = json.loads((out / "run" / "train-result.json").read_text())
keys = ("status", "global_step", "resumed_from_step", "world_size", "first_loss", "final_loss", "seconds")
print(
    json.dumps(
        {"exit_codes": codes, **{k: result.get(k) for k in keys}, "plan": result.get("plan")}, indent=1
    )
)
sys.exit(codes[-1])
