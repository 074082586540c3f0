"""What no step uses is not imported at a step's start (kubetune_trainer.process.skip_unused_libraries):
transformers asks whether scikit-learn is installed and imports it for assisted decoding, which no
step runs; a step's process answers "absent", and saves the import (docs/contributing.md)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kubetune_trainer import process

CHECK = """
import importlib.util, sys
{setup}
import transformers.generation.candidate_generator
from transformers.utils import is_sklearn_available
print(is_sklearn_available(), "sklearn" in sys.modules and sys.modules["sklearn"] is not None)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        ("", "True True"),  # the control: installed, and transformers imports it
        (
            "from kubetune_trainer.process import skip_unused_libraries; skip_unused_libraries()",
            "False False",
        ),
    ],
    ids=["as-installed", "skipped"],
)
def test_transformers_does_not_import_scikit_learn_in_a_steps_process(setup: str, expected: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHECK.format(setup=setup)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=True,
    )
    assert out.stdout.split("\n")[-2] == expected, out.stdout + out.stderr


def test_skipping_makes_the_library_unimportable_and_keeps_one_already_imported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    monkeypatch.delitem(sys.modules, "sklearn", raising=False)
    monkeypatch.setattr(process, "UNUSED_LIBRARIES", ("sklearn", "json"))
    process.skip_unused_libraries()
    assert importlib.util.find_spec("sklearn") is None
    with pytest.raises(ImportError):
        import sklearn  # noqa: F401
    assert sys.modules["json"] is not None  # already imported: kept
    monkeypatch.delitem(sys.modules, "sklearn")
