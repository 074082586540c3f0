"""The ``kubetune`` command.

    kubetune run examples/tiny-local.yaml --local   # fine-tune on this machine (CPU or GPU)
    kubetune prepare job.yaml                         # check the data, estimate memory, time, cost
    kubetune render job.yaml                          # the manifests the operator would create
    kubetune watch <name>                             # follow a FineTuneJob in the cluster
    kubetune bench                                    # notebook configs vs kubetune defaults
    kubetune crd                                      # print the FineTuneJob CRD

Each sub-command lives in its own module with ``add_parser(subparsers)``; heavy imports happen
only when that sub-command runs.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# (module, help) per sub-command; a module missing from this install is simply not offered.
SUBCOMMANDS = {
    "run": "kubetune_cli.run",
    "prepare": "kubetune_cli.prepare",
    "render": "kubetune_cli.render",
    "watch": "kubetune_cli.watch",
    "bench": "kubetune_cli.bench",
    "crd": "kubetune_cli.crd",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kubetune", description="LLM fine-tuning as a Kubernetes resource.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in SUBCOMMANDS.values():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name == module_name:
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
