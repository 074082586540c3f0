"""No credential is ever printed, written to the run folder or sent to MLflow.

A tracking URI with ``user:password@`` is refused wherever it comes from (``--tracking-uri``,
``MLFLOW_TRACKING_URI``, the manifest), naming where, before anything is written. Credentials given
the right way (``MLFLOW_TRACKING_USERNAME``/``PASSWORD``, ``HF_TOKEN`` in the environment) and a
tracking URI with credentials that reaches the trainer anyway (a trainer config written by hand, an
operator default) never show up: not on stdout or stderr, in no file of the run folder, and nowhere
in the real MLflow server's store (its database, its artifacts, its log) or in what its API returns.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.e2e.conftest import TINY_DATA, run_trainer, trainer_config, trainer_env

from kubetune_api.trainer_config import MLFLOW_RUN_FILE, TRAIN_RESULT_FILE

pytestmark = [pytest.mark.e2e]

NO_MODEL = "/nonexistent/kubetune-test-model"
REMEDY = (
    "must not carry credentials (user:password@ or a token in the URI): give the URI without them, and "
    "the user and password in the environment variables MLFLOW_TRACKING_USERNAME and "
    "MLFLOW_TRACKING_PASSWORD (or a token in MLFLOW_TRACKING_TOKEN)"
)


def _secret() -> str:
    return f"pw-{uuid.uuid4().hex}"


def _with_credentials(uri: str, password: str) -> str:
    return uri.replace("://", f"://kubetune:{password}@", 1)


def _files_holding(secret: str, *folders: Path) -> list[Path]:
    """Every file under ``folders`` whose bytes contain ``secret``."""
    needle = secret.encode()
    return [
        path
        for folder in folders
        if folder.exists()
        for path in folder.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    ]


def _manifest(tmp_path: Path, model: str, **registration: Any) -> Path:
    doc = {
        "apiVersion": "kubetune.io/v1alpha1",
        "kind": "FineTuneJob",
        "metadata": {"name": "creds"},
        "spec": {
            "model": {"path": model},
            "dataset": {"path": str(TINY_DATA), "format": "messages"},
            "method": "full",
            "training": {
                "maxSteps": 2,
                "batchSize": 4,
                "maxLength": 128,
                "loggingSteps": 1,
                "saveSteps": 2,
                "warmupSteps": 1,
            },
            **({"registration": registration} if registration else {}),
        },
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _kubetune_run(tmp_path: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubetune_cli", "run", *args],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.mark.parametrize("where", ["flag", "environment"])
def test_a_tracking_uri_with_credentials_is_refused_naming_where_it_came_from(
    tmp_path: Path, mlflow_server: Any, where: str
) -> None:
    password = _secret()
    uri = _with_credentials(mlflow_server.uri, password)
    out = tmp_path / "run"
    env = trainer_env()
    args = [str(_manifest(tmp_path, NO_MODEL)), "--local", "--output-dir", str(out)]
    if where == "flag":
        args += ["--tracking-uri", uri]
        source = "--tracking-uri"
    else:
        env["MLFLOW_TRACKING_URI"] = uri
        source = "the environment variable MLFLOW_TRACKING_URI"
    proc = _kubetune_run(tmp_path, *args, env=env)
    assert proc.returncode == 2
    assert proc.stderr == f"kubetune: {source} {REMEDY}\n"
    assert password not in proc.stdout + proc.stderr
    assert not out.exists()
    assert _files_holding(password, mlflow_server.workdir) == []


def test_the_environments_tracking_uri_is_checked_even_when_the_flag_wins(
    tmp_path: Path, mlflow_server: Any
) -> None:
    password = _secret()
    env = {**trainer_env(), "MLFLOW_TRACKING_URI": _with_credentials("https://mlflow.example.com", password)}
    out = tmp_path / "run"
    manifest = _manifest(tmp_path, NO_MODEL)
    proc = _kubetune_run(
        tmp_path,
        str(manifest),
        "--local",
        "--output-dir",
        str(out),
        "--tracking-uri",
        mlflow_server.uri,
        env=env,
    )
    assert proc.returncode == 2
    assert proc.stderr == f"kubetune: the environment variable MLFLOW_TRACKING_URI {REMEDY}\n"
    assert password not in proc.stdout + proc.stderr and not out.exists()


def test_a_manifest_tracking_uri_with_credentials_is_refused(tmp_path: Path, mlflow_server: Any) -> None:
    password = _secret()
    manifest = _manifest(tmp_path, NO_MODEL, trackingUri=_with_credentials(mlflow_server.uri, password))
    out = tmp_path / "run"
    proc = _kubetune_run(tmp_path, str(manifest), "--local", "--output-dir", str(out), env=trainer_env())
    assert proc.returncode == 2
    # the field, then the CRD rule's message (which names the field itself)
    assert proc.stderr.startswith(f"kubetune: {manifest}: spec.registration.trackingUri")
    assert "spec.registration.trackingUri must not carry credentials" in proc.stderr
    assert len(proc.stderr.splitlines()) == 1
    assert password not in proc.stdout + proc.stderr and not out.exists()


@pytest.mark.training
def test_credentials_in_the_environment_appear_nowhere_after_a_whole_local_run(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    """Train and register against the real MLflow server with the credentials where they belong."""
    password, hf_token = _secret(), f"hf_{uuid.uuid4().hex}"
    env = {
        **trainer_env(),
        "MLFLOW_TRACKING_USERNAME": "kubetune",
        "MLFLOW_TRACKING_PASSWORD": password,
        "HF_TOKEN": hf_token,
    }
    out = tmp_path / "run"
    manifest = _manifest(tmp_path, str(tiny_model), experiment=f"creds/{uuid.uuid4().hex[:8]}")
    proc = _kubetune_run(
        tmp_path,
        str(manifest),
        "--local",
        "--output-dir",
        str(out),
        "--tracking-uri",
        mlflow_server.uri,
        "--no-progress-bar",
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "registered" in proc.stdout
    for secret in (password, hf_token):
        assert secret not in proc.stdout + proc.stderr
        assert _files_holding(secret, out, mlflow_server.workdir) == []
    _assert_mlflow_run_is_clean(mlflow_server, out, (password, hf_token))


@pytest.mark.training
def test_the_trainer_writes_and_uploads_a_tracking_uri_without_its_credentials(
    tmp_path: Path, tiny_model: Path, mlflow_server: Any
) -> None:
    """A trainer config whose tracking URI carries ``user:password@`` (as an operator default could):
    training works, and the password is in no log line, no file it writes, nothing MLflow keeps."""
    password = _secret()
    out = tmp_path / "run"
    uri = _with_credentials(mlflow_server.uri, password)
    config = trainer_config(out, tiny_model, tracking_uri=uri, maxSteps=2, saveSteps=2)
    log = tmp_path / "train.log"
    assert run_trainer(config, log) == 0, log.read_text()[-3000:]
    assert password not in log.read_text()
    assert _files_holding(password, out, mlflow_server.workdir) == []
    assert (out / TRAIN_RESULT_FILE).is_file() and (out / MLFLOW_RUN_FILE).is_file()
    _assert_mlflow_run_is_clean(mlflow_server, out, (password,))


def _assert_mlflow_run_is_clean(mlflow_server: Any, out: Path, secrets: tuple[str, ...]) -> None:
    """Through the API too: params, tags and every text artifact of the run (the config included)."""
    import json

    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.uri)
    run_id = json.loads((out / MLFLOW_RUN_FILE).read_text())["run_id"]
    run = client.get_run(run_id)
    assert run.data.params, "the run has its params"
    texts = [*run.data.params.values(), *run.data.tags.values()]
    config = client.download_artifacts(run_id, "kubetune/trainer-config.yaml", str(out.parent / "artifacts"))
    texts.append(Path(config).read_text())
    assert "spec:" in texts[-1] and "trackingUri:" in texts[-1]  # the resolved trainer config
    for secret in secrets:
        assert not [t for t in texts if secret in t]
