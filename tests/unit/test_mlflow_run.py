"""The MLflow run of a job (kubetune_trainer.mlflow.run): redaction, the tracking URI, the run file,
"same server", and finding or making the run, against a fake client (no MLflow server)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST

from kubetune_api.spec import FineTuneJob
from kubetune_api.trainer_config import MLFLOW_RUN_FILE, TrainerConfig, resolve
from kubetune_trainer.mlflow.run import (
    TAG_CONFIG_HASH,
    TAG_JOB_UID,
    JobRun,
    RunFile,
    identity_tags,
    local_store_uri,
    redact,
    resolve_tracking_uri,
    same_server,
)

SECRET = "kt-run-secret-4711"


def make_config(
    tmp_path: Path, tracking_uri: str | None = "http://mlflow:5000", uid: str | None = "uid-1"
) -> TrainerConfig:
    job = FineTuneJob.model_validate(
        {
            "metadata": {"name": "run-job", "namespace": "ns", **({"uid": uid} if uid else {})},
            "spec": {
                "model": {"name": "Qwen/Qwen2-0.5B"},
                "dataset": {"name": "trl-lib/Capybara"},
                "training": {"maxSteps": 1},
            },
        }
    )
    return resolve(job, default_tracking_uri=tracking_uri, output_dir=str(tmp_path / "out"))


# --- redaction --------------------------------------------------------------------------------------


def test_redact_marks_the_user_information_of_every_uri() -> None:
    text = "at https://bob:p@ss@mlflow.example.com/x?owner=a@b.com and http://u:pw@other:5000"
    assert redact(text) == "at https://***@mlflow.example.com/x?owner=a@b.com and http://***@other:5000"


def test_redact_drops_the_user_information_of_a_uri_kept_as_the_servers_address() -> None:
    assert (
        redact("https://bob:p@ss@mlflow.example.com/x", drop_userinfo=True) == "https://mlflow.example.com/x"
    )
    assert redact("file:///home/me@corp/mlruns", drop_userinfo=True) == "file:///home/me@corp/mlruns"


def test_redact_removes_the_values_of_credential_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("HF_TOKEN", f"hf_{SECRET}")  # one secret holding another goes whole
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "ab")  # too short to redact
    text = redact(f"password {SECRET}, token hf_{SECRET}, user ab")
    assert text == "password ***, token ***, user ab"


def test_a_uri_kept_as_the_servers_address_keeps_a_host_that_holds_the_user_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "mlflow")
    assert redact("https://mlflow:pw@mlflow.example.com", drop_userinfo=True) == "https://mlflow.example.com"


# --- the server -------------------------------------------------------------------------------------


def test_the_tracking_uri_is_the_flag_then_the_config_then_the_local_store(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://mlflow:5000")
    assert resolve_tracking_uri(cfg, "http://flag:5000") == "http://flag:5000"
    assert resolve_tracking_uri(cfg) == "http://mlflow:5000"
    local = make_config(tmp_path, None)
    assert resolve_tracking_uri(local) == local_store_uri(tmp_path / "out")
    assert resolve_tracking_uri(local) == f"sqlite:///{(tmp_path / 'out').resolve()}/mlflow.db"


def test_same_server_ignores_credentials_and_trusts_a_record_without_a_uri() -> None:
    assert same_server("https://mlflow.example.com", "https://bob:pw@mlflow.example.com")
    assert same_server("https://***@mlflow.example.com", "https://mlflow.example.com")
    assert same_server(None, "http://mlflow:5000")
    assert not same_server("http://old-mlflow:5000", "http://mlflow:5000")
    assert not same_server("sqlite:////a/mlflow.db", "sqlite:////b/mlflow.db")


# --- the run file -----------------------------------------------------------------------------------


def test_the_run_file_round_trip_keeps_no_credentials(tmp_path: Path) -> None:
    RunFile("r1", "7", "https://bob:hunter2@mlflow.example.com").write(tmp_path)
    raw = json.loads((tmp_path / MLFLOW_RUN_FILE).read_text())
    assert raw == {"run_id": "r1", "experiment_id": "7", "tracking_uri": "https://mlflow.example.com"}
    assert RunFile.read(tmp_path) == RunFile("r1", "7", "https://mlflow.example.com")


@pytest.mark.parametrize("text", [None, "not json", "[]", '{"experiment_id": "7"}', '{"run_id": ""}'])
def test_a_missing_or_unusable_run_file_names_no_run(tmp_path: Path, text: str | None) -> None:
    if text is not None:
        (tmp_path / MLFLOW_RUN_FILE).write_text(text)
    assert RunFile.read(tmp_path) is None


# --- finding the run --------------------------------------------------------------------------------


class FakeClient:
    """The few MlflowClient calls JobRun makes, over runs kept in a dict."""

    def __init__(self) -> None:
        self.runs: dict[str, SimpleNamespace] = {}
        self.experiments: dict[str, str] = {}
        self.searches: list[str] = []

    def add_run(self, run_id: str, tags: dict[str, str], experiment_id: str = "1") -> None:
        info = SimpleNamespace(run_id=run_id, experiment_id=experiment_id)
        self.runs[run_id] = SimpleNamespace(info=info, data=SimpleNamespace(tags=tags))

    def get_run(self, run_id: str) -> Any:
        if run_id not in self.runs:
            raise MlflowException(f"Run '{run_id}' not found", error_code=RESOURCE_DOES_NOT_EXIST)
        return self.runs[run_id]

    def get_experiment_by_name(self, name: str) -> Any:
        exp_id = self.experiments.get(name)
        return None if exp_id is None else SimpleNamespace(experiment_id=exp_id)

    def create_experiment(self, name: str, artifact_location: str | None = None) -> str:
        self.experiments[name] = str(len(self.experiments) + 1)
        return self.experiments[name]

    def search_runs(self, experiment_ids: list[str], filter_string: str, **_: Any) -> list[Any]:
        self.searches.append(filter_string)
        return list(self.runs.values())

    def create_run(self, experiment_id: str, tags: dict[str, str]) -> Any:
        run_id = f"new{len(self.runs)}"
        self.add_run(run_id, tags, experiment_id)
        return self.runs[run_id]


def test_the_run_of_the_run_file_is_used_on_the_same_server(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    client = FakeClient()
    client.add_run("saved", {}, experiment_id="9")
    Path(cfg.output_dir).mkdir()
    RunFile("saved", "9", "http://mlflow:5000").write(cfg.output_dir)
    found = JobRun(cfg, "http://mlflow:5000", client).find()
    assert (found.run_id, found.experiment_id, found.from_file) == ("saved", "9", True)
    assert client.searches == []


def test_a_run_file_of_another_server_or_a_gone_run_falls_back_to_the_tags(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    Path(cfg.output_dir).mkdir()
    client = FakeClient()
    client.add_run("other-config", {**identity_tags(cfg), TAG_CONFIG_HASH: "0000"})
    client.add_run("mine", identity_tags(cfg))
    for saved in (RunFile("elsewhere", "1", "http://old:5000"), RunFile("gone", "1", "http://mlflow:5000")):
        saved.write(cfg.output_dir)
        found = JobRun(cfg, "http://mlflow:5000", client).find()
        assert (found.run_id, found.from_file) == ("mine", False)
    assert client.searches[-1] == f"tags.`{TAG_JOB_UID}` = 'uid-1'"


def test_a_new_run_is_tagged_with_the_jobs_identity_and_recorded(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, uid=None)
    Path(cfg.output_dir).mkdir()
    client = FakeClient()
    job_run = JobRun(cfg, "http://bob:pw@mlflow:5000", client)
    assert job_run.find(by_name=False).run_id is None and client.searches == []  # the tracker's local run
    found = job_run.find()
    assert found.run_id is None and client.searches == ["tags.`kubetune.job.name` = 'run-job'"]
    run_id = job_run.create(found.experiment_id)
    assert client.runs[run_id].data.tags == {**identity_tags(cfg), "mlflow.runName": "run-job"}
    job_run.remember(run_id, found.experiment_id)
    assert RunFile.read(cfg.output_dir) == RunFile(run_id, found.experiment_id, "http://mlflow:5000")
