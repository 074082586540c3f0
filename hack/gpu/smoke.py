"""GPU smoke run of the real trainer entry point on the tiny model (used on the device machine).

    python hack/gpu/smoke.py OUT_DIR

Builds the tiny assets, resolves examples/tiny-local.yaml (LoRA, Liger, bf16, packing) against
them with a local output folder, and runs ``python -m kubetune_trainer.train --config``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from kubetune_api.trainer_config import load_manifest, resolve
from kubetune_trainer import tiny_data
from kubetune_trainer.tiny import TINY_DATA, TINY_MODEL, ensure_tiny_assets

out = Path(sys.argv[1])
assets = ensure_tiny_assets(out / "tiny")
job = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "tiny-local.yaml")
job.spec.model.path = str(assets / TINY_MODEL)
job.spec.dataset.path = str(assets / TINY_DATA / tiny_data.FILE_NAME)
cfg = resolve(job, output_dir=str(out / "run"))
(out / "config.yaml").write_text(cfg.to_yaml())
code = subprocess.call([sys.executable, "-m", "kubetune_trainer.train", "--config", str(out / "config.yaml")])
result = json.loads((out / "run" / "train-result.json").read_text())
print(
    json.dumps(
        {
            k: result.get(k)
            for k in (
                "status",
                "global_step",
                "first_loss",
                "final_loss",
                "plan",
                "tokens_per_second",
                "seconds",
            )
        },
        indent=1,
    )
)
sys.exit(code)
