"""``kubetune render job.yaml``: print the manifests the operator would create for a FineTuneJob.

For review (what will run, with which image, GPUs, mounts and security settings) and for GitOps
diffs. The manifest is first checked against every rule the API server applies (the CRD's schema
and CEL rules, through their Python twins in ``kubetune_api.rules``): a manifest the API server
would refuse renders nothing, and each problem is printed as ``<file>: <field>: <message>`` (exit 2). The operator's settings come from the same ``KUBETUNE_*`` variables the operator reads
(e.g. ``KUBETUNE_TRAINER_IMAGE``). Owner references are left out: the FineTuneJob has no uid
until the API server stores it.

The training child is the one of the job's engine: ``spec.engine``, else the operator's default
(``KUBETUNE_ENGINE``); under ``auto`` (which the operator resolves against what the cluster serves)
the PyTorchJob is rendered. On TrainJob, it is the job's own TrainingRuntime and the TrainJob.

    kubetune render examples/qwen3-4b-full.yaml
    kubetune render job.yaml --namespace ml-team --no-registration
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml


def add_parser(sub: Any) -> None:
    p: argparse.ArgumentParser = sub.add_parser(
        "render",
        help="print the manifests the operator would create",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("manifest", type=Path, help="FineTuneJob YAML file")
    p.add_argument("-n", "--namespace", help="namespace (default: the manifest's, else default)")
    p.add_argument(
        "--no-registration",
        action="store_true",
        help="leave out the registration Job (created after training)",
    )
    p.set_defaults(func=_run)


def render(manifest: Path, *, namespace: str | None = None, registration: bool = True) -> str:
    from kubetune_api.engines import Engine
    from kubetune_api.trainer_config import load_manifest
    from kubetune_operator.builders import build_children
    from kubetune_operator.settings import Settings

    job = load_manifest(manifest)
    if namespace:
        job.metadata.namespace = namespace
    settings = Settings.from_env()
    default = settings.engine if isinstance(settings.engine, Engine) else Engine.PYTORCHJOB
    engine = Engine(job.spec.engine) if job.spec.engine is not None else default
    docs = build_children(job, settings, registration=registration, engine=engine)
    return dump_yaml(docs)


class _Dumper(yaml.SafeDumper):
    """YAML for people: multi-line strings (the trainer config) as literal blocks, no anchors."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def dump_yaml(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, width=120)


def _run(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from kubetune_api.schema import schema_problems

    try:
        text = render(args.manifest, namespace=args.namespace, registration=not args.no_registration)
    except ValidationError as e:
        print(
            "\n".join(f"kubetune render: {args.manifest}: {p}" for p in schema_problems(e)), file=sys.stderr
        )
        return 2
    except (OSError, ValueError) as e:
        print("\n".join(f"kubetune render: {line}" for line in str(e).splitlines()), file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0
