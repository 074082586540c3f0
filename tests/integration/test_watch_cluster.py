"""``kubetune watch`` against the real API server: the command runs as a process while the FineTuneJob's
status changes the way the operator (its state machine) and the trainer (progress) change it."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.integration.test_argocd_health import (
    PENDING,
    PROGRESS,
    REGISTERED,
    REGISTERING,
    RUNNING,
    TRAINING_FAILED,
    drive,
)
from tests.support.controlplane import REPO, ControlPlane

pytestmark = [pytest.mark.integration, pytest.mark.e2e]


def _create(kube: Any, namespace: str, name: str) -> None:
    doc = yaml.safe_load((REPO / "examples" / "qwen3-4b-full.yaml").read_text())
    doc["metadata"] = {"name": name, "namespace": namespace}
    kube.create(doc)


def _watch(control_plane: ControlPlane, namespace: str, name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kubetune_cli",
            "watch",
            name,
            "-n",
            namespace,
            "--kubeconfig",
            str(control_plane.kubeconfig),
            *extra,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


def _following(proc: subprocess.Popen[str]) -> None:
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.startswith("Following FineTuneJob"), (first, proc.stderr.read() if proc.stderr else "")


def _steps(kube: Any, namespace: str, name: str, *steps: Any) -> None:
    """Status changes as the operator makes them (its state machine; child names are job-*)."""
    for step in steps:
        drive(kube, namespace, name, step)
        time.sleep(0.2)


def test_watch_follows_a_job_to_its_registered_model(
    control_plane: ControlPlane, kube: Any, namespace: str
) -> None:
    _create(kube, namespace, "watched")
    proc = _watch(control_plane, namespace, "watched", "--timeout", "2m")
    _following(proc)
    _steps(kube, namespace, "watched", PENDING, RUNNING, {"progress": PROGRESS}, REGISTERING, REGISTERED)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "Pending: PyTorchJob job-train has no status yet" in out
    assert "Training" in out
    assert "[############------------]  50%  step 25/50  loss 1.5000  ETA 10m00s" in out
    assert "Registering: registration Job job-register is running" in out
    assert "Registered model qwen3_4b_assistant version 3  (models:/qwen3_4b_assistant/3)" in out
    assert "MLflow run abc" in out


def test_watch_exits_non_zero_when_the_job_fails(
    control_plane: ControlPlane, kube: Any, namespace: str
) -> None:
    _create(kube, namespace, "doomed")
    proc = _watch(control_plane, namespace, "doomed")
    _following(proc)
    _steps(kube, namespace, "doomed", PENDING, RUNNING, TRAINING_FAILED)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, out + err
    assert "1 Master replica(s) failed" in out.splitlines()[-1]


def test_watch_of_a_missing_job(control_plane: ControlPlane, namespace: str) -> None:
    proc = _watch(control_plane, namespace, "nosuchjob")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert f"FineTuneJob {namespace}/nosuchjob not found" in err


def test_watch_gives_up_after_its_timeout(
    control_plane: ControlPlane, kube: Any, namespace: str, tmp_path: Path
) -> None:
    _create(kube, namespace, "slow")
    started = time.monotonic()
    proc = _watch(control_plane, namespace, "slow", "--timeout", "3s")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, out + err
    assert "timed out after 3s; the job goes on" in err
    assert time.monotonic() - started < 30
