"""The trainer config: the one file the operator renders and the trainer reads.

The operator writes it into the ``<job>-config`` ConfigMap (key ``config.yaml``), mounted in every
trainer pod at ``/etc/kubetune/config.yaml``; ``kubetune run --local`` builds the same object from a
FineTuneJob manifest. It holds the whole resolved spec (every default filled in) plus where things
go at run time. It never holds a secret: credentials reach the pods as secretKeyRef variables.

Layout of the checkpoint volume (``output_dir``)::

    checkpoints/checkpoint-<step>/   one per save; counts only with its COMPLETE marker
    final/                           the trained model (adapter or full weights + tokenizer) + COMPLETE
    mlflow-run.json                  {"run_id", "experiment_id", "tracking_uri"}: one run per job
    train-result.json                what training did (steps, losses, whether MLflow was reachable)
    register-result.json             what registration did (name, version, uri, run_id)
    prepared/start.json              a chained job's starting model (spec.model.fromJob/registered)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from . import admission, rules
from .base import ApiModel
from .spec import FineTuneJob, FineTuneJobSpec

CONFIG_KEY = "config.yaml"
CONFIG_MOUNT_DIR = "/etc/kubetune"
CONFIG_PATH = f"{CONFIG_MOUNT_DIR}/{CONFIG_KEY}"
CHECKPOINT_MOUNT = "/var/lib/kubetune"
# Where each step leaves its report for the operator: the kubelet's terminationMessagePath (the
# builders set it; the trainer writes there unless a local run names another file on the command line)
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# kubetune_trainer.launch's own option (first, before torchrun's): the workers' time to checkpoint
# after SIGTERM; the operator writes it into the training command (never an environment variable)
SHUTDOWN_GRACE_FLAG = "--shutdown-grace-s"
COMPLETE_MARKER = "COMPLETE"
FINAL_DIR = "final"
CHECKPOINTS_DIR = "checkpoints"
MLFLOW_RUN_FILE = "mlflow-run.json"
TRAIN_RESULT_FILE = "train-result.json"
REGISTER_RESULT_FILE = "register-result.json"
# A chained job's starting model (spec.model.fromJob or registered), as the preparation step (or the
# first trainer process) put it in place: {"source", "parent" (ParentModel), "folder", "completed_at"}
START_FILE = "prepared/start.json"
# Exit code of a trainer that saved a checkpoint on SIGTERM: retryable (the PyTorchJob's
# restartPolicy ExitCode restarts it), and never 0, so a preempted run never looks like success.
EXIT_PREEMPTED = 143


class ParentModel(ApiModel):
    """The model a chained job starts from (spec.model.fromJob or spec.model.registered), resolved:
    the operator fills it from the parent's status, the local runner from the parent's run folder,
    the preparation step from the MLflow registry."""

    job: str | None = Field(default=None, description="The parent FineTuneJob (fromJob).")
    uid: str | None = Field(default=None, description="The parent's uid (lineage).")
    run_id: str | None = Field(default=None, description="The parent's MLflow run (lineage).")
    model_uri: str | None = Field(
        default=None, description="The registered version: models:/<name>/<version> (lineage)."
    )
    path: str | None = Field(
        default=None,
        description="The folder to start from: a full model, or a LoRA adapter (method lora). None for a "
        "registered model the preparation step has not downloaded yet.",
    )
    method: str | None = Field(default=None, description="How the parent trained: lora or full.")
    base_path: str | None = Field(
        default=None, description="A LoRA parent's base model (a folder, or a Hub id) its adapter goes on."
    )
    fingerprint: str | None = Field(
        default=None,
        description="What identifies the parent's model where no uid does (a local run folder): a hash of "
        "its COMPLETE marker.",
    )

    def identity(self) -> dict[str, Any]:
        """What decides the starting weights: the parent job (uid, or the folder's fingerprint) and
        which of its models, or the registered version. Folders count by name only (final,
        checkpoint-<step>): the same parent mounted elsewhere is the same model."""
        out: dict[str, Any] = {
            "job": self.job,
            "uid": self.uid,
            "fingerprint": self.fingerprint,
            "modelUri": None if self.job else self.model_uri,
            "path": Path(self.path).name if self.path and self.job else None,
            "method": self.method,
        }
        return {k: v for k, v in out.items() if v}


class JobRef(ApiModel):
    name: str = Field(description="FineTuneJob name.")
    namespace: str = Field(default="default", description="FineTuneJob namespace.")
    uid: str | None = Field(default=None, description="FineTuneJob uid (lineage tag).")


# spec.training fields that change how long or how a run goes, not which weights it trains toward
HOW_THE_RUN_GOES = (
    "epochs",
    "max_steps",
    "tokens_per_step",
    "gradient_checkpointing",
    "liger",
    "torch_compile",
    "logging_steps",
    "eval_steps",
    "save_steps",
    "save_total_limit",
    "loss_watchdog",
    "oom_retries",
)


class TrainerConfig(ApiModel):
    """Everything the trainer and the registration step need."""

    job: JobRef
    spec: FineTuneJobSpec
    output_dir: str = Field(
        default=CHECKPOINT_MOUNT, description="Checkpoint volume mount (or a local folder)."
    )
    tracking_uri: str | None = Field(default=None, description="MLflow tracking URI (resolved).")
    registry_uri: str | None = Field(
        default=None,
        description="MLflow model registry URI (resolved; unset: the tracking server's registry).",
    )
    experiment: str = Field(description="MLflow experiment name (resolved).")
    registered_model_name: str = Field(description="Registered model name (resolved).")
    report_progress: bool = Field(
        default=False, description="Patch progress into the FineTuneJob status (in a cluster)."
    )
    parent: ParentModel | None = Field(
        default=None, description="The resolved starting model of spec.model.fromJob (or registered)."
    )

    def config_hash(self) -> str:
        """Hash of what shapes the model: the spec without the fields that may change."""
        shaping = self.spec.wire()
        shaping.pop("suspend", None)
        shaping.get("registration", {}).pop("alias", None)
        # the gate decides whether a model is registered, not what it is (and it cannot change after
        # creation: spec.MUTABLE_SPEC_PATHS); left out, as before, so the hash of existing jobs stays
        shaping.get("registration", {}).pop("gate", None)
        blob = json.dumps(shaping, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def training_hash(self) -> str:
        """Hash of what decides the trained weights: model, data, method, adapter and hyperparameters.

        Written into every COMPLETE marker, so that a folder (a reused claim, a local run folder)
        holding another training's checkpoints is never resumed or taken as finished. Left out, so
        that the same training is never refused: fields at their defaults (a kubetune version that
        adds a defaulted field changes nothing), the folders of local files (only their names count:
        a moved cache or manifest is the same model and data), and what only says how long or how
        the run goes (steps or epochs, so a run may be continued; saving, logging, evaluation steps;
        compilation, Liger, checkpointing, micro-step size). A chained job (spec.model.fromJob or
        registered) counts its resolved parent (:meth:`ParentModel.identity`): checkpoints trained
        from another parent, or from the version an alias pointed at before, are never resumed.
        """
        spec = self.spec

        def dump(part: Any, *, drop: tuple[str, ...] = ()) -> dict[str, Any]:
            out: dict[str, Any] = part.model_dump(
                by_alias=True, exclude_none=True, exclude_defaults=True, mode="json", exclude=set(drop)
            )
            if out.get("path"):
                out["path"] = Path(str(out["path"])).name
            return out

        parts = {
            "model": dump(spec.model),
            "dataset": dump(spec.dataset),
            "training": dump(spec.training, drop=HOW_THE_RUN_GOES),
            "method": str(spec.method),
        }
        if spec.method == "lora":
            parts["lora"] = dump(spec.lora_settings())
        if spec.prefers:
            # SFT's hash stays as it was; a preference objective is other weights
            parts["objective"] = str(spec.objective)
            parts["preference"] = dump(spec.preference_settings())
        parent = self.parent
        if spec.model.registered:
            # the version the alias resolved to, once, as the volume records it
            start = recorded_start(self.output_dir) or {}
            if (start.get("source") or {}).get("registered") == spec.model.registered:
                parent = ParentModel.model_validate(start.get("parent") or {})
        if parent is not None and (spec.model.from_job or spec.model.registered):
            # the starting model: a job's output, or the registered version
            parts["parent"] = parent.identity()
        blob = json.dumps(parts, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(by_alias=True, exclude_none=True, mode="json"), sort_keys=False)

    @classmethod
    def load(cls, path: str | Path) -> TrainerConfig:
        return cls.model_validate(yaml.safe_load(Path(path).read_text()))


def resolve(
    job: FineTuneJob,
    *,
    default_tracking_uri: str | None = None,
    default_registry_uri: str | None = None,
    output_dir: str = CHECKPOINT_MOUNT,
    report_progress: bool = False,
) -> TrainerConfig:
    """The trainer config for a FineTuneJob, with the operator's (or the local run's) defaults."""
    reg = job.spec.registration
    return TrainerConfig(
        job=JobRef(name=job.metadata.name, namespace=job.metadata.namespace, uid=job.metadata.uid),
        spec=job.spec,
        output_dir=output_dir,
        tracking_uri=reg.tracking_uri or default_tracking_uri,
        registry_uri=reg.registry_uri or default_registry_uri,
        experiment=reg.experiment or f"kubetune/{job.metadata.namespace}",
        registered_model_name=reg.model_name or job.metadata.name,
        report_progress=report_progress,
    )


def load_manifest(path: str | Path) -> FineTuneJob:
    """Read a FineTuneJob from a YAML file (the first FineTuneJob document in it), refused as the API
    server would refuse it: a pydantic ``ValidationError`` for its fields' types, bounds and patterns,
    then a :class:`~kubetune_api.rules.RuleError` naming the file and each field that breaks a rule."""
    for doc in yaml.safe_load_all(Path(path).read_text()):
        if isinstance(doc, dict) and doc.get("kind") == "FineTuneJob":
            job = FineTuneJob.model_validate(doc, context={rules.ADMITTED: True})
            problems = admission.check(job.wire())
            if problems:
                raise rules.RuleError(problems, source=str(path))
            return job
    raise ValueError(f"{path}: no FineTuneJob document found")


def recorded_start(output_dir: str | Path) -> dict[str, Any] | None:
    """What ``<output_dir>/prepared/start.json`` records (None: nothing, or unreadable)."""
    try:
        data = json.loads((Path(output_dir) / START_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def dump_json(data: dict[str, Any], path: Path) -> None:
    """Write JSON atomically (write a temporary file, then rename)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
