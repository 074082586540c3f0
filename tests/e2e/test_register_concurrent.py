"""Registration exactly once when registration processes overlap, against a real ``mlflow server``.

Two registration processes for the same training, started at the same moment (a Job's replacement
pod while the old one still runs, a retry racing a slow pod), must end with one MLflow run, one
model logged into it and one model version, and both must report that version. A process killed
(SIGKILL) while it holds the registration claim must not keep it: the next one takes over and
finishes with one version.

Every trial reuses one final model (the tiny Qwen2 model's full weights, made once for the module)
through a symlink, so a trial costs two process start-ups and one registration of a ~1 MB model.
The processes are the registration entry point (``kubetune_trainer.register.main``, what
``python -m kubetune_trainer.register`` runs) behind a start line: each imports first what the
registration imports before it takes the claim (MLflow, seconds), then both wait for one file and
start within milliseconds of each other, so they really race for the claim and the same MLflow
objects. Only the one that logs the model imports transformers and torch, under the claim, as in a
pod (tests/unit/test_register.py checks that the other never does).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.conftest import REPO, trainer_env
from tests.e2e.test_register_e2e import client, make_final, write_config
from tests.support.mlflow_server import MlflowServer

pytestmark = [pytest.mark.e2e, pytest.mark.training]

TRIALS = 20
PROCESS_TIMEOUT_S = 240.0

# The registration entry point behind a start line: the slow imports of the race happen before it.
LAUNCHER = """
import sys, time
from pathlib import Path
import mlflow, mlflow.tracking
from kubetune_trainer.registration import register
ready, go = Path(sys.argv[1]), Path(sys.argv[2])
ready.touch()
while not go.exists():
    time.sleep(0.002)
sys.exit(register.main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def shared_final(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One final model (full weights, marked COMPLETE) that every trial registers."""
    return make_final(tmp_path_factory.mktemp("shared-final"), tiny_model, "full")


def prepare(tmp: Path, tiny_model: Path, final: Path, uri: str, trial: str) -> tuple[Path, str]:
    """A job's config and output folder (its ``final`` a link to the shared model); the model name."""
    name = f"tiny-race-{trial}"
    config = write_config(
        tmp,
        base=tiny_model,
        method="full",
        tracking_uri=uri,
        name=f"race-{trial}",
        uid=f"uid-race-{trial}",
        model_name=name,
    )
    out = tmp / "out"
    out.mkdir(parents=True, exist_ok=True)
    (out / "final").symlink_to(final, target_is_directory=True)
    return config, name


def open_training_run(out: Path, uri: str, uid: str) -> str:
    """The run training opened (its id on the volume), as when training reached MLflow."""
    mlflow = client(uri)
    experiment = mlflow.get_experiment_by_name("kubetune/team-a")
    exp_id = experiment.experiment_id if experiment else mlflow.create_experiment("kubetune/team-a")
    run_id = str(mlflow.create_run(exp_id, tags={"kubetune.job.uid": uid}).info.run_id)
    mlflow.set_terminated(run_id)
    (out / "mlflow-run.json").write_text(
        json.dumps({"run_id": run_id, "experiment_id": exp_id, "tracking_uri": uri})
    )
    return run_id


def start(config: Path, tag: str, ready: Path, go: Path) -> subprocess.Popen[str]:
    env = trainer_env()
    env["MLFLOW_UV_AUTO_DETECT"] = "false"
    term = config.parent / f"termination-{tag}"
    argv = ["--config", str(config), "--termination-message-path", str(term)]
    return subprocess.Popen(
        [sys.executable, "-c", LAUNCHER, str(ready), str(go), *argv],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str]:
    try:
        out, _ = proc.communicate(timeout=PROCESS_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out


def race(configs: list[Path], tmp: Path) -> list[tuple[int, str]]:
    """Start one process per config, wait until each has imported everything, then let all go."""
    go = tmp / "go"
    procs = []
    readies = []
    try:
        for i, config in enumerate(configs):
            ready = tmp / f"ready-{i}"
            readies.append(ready)
            procs.append(start(config, str(i), ready, go))
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        while not all(r.exists() for r in readies):
            assert all(p.poll() is None for p in procs), [finish(p)[1][-3000:] for p in procs]
            assert time.monotonic() < deadline, "the registration processes never got ready"
            time.sleep(0.05)
        go.touch()
    finally:
        results = [finish(p) for p in procs]
    return results


def job_runs(uri: str, uid: str) -> list[Any]:
    mlflow = client(uri)
    experiment = mlflow.get_experiment_by_name("kubetune/team-a")
    assert experiment is not None
    return list(
        mlflow.search_runs([experiment.experiment_id], filter_string=f"tags.`kubetune.job.uid` = '{uid}'")
    )


def logged_models(uri: str, run_id: str) -> list[Any]:
    mlflow = client(uri)
    experiment_id = mlflow.get_run(run_id).info.experiment_id
    return list(mlflow.search_logged_models([experiment_id], filter_string=f"source_run_id = '{run_id}'"))


@pytest.mark.parametrize("trial", range(TRIALS))
def test_two_registrations_at_once_make_one_version(
    trial: int, tmp_path: Path, tiny_model: Path, shared_final: Path, mlflow_server: MlflowServer
) -> None:
    uri = mlflow_server.uri
    config, name = prepare(tmp_path, tiny_model, shared_final, uri, f"t{trial}")
    uid = f"uid-race-t{trial}"
    # Odd trials: training reached MLflow and left its run's id on the volume. Even trials: it did
    # not, and both processes would each make a run for the job without the claim.
    training_run = open_training_run(tmp_path / "out", uri, uid) if trial % 2 else None
    # The two processes share one config and output folder, as two pods of one Job share the volume.
    started = time.monotonic()
    results = race([config, config], tmp_path)
    elapsed = time.monotonic() - started
    for code, out in results:
        assert code == 0, out[-4000:]
    messages = [json.loads((tmp_path / f"termination-{i}").read_text()) for i in range(2)]
    # Both report the same, one version.
    assert messages[0] == messages[1], messages
    assert messages[0]["version"] == "1" and messages[0]["name"] == name

    versions = client(uri).search_model_versions(f"name = '{name}'")
    assert [v.version for v in versions] == ["1"]
    runs = job_runs(uri, uid)
    assert [r.info.run_id for r in runs] == [messages[0]["run_id"]]
    if training_run:
        assert messages[0]["run_id"] == training_run
    assert versions[0].run_id == messages[0]["run_id"]
    models = logged_models(uri, messages[0]["run_id"])
    assert len(models) == 1, [(m.model_id, m.status) for m in models]
    assert versions[0].source == f"models:/{models[0].model_id}"
    # One of the two waited for the other's claim and found its version (not a second upload).
    outputs = "\n".join(out for _, out in results)
    assert outputs.count("logging the model into run") == 1, outputs[-6000:]
    print(f"trial {trial}: two processes registered {name} once in {elapsed:.1f}s")


def test_a_claim_left_by_a_killed_process_is_taken_over(
    tmp_path: Path, tiny_model: Path, shared_final: Path, mlflow_server: MlflowServer
) -> None:
    from mlflow.entities import LoggedModelStatus

    uri = mlflow_server.uri
    config, name = prepare(tmp_path, tiny_model, shared_final, uri, "killed")
    uid = "uid-race-killed"
    out = tmp_path / "out"
    # The first process is killed while it logs the model: its logged model is still PENDING.
    go = tmp_path / "go"
    go.touch()
    first = start(config, "first", tmp_path / "ready-first", go)
    try:
        deadline = time.monotonic() + PROCESS_TIMEOUT_S
        pending: list[Any] = []
        while not pending:
            assert first.poll() is None, f"it finished before it could be killed:\n{finish(first)[1][-4000:]}"
            assert time.monotonic() < deadline, "the model was never being logged"
            runs = job_runs(uri, uid) if (out / "mlflow-run.json").exists() else []
            if runs:
                pending = [
                    m
                    for m in logged_models(uri, runs[0].info.run_id)
                    if m.status == LoggedModelStatus.PENDING
                ]
            time.sleep(0.02)
        os.kill(first.pid, signal.SIGKILL)
    finally:
        code, _ = finish(first)
    assert code == -signal.SIGKILL
    holder = json.loads((out / "register.lock").read_text())
    assert holder["pid"] == first.pid and holder["released"] is False  # it died holding the claim
    assert client(uri).search_model_versions(f"name = '{name}'") == []

    started = time.monotonic()
    second = start(config, "second", tmp_path / "ready-second", go)
    code, second_out = finish(second)
    took = time.monotonic() - started
    assert code == 0, second_out[-4000:]
    # taken over at once, not after a lease ran out (the claim waits up to an hour)
    assert took < 120, took
    assert f"pid {first.pid}" in second_out and "ended without releasing" in second_out, second_out[-4000:]
    result = json.loads((tmp_path / "termination-second").read_text())
    versions = client(uri).search_model_versions(f"name = '{name}'")
    assert [v.version for v in versions] == ["1"] == [result["version"]]
    # The killed process's unfinished upload is gone; the run holds the one model that was finished.
    models = logged_models(uri, result["run_id"])
    assert [m.status for m in models] == [LoggedModelStatus.READY], models
    assert pending[0].model_id not in {m.model_id for m in models}
    assert versions[0].source == f"models:/{models[0].model_id}"
    released = json.loads((out / "register.lock").read_text())
    assert released["pid"] == second.pid and released["released"] is True

    # A third run finds the version and changes nothing.
    third = start(config, "third", tmp_path / "ready-third", go)
    code, third_out = finish(third)
    assert code == 0, third_out[-4000:]
    assert json.loads((tmp_path / "termination-third").read_text()) == result
    assert "ended without releasing" not in third_out
    assert len(client(uri).search_model_versions(f"name = '{name}'")) == 1
    assert len(logged_models(uri, result["run_id"])) == 1
