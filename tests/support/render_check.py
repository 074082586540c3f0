"""`kubetune render` checked against a real API server: render an example on an engine, dry-run what it
printed through the server (schema, CEL and, where their controllers run, the webhooks), and compare
what the server kept with what was rendered. Shared by tests/integration (the CRDs alone) and
tests/cluster (the real Trainer v2 and JobSet controllers, with their webhooks)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tests.support.controlplane import REPO

Kubectl = Callable[..., "subprocess.CompletedProcess[str]"]


def render_example(tmp_path: Path, example: str, namespace: str, engine: str) -> list[dict[str, Any]]:
    """``kubetune render`` (the installed command) of ``examples/<example>`` with ``spec.engine`` set,
    into ``namespace``, with no ``KUBETUNE_*`` setting of this process leaking into it."""
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    doc["spec"]["engine"] = engine
    path = tmp_path / example
    path.write_text(yaml.safe_dump(doc))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KUBETUNE_")}
    out = subprocess.run(
        [str(Path(sys.executable).parent / "kubetune"), "render", str(path), "--namespace", namespace],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dry_run(kubectl: Kubectl, namespace: str, docs: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """``kubectl apply --dry-run=server --validate=strict`` of ``docs``: an unknown or pruned field is an
    error, and every schema rule, CEL rule and admission webhook applies; nothing is stored."""
    return kubectl(
        "apply",
        "--dry-run=server",
        "--validate=strict",
        "--namespace",
        namespace,
        "-o",
        "json",
        "-f",
        "-",
        input=yaml.safe_dump_all(docs),
        check=False,
    )


def not_kept(stored: Any, built: Any, path: str = "") -> list[str]:
    """What of ``built`` the API server did not keep (pruned or changed); defaults it added are fine."""
    if isinstance(built, dict):
        if not isinstance(stored, dict):
            return [path or "."]
        return [p for k, v in built.items() for p in not_kept(stored.get(k), v, f"{path}.{k}")]
    if isinstance(built, list):
        if not isinstance(stored, list) or len(stored) != len(built):
            return [path]
        return [
            p
            for i, (s, b) in enumerate(zip(stored, built, strict=True))
            for p in not_kept(s, b, f"{path}[{i}]")
        ]
    return [] if stored == built else [path]
