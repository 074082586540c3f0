"""``kubetune bench``: the notebooks' configurations vs kubetune's defaults (the kubetune_bench package)."""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "bench", help="benchmark the notebooks' configurations against kubetune's defaults"
    )
    from kubetune_bench.cli import add_arguments

    add_arguments(p)
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from kubetune_bench.cli import run_from_args

    return run_from_args(args)
