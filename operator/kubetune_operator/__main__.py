"""Run the kubetune operator.

    python -m kubetune_operator                          # namespaces from KUBETUNE_NAMESPACES, else all
    python -m kubetune_operator --namespace team-a --namespace team-b
    python -m kubetune_operator --all-namespaces --liveness http://0.0.0.0:8080/healthz

Settings come from ``KUBETUNE_*`` environment variables (see ``kubetune_operator.settings``). The
same handlers also run under ``kopf run -m kubetune_operator.handlers`` (and ``kopf.testing.KopfRunner``).
With ``KUBETUNE_LEADER_ELECTION=true`` (the Helm chart's default, two replicas) each replica waits
for a ``coordination.k8s.io`` Lease and only its holder runs kopf (``kubetune_operator.leader``: why
a Lease and not kopf's peering, the timings, what happens on a takeover). kopf itself always runs
standalone, without its peering.
"""

from __future__ import annotations

import argparse
import functools
import sys

import kopf

from .settings import Settings


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m kubetune_operator",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    parser.add_argument(
        "--liveness",
        metavar="URL",
        default=None,
        help="serve a liveness probe, e.g. http://0.0.0.0:8080/healthz",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log more")
    parser.add_argument("--debug", action="store_true", help="log everything, kopf internals included")
    parser.add_argument("--log-format", choices=["plain", "full", "json"], default="full")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settings = Settings.from_env()
    namespaces: list[str] = list(args.namespace) or ([] if args.all_namespaces else list(settings.namespaces))
    kopf.configure(
        debug=args.debug,
        verbose=args.verbose,
        log_format=kopf.LogFormat[args.log_format.upper()],
        log_refkey=None,
    )
    from . import handlers as _handlers  # noqa: F401  (importing registers the handlers with kopf)

    run = functools.partial(
        kopf.run,
        standalone=True,
        clusterwide=not namespaces,
        namespaces=namespaces,
        liveness_endpoint=args.liveness,
    )
    if settings.leader_election:
        from .leader import run_elected

        return run_elected(
            settings, args.liveness, lambda memo, loop, stop: run(memo=memo, loop=loop, stop_flag=stop)
        )
    run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
