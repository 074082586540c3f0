"""The preparation step on this machine, shown as ``kubetune prepare`` shows it: the report, or the
refusal. ``kubetune prepare`` and ``kubetune run --local`` (before it trains) both run it; apart from
both so that neither imports the other in a circle."""

from __future__ import annotations

from pathlib import Path
from typing import TextIO

from kubetune_api.preparation import EXIT_REFUSED
from kubetune_api.trainer_config import TrainerConfig

from .report import render_refusal, render_report


def run_preparation(cfg: TrainerConfig, out: TextIO, err: TextIO) -> int:
    """Prepare ``cfg`` into its output folder: the report on ``out`` (0), or the refusal on ``err``
    (EXIT_REFUSED)."""
    from kubetune_trainer.preparation.prepare import Refused, prepare

    try:
        report = prepare(cfg, root=Path(cfg.output_dir))
    except Refused as e:
        err.write("".join(f"{line}\n" for line in render_refusal(e.refusal)))
        return EXIT_REFUSED
    out.write("".join(f"{line}\n" for line in render_report(report)))
    return 0
