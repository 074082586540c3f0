"""``kubetune watch``: what it prints for each kind of FineTuneJob status, and its exit status.

The real-API-server version (a FineTuneJob whose status changes while the command runs) is in
tests/integration/test_watch_cluster.py.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Any

import pytest

from kubetune_api.failures import HINTS, MEANINGS, Failure, TrainingFailure
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


def test_no_kubeconfig_is_one_line_and_exit_2_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kubernetes")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    monkeypatch.setenv("HOME", str(tmp_path))
    args = build_parser().parse_args(["watch", "my-job"])
    assert args.func(args) == watch.EXIT_MISSING
    err = capsys.readouterr().err
    assert err.startswith("kubetune watch: no cluster to follow the job in: ") and err.count("\n") == 1, err
    assert "(--kubeconfig, --context or KUBECONFIG)" in err

    (tmp_path / "config").write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    args = build_parser().parse_args(
        ["watch", "my-job", "--kubeconfig", str(tmp_path / "config"), "--context", "gpu"]
    )
    assert args.func(args) == watch.EXIT_MISSING
    assert "no cluster to follow the job in" in capsys.readouterr().err


# --- why training failed, the budget, memory retries and goodput ------------------------------------------

DISK_FULL = TrainingFailure.of(
    Failure.DISK_FULL, "OSError: [Errno 28] No space left on device saving checkpoint-120", step=120
)
GOODPUT = {
    "heldGpuSeconds": 5040.0,
    "productiveGpuSeconds": 4410.0,
    "restartLostGpuSeconds": 300.0,
    "startupGpuSeconds": 230.0,
    "checkpointGpuSeconds": 100.0,
    "restarts": 1,
    "goodputPercent": 87.5,
}
GOODPUT_LINE = (
    "Goodput 87.5%: of 5,040 GPU-seconds held, 4,410 productive, 300 lost to 1 restart, 230 start-up, "
    "100 saving checkpoints"
)
BUDGET = (
    "training stopped at spec.budget maxDuration 2h: step 300 of 500 planned; the final model is that step's"
)


def failed(reason: str, message: str, **status: Any) -> dict[str, Any]:
    """A Failed job as the operator writes a training failure: the reason on Training and Ready."""
    return job(
        "Failed",
        conditions=[cond("Training", message, "False", reason), cond("Ready", message, "False", reason)],
        **status,
    )


def test_a_training_failure_shows_its_reason_message_meaning_and_remedy() -> None:
    code, text = run([job("Training", conditions=TRAINING), failed("DiskFull", DISK_FULL.describe())])
    assert code == watch.EXIT_FAILED
    assert text.splitlines() == [
        "     0s  Training: training",
        "     0s  Failed",
        "DiskFull at step 120: OSError: [Errno 28] No space left on device saving checkpoint-120",
        "  what it means: the checkpoint volume is full (No space left on device)",
        "  what to do: the previous checkpoint stays usable: give the job a larger volume (spec.storage.size, "
        "or a larger existingClaim) or keep fewer checkpoints (spec.training.saveTotalLimit), then re-create "
        "it on the same claim to resume",
    ]
    assert text.count(HINTS[Failure.DISK_FULL]) == 1  # the hint the message ends with, shown once


@pytest.mark.parametrize("reason", list(Failure))
def test_every_failure_is_shown_with_its_texts_once(reason: Failure) -> None:
    for step in (None, 7):
        failure = TrainingFailure.of(reason, "what happened", step=step)
        at = "" if step is None else " at step 7"
        assert watch.failure_lines(reason, failure.describe()) == [
            f"{reason}{at}: what happened",
            f"  what it means: {MEANINGS[reason]}",
            f"  what to do: {HINTS[reason]}",
        ]


def test_a_failure_message_without_the_reason_or_the_hint_gets_both() -> None:
    code, text = run([failed("LossDiverged", "the loss was NaN at step 40")])
    assert code == watch.EXIT_FAILED
    assert text.splitlines()[-3:] == [
        "LossDiverged: the loss was NaN at step 40",
        f"  what it means: {MEANINGS[Failure.LOSS_DIVERGED]}",
        f"  what to do: {HINTS[Failure.LOSS_DIVERGED]}",
    ]
    assert watch.failure_lines(Failure.EVICTED, "")[0] == "Evicted"
    assert (
        watch.failure_lines(Failure.NCCL_ERROR, "NcclErrors on rank 3")[0]
        == "NcclError: NcclErrors on rank 3"
    )


def test_the_failure_on_the_training_condition_when_ready_says_something_else() -> None:
    oom = TrainingFailure.of(Failure.HOST_OUT_OF_MEMORY, "container pytorch was OOMKilled (limit 64Gi)")
    status = job(
        "Failed",
        conditions=[
            cond("Training", oom.describe(), "False", "HostOutOfMemory"),
            cond("Ready", "training failed", "False", "TrainingFailed"),
        ],
    )
    _, text = run([status])
    assert text.splitlines()[-3] == "HostOutOfMemory: container pytorch was OOMKilled (limit 64Gi)"


def test_a_failure_reason_on_a_true_condition_is_not_a_failure() -> None:
    assert watch.training_failure({"conditions": [cond("Ready", "all good", "True", "DiskFull")]}) is None


def test_stopped_at_the_budget_and_registered() -> None:
    status = job(
        "Succeeded",
        conditions=[
            cond("Ready", "registered model qwen version 3"),
            cond("BudgetReached", BUDGET, "True", "BudgetReached"),
        ],
        registeredModel={"name": "qwen", "version": "3", "uri": "models:/qwen/3"},
        budget={"reached": True, "limit": "maxDuration 2h", "step": 300, "totalSteps": 500},
        goodput=GOODPUT,
    )
    code, text = run([status])
    assert code == watch.EXIT_SUCCEEDED
    assert text.splitlines() == [
        "     0s  Succeeded",
        BUDGET,
        "Registered model qwen version 3  (models:/qwen/3)",
        GOODPUT_LINE,
    ]


def test_stopped_at_the_budget_without_registering() -> None:
    status = job(
        "Succeeded",
        conditions=[cond("Ready", "trained; registration is off (budget.register: false)")],
        budget={"reached": True, "limit": "maxGpuHours 16", "step": 300, "totalSteps": 500},
    )
    _, text = run([status])
    assert text.splitlines()[1:] == [
        "training stopped at spec.budget maxGpuHours 16: step 300 of 500 planned",
        "trained; registration is off (budget.register: false)",
    ]
    assert watch.budget_line({"budget": {"reached": False, "limit": "maxDuration 2h"}}) is None
    assert watch.budget_line({"conditions": [cond("BudgetReached", "", "False", "BudgetReached")]}) is None


def test_memory_retries_are_shown_once_each_as_they_come() -> None:
    first = {"attempt": 1, "step": 40, "before": "8 rows x 1", "after": "4 rows x 2"}
    second = {"attempt": 2, "step": 41, "before": "4 rows x 2", "after": "2 rows x 4"}
    progress = {"step": 40, "totalSteps": 100}
    code, text = run(
        [
            job("Training", conditions=TRAINING, progress=progress),
            job("Training", conditions=TRAINING, progress=progress, memoryRetries=[first]),
            job("Training", conditions=TRAINING, progress=progress, memoryRetries=[first]),
            job("Training", conditions=TRAINING, progress=progress, memoryRetries=[first, second]),
            job("Succeeded", conditions=[cond("Ready", "done")], memoryRetries=[first, second]),
        ]
    )
    assert code == 0
    bar = "         [##########--------------]  40%  step 40/100"
    assert text.splitlines() == [
        "     0s  Training: training",
        bar,
        "         CUDA out of memory at step 40: retry 1, 8 rows x 1 -> 4 rows x 2",
        bar,
        "         CUDA out of memory at step 41: retry 2, 4 rows x 2 -> 2 rows x 4",
        bar,
        "     0s  Succeeded",
        "done",
    ]


def test_a_memory_retry_ends_the_redrawn_progress_line_on_a_terminal() -> None:
    retry = {"attempt": 1, "before": "8 rows x 1", "after": "4 rows x 2"}
    progress = {"step": 1, "totalSteps": 4}
    _, text = run(
        [
            job("Training", conditions=TRAINING, progress=progress),
            job("Training", conditions=TRAINING, progress=progress, memoryRetries=[retry]),
        ],
        tty=True,
    )
    bar = "[######------------------]  25%  step 1/4"
    assert text.endswith(
        f"\r\033[2K{bar}\n         CUDA out of memory: retry 1, 8 rows x 1 -> 4 rows x 2\n\r\033[2K{bar}\n"  # the stream ended: the line is closed
    )


def test_goodput_after_a_failure_and_without_a_percent() -> None:
    goodput = {**GOODPUT, "goodputPercent": None, "restarts": 2}
    _, text = run([failed("DiskFull", DISK_FULL.describe(), goodput=goodput)])
    assert text.splitlines()[-1] == (
        "Goodput 87.5%: of 5,040 GPU-seconds held, 4,410 productive, 300 lost to 2 restarts, 230 start-up, "
        "100 saving checkpoints"
    )
    assert watch.goodput_line({"goodput": {}}) == (
        "Goodput ?: of 0 GPU-seconds held, 0 productive, 0 lost to 0 restarts, 0 start-up, 0 saving checkpoints"
    )
    assert watch.goodput_line({}) is None


def _operator_status(*observations: Any) -> dict[str, Any]:
    """The status the operator's own state machine writes after these observations."""
    from kubetune_api.status import FineTuneJobStatus
    from kubetune_operator import state

    status = FineTuneJobStatus()
    for obs in observations:
        written = state.transition(status, obs).status
        status = FineTuneJobStatus.model_validate(written)
    return {"metadata": {"name": "job", "namespace": "ns"}, "status": written}


def _observation(**kw: Any) -> Any:
    from kubetune_operator import state

    return state.Observation(
        generation=1,
        now="2026-11-30T10:00:00Z",
        namespace="ns",
        pytorchjob_name="job-train",
        registration_job_name="job-register",
        checkpoint_claim="job-ckpt",
        children={"checkpointClaim": "job-ckpt", "configMap": "job-config", "pytorchJob": "job-train"},
        **kw,
    )


def _pytorchjob(condition: str, message: str = "") -> Any:
    from kubetune_operator import state

    return state.TrainingObservation(
        exists=True, condition=condition, reason=f"PyTorchJob{condition}", message=message
    )


def test_a_failure_in_the_operators_own_words() -> None:
    """The message the operator writes (TrainingFailure.describe(), then the logs command and the
    claim): the hint once, on its line, and what the operator added after it."""
    failure = TrainingFailure.of(
        Failure.DISK_FULL, "pod job-train-master-0: No space left on device", step=120
    )
    obj = _operator_status(
        _observation(training=_pytorchjob("Running")),
        _observation(training=_pytorchjob("Failed", "1 Master replica(s) failed"), failure=failure),
    )
    code, text = run([obj])
    assert code == watch.EXIT_FAILED
    lines = text.splitlines()
    assert lines[0] == "     0s  Failed"
    assert lines[1:4] == [
        "DiskFull at step 120: pod job-train-master-0: No space left on device",
        f"  what it means: {MEANINGS[Failure.DISK_FULL]}",
        f"  what to do: {HINTS[Failure.DISK_FULL]}",
    ]
    assert lines[4].startswith(
        "  See the trainer logs: kubectl logs -n ns -l training.kubeflow.org/job-name=job-train"
    )
    assert text.count(HINTS[Failure.DISK_FULL]) == 1


def test_a_budget_in_the_operators_own_words() -> None:
    from kubetune_api.status import BudgetStatus

    budget = BudgetStatus(reached=True, limit="maxDuration 2h", step=300, total_steps=500)
    obj = _operator_status(
        _observation(training=_pytorchjob("Running")),
        _observation(training=_pytorchjob("Succeeded", "done"), budget=budget, registration_enabled=False),
    )
    obj["status"]["budget"] = budget.model_dump(by_alias=True, exclude_none=True)  # the trainer's report
    code, text = run([obj])
    assert code == watch.EXIT_SUCCEEDED
    assert text.splitlines()[1] == (
        "training stopped at spec.budget maxDuration 2h: step 300 of 500 planned; the final model is that step's"
    )
    assert watch.budget_line({"budget": obj["status"]["budget"]}) == (
        "training stopped at spec.budget maxDuration 2h: step 300 of 500 planned"
    )


def test_the_checkpoints_pages_sample_of_the_end_of_a_watch_is_what_watch_prints() -> None:
    """docs/checkpoints.md shows how `kubetune watch` ends; its lines are the watch's own for the status
    that sample describes (the page's other numbers: a registered version 4, an evaluation gate)."""
    from tests.support import docs_samples
    from tests.support.controlplane import REPO

    (block,) = [
        b for b in docs_samples.code_blocks(REPO / "docs" / "checkpoints.md") if "Registered model" in b.text
    ]
    ui = "http://mlflow.mlflow.svc:5000"
    status = {
        "phase": "Succeeded",
        "registeredModel": {
            "name": "assistant",
            "version": "4",
            "uri": "models:/assistant/4",
            "alias": "champion",
            "url": f"{ui}/#/models/assistant/versions/4",
        },
        "evaluation": {
            "selected": "checkpoint-50",
            "evalLoss": 1.312,
            "gatePassed": True,
            "threshold": 1.3818,
            "baseEvalLoss": 1.41,
        },
        "mlflow": {
            "runId": "0a1b2c3d4e5f",
            "trackingUri": ui,
            "runUrl": f"{ui}/#/experiments/7/runs/0a1b2c3d4e5f",
        },
    }
    first, *rest = block.text.splitlines()
    assert first == f"{watch.format_duration(4 * 60 + 12):>7}  Succeeded"
    assert rest == watch.succeeded_lines(status)
