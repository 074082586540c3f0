"""The records of ``KUBETUNE_PROC_ACCOUNT`` (see ``sitecustomize.py`` beside it): what a process
was, and one JSON line per process. Importable as ``proc_account_core`` (this folder on
``PYTHONPATH``) and as ``tests.support.proc_account.proc_account_core``."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV = "KUBETUNE_PROC_ACCOUNT"
# the libraries whose import dominates a process's start (torch and what is built on it)
HEAVY = ("torch", "transformers", "trl", "peft", "datasets", "mlflow", "torchao", "sklearn", "kopf")
# python -m <module>: the module is the kind; a script: its file's name without .py
_SERVERS = {"mlflow": "mlflow server", "uvicorn": "mlflow server (uvicorn worker)"}


def kind(argv: Sequence[str], orig_argv: Sequence[str] = ()) -> str:
    """What a process was, from its command line: a module or a script and its subcommand, never an
    argument's value.

    >>> kind(["-m"], ["python", "-m", "kubetune_trainer.train", "--config", "/etc/x.yaml"])
    'kubetune_trainer.train'
    >>> kind(["/repo/trainer/kubetune_trainer/register.py", "--config", "c"])
    'kubetune_trainer.register'
    >>> kind(["/v/bin/kubetune", "run", "examples/tiny-local.yaml", "--local"])
    'kubetune run'
    >>> kind(["/r/cli/kubetune_cli/__main__.py", "run"], ["python", "-m", "kubetune_cli", "run", "j.yaml"])
    'kubetune run'
    >>> kind(["-c"], ["python", "-c", "print(1)"])
    'python -c'
    >>> kind(["/v/bin/pytest", "-q", "tests/unit"])
    'pytest'
    >>> kind(["/v/bin/mlflow", "server", "--port", "1"])
    'mlflow server'
    """
    orig = list(orig_argv)
    if "-m" in orig[1:]:
        rest = orig[orig.index("-m", 1) + 1 :]
        module = rest[0] if rest else ""
        if module == "kubetune_cli" and len(rest) > 1 and not rest[1].startswith("-"):
            return f"kubetune {rest[1]}"
        return _SERVERS.get(module, module)
    if not argv or not argv[0] or argv[0] == "-c":
        return "python -c" if argv and argv[0] == "-c" else "python"
    path = Path(argv[0])
    name = path.name.removesuffix(".py")
    if name in ("__main__", "main") and path.parent.name:
        name = path.parent.name
    if path.parent.name.startswith("kubetune_") and name != path.parent.name:
        name = f"{path.parent.name}.{name}"
    if name in ("kubetune", "kubetune_cli") and len(argv) > 1 and not argv[1].startswith("-"):
        return f"kubetune {argv[1]}"
    if name == "mlflow" and len(argv) > 1 and argv[1] == "server":
        return "mlflow server"
    return name


def append(what: str, *, cpu: float, wall: float, modules: Mapping[str, object] | None = None) -> None:
    """One record into the file ``KUBETUNE_PROC_ACCOUNT`` names (nothing when it is unset)."""
    path = os.environ.get(ENV)
    if not path:
        return
    record = {
        "kind": what,
        "cpu": round(cpu, 3),
        "wall": round(wall, 3),
        # imported: in sys.modules and not None (None marks a module made unimportable)
        "heavy": [m for m in HEAVY if (modules or {}).get(m) is not None],
    }
    # one write of one line: lines of concurrent processes do not interleave (O_APPEND)
    with Path(path).open("a", encoding="utf-8") as out:
        out.write(json.dumps(record) + "\n")


def record_pid(pid: int, what: str) -> None:
    """Record a running process that its launcher is about to stop (a Go controller, an operator
    killed with SIGKILL): its own CPU seconds so far, from ``/proc``. Nothing when accounting is
    off or the process is gone."""
    if not os.environ.get(ENV):
        return
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return
    ticks = os.sysconf("SC_CLK_TCK")
    # fields after the command: state is [0], utime [11], stime [12], starttime [19]
    cpu = (int(fields[11]) + int(fields[12])) / ticks
    append(what, cpu=cpu, wall=uptime - int(fields[19]) / ticks)


def summary(path: Path) -> list[tuple[str, int, float, float, float]]:
    """Per kind, largest CPU first: (kind, processes, CPU seconds, wall seconds, CPU seconds each)."""
    totals: dict[str, list[float]] = {}
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        r = json.loads(line)
        t = totals.setdefault(r["kind"], [0, 0.0, 0.0])
        t[0] += 1
        t[1] += r["cpu"]
        t[2] += r["wall"]
    rows = [(k, int(n), cpu, wall, cpu / n) for k, (n, cpu, wall) in totals.items()]
    return sorted(rows, key=lambda r: -r[2])
