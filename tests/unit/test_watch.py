"""``kubetune watch``: what it prints for each kind of FineTuneJob status, and its exit status.

The real-API-server version (a FineTuneJob whose status changes while the command runs) is in
tests/integration/test_watch_cluster.py.
"""

from __future__ import annotations

import argparse
import io
from typing import Any

import pytest

from kubetune_cli import watch
from kubetune_cli.main import build_parser


def job(phase: str | None, **status: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"metadata": {"name": "j", "namespace": "ns"}}
    if phase is not None:
        body["status"] = {"phase": phase, **status}
    return body


def cond(ctype: str, message: str, status: str = "True", reason: str = "Because") -> dict[str, Any]:
    return {"type": ctype, "status": status, "reason": reason, "message": message, "lastTransitionTime": "t"}


TRAINING = [
    cond("ChildrenReady", "checkpoint volume, trainer config and PyTorchJob exist"),
    cond("Training", "training"),
]
SUCCEEDED = job(
    "Succeeded",
    conditions=[cond("Ready", "registered model qwen version 3")],
    registeredModel={"name": "qwen", "version": "3", "uri": "models:/qwen/3", "alias": "champion"},
    mlflow={"runId": "abc123", "trackingUri": "http://mlflow:5000"},
)
FAILED = job(
    "Failed", conditions=[cond("Ready", "PyTorchJob j-train failed (1 Master replica(s) failed)", "False")]
)


def run(versions: list[dict[str, Any] | None], tty: bool = False) -> tuple[int, str]:
    out = io.StringIO()
    code = watch.follow(iter(versions), out, tty=tty)
    return code, out.getvalue()


def test_a_job_followed_to_success() -> None:
    code, text = run(
        [
            job(None),
            job("Pending", conditions=[cond("Training", "PyTorchJob created; waiting for its pods")]),
            job("Training", conditions=TRAINING),
            job(
                "Training",
                conditions=TRAINING,
                progress={"step": 10, "totalSteps": 50, "percent": 20, "loss": 2.0},
            ),
            job(
                "Training",
                conditions=TRAINING,
                progress={
                    "step": 25,
                    "totalSteps": 50,
                    "percent": 50,
                    "epoch": 0.5,
                    "loss": 1.5,
                    "evalLoss": 1.6,
                    "tokensPerSecond": 12345.6,
                    "etaSeconds": 600,
                },
            ),
            job(
                "Registering",
                conditions=[cond("Registered", "registration Job j-register is running", "False")],
            ),
            SUCCEEDED,
            job("Training"),  # never read: the job has ended
        ]
    )
    assert code == 0
    lines = text.splitlines()
    phases = [line.split()[1].rstrip(":") for line in lines if line.strip() and not line.startswith(" " * 9)]
    assert phases[:5] == ["Pending", "Pending", "Training", "Registering", "Succeeded"]
    assert "Pending: PyTorchJob created; waiting for its pods" in text
    assert (
        "[############------------]  50%  step 25/50  epoch 0.50  loss 1.5000  eval 1.6000  12,346 tok/s  ETA 10m00s"
        in text
    )
    assert "[#####-------------------]  20%  step 10/50  loss 2.0000" in text
    assert "Registering: registration Job j-register is running" in text
    assert lines[-2] == "Registered model qwen version 3  (models:/qwen/3)  alias @champion"
    assert lines[-1] == "MLflow run abc123 on http://mlflow:5000"


def test_a_failed_job_exits_non_zero_with_the_reason() -> None:
    code, text = run([job("Training", conditions=TRAINING), FAILED])
    assert code == watch.EXIT_FAILED
    assert text.splitlines()[-1] == "PyTorchJob j-train failed (1 Master replica(s) failed)"


def test_suspended_is_followed_until_it_ends() -> None:
    suspended = job(
        "Suspended", conditions=[cond("Suspended", "spec.suspend is true: the PyTorchJob is suspended")]
    )
    code, text = run(
        [job("Training", conditions=TRAINING), suspended, job("Training", conditions=TRAINING), SUCCEEDED]
    )
    assert code == 0
    assert "Suspended: spec.suspend is true" in text


def test_deleted_and_ended_streams() -> None:
    assert run([job("Training"), None]) == (
        watch.EXIT_MISSING,
        "     0s  Training\nthe FineTuneJob was deleted\n",
    )
    assert run([job("Training")])[0] == watch.EXIT_TIMEOUT


def test_progress_is_redrawn_in_place_on_a_terminal() -> None:
    versions: list[dict[str, Any] | None] = [
        job("Training", conditions=TRAINING, progress={"step": s, "totalSteps": 4}) for s in range(1, 5)
    ]
    code, text = run([*versions, SUCCEEDED], tty=True)
    assert code == 0
    assert text.count("\r\033[2K") == 4
    assert "[######------------------]  25%  step 1/4" in text
    assert "\n" in text.split("step 4/4")[1][:1]  # the bar line is ended before the next phase


def test_unchanged_progress_prints_nothing_new() -> None:
    v = job("Training", conditions=TRAINING, progress={"step": 3, "totalSteps": 6, "loss": 1.0})
    _, once = run([v])
    _, thrice = run([v, v, v])
    assert once == thrice


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "?"), (0, "0s"), (59, "59s"), (61, "1m01s"), (3600, "1h00m"), (5 * 3600 + 7 * 60, "5h07m")],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert watch.format_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "seconds"), [("90", 90), ("90s", 90), ("15m", 900), ("6h", 21600), ("1h30m", 5400)]
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert watch.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "1d", "5 m"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        watch.parse_duration(text)


def test_the_subcommand_is_wired() -> None:
    args = build_parser().parse_args(["watch", "my-job", "-n", "team", "--timeout", "2h"])
    assert (args.name, args.namespace, args.timeout) == ("my-job", "team", 7200.0)
    assert args.func is watch._run
