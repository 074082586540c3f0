"""The chart's in-cluster MLflow server command, run for real: the rendered `mlflow server` arguments
(with the project's MLflow, the version the chart's image pins) start a server whose probe path answers,
that accepts the Service's host names and refuses others (its DNS-rebinding protection)."""

from __future__ import annotations

import contextlib
import http.client
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.support.controlplane import free_port
from tests.unit.test_chart import CI_VALUES, one, render

pytestmark = [pytest.mark.helm, pytest.mark.e2e]


def _get(port: int, path: str, host: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers={"Host": host})
        return conn.getresponse().status
    finally:
        conn.close()


def test_rendered_mlflow_server_command_runs(tmp_path: Path) -> None:
    objs = render("-f", str(CI_VALUES))
    container = one(objs, "Deployment", "kubetune-mlflow")["spec"]["template"]["spec"]["containers"][0]
    command = container["command"]
    image_version = container["image"].rsplit(":v", 1)[1]
    mlflow_bin = Path(sys.executable).parent / "mlflow"
    version = subprocess.run(
        [str(mlflow_bin), "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert image_version in version, f"the chart pins MLflow {image_version}, the project has {version}"

    port = free_port()
    store = tmp_path / "mlflow"
    store.mkdir()
    # Here: this machine's paths, 127.0.0.1, a free port, one worker.
    args = [
        re.sub(r"^--port=\d+$", f"--port={port}", arg)
        .replace("/mlflow/", f"{store}/")
        .replace("--host=0.0.0.0", "--host=127.0.0.1")
        .replace("--workers=2", "--workers=1")
        for arg in command[2:]
    ]
    log = (tmp_path / "server.log").open("wb")
    # Its own process group (killed as a whole at the end), the container's environment.
    env = {**os.environ, **{e["name"]: e["value"] for e in container["env"]}, "HOME": str(tmp_path)}
    proc = subprocess.Popen(
        [str(mlflow_bin), "server", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        env=env,
        start_new_session=True,
    )
    try:
        probe = container["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + 90
        status = 0
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "server.log").read_text()
            try:
                status = _get(port, probe, "localhost")
                if status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert status == 200, (tmp_path / "server.log").read_text()[-3000:]
        # The Service's names (with the Service port, as clients send them) are allowed; strangers are not.
        service_host = "kubetune-mlflow.kubetune-system.svc:5000"
        assert _get(port, "/api/2.0/mlflow/experiments/search?max_results=1", service_host) == 200
        assert _get(port, "/api/2.0/mlflow/experiments/search?max_results=1", "mlflow.example.com") == 200
        assert _get(port, "/api/2.0/mlflow/experiments/search?max_results=1", "evil.example.net") == 403
        assert (store / "mlflow.db").exists()
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group, SIGKILL to whatever is left of it."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
