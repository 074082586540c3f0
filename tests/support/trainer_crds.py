"""Kubeflow Trainer v2's real CRDs (TrainJob, TrainingRuntime, ClusterTrainingRuntime), taken from
the Go module of the version kubetune pairs with Kueue v0.17 (``TRAINER_VERSION``), as the Go
toolchain downloads it into its module cache (``go mod download -json``: its ``Dir``), so the tests
check kubetune's TrainJob child against the schema the API server really applies. Nothing is built.

:func:`trainer_crd_dir` answers the folder (``manifests/base/crds``), or raises :class:`Unavailable`
with the reason (no Go toolchain; the module cannot be had) for the fixture to skip with.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
TRAINER_VERSION = "v2.2.0"  # Kueue v0.17 writes spec.runtimePatches: Trainer >= v2.2 (research/trainjob.md)
CRD_SUBDIR = Path("manifests") / "base" / "crds"
CRD_FILES = (
    "trainer.kubeflow.org_trainjobs.yaml",
    "trainer.kubeflow.org_trainingruntimes.yaml",
    "trainer.kubeflow.org_clustertrainingruntimes.yaml",
)


class Unavailable(Exception):  # noqa: N818  a reason to skip, not an error
    """The CRDs cannot be had here: why."""


@functools.cache
def trainer_crd_dir() -> Path:
    """The folder holding Trainer ``TRAINER_VERSION``'s CRDs in the Go module cache (downloaded once
    when missing; the module cache is read-only and shared)."""
    go = shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)
    if go is None:
        raise Unavailable("the Go toolchain (go) is not installed: it downloads Kubeflow Trainer's CRDs")
    with tempfile.TemporaryDirectory() as scratch:  # outside any module: no go.mod is read or written
        out = subprocess.run(
            [go, "mod", "download", "-json", f"{TRAINER_MODULE}@{TRAINER_VERSION}"],
            cwd=scratch,
            env={**os.environ, "GOFLAGS": "-mod=mod"},
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    try:
        info = json.loads(out.stdout)
    except ValueError:
        info = {}
    if out.returncode != 0 or not info.get("Dir"):
        detail = info.get("Error") or out.stderr.strip() or f"exit code {out.returncode}"
        raise RuntimeError(f"go mod download {TRAINER_MODULE}@{TRAINER_VERSION} failed: {detail}")
    crds = Path(info["Dir"]) / CRD_SUBDIR
    missing = [name for name in CRD_FILES if not (crds / name).is_file()]
    if missing:
        raise RuntimeError(f"{TRAINER_MODULE}@{TRAINER_VERSION} has no {', '.join(missing)} under {crds}")
    return crds
