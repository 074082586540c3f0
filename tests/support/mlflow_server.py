"""A real MLflow tracking server for tests: ``mlflow server`` on 127.0.0.1 with a sqlite store.

The server runs from the project's own environment (the ``mlflow`` next to the running Python), with
one worker, a sqlite backend store and proxied artifacts (``--serve-artifacts``) under ``workdir``,
so clients exercise the same REST and artifact paths they use against a team server.

``stop()`` and ``start()`` take it down and bring it back on the same port and the same store, to
test clients that must survive an unreachable tracking server::

    with running_mlflow_server(tmp_path) as server:
        mlflow.set_tracking_uri(server.uri)
        server.stop()   # now connections are refused
        server.start()  # same URI, same runs and registered models
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.support import proc_account

START_TIMEOUT_S = 240.0  # a busy two-core machine took 71 s (start-up is imports, mostly)
STOP_TIMEOUT_S = 15.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def mlflow_executable() -> str:
    """The ``mlflow`` script of the environment running the tests (not whatever is on PATH)."""
    candidate = Path(sys.executable).with_name("mlflow")
    return str(candidate) if candidate.exists() else "mlflow"


@dataclass
class MlflowServer:
    workdir: Path
    port: int
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "mlflow-server.log"

    def command(self) -> list[str]:
        return [
            mlflow_executable(),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            # One worker: start-up dominates test time, and one process keeps the sqlite store free
            # of concurrent writers.
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{self.workdir / 'mlflow.db'}",
            "--serve-artifacts",
            "--artifacts-destination",
            str(self.workdir / "artifacts"),
        ]

    def start(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the server (again) and wait until /health answers."""
        if self.running():
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        # The server must not pick up a tracking URI or credentials meant for the client under test.
        for name in (
            "MLFLOW_TRACKING_URI",
            "MLFLOW_TRACKING_TOKEN",
            "MLFLOW_TRACKING_USERNAME",
            "MLFLOW_TRACKING_PASSWORD",
        ):
            env.pop(name, None)
        env["PYTHONUNBUFFERED"] = "1"
        # No job runner: MLflow 3 starts one (four more processes that import mlflow and then poll)
        # for its server-side jobs, which kubetune does not use; a test server would pay for it in CPU.
        env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.command(),
                cwd=self.workdir,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                # Its own process group: uvicorn's worker is a child, and stop() must end both.
                start_new_session=True,
            )
        self._wait_healthy(timeout_s)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited with {self.process.returncode} during start-up:\n{self.log_tail()}"
                )
            if self.healthy():
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(
            f"mlflow server on {self.uri} not healthy after {timeout_s:.0f}s:\n{self.log_tail()}"
        )

    def stop(self) -> None:
        """Stop the server (the whole process group) and wait until the port refuses connections."""
        proc, self.process = self.process, None
        if proc is None:
            return
        if proc.poll() is None:
            proc_account.record_pid(proc.pid, "mlflow server")
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        # A worker that outlived its parent would keep answering on the port.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while self._port_open() and time.monotonic() < deadline:
            time.sleep(0.1)

    def _port_open(self) -> bool:
        with socket.socket() as s:
            s.settimeout(0.5)
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no server log)"


@contextlib.contextmanager
def running_mlflow_server(workdir: Path, port: int | None = None) -> Iterator[MlflowServer]:
    """A started MLflow server whose store lives in ``workdir``; always stopped on exit."""
    server = MlflowServer(workdir=Path(workdir), port=port or free_port())
    try:
        server.start()
        yield server
    finally:
        server.stop()
