"""Chained jobs (``spec.model.fromJob``): what a Succeeded parent job gives this one. No client, no
decision: whether the parent lets the job start is :mod:`kubetune_operator.state.chaining`'s verdict.

Once the parent is ready, the preparation and training pods of this job mount the parent's checkpoint
claim read-only at :data:`PARENT_MOUNT` (:func:`volumes`; the registration reads only this job's own
volume, where the preparation put its starting model), and the trainer config names the folder to
load, the parent's method and, for a LoRA parent, its base model (:func:`trainer_parent`). What the
pods need is recorded in ``status.parent`` (:func:`parent_status`), so the children are built the
same once the parent is gone.
"""

from __future__ import annotations

from typing import Any

from kubetune_api import spec as api
from kubetune_api.preparation import MODEL_DIR
from kubetune_api.status import FineTuneJobStatus, ParentStatus
from kubetune_api.trainer_config import CHECKPOINTS_DIR, FINAL_DIR, TrainerConfig, resolve

# Where the parent's checkpoint volume is mounted (read-only) in this job's pods.
PARENT_MOUNT = "/var/lib/kubetune-parent"
PARENT_VOLUME = "parent"
PARENT_BASE_VOLUME = "parent-base"


def recorded(job: api.FineTuneJob) -> ParentStatus | None:
    """The parent this job started from, as its status recorded it (None: not seen yet); while the
    job waits, only the parent's name and uid (no ``path``)."""
    ref = job.spec.model.from_job
    seen = job.status.parent if job.status is not None else None
    if ref is None or seen is None or not seen.uid or seen.job != ref.name:
        return None
    return seen


def folder(parent: api.FineTuneJob, choice: api.CheckpointChoice) -> str | None:
    """The parent's folder to train from, relative to its volume: final/, or its best checkpoint."""
    if choice == api.CheckpointChoice.FINAL:
        return FINAL_DIR
    status = parent.status or FineTuneJobStatus()
    evaluation = status.evaluation
    # a parent that registered by bestEval chose among its checkpoints and final/ already
    if (
        parent.spec.registration.select == api.CheckpointChoice.BEST_EVAL
        and evaluation
        and evaluation.selected
    ):
        label = evaluation.selected
        return FINAL_DIR if label == FINAL_DIR else f"{CHECKPOINTS_DIR}/{label}"
    best = status.checkpoints.best_step if status.checkpoints else None
    return f"{CHECKPOINTS_DIR}/checkpoint-{best}" if best is not None else None


def parent_status(parent: api.FineTuneJob, folder: str, *, preparation: bool = True) -> ParentStatus:
    """What this job records of its Succeeded parent (``status.parent``)."""
    status = parent.status or FineTuneJobStatus()
    children = status.children
    claim = (children.checkpoint_claim if children else None) or (
        parent.spec.storage.existing_claim or f"{parent.metadata.name}-ckpt"
    )
    model, method = parent.spec.model, parent.spec.method
    base = base_claim = base_sub_path = None
    if method == api.Method.LORA:
        if model.path:
            base = model.path
            if model.volume is not None:
                base_claim, base_sub_path = model.volume.claim_name, model.volume.sub_path
        elif model.name and not preparation:
            base = model.name
        else:  # the parent's preparation left its starting model there (a Hub download, or merged)
            base = f"{PARENT_MOUNT}/{MODEL_DIR}"
    return ParentStatus(
        job=parent.metadata.name,
        uid=parent.metadata.uid,
        # the trainer's run; the registered version's run when the trainer never reported one
        run_id=(status.mlflow.run_id if status.mlflow else None)
        or (status.registered_model.run_id if status.registered_model else None),
        model_uri=status.registered_model.uri if status.registered_model else None,
        path=folder,
        claim=claim,
        method=str(method),
        base=base,
        base_claim=base_claim,
        base_sub_path=base_sub_path,
    )


def volumes(job: api.FineTuneJob) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The parent's checkpoint volume (and a LoRA parent's base model volume), read-only, for every
    pod of a job whose parent is recorded; nothing otherwise."""
    seen = recorded(job)
    if seen is None or not seen.claim:
        return [], []
    vols: list[dict[str, Any]] = [
        {"name": PARENT_VOLUME, "persistentVolumeClaim": {"claimName": seen.claim, "readOnly": True}}
    ]
    mounts: list[dict[str, Any]] = [{"name": PARENT_VOLUME, "mountPath": PARENT_MOUNT, "readOnly": True}]
    if seen.base_claim and seen.base:
        vols.append(
            {
                "name": PARENT_BASE_VOLUME,
                "persistentVolumeClaim": {"claimName": seen.base_claim, "readOnly": True},
            }
        )
        mount: dict[str, Any] = {"name": PARENT_BASE_VOLUME, "mountPath": seen.base, "readOnly": True}
        if seen.base_sub_path:
            mount["subPath"] = seen.base_sub_path
        mounts.append(mount)
    return vols, mounts


def trainer_parent(job: api.FineTuneJob) -> dict[str, Any] | None:
    """The trainer config's ``parent`` (wire form) for a job whose parent is recorded."""
    seen = recorded(job)
    if seen is None or seen.path is None:
        return None
    return {
        "job": seen.job,
        "uid": seen.uid,
        "runId": seen.run_id,
        "modelUri": seen.model_uri,
        "path": f"{PARENT_MOUNT}/{seen.path}",
        "method": seen.method,
        "basePath": seen.base,
    }


def trainer_config(
    job: api.FineTuneJob, tracking_uri: str | None, registry_uri: str | None = None
) -> TrainerConfig:
    """The job's trainer config as the operator renders it, with ``parent`` once it is recorded."""
    config = resolve(
        job, default_tracking_uri=tracking_uri, default_registry_uri=registry_uri, report_progress=True
    )
    return with_trainer_parent(config, job)


def with_trainer_parent(config: TrainerConfig, job: api.FineTuneJob) -> TrainerConfig:
    """The trainer config (a ``TrainerConfig``) with its ``parent`` filled, for a job whose parent
    is recorded; as it is otherwise."""
    wire = trainer_parent(job)
    if wire is None:
        return config
    data = config.model_dump(by_alias=True, exclude_none=True, mode="json")
    data["parent"] = {k: v for k, v in wire.items() if v is not None}
    return TrainerConfig.model_validate(data)


def with_recorded(job: api.FineTuneJob, seen: ParentStatus) -> api.FineTuneJob:
    """``job`` as if its status recorded ``seen`` already (the pass that first finds the parent
    Succeeded builds the children with it, before its status write)."""
    status = (job.status or FineTuneJobStatus()).model_copy(update={"parent": seen})
    return job.model_copy(update={"status": status})
