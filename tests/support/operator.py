"""The kubetune operator as a real process, the way its Deployment runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.support import proc_account
from tests.support.controlplane import REPO, free_port


class OperatorProcess:
    """The operator as a real process (``python -m kubetune_operator``), to be killed mid-flight."""

    def __init__(self, namespace: str, env: dict[str, str], log: Path) -> None:
        self.namespace = namespace
        self.env = {**os.environ, **env}
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None
        self.liveness_port = free_port()

    @property
    def liveness_url(self) -> str:
        return f"http://127.0.0.1:{self.liveness_port}/healthz"

    def start(self) -> None:
        out = self.log.open("ab")
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "kubetune_operator",
                "--namespace",
                self.namespace,
                "--verbose",
                "--liveness",
                self.liveness_url,
            ],
            env=self.env,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )

    def kill(self) -> None:
        """SIGKILL: no cleanup, no graceful stop, like a node loss or an OOM kill."""
        if self.proc is not None and self.proc.poll() is None:
            proc_account.record_pid(self.proc.pid, "kubetune_operator")
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None
