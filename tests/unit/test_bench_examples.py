"""Where the benchmark's kubetune cases find their FineTuneJob examples: ``--examples``, the copy an
installed wheel carries, or ./examples; and the hooks diagnostics use instead of patching the module."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from kubetune_bench.cases import EXAMPLES, Job, default_examples_dir, example_path
from kubetune_bench.cli import build_parser
from kubetune_bench.jobs import _command

REPO = Path(__file__).resolve().parents[2]


def test_a_source_checkout_reads_the_examples_in_the_current_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert default_examples_dir() == Path("examples")
    assert (
        example_path("kubetune-full", None).read_text() == (REPO / "examples/qwen3-4b-full.yaml").read_text()
    )


def test_a_missing_example_names_the_file_and_the_option(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"qwen2-0.5b-lora-8gpu.yaml.*--examples"):
        example_path("kubetune-lora", tmp_path)


def test_the_wheel_carries_every_example_the_cases_train() -> None:
    wheel = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["hatch"]["build"]["targets"]["wheel"]
    assert "bench/kubetune_bench" in wheel["packages"]
    carried = wheel["force-include"]
    for name in EXAMPLES.values():
        assert carried[f"examples/{name}"] == f"kubetune_bench/examples/{name}"
        assert (REPO / "examples" / name).is_file()


def test_examples_reach_each_case_s_process(tmp_path: Path) -> None:
    args = build_parser().parse_args(["--examples", str(tmp_path)])
    assert args.examples == tmp_path
    cmd = _command(
        Job("tiny:kubetune-full"), tmp_path / "x.json", warmup=1, steps=1, rows=4, extra=["--examples", "E"]
    )
    assert cmd[1:3] == ["-m", "kubetune_bench"] and cmd[cmd.index("--examples") + 1] == "E"


def test_the_configure_hook_edits_the_resolved_config_before_the_call_s_training_fields(
    tmp_path: Path,
) -> None:
    datasets = pytest.importorskip("datasets")
    from kubetune_api.spec import Toggle
    from kubetune_bench.runners import CaseHooks, CaseOptions, _Case, _Device, _kubetune_trainer_config

    seen: list[object] = []

    def configure(cfg: Any) -> None:
        seen.append(cfg.spec.training.gradient_checkpointing)
        cfg.spec.lora.dropout = 0.0

    options = CaseOptions(
        warmup=1,
        steps=2,
        rows=4,
        training_overrides=(("gradientCheckpointing", "always"),),
        examples=REPO / "examples",
    )
    ctx = _Case(
        "tiny:kubetune-lora",
        "tiny",
        "kubetune-lora",
        _Device(cuda=False, world=1),
        options,
        CaseHooks(configure=configure),
        tmp_path,
    )
    cfg = _kubetune_trainer_config(ctx, datasets.Dataset.from_dict({"input_ids": [[20, 21, 22]]}), None)
    assert cfg.spec.lora.dropout == 0.0 and cfg.spec.training.max_steps == 3
    assert seen and seen[0] != Toggle.ALWAYS  # the hook saw the example's own setting
    assert cfg.spec.training.gradient_checkpointing == Toggle.ALWAYS  # --training came after it
    assert cfg.spec.training.max_length == 128  # the tiny model's conversations
    assert (tmp_path / "data" / "train.jsonl").is_file()
