"""``kubetune prepare job.yaml``: what the preparation step would find and estimate, on this machine.

The same step the operator runs as ``<job>-prepare`` before any GPU is held: the model and data set
resolved and downloaded once, the data checked and tokenized with the trainer's own code, and the
plan's estimate of memory, speed, time and GPU-hours for the GPUs the manifest asks for
(``spec.resources``; an H100 80GB is assumed when ``gpuProduct`` is not set)::

    kubetune prepare examples/qwen3-4b-full.yaml
    kubetune prepare job.yaml --output-dir /data/runs/job

The manifest is read as ``kubetune run --local`` reads it, and the prepared model and data land in
the same run folder (default ``./runs/<name>/prepared``), where ``kubetune run --local`` trains
from them. Exit status: 0 with the report, 2 when preparation refuses the job (the reason, what
was found, and what to do) or the manifest is not valid.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path
from typing import Any

from kubetune_api.preparation import EXIT_REFUSED
from kubetune_trainer.sources.data_check import BadInputError

from .preparation import run_preparation


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "prepare",
        help="download, check and tokenize a FineTuneJob's model and data, and estimate memory, time and cost",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("manifest", type=Path, help="FineTuneJob YAML file")
    p.add_argument("--output-dir", type=Path, default=None, help="run folder (default: ./runs/<name>)")
    p.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="where the tiny model is built (default: $KUBETUNE_CACHE or ~/.cache/kubetune/tiny)",
    )
    p.add_argument("--debug", action="store_true", help="show the traceback of a bad-input error")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from .run import local_config

    try:
        cfg, tiny, cache = local_config(
            args.manifest, output_dir=args.output_dir, cache_dir=args.cache_dir, tracking_uri=None
        )
        if tiny:
            from kubetune_trainer.tiny import ensure_tiny_assets

            print(
                f"kubetune: tiny model and data in {cache} (built on first use, no download)", file=sys.stderr
            )
            ensure_tiny_assets(cache)
        print(f"kubetune: preparing {cfg.job.name} into {Path(cfg.output_dir)}", file=sys.stderr)
        return run_preparation(cfg, sys.stdout, sys.stderr)
    except BadInputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kubetune: {e}", file=sys.stderr)
        return EXIT_REFUSED
