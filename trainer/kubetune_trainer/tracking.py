"""MLflow tracking for a training run: one MLflow run per FineTuneJob, the same one across restarts.

Only rank 0 creates an :class:`MlflowTracker`. The run id is kept on the checkpoint volume in
``mlflow-run.json`` (``{"run_id", "experiment_id", "tracking_uri"}``), so a restarted pod (after a
preemption, a node loss, a kill -9) logs into the same run, and the registration step logs the model
there too. When that file is missing, a run tagged with the job's identity is looked up first, so a
crash between creating the run and writing the file does not make a second run.

A tracking server that is down or refuses must never kill training: every call is guarded, a
failure is logged once as a warning, the tracker backs off for a while and tries again, and the
result says ``ok = False`` with the reason (it goes into ``train-result.json``).

Params are the resolved spec, flattened, without ``secrets`` and ``env`` (only references there,
but nothing credential-shaped is ever logged); the whole trainer config (which holds no secret)
is logged as an artifact. Both go through :func:`kubetune_trainer.mlflow_client.redact` first
(``user:password@`` in URIs, the values of the credential variables in the environment).

>>> flatten_params({"training": {"learningRate": 0.001, "seed": 1}, "method": "lora"})
{'training.learningRate': '0.001', 'training.seed': '1', 'method': 'lora'}
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubetune_api.trainer_config import MLFLOW_RUN_FILE, TrainerConfig, dump_json

from .mlflow_client import redact

log = logging.getLogger(__name__)

T = TypeVar("T")

# Fail fast while training: a slow or dead server should cost seconds per attempt, not minutes.
# (MLflow's defaults retry 7 times with exponential back-off.) Set only when the user did not.
_FAST_FAIL_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
RETRY_AFTER_S = 60.0
# Spec sections that never go into params.
_NOT_PARAMS = ("secrets", "env")
TAG_JOB_NAME = "kubetune.job.name"
TAG_JOB_NAMESPACE = "kubetune.job.namespace"
TAG_JOB_UID = "kubetune.job.uid"
TAG_CONFIG_HASH = "kubetune.config_hash"
CONFIG_ARTIFACT = "kubetune/trainer-config.yaml"


def default_tracking_uri(output_dir: str | Path) -> str:
    """The local store used when no tracking server is configured: sqlite next to the checkpoints."""
    return f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"


def flatten_params(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten_params(value, f"{name}."))
        elif isinstance(value, list):
            out[name] = json.dumps(value)[:6000]
        else:
            out[name] = str(value)[:6000]
    return out


def spec_params(cfg: TrainerConfig) -> dict[str, str]:
    wire = cfg.spec.wire()
    for section in _NOT_PARAMS:
        wire.pop(section, None)
    # credentials never reach MLflow, whatever slipped past the checks (mlflow_client.redact)
    params = {name: redact(value) for name, value in flatten_params(wire).items()}
    params["kubetune.configHash"] = cfg.config_hash()
    return params


def read_run_file(output_dir: Path) -> dict[str, Any] | None:
    path = output_dir / MLFLOW_RUN_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("run_id") else None


class MlflowTracker:
    """Rank 0's connection to MLflow; every method is safe to call when the server is down."""

    def __init__(self, cfg: TrainerConfig, output_dir: Path, *, tracking_uri: str | None = None) -> None:
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.tracking_uri = tracking_uri or cfg.tracking_uri or default_tracking_uri(output_dir)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.resumed = False
        self.ok = True
        self.error: str | None = None
        self._client: Any = None
        self._retry_at = 0.0
        self._pending_params: dict[str, str] = {}
        # Set only what the user did not, and put it back in finish(): in `kubetune run --local` the
        # registration step runs in this process with its own retry policy.
        self._env_set = [name for name in _FAST_FAIL_ENV if name not in os.environ]
        for name in self._env_set:
            os.environ[name] = _FAST_FAIL_ENV[name]

    # --- guarded calls ------------------------------------------------------------------------

    def _call(self, what: str, fn: Callable[[], T]) -> T | None:
        if time.monotonic() < self._retry_at:
            return None
        try:
            return fn()
        except Exception as e:  # any MLflow/HTTP/DB error: tracking is never worth a failed run
            first = self.ok
            self.ok = False
            self.error = f"{what}: {type(e).__name__}: {_short(e)}"
            self._retry_at = time.monotonic() + RETRY_AFTER_S
            if first:
                log.warning(
                    "MLflow at %s failed (%s); training goes on, retrying in %.0fs",
                    _redact(self.tracking_uri),
                    self.error,
                    RETRY_AFTER_S,
                )
            else:
                log.debug("MLflow still failing: %s", self.error)
            return None

    def _mlflow(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.tracking_uri)
        return self._client

    # --- the run ------------------------------------------------------------------------------

    def _experiment_id(self) -> str:
        from mlflow.exceptions import MlflowException

        client = self._mlflow()
        name = self.cfg.experiment
        exp = client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        artifact_location = None
        if not self.tracking_uri.startswith(("http://", "https://", "databricks")):
            # A local store: keep artifacts beside it, not in whatever the current directory is.
            artifact_location = (self.output_dir / "mlartifacts").resolve().as_uri()
        try:
            return str(client.create_experiment(name, artifact_location=artifact_location))
        except MlflowException:
            # Another job created it in the meantime.
            exp = client.get_experiment_by_name(name)
            if exp is None:
                raise
            return str(exp.experiment_id)

    def _tags(self) -> dict[str, str]:
        job = self.cfg.job
        tags = {
            TAG_JOB_NAME: job.name,
            TAG_JOB_NAMESPACE: job.namespace,
            TAG_CONFIG_HASH: self.cfg.config_hash(),
            "mlflow.runName": job.name,
        }
        if job.uid:
            tags[TAG_JOB_UID] = job.uid
        return tags

    def _find_existing_run(self, experiment_id: str) -> str | None:
        """The run of this job, from mlflow-run.json or, failing that, by its identity tags."""
        saved = read_run_file(self.output_dir)
        client = self._mlflow()
        if saved and saved.get("tracking_uri") == _redact(self.tracking_uri):
            try:
                client.get_run(saved["run_id"])
                return str(saved["run_id"])
            except Exception:
                log.warning("run %s from %s is gone; looking for another", saved["run_id"], MLFLOW_RUN_FILE)
        job = self.cfg.job
        if not job.uid:
            # A local run has no uid; its store lives in its own output folder, so the file is enough.
            return None
        query = f"tags.`{TAG_JOB_UID}` = '{job.uid}'"
        runs = client.search_runs(
            [experiment_id], filter_string=query, max_results=1, order_by=["start_time DESC"]
        )
        return str(runs[0].info.run_id) if runs else None

    def _ensure_run(self) -> bool:
        if self.run_id is not None:
            return True

        def open_run() -> str:
            client = self._mlflow()
            self.experiment_id = self._experiment_id()
            run_id = self._find_existing_run(self.experiment_id)
            if run_id is not None:
                client.update_run(run_id, status="RUNNING")
                self.resumed = True
            else:
                run_id = str(client.create_run(self.experiment_id, tags=self._tags()).info.run_id)
            return run_id

        run_id = self._call("open run", open_run)
        if run_id is None:
            return False
        self.run_id = run_id
        dump_json(
            {
                "run_id": run_id,
                "experiment_id": self.experiment_id,
                "tracking_uri": _redact(self.tracking_uri),
            },
            self.output_dir / MLFLOW_RUN_FILE,
        )
        log.info(
            "MLflow run %s (%s) in experiment %r at %s",
            run_id,
            "resumed" if self.resumed else "new",
            self.cfg.experiment,
            _redact(self.tracking_uri),
        )
        return True

    def status(self) -> dict[str, str] | None:
        """The run as ``status.mlflow`` shows it (camelCase; the URI without credentials); None until
        the run exists (MLflow down at the start: a later report carries it)."""
        if self.run_id is None:
            return None
        out = {"trackingUri": _redact(self.tracking_uri), "runId": self.run_id}
        if self.experiment_id is not None:
            out["experimentId"] = self.experiment_id
        return out

    def start(self, extra_params: dict[str, str] | None = None) -> None:
        """Open (or re-open) the job's run; log params and the resolved config."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._pending_params = {**spec_params(self.cfg), **(extra_params or {})}
        if self._ensure_run():
            self._flush_params()

    def _flush_params(self) -> None:
        if not self._pending_params or self.run_id is None:
            return
        from mlflow.entities import Param

        run_id = self.run_id
        client = self._mlflow()

        def log_params() -> bool:
            logged = client.get_run(run_id).data.params
            # Params are immutable in MLflow: on a restart, log only those not there yet.
            fresh = [Param(k, v) for k, v in self._pending_params.items() if k not in logged]
            for i in range(0, len(fresh), 100):
                client.log_batch(run_id, params=fresh[i : i + 100])
            client.log_text(run_id, redact(self.cfg.to_yaml()), CONFIG_ARTIFACT)
            return True

        if self._call("log params", log_params):
            self._pending_params = {}

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        numeric = {
            k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        if not numeric or not self._ensure_run():
            return
        self._flush_params()
        from mlflow.entities import Metric

        run_id = self.run_id
        now = int(time.time() * 1000)
        batch = [Metric(key=_metric_key(k), value=v, timestamp=now, step=step) for k, v in numeric.items()]
        self._call("log metrics", lambda: self._mlflow().log_batch(run_id, metrics=batch))

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self._ensure_run():
            return
        run_id = self.run_id
        self._call("set tags", lambda: [self._mlflow().set_tag(run_id, k, v) for k, v in tags.items()])

    def finish(self, status: str) -> None:
        """End the run's current attempt: FINISHED, KILLED (preempted: the next attempt re-opens it) or FAILED."""
        try:
            if self.run_id is None:
                return
            run_id = self.run_id
            # One last try even inside the back-off window: this is the final word of this attempt.
            self._retry_at = 0.0
            self._call("end run", lambda: self._mlflow().set_terminated(run_id, status=status))
        finally:
            for name in self._env_set:
                os.environ.pop(name, None)
            self._env_set = []

    def result(self) -> dict[str, Any]:
        return {
            "mlflow_ok": self.ok,
            "mlflow_error": self.error,
            "mlflow_run_id": self.run_id,
            "mlflow_experiment_id": self.experiment_id,
            "mlflow_tracking_uri": _redact(self.tracking_uri),
        }


def _metric_key(key: str) -> str:
    # Trainer's end-of-run summary keys start with "train_"; keep the per-step names short and stable.
    return key.replace("/", "_")


def _short(e: Exception, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _redact(uri: str) -> str:
    """Drop user:password@ from a URI before it is logged or written anywhere.

    The user information is what the authority (up to the first ``/``, ``?`` or ``#``) holds before
    its last ``@``: a password may contain ``@``, and a path or query may too.

    >>> _redact("https://bob:p@ss@mlflow.example.com/x?owner=a@b.com")
    'https://mlflow.example.com/x?owner=a@b.com'
    >>> _redact("file:///home/me@corp/mlruns")
    'file:///home/me@corp/mlruns'
    """
    m = re.match(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/?#]*)(.*)\Z", uri, re.DOTALL)
    if m is None or "@" not in m.group(2):
        return uri
    return m.group(1) + m.group(2).rpartition("@")[2] + m.group(3)
