"""What a step's process spends before its work (issue 42: the suite's CPU, and a pod's start).

- The environment hack/setup.sh makes holds the libraries' bytecode (``uv sync --compile-bytecode``):
  where PYTHONDONTWRITEBYTECODE is set (this project's machines), Python never writes it, and every
  process compiled torch, transformers, TRL, PEFT and MLflow from source again (a tiny training took
  about twice the CPU).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

import pytest

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
