"""The MLflow run of a FineTuneJob: one run per job, which training and registration both use.

Training (:class:`kubetune_trainer.mlflow.tracking.MlflowTracker`) opens the run and logs into it; the
registration step (:mod:`kubetune_trainer.register`) logs the model into the same run. Both find it
the same way, here:

* the tracking URI: the flag of the registration step, else the trainer config's, else a local
  sqlite store next to the checkpoints (:func:`resolve_tracking_uri`, the one fallback);
* the run file ``mlflow-run.json`` on the checkpoint volume (:class:`RunFile`), which names the run,
  its experiment and the server, without credentials; it counts only for the same server
  (:func:`same_server`);
* failing that, the job's run found by its identity tags, or else a new run (:class:`JobRun`);
* credentials never written or logged: :func:`redact` is the one function that removes them.

The calls to MLflow go through a ``call(what, fn, *args)`` of the caller's: training calls once and
lets its tracker guard the failure; registration retries through a
:class:`~kubetune_trainer.mlflow.client.Retrier`.

>>> redact("https://bob:p@ss@mlflow.example.com/x?owner=a@b.com", drop_userinfo=True)
'https://mlflow.example.com/x?owner=a@b.com'
>>> same_server("https://mlflow.example.com", "https://bob:pw@mlflow.example.com")
True
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from kubetune_api.failures import USERINFO
from kubetune_api.trainer_config import MLFLOW_RUN_FILE, TrainerConfig, dump_json

from .. import settings

log = logging.getLogger(__name__)

# --- credentials ------------------------------------------------------------------------------------

# Shorter values are not redacted: replacing every "ab" in a log line would hide more than it protects,
# and a credential that short protects nothing anyway.
MIN_REDACTED_LENGTH = 4
REDACTED = "***"


def secret_values() -> list[str]:
    """The values of the credential variables in the environment, longest first (so that a secret
    containing another is replaced whole)."""
    values = set(settings.current().secrets)
    return sorted((v for v in values if len(v) >= MIN_REDACTED_LENGTH), key=len, reverse=True)


def redact(text: str, *, drop_userinfo: bool = False) -> str:
    """``text`` without credentials: the one redaction of kubetune's trainer.

    By default (logs, messages, params, artifacts) the values of the credential variables in the
    environment become ``***``, and so does the ``user:password@`` of every URI in the text
    (``https://***@host``). With ``drop_userinfo`` (a tracking URI kept or shown as the server's
    address: the run file, ``status.mlflow``) only the user information goes, whole
    (``https://host``), so the same server always reads the same and a user name that is also part
    of the host name leaves the host alone.

    >>> redact("View run at https://bob:hunter2@mlflow.example.com/path")
    'View run at https://***@mlflow.example.com/path'
    >>> redact("file:///home/me@corp/mlruns", drop_userinfo=True)
    'file:///home/me@corp/mlruns'
    """
    if drop_userinfo:
        return USERINFO.sub(r"\g<scheme>", text)
    for value in secret_values():
        text = text.replace(value, REDACTED)
    return USERINFO.sub(rf"\g<scheme>{REDACTED}@", text)


# --- the server -------------------------------------------------------------------------------------


def local_store_uri(output_dir: str | Path) -> str:
    """The local store used when no tracking server is configured: sqlite next to the checkpoints."""
    return f"sqlite:///{Path(output_dir).resolve() / 'mlflow.db'}"


def resolve_tracking_uri(cfg: TrainerConfig, override: str | None = None) -> str:
    """The tracking URI of a job: ``override`` (a command-line flag), else the trainer config's
    (the spec's ``registration.trackingUri`` or the operator's default), else the local store."""
    return override or cfg.tracking_uri or local_store_uri(cfg.output_dir)


def resolve_registry_uri(cfg: TrainerConfig, tracking_uri: str) -> str:
    """The model registry's URI: the one resolved into the config (the spec's
    ``registration.registryUri`` or the operator's default), else the tracking server's own registry."""
    return cfg.registry_uri or tracking_uri


def same_server(saved_uri: str | None, tracking_uri: str) -> bool:
    """Whether a run recorded for ``saved_uri`` lives on the server at ``tracking_uri``.

    Credentials do not count (the run file keeps the URI without them); a record without a URI
    (written before kubetune kept one) is taken as this server's: looking the run up tells.
    """
    if saved_uri is None:
        return True
    return redact(saved_uri, drop_userinfo=True) == redact(tracking_uri, drop_userinfo=True)


def is_local_store(tracking_uri: str) -> bool:
    return not tracking_uri.startswith(("http://", "https://", "databricks"))


# --- the run file -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFile:
    """``<output_dir>/mlflow-run.json``: the job's run, its experiment and its server (no credentials)."""

    run_id: str
    experiment_id: str | None = None
    tracking_uri: str | None = None

    @classmethod
    def read(cls, output_dir: str | Path) -> RunFile | None:
        """The recorded run; None when the file is missing, unreadable or names no run."""
        try:
            data = json.loads((Path(output_dir) / MLFLOW_RUN_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or not data.get("run_id"):
            return None
        experiment_id, uri = data.get("experiment_id"), data.get("tracking_uri")
        return cls(
            run_id=str(data["run_id"]),
            experiment_id=None if experiment_id is None else str(experiment_id),
            tracking_uri=None if uri is None else str(uri),
        )

    def write(self, output_dir: str | Path) -> None:
        """Write it atomically, the URI without its credentials."""
        uri = None if self.tracking_uri is None else redact(self.tracking_uri, drop_userinfo=True)
        dump_json(
            {"run_id": self.run_id, "experiment_id": self.experiment_id, "tracking_uri": uri},
            Path(output_dir) / MLFLOW_RUN_FILE,
        )


# --- the job's run ----------------------------------------------------------------------------------

TAG_JOB_NAME = "kubetune.job.name"
TAG_JOB_NAMESPACE = "kubetune.job.namespace"
TAG_JOB_UID = "kubetune.job.uid"
TAG_CONFIG_HASH = "kubetune.config_hash"
# the tags that say which job, from which config, made an MLflow object
IDENTITY_TAGS = (TAG_JOB_NAME, TAG_JOB_NAMESPACE, TAG_JOB_UID, TAG_CONFIG_HASH)


def identity_tags(cfg: TrainerConfig) -> dict[str, str]:
    """The job and config hash, as tags (the uid only where the job has one: a local run has none)."""
    tags = {
        TAG_JOB_NAME: cfg.job.name,
        TAG_JOB_NAMESPACE: cfg.job.namespace,
        TAG_CONFIG_HASH: cfg.config_hash(),
    }
    if cfg.job.uid:
        tags[TAG_JOB_UID] = cfg.job.uid
    return tags


def same_job(tags: dict[str, str], identity: dict[str, str]) -> bool:
    """Whether an MLflow object's tags say it was made by this job, from this config."""
    return all(tags.get(key) == identity.get(key) for key in IDENTITY_TAGS)


class Call(Protocol):
    """How a caller runs one MLflow call: ``what`` names it in messages."""

    def __call__(self, what: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any: ...


def call_once(what: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
    """Run the call as it is (the caller guards failures)."""
    return fn(*args, **kwargs)


def _run_is_missing(exc: Exception) -> bool:
    """MLflow's answer for a run that does not exist (a local store's error, or HTTP 404)."""
    return (
        getattr(exc, "error_code", None) == "RESOURCE_DOES_NOT_EXIST" or getattr(exc, "status", None) == 404
    )


@dataclass(frozen=True)
class FoundRun:
    run_id: str | None  # None: this job has no run on this server yet
    experiment_id: str
    from_file: bool = False  # named by the run file (nothing new to record)


class JobRun:
    """Finds, creates and records the one MLflow run of a job on one server."""

    def __init__(
        self,
        cfg: TrainerConfig,
        tracking_uri: str,
        client: Any,
        call: Call = call_once,
        *,
        output_dir: str | Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.tracking_uri = tracking_uri
        self.client = client
        self.call = call
        self.output_dir = Path(output_dir if output_dir is not None else cfg.output_dir)
        self.identity = identity_tags(cfg)

    def experiment_id(self) -> str:
        """The config's experiment, created when missing (beside a local store, its artifacts too)."""
        return str(
            self.call(f"get or create experiment {self.cfg.experiment!r}", self._get_or_create_experiment)
        )

    def _get_or_create_experiment(self) -> str:
        from mlflow.exceptions import MlflowException

        name = self.cfg.experiment
        exp = self.client.get_experiment_by_name(name)
        if exp is not None:
            return str(exp.experiment_id)
        location = None
        if is_local_store(self.tracking_uri):
            # A local store: keep artifacts beside it, not in whatever the current directory is.
            location = (self.output_dir / "mlartifacts").resolve().as_uri()
        try:
            return str(self.client.create_experiment(name, artifact_location=location))
        except MlflowException:
            exp = self.client.get_experiment_by_name(name)  # another job created it in the meantime
            if exp is None:
                raise
            return str(exp.experiment_id)

    def find(self, *, by_name: bool = True) -> FoundRun:
        """The run named in the run file (on this server, still there), else this job's run found by
        its identity tags (searched by uid, or by name when ``by_name`` and the job has no uid)."""
        saved = self._saved_run()
        if saved is not None:
            return saved
        experiment_id = self.experiment_id()
        if self.cfg.job.uid:
            query = f"tags.`{TAG_JOB_UID}` = '{self.cfg.job.uid}'"
        elif by_name:
            query = f"tags.`{TAG_JOB_NAME}` = '{self.cfg.job.name}'"
        else:
            return FoundRun(None, experiment_id)
        runs = self.call(
            "search this job's runs",
            self.client.search_runs,
            [experiment_id],
            filter_string=query,
            order_by=["start_time DESC"],
            max_results=20,
        )
        found = [r for r in runs if same_job(dict(r.data.tags), self.identity)]
        if not found:
            return FoundRun(None, experiment_id)
        run_id = str(found[0].info.run_id)
        log.info("no usable %s; found this job's run %s by its tags", MLFLOW_RUN_FILE, run_id)
        return FoundRun(run_id, experiment_id)

    def _saved_run(self) -> FoundRun | None:
        saved = RunFile.read(self.output_dir)
        if saved is None:
            return None
        if not same_server(saved.tracking_uri, self.tracking_uri):
            log.warning("%s names a run on another tracking server; using another", MLFLOW_RUN_FILE)
            return None
        try:
            run = self.call(f"get run {saved.run_id}", self.client.get_run, saved.run_id)
        except Exception as exc:
            if not _run_is_missing(exc):
                raise
            log.warning(
                "run %s from %s does not exist at %s; using another",
                saved.run_id,
                MLFLOW_RUN_FILE,
                redact(self.tracking_uri),
            )
            return None
        return FoundRun(saved.run_id, str(run.info.experiment_id), from_file=True)

    def create(self, experiment_id: str) -> str:
        """A new run of this job, tagged with its identity and named after it."""
        tags = {**self.identity, "mlflow.runName": self.cfg.job.name}
        run = self.call("create a run", self.client.create_run, experiment_id, tags=tags)
        return str(run.info.run_id)

    def remember(self, run_id: str, experiment_id: str) -> None:
        """Record the run in the run file, so that a restart or the registration finds it."""
        RunFile(run_id, experiment_id, self.tracking_uri).write(self.output_dir)
