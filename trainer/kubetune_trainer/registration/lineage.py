"""Where a registered model came from, exactly: the tags preparation and the image add to the
registered version (beside the spec's names, :func:`kubetune_trainer.register.lineage_tags`).

- the commits the preparation step resolved for the base model and the data set, the data's
  content hash and the tokenized data's hash (``prepared/report.json`` on the checkpoint volume,
  :mod:`kubetune_api.preparation`);
- the trainer image the pod runs (``KUBETUNE_IMAGE``, set by the operator on every pod);
- the versions of the libraries that trained it (torch, transformers, trl, peft, datasets, liger);
- the optimizer step the final model is, the checkpoint of that step on the volume, and the budget
  limit when ``spec.budget`` stopped the run (the final model's COMPLETE marker).
- a chained job's parent (``prepared/start.json``, :mod:`..sources.chain`): the parent job, its uid, its
  MLflow run, which of its models (final or checkpoint-<step>), and the registered version started
  from (``models:/<name>/<version>``, the version also on its own).

Tags are strings, never a secret: the report holds none.
"""

from __future__ import annotations

import json
import logging
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from pydantic import ValidationError

from kubetune_api.preparation import REPORT_FILE, PreparationReport
from kubetune_api.trainer_config import COMPLETE_MARKER, FINAL_DIR, recorded_start

from .. import settings
from ..volume import checkpoints

log = logging.getLogger(__name__)

TAG_BASE_MODEL_COMMIT = "kubetune.base_model.commit"
TAG_DATASET_COMMIT = "kubetune.dataset.commit"
TAG_DATASET_HASH = "kubetune.dataset.hash"
TAG_TOKENIZED_HASH = "kubetune.tokenized.hash"
TAG_TOKENIZED_KEY = "kubetune.tokenized.key"
TAG_IMAGE = "kubetune.trainer_image"
VERSION_TAG_PREFIX = "kubetune.version."
TAG_FINAL_STEP = "kubetune.final.step"
TAG_CHECKPOINT = "kubetune.final.checkpoint"
TAG_BUDGET = "kubetune.budget_reached"
TAG_PARENT_JOB = "kubetune.parent.job"
TAG_PARENT_UID = "kubetune.parent.uid"
TAG_PARENT_RUN = "kubetune.parent.run_id"
TAG_PARENT_MODEL_URI = "kubetune.parent.model_uri"
TAG_PARENT_VERSION = "kubetune.parent.version"
TAG_PARENT_CHECKPOINT = "kubetune.parent.checkpoint"
TAG_PARENT_METHOD = "kubetune.parent.method"
TAG_PARENT_REGISTERED = "kubetune.parent.registered"
LIBRARIES = ("torch", "transformers", "trl", "peft", "datasets", "liger-kernel", "kubetune")


def preparation_report(output_dir: str | Path) -> PreparationReport | None:
    """The preparation report on the volume; None when the job was not prepared (or it is unreadable)."""
    path = Path(output_dir) / REPORT_FILE
    try:
        return PreparationReport.model_validate(json.loads(path.read_text()))
    except FileNotFoundError:
        return None
    except (ValueError, ValidationError) as e:
        log.warning("%s is not a preparation report (%s): no preparation lineage", path, e)
        return None


def library_versions() -> dict[str, str]:
    out = {}
    for name in LIBRARIES:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def provenance_tags(output_dir: str | Path) -> dict[str, str]:
    """The exact sources (from preparation), the image and the library versions, as tags."""
    tags: dict[str, str] = {}
    report = preparation_report(output_dir)
    if report is not None:
        found = {
            TAG_BASE_MODEL_COMMIT: report.model_revision,
            TAG_DATASET_COMMIT: report.dataset_revision,
            TAG_DATASET_HASH: report.dataset_hash,
            TAG_TOKENIZED_HASH: report.tokenized_hash,
            TAG_TOKENIZED_KEY: report.tokenized_key,
        }
        tags.update({k: v for k, v in found.items() if v})
    image = settings.current().image
    if image:
        tags[TAG_IMAGE] = image
    tags.update({f"{VERSION_TAG_PREFIX}{name}": v for name, v in library_versions().items()})
    tags.update(final_tags(Path(output_dir)))
    tags.update(parent_tags(Path(output_dir)))
    return tags


def parent_tags(output_dir: Path) -> dict[str, str]:
    """The model a chained job started from, as ``prepared/start.json`` recorded it."""
    start = recorded_start(output_dir) or {}
    parent = start.get("parent") if isinstance(start.get("parent"), dict) else {}
    source = start.get("source") if isinstance(start.get("source"), dict) else {}
    assert isinstance(parent, dict) and isinstance(source, dict)
    uri = parent.get("modelUri")
    found = {
        TAG_PARENT_JOB: parent.get("job"),
        TAG_PARENT_UID: parent.get("uid"),
        TAG_PARENT_RUN: parent.get("runId"),
        TAG_PARENT_MODEL_URI: uri,
        TAG_PARENT_VERSION: str(uri).rsplit("/", 1)[-1] if uri else None,
        TAG_PARENT_CHECKPOINT: Path(str(parent["path"])).name
        if parent.get("job") and parent.get("path")
        else None,
        TAG_PARENT_METHOD: parent.get("method"),
        TAG_PARENT_REGISTERED: source.get("registered"),
    }
    return {k: str(v) for k, v in found.items() if v}


def final_tags(output_dir: Path) -> dict[str, str]:
    """The final model's step, the complete checkpoint of that step, and the budget that stopped it."""
    try:
        marker = json.loads((output_dir / FINAL_DIR / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(marker, dict) or not isinstance(marker.get("step"), int):
        return {}
    step = marker["step"]
    tags = {TAG_FINAL_STEP: str(step)}
    same = [
        c
        for c in checkpoints.complete_checkpoints(checkpoints.checkpoints_root(output_dir))
        if c.step == step
    ]
    if same:
        tags[TAG_CHECKPOINT] = str(same[0].path)
    if marker.get("budget"):
        tags[TAG_BUDGET] = str(marker["budget"])
    return tags
