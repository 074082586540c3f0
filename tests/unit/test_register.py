"""Registration without a real MLflow server: failure classes, the retry budget, redaction, results.

The refusal and outage cases talk to a stub HTTP server on 127.0.0.1 through MLflow's real client,
so the classification is checked against the exceptions MLflow actually raises.
"""

from __future__ import annotations

import errno
import http.server
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from mlflow.exceptions import MlflowException, RestException

from kubetune_api.spec import FineTuneJob
from kubetune_api.trainer_config import TrainerConfig, resolve
from kubetune_trainer import settings
from kubetune_trainer.mlflow.client import (
    MlflowRefusedError,
    MlflowUnavailableError,
    RedactingFilter,
    RedactingStream,
    Retrier,
    classify,
    redact,
)
from kubetune_trainer.registration import claim as register_claim
from kubetune_trainer.registration import register

SECRET = "kt-unit-secret-value-991"


def make_config(tmp_path: Path, tracking_uri: str, **registration: Any) -> TrainerConfig:
    job = FineTuneJob.model_validate(
        {
            "metadata": {"name": "unit-job", "namespace": "ns", "uid": "uid-unit"},
            "spec": {
                "model": {"name": "Qwen/Qwen2-0.5B", "revision": "abc123"},
                "dataset": {"name": "trl-lib/Capybara"},
                "training": {"maxSteps": 1},
                "registration": {"alias": "champion", **registration},
                "secrets": {"huggingFaceToken": {"name": "hf", "key": "token"}},
            },
        }
    )
    return resolve(job, default_tracking_uri=tracking_uri, output_dir=str(tmp_path / "out"))


def write_config(tmp_path: Path, cfg: TrainerConfig, *, complete: bool = True) -> Path:
    final = Path(cfg.output_dir) / "final"
    final.mkdir(parents=True)
    (final / "adapter_config.json").write_text("{}")
    if complete:
        (final / "COMPLETE").write_text("{}")
    path = tmp_path / "config.yaml"
    path.write_text(cfg.to_yaml())
    return path


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


# --- classification and retries -----------------------------------------------------------------------


def _http_error(status: int) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    return requests.HTTPError(f"{status}", response=response)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (requests.ConnectionError("refused"), "unreachable"),
        (
            MlflowException("API request to http://x/api failed with exception HTTPConnectionPool"),
            "unreachable",
        ),
        (RestException({"error_code": "TEMPORARILY_UNAVAILABLE", "message": "busy"}), "unreachable"),
        (RestException({"error_code": "INTERNAL_ERROR", "message": "db down"}), "unreachable"),
        (RestException({"error_code": "PERMISSION_DENIED", "message": "no"}), "refused"),
        (RestException({"error_code": "INVALID_PARAMETER_VALUE", "message": "bad name"}), "refused"),
        (_http_error(502), "unreachable"),
        (_http_error(401), "refused"),
        (MlflowException("a local mistake"), None),
        (ValueError("bug"), None),
    ],
)
def test_classify(exc: BaseException, kind: str | None) -> None:
    assert classify(exc)[0] == kind


def test_a_failure_of_another_host_is_not_an_mlflow_outage() -> None:
    hub = requests.ConnectionError(
        "no route", request=requests.Request("GET", "https://huggingface.co/api/x")
    )
    assert classify(hub, "http://mlflow.example:5000")[0] is None
    ours = requests.ConnectionError(
        "refused", request=requests.Request("GET", "http://mlflow.example:5000/api")
    )
    assert classify(ours, "http://u:p@mlflow.example:5000")[0] == "unreachable"


def test_redacting_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    sink = io.StringIO()
    stream = RedactingStream(sink)
    stream.write(f"View run at https://me:{SECRET}@mlflow/#/runs/1\n")
    stream.flush()
    assert sink.getvalue() == "View run at https://***@mlflow/#/runs/1\n"


def test_retrier_backs_off_and_then_succeeds() -> None:
    fake = FakeClock()
    calls = []

    def flaky() -> str:
        calls.append(fake.now)
        if len(calls) < 4:
            raise requests.ConnectionError("connection refused")
        return "ok"

    retrier = Retrier("http://mlflow:5000", budget_s=60, sleep=fake.sleep, clock=fake.clock)
    assert retrier.call("do it", flaky) == "ok"
    assert len(calls) == 4
    # Exponential: 1, 2, 4 seconds, each with +-20% jitter.
    assert len(fake.sleeps) == 3
    for slept, planned in zip(fake.sleeps, (1, 2, 4), strict=True):
        assert 0.8 * planned <= slept <= 1.2 * planned


def test_retrier_gives_up_when_the_total_budget_is_spent() -> None:
    fake = FakeClock()

    def down() -> None:
        fake.now += 0.5  # each failing attempt takes time too, and counts
        raise requests.ConnectionError("connection refused")

    retrier = Retrier("http://user:pw@mlflow:5000", budget_s=20, sleep=fake.sleep, clock=fake.clock)
    with pytest.raises(MlflowUnavailableError) as info:
        retrier.call("log the model", down)
    assert fake.now <= 20 + 0.5
    message = str(info.value)
    assert "http://***@mlflow:5000" in message and "pw" not in message
    assert "log the model" in message and "retry budget 20s" in message
    # The budget is for the whole registration: a later outage gets only what is left.
    with pytest.raises(MlflowUnavailableError):
        retrier.call("tag the run", down)
    assert fake.now <= 20 + 1.0


def test_retrier_does_not_retry_a_refusal_or_a_bug() -> None:
    fake = FakeClock()
    retrier = Retrier("http://mlflow:5000", budget_s=60, sleep=fake.sleep, clock=fake.clock)

    def forbidden() -> None:
        raise RestException({"error_code": "PERMISSION_DENIED", "message": "user may not register"})

    with pytest.raises(MlflowRefusedError) as info:
        retrier.call("register 'm'", forbidden)
    assert info.value.status == 403 and info.value.error_code == "PERMISSION_DENIED"
    assert "MLflow at http://mlflow:5000 refused to register 'm' (HTTP 403, PERMISSION_DENIED)" in str(
        info.value
    )

    def bug() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        retrier.call("x", bug)
    assert fake.sleeps == []


# --- secrets --------------------------------------------------------------------------------------------


def test_redact_removes_env_credentials_and_uri_passwords(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", SECRET)
    monkeypatch.setenv("HF_TOKEN", "hf_abc")
    text = redact(f"Authorization: Basic {SECRET} to https://bob:{SECRET}@mlflow/x with hf_abc")
    assert SECRET not in text and "hf_abc" not in text and "bob" not in text
    assert "https://***@mlflow/x" in text


def test_log_filter_redacts_messages_and_tracebacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    record = logging.LogRecord("x", logging.WARNING, __file__, 1, "token is %s", (SECRET,), None)
    try:
        raise RuntimeError(f"header Bearer {SECRET}")
    except RuntimeError:
        import sys

        record.exc_info = sys.exc_info()
    assert RedactingFilter().filter(record)
    assert SECRET not in logging.Formatter().format(record)


def test_lineage_tags_name_the_sources_and_never_a_secret(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://mlflow:5000")
    versions = {k: v for k, v in register.lineage_tags(cfg).items() if k.startswith("kubetune.version.")}
    assert versions["kubetune.version.transformers"] and versions["kubetune.version.peft"]
    tags = {k: v for k, v in register.lineage_tags(cfg).items() if k not in versions}
    assert tags == {
        "kubetune.job.name": "unit-job",
        "kubetune.job.namespace": "ns",
        "kubetune.job.uid": "uid-unit",
        "kubetune.config_hash": cfg.config_hash(),
        "kubetune.method": "lora",
        "kubetune.base_model": "Qwen/Qwen2-0.5B",
        "kubetune.base_model.revision": "abc123",
        "kubetune.dataset": "trl-lib/Capybara",
        "kubetune.dataset.revision": "main",
        "kubetune.lora_merged": "true",
    }
    # The alias may change later without making it another model.
    assert register.lineage_tags(make_config(tmp_path, "http://m", alias="other")) == {**tags, **versions}


# --- results --------------------------------------------------------------------------------------------


def test_termination_message_fits_the_kubelet_limit() -> None:
    text = register.termination_message({"error": "x" * 10_000, "reason": "MlflowRefused"})
    assert len(text.encode()) <= 4096
    assert json.loads(text)["reason"] == "MlflowRefused"


def test_termination_message_is_not_created_outside_a_container(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(settings.TERMINATION_MESSAGE_ENV, str(tmp_path / "elsewhere"))  # ignored
    absent = tmp_path / "termination-log"
    monkeypatch.setattr(register, "DEFAULT_TERMINATION_MESSAGE_PATH", str(absent))
    register.write_termination_message({"name": "m"}, None)
    assert not absent.exists()
    absent.write_text("")  # the kubelet creates it in a pod
    register.write_termination_message({"name": "m"}, None)
    assert json.loads(absent.read_text()) == {"name": "m"}
    assert not (tmp_path / "elsewhere").exists()


def test_refuses_a_final_model_without_its_complete_marker(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9")
    config = write_config(tmp_path, cfg, complete=False)
    term = tmp_path / "term"
    assert register.main(["--config", str(config), "--termination-message-path", str(term)]) == 2
    message = json.loads(term.read_text())
    assert message["reason"] == "NothingToRegister" and "COMPLETE" in message["error"]


def test_refuses_the_final_model_of_another_training(tmp_path: Path) -> None:
    """A reused claim holding another job's final model: never registered under this job."""
    cfg = make_config(tmp_path, "http://127.0.0.1:9")
    config = write_config(tmp_path, cfg)
    marker = Path(cfg.output_dir) / "final" / "COMPLETE"
    marker.write_text(json.dumps({"training_hash": "0123456789abcdef"}))
    term = tmp_path / "term"
    assert register.main(["--config", str(config), "--termination-message-path", str(term)]) == 2
    message = json.loads(term.read_text())
    assert message["reason"] == "NothingToRegister" and "another training" in message["error"]
    # the same training's marker passes this check (and goes on to MLflow, unreachable here)
    marker.write_text(json.dumps({"training_hash": cfg.training_hash()}))
    assert register.final_dir(cfg) == marker.parent


def test_an_unreadable_config_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    term = tmp_path / "term"
    missing = tmp_path / "nope.yaml"
    assert register.main(["--config", str(missing), "--termination-message-path", str(term)]) == 1
    assert f"cannot read the trainer config {missing}" in capsys.readouterr().err
    assert json.loads(term.read_text())["reason"] == "InvalidConfig"


def test_disabled_registration_does_nothing(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9", enabled=False)
    config = write_config(tmp_path, cfg, complete=False)
    term = tmp_path / "termination-log"
    assert register.main(["--config", str(config), "--termination-message-path", str(term)]) == 0
    assert not (Path(cfg.output_dir) / "register-result.json").exists()
    # the operator tells this from a registration (registration turned off while its Job ran)
    assert json.loads(term.read_text()) == {"skipped": "registration.enabled is false"}


# --- the claim: one registration at a time ----------------------------------------------------------------

HOLD_CLAIM = """
import sys, time
from pathlib import Path
from kubetune_trainer.registration.register import RegistrationClaim
claim = RegistrationClaim(Path(sys.argv[1]), 0)
claim.acquire()
Path(sys.argv[2]).touch()
time.sleep(600)
"""


def hold_claim_in_another_process(output_dir: Path) -> subprocess.Popen[bytes]:
    """A process that takes the claim and keeps it (until killed)."""
    held = output_dir / "held"
    proc = subprocess.Popen([sys.executable, "-c", HOLD_CLAIM, str(output_dir), str(held)])
    deadline = time.monotonic() + 120
    while not held.exists():
        assert proc.poll() is None, "the holder died"
        assert time.monotonic() < deadline, "the holder never took the claim"
        time.sleep(0.05)
    return proc


def test_one_claim_at_a_time_and_the_next_waits_for_the_release(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = register.RegistrationClaim(tmp_path, 0)
    first.acquire()
    holder = json.loads((tmp_path / "register.lock").read_text())
    assert holder["pid"] == os.getpid() and holder["released"] is False

    # Nothing to wait for: refused at once, naming the holder.
    with pytest.raises(register.ClaimError) as refused:
        register.RegistrationClaim(tmp_path, 0).acquire()
    assert refused.value.reason == "RegistrationInProgress"
    assert f"pid {os.getpid()}" in str(refused.value) and "register.lock" in str(refused.value)

    # A waiter polls; the holder finishes during its wait; the waiter gets the claim.
    clock = FakeClock()

    def holder_finishes(seconds: float) -> None:
        clock.sleep(seconds)
        first.release()

    second = register.RegistrationClaim(tmp_path, 30, poll_s=2, clock=clock.clock, sleep=holder_finishes)
    with caplog.at_level(logging.INFO, logger="kubetune_trainer.register"), second:
        assert second.exclusive
        assert json.loads((tmp_path / "register.lock").read_text())["released"] is False
        second.verify("do something")
    assert clock.sleeps == [2]
    assert "is registering this model; waiting" in caplog.text
    assert "ended without releasing" not in caplog.text  # the first one released it properly
    # released, never deleted (a waiter could hold the old file while a newcomer locks a new one)
    assert json.loads((tmp_path / "register.lock").read_text())["released"] is True


def test_a_claim_held_too_long_is_a_clear_failure(tmp_path: Path) -> None:
    clock = FakeClock()
    first = register.RegistrationClaim(tmp_path, 0)
    first.acquire()
    try:
        waiter = register.RegistrationClaim(tmp_path, 5, poll_s=2, clock=clock.clock, sleep=clock.sleep)
        with pytest.raises(register.ClaimError, match=r"held .* for the whole 5s this one waits"):
            waiter.acquire()
        assert clock.sleeps == [2, 2, 1]  # never sleeps past the wait
    finally:
        first.release()


def test_the_claim_of_a_killed_process_is_taken_over_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc = hold_claim_in_another_process(tmp_path)
    try:
        with pytest.raises(register.ClaimError):
            register.RegistrationClaim(tmp_path, 0).acquire()  # alive: it holds the claim
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    with caplog.at_level(logging.WARNING, logger="kubetune_trainer.register"):
        claim = register.RegistrationClaim(tmp_path, 0)
        claim.acquire()  # no wait: the kernel dropped the dead process's lock
    try:
        assert f"pid {proc.pid}" in caplog.text and "ended without releasing its claim" in caplog.text
        assert json.loads((tmp_path / "register.lock").read_text())["pid"] == os.getpid()
    finally:
        claim.release()


def test_a_claim_whose_file_was_replaced_is_lost(tmp_path: Path) -> None:
    claim = register.RegistrationClaim(tmp_path, 0)
    claim.acquire()
    try:
        (tmp_path / "register.lock").unlink()  # by hand; a newcomer would lock a new file
        other = register.RegistrationClaim(tmp_path, 0)
        other.acquire()
        other.release()
        with pytest.raises(
            register.ClaimError, match=r"lost the registration claim .* create a model version"
        ):
            claim.verify("create a model version")
    finally:
        claim.release()


def test_a_file_system_without_locks_registers_without_a_claim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_locks(fd: int, op: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(register_claim.fcntl, "flock", no_locks)
    with (
        caplog.at_level(logging.WARNING, logger="kubetune_trainer.register"),
        register.RegistrationClaim(tmp_path, 0) as claim,
    ):
        assert not claim.exclusive
        claim.verify("log the model")  # nothing to lose
    assert "keeps no locks (No locks available); registering without a claim" in caplog.text


def test_main_fails_clearly_while_another_registration_holds_the_claim(tmp_path: Path) -> None:
    cfg = make_config(tmp_path, "http://127.0.0.1:9")
    config = write_config(tmp_path, cfg)
    proc = hold_claim_in_another_process(Path(cfg.output_dir))
    try:
        term = tmp_path / "term"
        args = ["--config", str(config), "--termination-message-path", str(term), "--claim-wait", "0"]
        assert register.main(args) == register.EXIT_ERROR
    finally:
        proc.kill()
        proc.wait()
    failure = json.loads(term.read_text())
    assert failure["reason"] == "RegistrationInProgress"
    assert f"pid {proc.pid}" in failure["error"] and "--claim-wait" in failure["error"]


# The registration entry point in a process of its own, saying at its end which of the libraries that
# load a model it imported.
REGISTER_AND_SAY_IMPORTS = """
import atexit, runpy, sys
MODEL_LIBRARIES = ("torch", "transformers", "peft", "trl", "torchao")
atexit.register(lambda: print("imported:", [m for m in MODEL_LIBRARIES if sys.modules.get(m) is not None]))
sys.argv = ["kubetune_trainer.register", *sys.argv[1:]]
runpy.run_module("kubetune_trainer.register", run_name="__main__")
"""


@pytest.mark.slow
def test_the_registration_that_waited_for_the_claim_reports_the_version_without_loading_a_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two registrations at once (a Job's replacement pod beside the old one): the one that waits for
    the claim finds what the holder registered and reports it, and never imports torch, transformers
    or PEFT (seconds of CPU in a pod that only reads MLflow): only the process that logs the model
    loads it."""
    from mlflow.tracking import MlflowClient

    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_UV_AUTO_DETECT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = make_config(tmp_path, uri)
    config = write_config(tmp_path, cfg)
    out = Path(cfg.output_dir)
    log_path, term = tmp_path / "waiter.log", tmp_path / "termination-log"
    holder = register_claim.RegistrationClaim(out, 0)
    holder.acquire()
    try:
        # the holder registers: the job's run and a version of it, tagged with the job's lineage
        mlflow = MlflowClient(tracking_uri=uri, registry_uri=uri)
        experiment_id = mlflow.create_experiment(cfg.experiment)
        run_id = mlflow.create_run(experiment_id).info.run_id
        run_file = {"run_id": run_id, "experiment_id": experiment_id, "tracking_uri": uri}
        (out / "mlflow-run.json").write_text(json.dumps(run_file))
        mlflow.create_registered_model(cfg.registered_model_name)
        lineage = register.lineage_tags(cfg)
        mlflow.create_model_version(cfg.registered_model_name, f"runs:/{run_id}/model", run_id, tags=lineage)
        args = ["--config", str(config), "--termination-message-path", str(term)]
        with log_path.open("wb") as log_file:
            waiter = subprocess.Popen(
                [sys.executable, "-c", REGISTER_AND_SAY_IMPORTS, *args],
                stdout=log_file,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 240
        while "waiting for it to finish" not in log_path.read_text():
            assert waiter.poll() is None, log_path.read_text()[-4000:]
            assert time.monotonic() < deadline, "the second registration never waited for the claim"
            time.sleep(0.05)
    finally:
        holder.release()
    assert waiter.wait(timeout=240) == 0, log_path.read_text()[-4000:]
    said = log_path.read_text()
    result = json.loads(term.read_text())
    assert (result["version"], result["run_id"]) == ("1", run_id), result
    assert "already registered" in said and "logging the model" not in said, said[-4000:]
    assert "imported: []" in said, said[-4000:]


# --- through MLflow's client, against a stub server --------------------------------------------------------


@pytest.fixture
def stub_mlflow() -> Iterator[tuple[str, dict[str, Any]]]:
    """An HTTP server on 127.0.0.1 that answers every request with ``state['status']``."""
    state: dict[str, Any] = {"status": 403, "requests": 0, "auth": []}

    class Handler(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            state["requests"] += 1
            state["auth"].append(self.headers.get("Authorization"))
            status = state["status"]
            body: dict[str, str] = (
                {"error_code": "PERMISSION_DENIED", "message": "Permission denied for experiment"}
                if status == 403
                else {"error_code": "TEMPORARILY_UNAVAILABLE", "message": "overloaded"}
            )
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.block_on_close = False  # MLflow keeps connections alive; do not wait for them
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_TOKEN", SECRET)
    for key in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_UV_AUTO_DETECT", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(key, raising=False)


def test_a_refusal_fails_at_once_with_the_tracking_uri(
    tmp_path: Path,
    stub_mlflow: tuple[str, dict[str, Any]],
    clean_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri, state = stub_mlflow
    # Credentials in the URI (basic auth) are as secret as the token.
    config = write_config(tmp_path, make_config(tmp_path, uri.replace("http://", "http://kt:pw-in-uri-55@")))
    term = tmp_path / "term"
    started = time.monotonic()
    code = register.main(["--config", str(config), "--termination-message-path", str(term)])
    assert code == register.EXIT_REFUSED
    assert time.monotonic() - started < 10
    assert state["requests"] == 1  # no retry
    assert state["auth"][0]  # credentials were sent (requests prefers the URI's over the token)...
    out, err = capsys.readouterr()
    shown_uri = uri.replace("http://", "http://***@")
    assert f"MLflow at {shown_uri} refused" in err and "HTTP 403" in err
    for text in (out, err, term.read_text()):  # ...and never shown
        assert SECRET not in text and "pw-in-uri-55" not in text
    assert json.loads(term.read_text())["reason"] == "MlflowRefused"


def test_server_errors_are_retried_until_the_budget_is_spent(
    tmp_path: Path,
    stub_mlflow: tuple[str, dict[str, Any]],
    clean_env: None,
    capsys: pytest.CaptureFixture[str],
) -> None:
    uri, state = stub_mlflow
    state["status"] = 503
    config = write_config(tmp_path, make_config(tmp_path, uri))
    started = time.monotonic()
    code = register.main(
        ["--config", str(config), "--retry-budget", "3", "--termination-message-path", str(tmp_path / "t")]
    )
    elapsed = time.monotonic() - started
    assert code == register.EXIT_UNAVAILABLE
    assert state["requests"] >= 2
    assert elapsed < 3 + 5
    assert set(state["auth"]) == {f"Bearer {SECRET}"}  # the token comes from the environment...
    out, err = capsys.readouterr()
    assert f"MLflow at {uri} is unreachable" in err
    assert SECRET not in out + err  # ...and is never shown


# --- loading the base model -----------------------------------------------------------------------------


class _StopError(Exception):
    pass


@pytest.mark.parametrize("trust", [False, True])
def test_the_hub_base_is_loaded_at_its_revision_with_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, trust: bool
) -> None:
    import torch
    import transformers

    monkeypatch.setenv("HF_TOKEN", "hf_unit_token")
    cfg = make_config(tmp_path, "http://m")
    cfg.spec.model.trust_remote_code = trust
    seen: dict[str, Any] = {}

    def fake_tokenizer(path: Any, **kwargs: Any) -> Any:
        seen["tokenizer"] = (str(path), kwargs)
        return object()

    def fake_model(name: Any, **kwargs: Any) -> Any:
        seen["model"] = (name, kwargs)
        raise _StopError

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", fake_tokenizer)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    with pytest.raises(_StopError):
        register.load_final_model(cfg, tmp_path / "final")
    # The trained tokenizer (chat template, pad token) comes from final/, the weights from the Hub.
    assert seen["tokenizer"] == (str(tmp_path / "final"), {"trust_remote_code": trust})
    assert seen["model"] == (
        "Qwen/Qwen2-0.5B",
        {"revision": "abc123", "token": "hf_unit_token", "dtype": torch.bfloat16, "trust_remote_code": trust},
    )
