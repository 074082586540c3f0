"""What a step's process spends before its work (issue 42: the suite's CPU, and a pod's start).

- The environment hack/setup.sh makes holds the libraries' bytecode (``uv sync --compile-bytecode``):
  where PYTHONDONTWRITEBYTECODE is set (this project's machines), Python never writes it, and every
  process compiled torch, transformers, TRL, PEFT and MLflow from source again (a tiny training took
  about twice the CPU).
- A training that refuses before it trains (bad data, another training's folder, a model already
  complete) imports none of the training stack: its SIGTERM guard (:mod:`kubetune_trainer.training.
  preemption`) needs no transformers, and leaving the process group needs no torch when none was
  joined.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kubetune_api.trainer_config import TrainerConfig

# What every step imports (registration and training, preparation most of it), the heaviest first.
STEP_LIBRARIES = ("torch", "transformers", "trl", "peft", "mlflow", "datasets", "accelerate")


@pytest.mark.parametrize("name", STEP_LIBRARIES)
def test_the_steps_libraries_are_installed_with_their_bytecode(name: str) -> None:
    # where the package is, from its installed files (no import, nor a finder: the fast lane's too)
    source = Path(str(importlib.metadata.distribution(name).locate_file(f"{name}/__init__.py")))
    assert source.is_file(), source
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.is_file(), (
        f"{name} has no bytecode ({cached}): every process compiles it from source again where "
        "PYTHONDONTWRITEBYTECODE is set; run hack/setup.sh (uv sync --compile-bytecode)"
    )


# The training step's command on a config whose data it refuses; then what it had imported.
TRAIN_AND_SAY_IMPORTED = """
import runpy, sys
sys.argv = ["kubetune_trainer.train", "--config", sys.argv[1]]
try:
    runpy.run_module("kubetune_trainer.train", run_name="__main__")
except SystemExit as e:
    code = e.code
heavy = ("torch", "transformers", "peft", "trl", "datasets", "mlflow", "accelerate")
print("exit", code, "imported", sorted(n for n in heavy if sys.modules.get(n) is not None))
"""


@pytest.mark.slow
def test_a_training_that_refuses_its_data_imports_none_of_the_training_stack(tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"foo": "no messages column"}\n')
    cfg = TrainerConfig.model_validate(
        {
            "job": {"name": "refused", "namespace": "default", "uid": "0c4f5d2e-0000-4000-8000-00000000002a"},
            "spec": {
                "model": {"path": str(tmp_path / "model")},
                "dataset": {"path": str(data), "format": "messages"},
                "method": "full",
                "training": {"maxSteps": 1},
            },
            "outputDir": str(tmp_path / "out"),
            "experiment": "test/refused",
            "registeredModelName": "refused",
        }
    )
    config = tmp_path / "config.yaml"
    config.write_text(cfg.to_yaml())
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBETUNE_")}
    out = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_SAY_IMPORTED, str(config)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    assert "exit 2 imported []" in out.stdout, out.stdout + out.stderr
    assert "needs column(s) ['messages']" in out.stderr, out.stderr
    failure = json.loads(out.stdout.splitlines()[0])["failure"]
    assert failure["reason"] == "DatasetError", failure
