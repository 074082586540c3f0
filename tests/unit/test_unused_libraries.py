"""What no step uses is not imported at a step's start (kubetune_trainer.process.skip_unused_libraries):
transformers asks whether scikit-learn is installed and imports it for assisted decoding, which no
step runs, and whether torchao is and imports it for its torchao quantizer, which no step loads
(torchao is float8 training's, KUBETUNE_FP8); a step's process answers "absent", and saves the
import (docs/contributing.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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
    line, printed = last_line(CHECK.format(setup=setup))
    assert line == expected, printed


def last_line(code: str) -> tuple[str, str]:
    """The last line a fresh interpreter running ``code`` prints (warnings off), and all it printed."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
        check=True,
    )
    return out.stdout.split("\n")[-2], out.stdout + out.stderr


FLOAT8_CHECK = """
import sys
from pathlib import Path
{setup}
import peft
import transformers.modeling_utils
from transformers.utils import is_torchao_available
print(is_torchao_available(), sys.modules.get("torchao") is not None)
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        # the control: a training process asked for float8 (KUBETUNE_FP8) keeps torchao, as installed
        ("skip_unused_libraries(float8=True)", "True True"),
        ("skip_unused_libraries()", "False False"),
    ],
    ids=["float8-asked", "skipped"],
)
def test_loading_models_does_not_import_torchao_unless_float8_is_asked(setup: str, expected: str) -> None:
    code = FLOAT8_CHECK.format(setup=f"from kubetune_trainer.process import skip_unused_libraries; {setup}")
    line, printed = last_line(code)
    assert line == expected, printed


# Each step's command, ended at once (no such config), saying which libraries it made absent.
STEP_AND_SAY_ABSENT = """
import runpy, sys
module = sys.argv[1]
sys.argv = [module, "--config", sys.argv[2]]
try:
    runpy.run_module(module, run_name="__main__")
except SystemExit:
    pass
print("absent:", sorted(name for name in ("sklearn", "torchao") if name in sys.modules and sys.modules[name] is None))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("module", "fp8", "absent"),
    [
        ("kubetune_trainer.prepare", "tensorwise", "['sklearn', 'torchao']"),  # never trains
        ("kubetune_trainer.register", "tensorwise", "['sklearn', 'torchao']"),  # never trains
        ("kubetune_trainer.train", None, "['sklearn', 'torchao']"),
        ("kubetune_trainer.train", "off", "['sklearn', 'torchao']"),
        ("kubetune_trainer.train", "tensorwise", "['sklearn']"),  # float8 asked: torchao stays
        ("kubetune_trainer.train", "rowwise", "['sklearn']"),  # malformed: refused by name later, not here
    ],
)
def test_each_step_makes_absent_what_it_does_not_use(
    module: str, fp8: str | None, absent: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "KUBETUNE_FP8"}
    if fp8 is not None:
        env["KUBETUNE_FP8"] = fp8
    out = subprocess.run(
        [sys.executable, "-c", STEP_AND_SAY_ABSENT, module, str(tmp_path / "missing.yaml")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        check=True,
    )
    assert f"absent: {absent}" in out.stdout, out.stdout + out.stderr


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
