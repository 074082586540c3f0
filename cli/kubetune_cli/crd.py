"""``kubetune crd``: print the FineTuneJob CustomResourceDefinition."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from kubetune_api.crd import render


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser("crd", help="print the FineTuneJob CRD")
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    sys.stdout.write(render())
    return 0
