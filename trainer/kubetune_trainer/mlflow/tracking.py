"""MLflow tracking for a training run: one MLflow run per FineTuneJob, the same one across restarts.

Only rank 0 creates an :class:`MlflowTracker`. The run is found or made, and kept on the checkpoint
volume in ``mlflow-run.json``, by :class:`kubetune_trainer.mlflow.run.JobRun` (as the registration
step finds it), so a restarted pod (after a preemption, a node loss, a kill -9) logs into the same
run, and the registration step logs the model there too. When that file is missing, a run tagged
with the job's identity is looked up first, so a crash between creating the run and writing the file
does not make a second run.

A tracking server that is down or refuses must never kill training: every call is guarded, a
failure is logged once as a warning, the tracker backs off for a while and tries again, and the
result says ``ok = False`` with the reason (it goes into ``train-result.json``).

Params are the resolved spec, flattened, without ``secrets`` and ``env`` (only references there,
but nothing credential-shaped is ever logged); the whole trainer config (which holds no secret)
is logged as an artifact. Both go through :func:`kubetune_trainer.mlflow.run.redact` first
(``user:password@`` in URIs, the values of the credential variables in the environment).

Once the run is open, MLflow's system metrics (CPU, host memory, disk, network, each GPU) are logged
into it until :meth:`MlflowTracker.finish` (:mod:`kubetune_trainer.mlflow.system`).

>>> flatten_params({"training": {"learningRate": 0.001, "seed": 1}, "method": "lora"})
{'training.learningRate': '0.001', 'training.seed': '1', 'method': 'lora'}
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kubetune_api.mlflow_links import run_url
from kubetune_api.trainer_config import TrainerConfig

from .run import JobRun, redact, resolve_tracking_uri
from .system import SystemMetrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# Fail fast while training: a slow or dead server should cost seconds per attempt, not minutes.
# (MLflow's defaults retry 7 times with exponential back-off.) Set only when the user did not.
_FAST_FAIL_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
RETRY_AFTER_S = 60.0
# Spec sections that never go into params.
_NOT_PARAMS = ("secrets", "env")
CONFIG_ARTIFACT = "kubetune/trainer-config.yaml"


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


class MlflowTracker:
    """Rank 0's connection to MLflow; every method is safe to call when the server is down."""

    def __init__(self, cfg: TrainerConfig, output_dir: Path, *, tracking_uri: str | None = None) -> None:
        self.cfg = cfg
        self.output_dir = Path(output_dir)
        self.tracking_uri = resolve_tracking_uri(cfg, tracking_uri)
        self.run_id: str | None = None
        self.experiment_id: str | None = None
        self.resumed = False
        self.ok = True
        self.error: str | None = None
        self._client: Any = None
        self._retry_at = 0.0
        self._pending_params: dict[str, str] = {}
        self.system_metrics: SystemMetrics | None = None
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
                    self._shown_uri,
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

    def _ensure_run(self) -> bool:
        if self.run_id is not None:
            return True

        def open_run() -> str:
            job_run = JobRun(self.cfg, self.tracking_uri, self._mlflow(), output_dir=self.output_dir)
            # A local run has no uid; its store lives in its own output folder, so the file is enough.
            found = job_run.find(by_name=False)
            self.experiment_id = found.experiment_id
            if found.run_id is not None:
                self._mlflow().update_run(found.run_id, status="RUNNING")
                self.resumed = True
                run_id = found.run_id
            else:
                run_id = job_run.create(found.experiment_id)
            job_run.remember(run_id, found.experiment_id)
            return run_id

        run_id = self._call("open run", open_run)
        if run_id is None:
            return False
        self.run_id = run_id
        log.info(
            "MLflow run %s (%s) in experiment %r at %s",
            run_id,
            "resumed" if self.resumed else "new",
            self.cfg.experiment,
            self._shown_uri,
        )
        # from the moment the run is open (MLflow down at the start: from when it opens)
        self.system_metrics = SystemMetrics.start(run_id, self.tracking_uri, resume=self.resumed)
        return True

    @property
    def _shown_uri(self) -> str:
        return redact(self.tracking_uri, drop_userinfo=True)

    def status(self) -> dict[str, str] | None:
        """The run as ``status.mlflow`` shows it (camelCase; the URI without credentials); None until
        the run exists (MLflow down at the start: a later report carries it)."""
        if self.run_id is None:
            return None
        out = {"trackingUri": self._shown_uri, "runId": self.run_id}
        if self.experiment_id is not None:
            out["experimentId"] = self.experiment_id
        link = run_url(self.tracking_uri, self.experiment_id, self.run_id)
        if link is not None:
            out["runUrl"] = link
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
            if self.system_metrics is not None:
                # the last point before the run's attempt ends
                self.system_metrics.stop()
                self.system_metrics = None
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
            "mlflow_tracking_uri": self._shown_uri,
        }


def _metric_key(key: str) -> str:
    # Trainer's end-of-run summary keys start with "train_"; keep the per-step names short and stable.
    return key.replace("/", "_")


def _short(e: Exception, limit: int = 300) -> str:
    text = " ".join(str(e).split())
    return text if len(text) <= limit else text[:limit] + "..."
