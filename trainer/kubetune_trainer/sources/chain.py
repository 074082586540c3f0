"""Chained jobs: the model a job starts from when ``spec.model`` is ``fromJob`` or ``registered``.

The starting model is put in place once, on the job's own volume, and every later reader (the
trainer's ranks, its restarts, the registration step, a child job of this one) loads it from there:

- ``fromJob``, the parent trained **LoRA** (its folder holds an adapter): the parent's base model is
  loaded, the adapter applied and merged into it (``merge_and_unload``), and the merged weights are
  saved with the parent's trained tokenizer (chat template, added tokens) into ``prepared/model``.
  LoRA on it trains a fresh adapter on the merged weights; full training trains them all.
- ``fromJob``, the parent trained **full** weights: its folder is a complete model. A full job loads
  it where it is; a LoRA job copies its model files into ``prepared/model`` (the base its own
  adapter goes on, for its registration and for its own children, which mount only this volume).
- ``registered`` (``models:/<name>@<alias>`` or ``models:/<name>/<version>``): the alias is resolved
  to a version through the MLflow registry **once** (a restart, or a rerun of the same run folder,
  keeps that version even when the alias moved since), and the version's model files (MLflow's
  transformers flavour keeps the weights under ``model/`` and the tokenizer under
  ``components/tokenizer/``) are downloaded into ``prepared/model``.

``prepared/start.json`` (:data:`kubetune_api.trainer_config.START_FILE`) records what the folder
is: the source it was made from (so another source makes it again), the resolved parent
(:class:`~kubetune_api.trainer_config.ParentModel`: job, uid, run, registered version), and the
folder to load. The preparation step writes it; when a job runs without one, the first trainer
process does, under an exclusive ``flock`` the others wait on.

Input the user must fix raises :class:`ChainError` (a :class:`~.data_check.BadInputError`) naming
the field: a parent folder that is not there or not complete, a registered model or alias that
does not exist, a version that is an adapter without its base.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubetune_api.trainer_config import (
    COMPLETE_MARKER,
    START_FILE,
    ParentModel,
    TrainerConfig,
    dump_json,
    recorded_start,
)

from .. import settings
from ..mlflow.run import local_store_uri, redact, resolve_registry_uri, resolve_tracking_uri
from .data_check import BadInputError

log = logging.getLogger("kubetune_trainer.chain")

START_DIR = "prepared/model"  # kubetune_api.preparation.MODEL_DIR: a chained job has no Hub model
LOCK_FILE = "prepared/.start.lock"
ADAPTER_CONFIG = "adapter_config.json"
# A model folder's files worth copying: not a checkpoint's optimizer, scheduler, RNG or trainer state.
MODEL_SUFFIXES = (".json", ".safetensors", ".model", ".txt", ".jinja", ".tiktoken", ".py", ".bin")
NOT_MODEL_FILES = ("trainer_state.json", "training_args.bin", "optimizer.pt", "scheduler.pt", "scaler.pt")
# MLflow's transformers flavour: the weights under model/, the tokenizer under components/tokenizer/
MLFLOW_MODEL_DIR = "model"
MLFLOW_TOKENIZER_DIR = "components/tokenizer"
MLFLOW_PEFT_DIR = "peft"


class ChainError(BadInputError):
    """The starting model a chained job names cannot be had: the message names the field."""


def is_chained(cfg: TrainerConfig) -> bool:
    return bool(cfg.spec.model.from_job or cfg.spec.model.registered)


@dataclass(frozen=True)
class Start:
    """The starting model of a chained job, as ``prepared/start.json`` records it."""

    folder: Path  # the full model (weights + tokenizer) to load
    parent: ParentModel  # the resolved parent (lineage, training hash)
    source: dict[str, Any]  # what it was made from (made again when this changes)


# --- the record -------------------------------------------------------------------------------------


def source_of(cfg: TrainerConfig) -> dict[str, Any]:
    """What decides the starting model, as recorded in start.json: another value makes it again."""
    src = cfg.spec.model
    if src.registered:
        return {"registered": src.registered}  # resolved once: the alias is not looked up again
    parent = cfg.parent
    if parent is None or not parent.path:
        raise ChainError(
            f"spec.model.fromJob {src.from_job.name if src.from_job else ''}: the trainer config names no "
            "parent folder (parent.path); in a cluster the operator fills it once the parent Succeeded, "
            "locally kubetune run --local finds the parent's run folder"
        )
    return {
        **parent.identity(),
        "folder": parent.path,
        "base": parent.base_path,
        "thisMethod": str(cfg.spec.method),
    }


def read_start(cfg: TrainerConfig, root: Path | None = None) -> Start | None:
    """The starting model recorded for this config's source, when its folder is there."""
    root = Path(root or cfg.output_dir)
    data = recorded_start(root)
    if data is None:
        return None
    try:
        wanted = source_of(cfg)
    except ChainError:
        wanted = None
    if wanted is not None and data.get("source") != wanted:
        return None
    folder = Path(str(data.get("folder") or ""))
    folder = folder if folder.is_absolute() else root / folder
    if not (folder / "config.json").is_file():
        return None
    parent = ParentModel.model_validate(data.get("parent") or {})
    return Start(folder=folder, parent=parent, source=data.get("source") or {})


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    path = root / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX)
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            # a file system without locks: the folder is still written aside and renamed into place
            log.warning("%s: no file locks on this volume (%s); not waiting for other processes", path, e)
            yield
            return
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_start(cfg: TrainerConfig, root: Path | None = None) -> Start:
    """The starting model in place (made now when the volume does not hold it for this source)."""
    root = Path(root or cfg.output_dir)
    found = read_start(cfg, root)
    if found is not None:
        return found
    with _locked(root):
        found = read_start(cfg, root)  # another process made it while this one waited
        if found is not None:
            return found
        start = _make(cfg, root)
        record = {
            "source": start.source,
            "parent": start.parent.wire(),
            "folder": str(start.folder.relative_to(root))
            if start.folder.is_relative_to(root)
            else str(start.folder),
            "completed_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        dump_json(record, root / START_FILE)
        log.info("starting model: %s (%s)", start.folder, describe(start.parent))
        return start


def resolved(cfg: TrainerConfig, root: Path | None = None) -> TrainerConfig:
    """``cfg`` with its parent as resolved (a registered alias's version), the starting model in
    place; ``cfg`` itself for a job that is not chained."""
    if not is_chained(cfg):
        return cfg
    start = ensure_start(cfg, root)
    return cfg.model_copy(update={"parent": start.parent})


def describe(parent: ParentModel) -> str:
    if parent.job:
        return f"FineTuneJob {parent.job}'s {Path(parent.path or '').name} ({parent.method})"
    return f"registered model {parent.model_uri}"


# --- making it --------------------------------------------------------------------------------------


def _make(cfg: TrainerConfig, root: Path) -> Start:
    source = source_of(cfg)
    dest = root / START_DIR
    if cfg.spec.model.registered:
        return Start(dest, _download_registered(cfg, dest), source)
    parent = cfg.parent
    assert parent is not None and parent.path  # source_of refused it otherwise
    folder = parent_folder(parent, field="spec.model.fromJob")
    if (folder / ADAPTER_CONFIG).is_file():
        _merge_adapter(cfg, folder, parent, dest)
        return Start(dest, parent.model_copy(update={"method": "lora"}), source)
    if not (folder / "config.json").is_file():
        raise ChainError(
            f"spec.model.fromJob: {folder} holds neither a model (config.json) nor a LoRA adapter "
            f"({ADAPTER_CONFIG})"
        )
    parent = parent.model_copy(update={"method": parent.method or "full"})
    if str(cfg.spec.method) == "full":
        return Start(folder, parent, source)  # loaded where it is; nobody needs a copy
    _copy_model(folder, dest)
    return Start(dest, parent, source)


def parent_folder(parent: ParentModel, *, field: str) -> Path:
    """The parent's folder, refused unless it is there and complete (its COMPLETE marker)."""
    folder = Path(str(parent.path))
    if not folder.is_dir():
        raise ChainError(f"{field}: the parent's model folder {folder} does not exist")
    if not (folder / COMPLETE_MARKER).is_file():
        raise ChainError(
            f"{field}: {folder} has no {COMPLETE_MARKER} marker: the parent did not finish writing it"
        )
    return folder


def _fresh(dest: Path) -> Path:
    """An empty temporary folder beside ``dest``, renamed into place by :func:`_publish`."""
    tmp = dest.with_name(dest.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def _publish(tmp: Path, dest: Path) -> None:
    if dest.exists():
        shutil.rmtree(dest)
    tmp.rename(dest)


def _model_files(folder: Path) -> list[Path]:
    return [
        p
        for p in sorted(folder.iterdir())
        if p.is_file()
        and p.name.endswith(MODEL_SUFFIXES)
        and p.name not in NOT_MODEL_FILES
        and not p.name.startswith("rng_state")
    ]


def _copy_model(folder: Path, dest: Path) -> None:
    tmp = _fresh(dest)
    for path in _model_files(folder):
        shutil.copy2(path, tmp / path.name)
    _publish(tmp, dest)
    log.info("copied the parent's model %s into %s", folder, dest)


def adapter_base(folder: Path, parent: ParentModel) -> str:
    """The base a parent's adapter goes on: the one the operator or the local runner named, else the
    one the adapter's config recorded when it was trained."""
    if parent.base_path:
        return parent.base_path
    try:
        recorded = json.loads((folder / ADAPTER_CONFIG).read_text()).get("base_model_name_or_path")
    except (OSError, ValueError):
        recorded = None
    if not recorded:
        raise ChainError(
            f"spec.model.fromJob: {folder} is a LoRA adapter, and neither the trainer config (parent.basePath) "
            "nor the adapter's config names its base model"
        )
    return str(recorded)


def _merge_adapter(cfg: TrainerConfig, folder: Path, parent: ParentModel, dest: Path) -> None:
    """The parent's base with its adapter merged in, saved with the parent's tokenizer."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = adapter_base(folder, parent)
    trust = cfg.spec.model.trust_remote_code
    if not Path(base).is_dir() and base.startswith("/"):
        raise ChainError(f"spec.model.fromJob: the parent's base model {base} is not there")
    log.info("merging the parent's adapter %s into its base %s", folder, base)
    # the trained tokenizer: its chat template and any tokens the parent added
    tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=trust)
    model: Any = AutoModelForCausalLM.from_pretrained(
        base, dtype="auto", trust_remote_code=trust, token=settings.current().hf_token
    )
    if len(tokenizer) > model.get_input_embeddings().num_embeddings:
        # the parent grew the embeddings the same way when it added chat tokens (kubetune_trainer.sources.chat)
        model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    merged = PeftModel.from_pretrained(model, folder).merge_and_unload()
    tmp = _fresh(dest)
    merged.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    _publish(tmp, dest)


# --- registered models ------------------------------------------------------------------------------


def parse_registered(uri: str) -> tuple[str, str | None, str | None]:
    """``models:/<name>@<alias>`` or ``models:/<name>/<version>`` -> (name, alias, version).

    >>> parse_registered("models:/assistant@champion")
    ('assistant', 'champion', None)
    >>> parse_registered("models:/assistant/3")
    ('assistant', None, '3')
    """
    body = uri.removeprefix("models:/")
    if "@" in body:
        name, alias = body.rsplit("@", 1)
        return name, alias, None
    name, version = body.rsplit("/", 1)
    return name, None, version


def _tracking_uri(cfg: TrainerConfig) -> str:
    return resolve_tracking_uri(cfg)


def resolve_registered(cfg: TrainerConfig) -> Any:
    """The model version ``spec.model.registered`` names (an alias looked up now)."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    uri = str(cfg.spec.model.registered)
    tracking = _tracking_uri(cfg)
    registry = resolve_registry_uri(cfg, tracking)
    name, alias, version = parse_registered(uri)
    client = MlflowClient(tracking_uri=tracking, registry_uri=registry)
    try:
        if alias is not None:
            return client.get_model_version_by_alias(name, alias)
        return client.get_model_version(name, str(version))
    except MlflowException as e:
        if e.error_code not in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE", "NOT_FOUND"):
            raise  # unreachable, refused: not the spec's fault
        what = f"alias {alias!r}" if alias is not None else f"version {version}"
        hint = ""
        if registry == local_store_uri(cfg.output_dir):
            hint = (
                ". That is this run folder's own store; a model another local run registered is in "
                "that run's store: give its URI (--tracking-uri sqlite:///<its run folder>/mlflow.db, "
                "or MLFLOW_TRACKING_URI)"
            )
        raise ChainError(
            f"spec.model.registered {uri}: the MLflow registry at {redact(registry, drop_userinfo=True)} has no "
            f"registered model {name!r} with {what} ({' '.join(str(e.message).split())[:300]}){hint}"
        ) from e


def _download_registered(cfg: TrainerConfig, dest: Path) -> ParentModel:
    """The registered version's model files in ``dest``; the resolved parent."""
    import mlflow

    uri = str(cfg.spec.model.registered)
    version = resolve_registered(cfg)
    resolved_uri = f"models:/{version.name}/{version.version}"
    log.info("%s is %s (run %s): downloading its model files", uri, resolved_uri, version.run_id)
    download = _fresh(dest.with_name(dest.name + ".download"))
    tracking = _tracking_uri(cfg)
    # models:/ URIs are looked up in the process's registry, not the tracking_uri argument's
    mlflow.set_tracking_uri(tracking)
    mlflow.set_registry_uri(resolve_registry_uri(cfg, tracking))
    try:
        mlflow.artifacts.download_artifacts(
            artifact_uri=resolved_uri, dst_path=str(download), tracking_uri=tracking
        )
        weights = download / MLFLOW_MODEL_DIR
        if not (weights / "config.json").is_file():
            if (download / MLFLOW_PEFT_DIR).is_dir():
                raise ChainError(
                    f"spec.model.registered {uri}: {resolved_uri} is a LoRA adapter without its base "
                    "(registered with registration.mergeLora: false); start from a merged or full version"
                )
            raise ChainError(f"spec.model.registered {uri}: {resolved_uri} holds no transformers model")
        tmp = _fresh(dest)
        for path in _model_files(weights):
            path.rename(tmp / path.name)
        tokenizer = download / MLFLOW_TOKENIZER_DIR
        if tokenizer.is_dir():
            for path in _model_files(tokenizer):
                if not (tmp / path.name).exists():
                    path.rename(tmp / path.name)
        _publish(tmp, dest)
    finally:
        shutil.rmtree(download, ignore_errors=True)
    return ParentModel(run_id=version.run_id, model_uri=resolved_uri, path=str(dest), method="full", job=None)


# --- identity ---------------------------------------------------------------------------------------


def fingerprint(folder: Path) -> str:
    """A hash of a model folder's COMPLETE marker (its step, time and training hash): the same folder
    trained again reads differently."""
    try:
        text = (folder / COMPLETE_MARKER).read_bytes()
    except OSError:
        text = b""
    return hashlib.sha256(text).hexdigest()[:16]


__all__ = [
    "START_FILE",
    "ChainError",
    "Start",
    "ensure_start",
    "fingerprint",
    "is_chained",
    "parse_registered",
    "read_start",
    "resolved",
]
