"""The Argo CD health check for FineTuneJob (deploy/argocd/health/finetunejob.lua) in Argo CD's own Lua
sandbox: gopher-lua (the version Argo CD's current release embeds) with the libraries Argo CD opens by
default (base, table, package; no string, math or os) and with every library open (useOpenLibs),
through ``luahealth`` (hack/lua, tests/support/lua.py). Every case asserts the exact health status and
message under both. A job on Kubeflow Trainer v2 (TrainJob) has the same health as one on a PyTorchJob
in each phase, both statuses written by the operator's state machine (issue 31 item 6). Statuses
written through a real API server by the operator's own state machine:
tests/integration/test_argocd_health.py.
"""

from __future__ import annotations

import random
import re
from decimal import ROUND_FLOOR, ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from tests.support.controlplane import REPO
from tests.support.lua import LuaError, run_health
from tests.unit.test_state_advance import World, drive, first, job_condition, manifest, ours
from tests.unit.test_state_trainjob import trainjob

from kubetune_api import spec as api
from kubetune_api.failures import Failure, TrainingFailure
from kubetune_api.status import Phase
from kubetune_operator import state
from kubetune_operator.state import Child

ARGOCD = REPO / "deploy" / "argocd"
SCRIPT_PATH = ARGOCD / "health" / "finetunejob.lua"
SCRIPT = SCRIPT_PATH.read_text()
HEALTH_KEY = "resource.customizations.health.kubetune.io_FineTuneJob"
LIBRARIES = {"argocd-default-libs": False, "open-libs": True}
INT64_MAX = 2**63 - 1

WAITING = "Waiting for the kubetune operator to pick up the FineTuneJob"
CREATED = "PyTorchJob job-train is created."
FAILED = "PyTorchJob job-train has failed because 1 Master replica(s) failed."
CONFLICT = "PersistentVolumeClaim job-ckpt already exists and is not owned by this FineTuneJob"
FORBIDDEN = (
    'creating PersistentVolumeClaim job-ckpt: 403 Forbidden: persistentvolumeclaims "job-ckpt" is forbidden: '
    "exceeded quota: no-pvcs. A ResourceQuota, the operator's RBAC or an admission policy forbids it; "
    "retrying with backoff (attempt 2) until it is allowed"
)
API_ERROR = (
    "creating PyTorchJob job-train: 503 Service Unavailable: the server is currently unable to handle the "
    "request. Retrying with backoff (3 attempts in a row failed)"
)
UNSCHEDULABLE = (
    "the scheduler cannot place pod job-train-master-0: 0/4 nodes are available: 4 node(s) didn't match Pod's "
    "node affinity/selector. preemption: 0/4 nodes are available: 4 Preemption is not helpful for scheduling."
)
NOT_CREATED = (
    "the Training Operator cannot create pod job-train-master-0 of PyTorchJob job-train: Error creating: pods "
    '"job-train-master-0" is forbidden: no PriorityClass with name training-preemptible was found'
)
IMAGE_PULL = "pod job-train-master-0 cannot pull its image: container pytorch (image t:nope): ErrImagePull"
MOUNT = (
    'pod job-train-master-0 cannot mount its volumes: MountVolume.SetUp failed for volume "ckpt": '
    "mount failed: exit status 32"
)
# as the operator writes it: TrainingFailure.describe(), then where to look
DISK_FULL = (
    TrainingFailure.of(
        Failure.DISK_FULL,
        "pod job-train-master-0: No space left on device on the checkpoint volume",
        step=120,
    ).describe()
    + " See the trainer logs: kubectl logs -n ns -l training.kubeflow.org/job-name=job-train --all-containers "
    "--prefix. Checkpoints stay on PVC job-ckpt when it is kept (storage.keepOnDelete or storage.existingClaim)."
)
BUDGET = (
    "training stopped at spec.budget maxDuration 2h: step 300 of 500 planned; the final model is that step's"
)
MODEL = {"name": "qwen3_4b_assistant", "version": "3", "uri": "models:/qwen3_4b_assistant/3"}
REGISTERED = "Registered model qwen3_4b_assistant version 3"


def cond(ctype: str, status: str, reason: str, message: str = "") -> dict[str, Any]:
    """A condition as the operator writes it."""
    return {
        "type": ctype,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": "2026-11-30T10:00:00Z",
        "observedGeneration": 1,
    }


def job(status: Any = None, *, generation: Any = 1, **extra: Any) -> dict[str, Any]:
    """A FineTuneJob as Argo CD reads it; ``status`` left out when None."""
    obj: dict[str, Any] = {
        "apiVersion": api.API_VERSION,
        "kind": api.KIND,
        "metadata": {"name": "job", "namespace": "ns", "generation": generation},
        "spec": {"method": "lora"},
    }
    if status is not None:
        obj["status"] = status
    obj.update(extra)
    return obj


def training(progress: Any, **extra: Any) -> dict[str, Any]:
    return job(
        {
            "phase": "Training",
            "observedGeneration": 1,
            "conditions": [cond("Training", "True", "PyTorchJobRunning", "PyTorchJob job-train is running.")],
            "progress": progress,
            **extra,
        }
    )


def succeeded(*conditions: dict[str, Any], model: Any = MODEL) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": "Succeeded",
        "observedGeneration": 2,
        "conditions": [
            cond("Ready", "True", "Succeeded", "registered qwen3_4b_assistant version 3"),
            *conditions,
        ],
    }
    if model is not None:
        status["registeredModel"] = model
    return job(status, generation=2)


NAN, INF = float("nan"), float("inf")
PREPARING = (
    "preparation Job j-prepare is downloading the model and the data, checking, tokenizing and estimating"
)
REFUSED = "data/chat.jsonl has no rows. Point spec.dataset at a file that holds examples. Nothing was started on a GPU"
PROGRESS = {"step": 25, "totalSteps": 50, "percent": 50, "loss": 1.5, "etaSeconds": 600}

# name: (object, health status, health message), under both library sets
CASES: dict[str, tuple[dict[str, Any], str, str]] = {
    # --- no status yet ---
    "no-status": (job(), "Progressing", WAITING),
    "empty-status": (job({}), "Progressing", WAITING),
    "empty-phase": (job({"phase": ""}), "Progressing", WAITING),
    "progress-before-phase": (job({"progress": PROGRESS}), "Progressing", WAITING),
    # --- every phase ---
    "pending": (
        job(
            {
                "phase": "Pending",
                "observedGeneration": 1,
                "conditions": [cond("Training", "False", "PyTorchJobCreated", CREATED)],
            }
        ),
        "Progressing",
        CREATED,
    ),
    "pending-no-conditions": (job({"phase": "Pending"}), "Progressing", "Pending"),
    "pending-ready-reason-only": (
        job({"phase": "Pending", "conditions": [cond("Ready", "False", "Creating")]}),
        "Progressing",
        "Creating",
    ),
    "training-no-progress": (training(None), "Progressing", "PyTorchJob job-train is running."),
    "training-no-conditions": (job({"phase": "Training"}), "Progressing", "Training"),
    "training-with-loss-and-eta": (
        training(PROGRESS),
        "Progressing",
        "step 25/50 (50%), loss 1.5000, ETA 10 min",
    ),
    "registering": (
        job(
            {
                "phase": "Registering",
                "conditions": [
                    cond(
                        "Registered",
                        "False",
                        "Registering",
                        "registering the model in MLflow (Job job-register)",
                    )
                ],
            }
        ),
        "Progressing",
        "registering the model in MLflow (Job job-register)",
    ),
    "registering-no-conditions": (
        job({"phase": "Registering"}),
        "Progressing",
        "Registering the model in MLflow",
    ),
    "succeeded": (succeeded(), "Healthy", REGISTERED),
    "succeeded-version-as-number": (
        succeeded(model={"name": "qwen3_4b_assistant", "version": 3}),
        "Healthy",
        REGISTERED,
    ),
    "succeeded-registration-off": (
        job(
            {
                "phase": "Succeeded",
                "conditions": [cond("Ready", "True", "Succeeded", "trained; registration is turned off")],
            }
        ),
        "Healthy",
        "trained; registration is turned off",
    ),
    "succeeded-bare": (job({"phase": "Succeeded"}), "Healthy", "Succeeded"),
    "failed": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "TrainingFailed", FAILED)]}),
        "Degraded",
        f"TrainingFailed: {FAILED}",
    ),
    "failed-bare": (job({"phase": "Failed"}), "Degraded", "The FineTuneJob failed"),
    "preparing": (
        job(
            {
                "phase": "Preparing",
                "conditions": [cond("Prepared", "False", "Preparing", PREPARING)],
            }
        ),
        "Progressing",
        PREPARING,
    ),
    "preparing-bare": (
        job({"phase": "Preparing"}),
        "Progressing",
        "Preparing: downloading, checking and tokenizing",
    ),
    "failed-refused-by-preparation": (
        job(
            {
                "phase": "Failed",
                "conditions": [
                    cond("Prepared", "False", "DatasetEmpty", REFUSED),
                    cond("Ready", "False", "DatasetEmpty", REFUSED),
                ],
            }
        ),
        "Degraded",
        f"DatasetEmpty: {REFUSED}",
    ),
    "suspended": (
        job(
            {
                "phase": "Suspended",
                "conditions": [
                    cond(
                        "Suspended", "True", "Suspended", "spec.suspend is true; the PyTorchJob is suspended"
                    )
                ],
            }
        ),
        "Suspended",
        "spec.suspend is true; the PyTorchJob is suspended",
    ),
    "suspended-bare": (job({"phase": "Suspended"}), "Suspended", "Suspended"),
    "child-conflict": (
        job({"phase": "Pending", "conditions": [cond("ChildrenReady", "False", "ChildConflict", CONFLICT)]}),
        "Degraded",
        CONFLICT,
    ),
    "children-not-ready-other-reason": (
        job(
            {
                "phase": "Pending",
                "conditions": [cond("ChildrenReady", "False", "Creating", "creating the PyTorchJob")],
            }
        ),
        "Progressing",
        "creating the PyTorchJob",
    ),
    "child-forbidden": (
        job(
            {
                "phase": "Pending",
                "conditions": [
                    cond("ChildrenReady", "False", "ChildForbidden", FORBIDDEN),
                    cond("Training", "False", "ChildForbidden", FORBIDDEN),
                ],
            }
        ),
        "Degraded",
        FORBIDDEN,
    ),
    "child-forbidden-while-training": (
        training(PROGRESS, conditions=[cond("ChildrenReady", "False", "ChildForbidden", FORBIDDEN)]),
        "Degraded",
        FORBIDDEN,
    ),
    # no training engine to run on (issue 31): a person installs one or fixes the setting
    "no-training-engine": (
        job(
            {
                "phase": "Pending",
                "conditions": [
                    cond("ChildrenReady", "False", "NoTrainingEngine", "no training engine: install one"),
                    cond("Training", "False", "NoTrainingEngine", "no training engine: install one"),
                ],
            }
        ),
        "Degraded",
        "no training engine: install one",
    ),
    "engine-not-served": (
        job(
            {
                "phase": "Pending",
                "conditions": [cond("ChildrenReady", "False", "EngineNotServed", "not served")],
            }
        ),
        "Degraded",
        "not served",
    ),
    "engine-not-implemented": (
        job(
            {
                "phase": "Pending",
                "conditions": [cond("ChildrenReady", "False", "EngineNotImplemented", "later")],
            }
        ),
        "Degraded",
        "later",
    ),
    "child-forbidden-reason-only": (
        job({"phase": "Pending", "conditions": [cond("ChildrenReady", "False", "ChildForbidden")]}),
        "Degraded",
        "ChildForbidden",
    ),
    "child-forbidden-no-longer": (
        job(
            {"phase": "Pending", "conditions": [cond("ChildrenReady", "True", "ChildForbidden", "old words")]}
        ),
        "Progressing",
        "old words",
    ),
    "child-api-error-pending": (
        job(
            {
                "phase": "Pending",
                "conditions": [
                    cond("Training", "False", "CreatingChildren", "creating the children"),
                    cond("ChildrenReady", "False", "ChildApiError", API_ERROR),
                ],
            }
        ),
        "Progressing",
        API_ERROR,
    ),
    "child-api-error-while-training": (
        training(PROGRESS, conditions=[cond("ChildrenReady", "False", "ChildApiError", API_ERROR)]),
        "Progressing",
        API_ERROR,
    ),
    "child-api-error-registering": (
        job(
            {
                "phase": "Registering",
                "conditions": [
                    cond(
                        "Registered",
                        "False",
                        "RegistrationRunning",
                        "registration Job job-register is running",
                    ),
                    cond("ChildrenReady", "False", "ChildApiError", API_ERROR),
                ],
            }
        ),
        "Progressing",
        API_ERROR,
    ),
    "unschedulable": (
        job(
            {
                "phase": "Pending",
                "observedGeneration": 1,
                "conditions": [
                    cond(
                        "ChildrenReady", "True", "ChildrenCreated", "checkpoint volume, trainer config exist"
                    ),
                    cond("Training", "False", "Unschedulable", UNSCHEDULABLE),
                ],
            }
        ),
        "Degraded",
        UNSCHEDULABLE,
    ),
    "pods-not-created": (
        job({"phase": "Pending", "conditions": [cond("Training", "False", "PodsNotCreated", NOT_CREATED)]}),
        "Degraded",
        NOT_CREATED,
    ),
    "image-pull-failed": (
        job({"phase": "Pending", "conditions": [cond("Training", "False", "ImagePullFailed", IMAGE_PULL)]}),
        "Degraded",
        IMAGE_PULL,
    ),
    "worker-unschedulable-while-training": (
        training(PROGRESS, conditions=[cond("Training", "False", "Unschedulable", UNSCHEDULABLE)]),
        "Degraded",
        UNSCHEDULABLE,
    ),
    "pods-trouble-reason-only": (
        job({"phase": "Pending", "conditions": [cond("Training", "False", "PodsNotCreated")]}),
        "Degraded",
        "PodsNotCreated",
    ),
    "pods-trouble-left-behind-in-registering": (
        job(
            {
                "phase": "Registering",
                "conditions": [
                    cond("Training", "False", "Unschedulable", UNSCHEDULABLE),
                    cond(
                        "Registered",
                        "False",
                        "RegistrationRunning",
                        "registration Job job-register is running",
                    ),
                ],
            }
        ),
        "Progressing",
        "registration Job job-register is running",
    ),
    "pods-trouble-reason-not-a-string": (
        job({"phase": "Pending", "conditions": [cond("Training", "False", 7, "waiting")]}),  # type: ignore[arg-type]
        "Progressing",
        "waiting",
    ),
    "unknown-phase": (job({"phase": "Exploded"}), "Unknown", "Unknown phase Exploded"),
    # --- why training failed: the reason and the message (the operator's TrainingFailure.describe()) ---
    "failed-disk-full": (
        job(
            {
                "phase": "Failed",
                "conditions": [
                    cond("Training", "False", "DiskFull", DISK_FULL),
                    cond("Ready", "False", "DiskFull", DISK_FULL),
                ],
            }
        ),
        "Degraded",
        DISK_FULL,
    ),
    "failed-message-without-the-reason": (
        job(
            {"phase": "Failed", "conditions": [cond("Ready", "False", "DiskFull", "No space left on device")]}
        ),
        "Degraded",
        "DiskFull: No space left on device",
    ),
    "failed-message-begins-with-a-longer-word": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "NcclError", "NcclErrors on rank 3")]}),
        "Degraded",
        "NcclError: NcclErrors on rank 3",
    ),
    "failed-message-begins-with-the-reason-and-a-colon": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "Unknown", "Unknown: boom")]}),
        "Degraded",
        "Unknown: boom",
    ),
    "failed-message-is-the-reason": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "Evicted", "Evicted")]}),
        "Degraded",
        "Evicted",
    ),
    "failed-message-not-ascii": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "DiskFull", "DiskFullé ü 😀")]}),
        "Degraded",
        "DiskFull: DiskFullé ü 😀",
    ),
    "failed-message-begins-with-the-reason-then-not-ascii": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "DiskFull", "DiskFull ÿ 😀")]}),
        "Degraded",
        "DiskFull ÿ 😀",
    ),
    "failed-reason-only": (
        job({"phase": "Failed", "conditions": [cond("Ready", "False", "LossDiverged")]}),
        "Degraded",
        "LossDiverged",
    ),
    "failed-message-only": (
        job({"phase": "Failed", "conditions": [{"type": "Ready", "status": "False", "message": "boom"}]}),
        "Degraded",
        "boom",
    ),
    # --- stopped at spec.budget: still Succeeded, with what it trained ---
    "succeeded-at-budget": (
        succeeded(cond("BudgetReached", "True", "BudgetReached", BUDGET)),
        "Healthy",
        f"{REGISTERED}; {BUDGET}",
    ),
    "succeeded-at-budget-not-registered": (
        succeeded(cond("BudgetReached", "True", "BudgetReached", BUDGET), model=None),
        "Healthy",
        f"registered qwen3_4b_assistant version 3; {BUDGET}",
    ),
    "succeeded-at-budget-reason-only": (
        succeeded(cond("BudgetReached", "True", "BudgetReached")),
        "Healthy",
        f"{REGISTERED}; BudgetReached",
    ),
    "succeeded-at-budget-without-words": (
        succeeded({"type": "BudgetReached", "status": "True"}),
        "Healthy",
        f"{REGISTERED}; BudgetReached",
    ),
    "succeeded-at-budget-and-alias-failed": (
        succeeded(
            cond("BudgetReached", "True", "BudgetReached", BUDGET),
            cond("AliasSynced", "False", "AliasFailed", "moving the alias to 'challenger' failed: 401"),
        ),
        "Degraded",
        f"{REGISTERED}; {BUDGET}; moving the alias to 'challenger' failed: 401",
    ),
    "succeeded-budget-not-reached": (
        succeeded(cond("BudgetReached", "False", "BudgetReached", BUDGET)),
        "Healthy",
        REGISTERED,
    ),
    # --- training pods that cannot mount a volume: like the other pod troubles ---
    "mount-failed": (
        job({"phase": "Pending", "conditions": [cond("Training", "False", "MountFailed", MOUNT)]}),
        "Degraded",
        MOUNT,
    ),
    "mount-failed-while-training": (
        training(PROGRESS, conditions=[cond("Training", "False", "MountFailed", MOUNT)]),
        "Degraded",
        MOUNT,
    ),
    "mount-failed-cleared": (
        training(PROGRESS, conditions=[cond("Training", "True", "MountFailed", MOUNT)]),
        "Progressing",
        "step 25/50 (50%), loss 1.5000, ETA 10 min",
    ),
    # --- the alias of a succeeded job ---
    "alias-moving": (
        succeeded(
            cond(
                "AliasSynced",
                "False",
                "MovingAlias",
                "pointing alias 'challenger' at qwen3_4b_assistant version 3",
            )
        ),
        "Healthy",
        f"{REGISTERED}; pointing alias 'challenger' at qwen3_4b_assistant version 3",
    ),
    "alias-failed-to-move": (
        succeeded(
            cond(
                "AliasSynced",
                "False",
                "AliasFailed",
                "moving the alias to 'challenger' failed: 401 Unauthorized",
            )
        ),
        "Degraded",
        f"{REGISTERED}; moving the alias to 'challenger' failed: 401 Unauthorized",
    ),
    "alias-moved": (
        succeeded(
            cond(
                "AliasSynced",
                "True",
                "AliasMoved",
                "alias 'challenger' points at qwen3_4b_assistant version 3",
            )
        ),
        "Healthy",
        REGISTERED,
    ),
    # --- a spec change the operator has not acted on yet ---
    "stale-generation-training": (
        job({"phase": "Training", "observedGeneration": 1, "progress": PROGRESS}, generation=2),
        "Progressing",
        "Waiting for the operator to act on generation 2",
    ),
    "stale-generation-pending": (
        job({"phase": "Pending", "observedGeneration": 3}, generation=4),
        "Progressing",
        "Waiting for the operator to act on generation 4",
    ),
    "stale-generation-registering": (
        job({"phase": "Registering", "observedGeneration": 1}, generation=2),
        "Progressing",
        "Waiting for the operator to act on generation 2",
    ),
    "stale-generation-succeeded-stays-healthy": (
        job({"phase": "Succeeded", "observedGeneration": 1, "registeredModel": MODEL}, generation=2),
        "Healthy",
        REGISTERED,
    ),
    "stale-generation-huge": (
        job({"phase": "Training", "observedGeneration": 1}, generation=INT64_MAX),
        "Progressing",
        "Waiting for the operator to act on generation 9.223e+18",
    ),
    # --- numbers ---
    "eta-under-a-minute": (training({"step": 1, "etaSeconds": 59}), "Progressing", "step 1, ETA under 1 min"),
    "eta-hours-and-minutes": (
        training({"step": 1, "etaSeconds": 2 * 3600 + 5 * 60 + 59}),
        "Progressing",
        "step 1, ETA 2 h 5 min",
    ),
    "eta-whole-hours-beyond-99": (
        training({"step": 1, "etaSeconds": 100 * 3600 + 59 * 60}),
        "Progressing",
        "step 1, ETA 100 h",
    ),
    "eta-zero-left-out": (
        training({"step": 50, "totalSteps": 50, "percent": 100, "etaSeconds": 0}),
        "Progressing",
        "step 50/50 (100%)",
    ),
    "loss-rounds-to-4-decimals": (
        training({"step": 7, "loss": 0.123456}),
        "Progressing",
        "step 7, loss 0.1235",
    ),
    "loss-whole": (training({"step": 7, "loss": 2}), "Progressing", "step 7, loss 2.0000"),
    "loss-tiny": (training({"step": 7, "loss": 1e-07}), "Progressing", "step 7, loss 0.0000"),
    "loss-negative": (training({"step": 7, "loss": -0.25}), "Progressing", "step 7, loss -0.2500"),
    "loss-nan": (
        training({"step": 7, "loss": NAN, "etaSeconds": 60}),
        "Progressing",
        "step 7, loss NaN, ETA 1 min",
    ),
    "loss-infinite": (training({"step": 7, "loss": INF}), "Progressing", "step 7, loss inf"),
    "eta-nan-and-infinite-left-out": (
        training({"step": 7, "etaSeconds": NAN, "totalSteps": INF, "percent": -INF}),
        "Progressing",
        "step 7",
    ),
    "very-large-numbers": (
        training(
            {"step": INT64_MAX, "totalSteps": INT64_MAX, "percent": 100, "loss": 1e30, "etaSeconds": 1e300}
        ),
        "Progressing",
        "step 9.223e+18/9.223e+18 (100%), loss 1.000e+30, ETA 2.778e+296 h",
    ),
    "largest-exact-whole-number": (
        training({"step": 2**53 - 1, "loss": 123456789012.34567}),
        "Progressing",
        "step 9007199254740991, loss 123456789012.3457",
    ),
    "loss-rounds-up-to-next-power-of-ten": (
        training({"step": 1, "loss": 9.99996e20}),
        "Progressing",
        "step 1, loss 1.000e+21",
    ),
    # --- malformed statuses: never a Lua error ---
    "status-a-string": (job("Training"), "Unknown", "status is a string, not an object"),
    "status-a-number": (job(3), "Unknown", "status is a number, not an object"),
    "status-a-list": (job([{"phase": "Training"}]), "Unknown", "status is a list, not an object"),
    "status-false": (job(False), "Unknown", "status is a boolean, not an object"),
    "phase-a-number": (job({"phase": 3}), "Unknown", "status.phase is a number, not a string"),
    "phase-an-object": (
        job({"phase": {"name": "Training"}}),
        "Unknown",
        "status.phase is a table, not a string",
    ),
    "phase-a-list": (job({"phase": ["Training"]}), "Unknown", "status.phase is a list, not a string"),
    "conditions-a-string": (
        job({"phase": "Failed", "conditions": "Ready"}),
        "Degraded",
        "The FineTuneJob failed",
    ),
    "conditions-an-object": (
        job({"phase": "Failed", "conditions": {"Ready": cond("Ready", "False", "X", "boom")}}),
        "Degraded",
        "The FineTuneJob failed",
    ),
    "conditions-with-junk-entries": (
        job(
            {
                "phase": "Failed",
                "conditions": [
                    3,
                    None,
                    "Ready",
                    [],
                    {"type": 5},
                    cond("Ready", "False", "TrainingFailed", FAILED),
                ],
            }
        ),
        "Degraded",
        f"TrainingFailed: {FAILED}",
    ),
    "condition-message-not-a-string": (
        job(
            {
                "phase": "Failed",
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "TrainingFailed", "message": 5}
                ],
            }
        ),
        "Degraded",
        "TrainingFailed",
    ),
    "condition-without-message-or-reason": (
        job(
            {
                "phase": "Failed",
                "conditions": [{"type": "Ready", "status": "False", "reason": {}, "message": None}],
            }
        ),
        "Degraded",
        "The FineTuneJob failed",
    ),
    "alias-condition-without-words": (
        succeeded({"type": "AliasSynced", "status": "False"}),
        "Healthy",
        REGISTERED,
    ),
    "progress-a-string": (training("half way"), "Progressing", "PyTorchJob job-train is running."),
    "progress-a-list": (training([25, 50]), "Progressing", "PyTorchJob job-train is running."),
    "step-a-string": (
        training({"step": "25", "loss": 1.5}),
        "Progressing",
        "PyTorchJob job-train is running.",
    ),
    "strings-where-numbers-are-expected": (
        training({"step": 25, "totalSteps": "50", "percent": "50%", "loss": "1.5", "etaSeconds": "600"}),
        "Progressing",
        "step 25",
    ),
    "booleans-where-numbers-are-expected": (
        training({"step": 25, "totalSteps": True, "loss": False, "etaSeconds": True}),
        "Progressing",
        "step 25",
    ),
    "fractional-counts-rounded": (
        training({"step": 24.6, "totalSteps": 50, "percent": 49.2}),
        "Progressing",
        "step 25/50 (49%)",
    ),
    "negative-eta-left-out": (training({"step": 3, "etaSeconds": -5}), "Progressing", "step 3"),
    "generation-a-string": (
        job({"phase": "Training", "observedGeneration": 1}, generation="2"),
        "Progressing",
        "Training",
    ),
    "observed-generation-a-string": (
        job({"phase": "Registering", "observedGeneration": "1"}, generation=2),
        "Progressing",
        "Registering the model in MLflow",
    ),
    "metadata-missing": (
        {
            "apiVersion": api.API_VERSION,
            "kind": api.KIND,
            "status": {"phase": "Training", "observedGeneration": 1},
        },
        "Progressing",
        "Training",
    ),
    "metadata-a-string": (
        job({"phase": "Pending", "observedGeneration": 1}, metadata="job"),
        "Progressing",
        "Pending",
    ),
    "registered-model-a-string": (
        succeeded(model="qwen3_4b_assistant/3"),
        "Healthy",
        "registered qwen3_4b_assistant version 3",
    ),
    "registered-model-without-name": (
        succeeded(model={"version": "3"}),
        "Healthy",
        "registered qwen3_4b_assistant version 3",
    ),
    "registered-model-version-empty": (
        succeeded(model={"name": "m", "version": ""}),
        "Healthy",
        "registered qwen3_4b_assistant version 3",
    ),
    "progress-on-a-suspended-job": (
        job(
            {
                "phase": "Suspended",
                "progress": PROGRESS,
                "conditions": [cond("Suspended", "True", "Suspended", "suspended at step 25")],
            }
        ),
        "Suspended",
        "suspended at step 25",
    ),
}


@pytest.mark.parametrize("libs", LIBRARIES)
@pytest.mark.parametrize("case", CASES)
def test_health(case: str, libs: str) -> None:
    obj, status, message = CASES[case]
    assert run_health(SCRIPT_PATH, obj, open_libs=LIBRARIES[libs]) == {"status": status, "message": message}


def test_cases_cover_every_phase() -> None:
    statuses = [obj.get("status") for obj, _, _ in CASES.values()]
    phases = {s.get("phase") for s in statuses if isinstance(s, dict) and isinstance(s.get("phase"), str)}
    assert {p.value for p in Phase} <= phases, {p.value for p in Phase} - phases


@pytest.mark.parametrize("libs", LIBRARIES)
def test_every_training_failure_is_degraded_with_its_reason_message_and_remedy(libs: str) -> None:
    """The operator's words for each failures.Failure, as it writes them (reason on Ready, message
    TrainingFailure.describe(), which holds the hint), shown as they are: no reason said twice."""
    for reason in Failure:
        for step in (None, 7):
            failure = TrainingFailure.of(reason, "what happened", step=step)
            obj = job({"phase": "Failed", "conditions": [cond("Ready", "False", reason, failure.describe())]})
            hs = run_health(SCRIPT_PATH, obj, open_libs=LIBRARIES[libs])
            assert hs == {"status": "Degraded", "message": failure.describe()}, reason
            assert hs["message"].startswith(f"{reason}") and failure.hint in hs["message"], reason


def test_loss_is_rounded_half_up_to_4_decimals() -> None:
    """The loss text, made with arithmetic alone, against exact decimal rounding of the float's value
    (values within a hair of a tie may go either way, as the product x * 10^4 rounds)."""
    rng = random.Random(20)
    checked = 0
    for _ in range(60):
        loss = rng.uniform(0, 10) * 10 ** rng.randint(-5, 8)
        exact = Decimal(loss) * 10000
        tie = exact.to_integral_value(rounding=ROUND_FLOOR) + Decimal("0.5")
        if abs(exact - tie) < exact * Decimal("1e-15") + Decimal("1e-9"):
            continue
        expected = str(Decimal(loss).quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP))
        hs = run_health(SCRIPT_PATH, training({"step": 1, "loss": loss}))
        assert hs["message"] == f"step 1, loss {expected}", loss
        checked += 1
    assert checked >= 55


def test_eta_in_minutes_and_hours() -> None:
    for seconds, text in [
        (60, "1 min"),
        (3599, "59 min"),
        (3600, "1 h 0 min"),
        (99 * 3600 + 3599, "99 h 59 min"),
        (360000, "100 h"),
    ]:
        hs = run_health(SCRIPT_PATH, training({"step": 1, "etaSeconds": seconds}))
        assert hs["message"] == f"step 1, ETA {text}", seconds


def test_script_uses_no_library_outside_argocds_default_set() -> None:
    """A quick guard beside the runs above (which only see the paths the cases take): no call into a
    library Argo CD leaves out, and no method call, which needs the string library on strings."""
    code = "\n".join(line.split("--", 1)[0] for line in SCRIPT.splitlines())
    assert not re.findall(r"\b(string|math|os|io|coroutine|debug|channel|utf8|bit32)\s*[.\[]", code)
    assert not re.findall(r"\w\s*:\s*\w+\s*\(", code)


# --- the sandbox itself: what luahealth gives a script is what Argo CD gives it ---------------------------


def lua(tmp_path: Path, source: str, obj: Any = None, *, open_libs: bool = False) -> dict[str, str]:
    script = tmp_path / "script.lua"
    script.write_text(source)
    return run_health(script, {} if obj is None else obj, open_libs=open_libs)


GLOBALS = """
local names = {}
for name, value in pairs(_G) do
  if type(value) == "table" and name ~= "_G" then names[#names + 1] = name end
end
table.sort(names)
local os = require("os")
local safe = {}
for name in pairs(os) do safe[#safe + 1] = name end
table.sort(safe)
return {status = "Healthy", message = table.concat(names, " ") .. " | os: " .. table.concat(safe, " ")}
"""


def test_default_sandbox_has_only_base_table_package_and_a_safe_os(tmp_path: Path) -> None:
    assert lua(tmp_path, GLOBALS)["message"] == "actionParams obj package table | os: date time"
    everything = lua(tmp_path, GLOBALS, open_libs=True)["message"]
    assert everything.startswith(
        "actionParams channel coroutine debug io math obj os package string table | os: "
    )
    # open libraries: the global os is gopher-lua's whole os; require("os") still gives the safe one
    # (Argo CD opens the package library again, which forgets the loaded modules)
    source = 'return {status = "Healthy", message = type(os) .. " " .. type(require("os").execute)}'
    assert lua(tmp_path, source) == {"status": "Healthy", "message": "nil nil"}
    assert lua(tmp_path, source.replace("type(os)", "type(os.execute)"), open_libs=True) == {
        "status": "Healthy",
        "message": "function nil",
    }


def test_the_old_script_fails_under_argocds_default_libraries(tmp_path: Path) -> None:
    """The failure Argo CD showed (health Unknown) reproduced, and gone with open libraries."""
    source = 'return {status = "Progressing", message = "loss " .. string.format("%.4f", obj.loss)}'
    with pytest.raises(LuaError, match=r"attempt to index a non-table object\(nil\) with key 'format'"):
        lua(tmp_path, source, {"loss": 1.5})
    assert lua(tmp_path, source, {"loss": 1.5}, open_libs=True) == {
        "status": "Progressing",
        "message": "loss 1.5000",
    }
    with pytest.raises(LuaError, match="attempt to index a non-table object"):
        lua(tmp_path, 'return {status = "Healthy", message = ("x"):upper()}')


def test_object_converted_as_argocd_converts_it(tmp_path: Path) -> None:
    source = """
local o = obj
local n = 0
for _ in pairs(o.map) do n = n + 1 end
return {status = "Healthy", message = table.concat({
  type(o.int), tostring(o.int), type(o.float), tostring(o.float), tostring(o.big),
  tostring(#o.list), tostring(o.list[2]), tostring(o.null), tostring(n), type(o.flag), tostring(o.whole)}, ",")}
"""
    obj = {
        "int": 7,
        "float": 0.5,
        "big": INT64_MAX,
        "list": [1, None, 3],
        "null": None,
        "map": {"a": 1, "b": None},
        "flag": True,
        "whole": 2.0,
    }
    # a null in a list closes the gap (gopher-lua's Append drops nil); a null field is absent
    assert (
        lua(tmp_path, source, obj)["message"]
        == "number,7,number,0.5,9.223372036854776e+18,2,3,nil,1,boolean,2"
    )


def test_results_read_as_argocd_reads_them(tmp_path: Path) -> None:
    assert lua(tmp_path, 'return {status = "Sideways", message = "x"}') == {
        "status": "Unknown",
        "message": "Lua returned an invalid health status",
    }
    assert lua(tmp_path, "return nil") == {"status": "", "message": ""}
    assert lua(tmp_path, "return {}") == {"status": "", "message": ""}
    assert lua(tmp_path, 'return {status = "Healthy", message = 5}') == {"status": "", "message": ""}
    with pytest.raises(LuaError, match="expect table output from Lua script, not string"):
        lua(tmp_path, 'return "Healthy"')
    with pytest.raises(LuaError, match="boom"):
        lua(tmp_path, 'error("boom")')
    with pytest.raises(LuaError, match="context deadline exceeded"):
        lua(tmp_path, "while true do end")


# --- the argocd-cm patch ----------------------------------------------------------------------------------


def test_argocd_cm_patch_carries_the_script_verbatim() -> None:
    patch = yaml.safe_load((ARGOCD / "argocd-cm-health.yaml").read_text())
    assert patch == {"data": {HEALTH_KEY: SCRIPT}}


def test_a_preparation_pod_that_cannot_start_is_degraded() -> None:
    message = "the pod of preparation Job j-prepare cannot start: pod j-prepare-x: ErrImagePull"
    obj = job({"phase": "Preparing", "conditions": [cond("Prepared", "False", "ImagePullFailed", message)]})
    for libs in LIBRARIES.values():
        assert run_health(SCRIPT_PATH, obj, open_libs=libs) == {"status": "Degraded", "message": message}


# --- the same health on either engine (issue 31 item 6) -------------------------------------------------
#
# The check reads only the FineTuneJob, so it needs no change for a job on Kubeflow Trainer v2: here the
# operator's own state machine (tests/unit/test_state_advance.py's ``drive``) writes the status of a job
# in each phase from a PyTorchJob and from a TrainJob in the matching state (as Trainer v2.2 writes it:
# tests/unit/test_state_trainjob.py), and Argo CD's verdict on both statuses is the same.

RESULT_REGISTERED = {"name": "m", "version": "2", "uri": "models:/m/2", "run_id": "r"}


def _engine_cases() -> dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any], Any, str]]:
    """name: (FineTuneJob spec fields, the PyTorchJob, the TrainJob, the registration Job as
    observed, the health status both must have)."""
    none = state.RegistrationObservation()
    registered = state.RegistrationObservation(True, "Complete", result=RESULT_REGISTERED)
    queue = {"resources": {"gpusPerNode": 1, "queueName": "team-a"}}
    return {
        "no-status-yet": ({}, ours("j-train"), trainjob(), none, "Progressing"),
        "created": ({}, ours("j-train", **job_condition("Created")), trainjob(active=0), none, "Progressing"),
        "training": (
            {},
            ours("j-train", **job_condition("Running")),
            trainjob(active=1, ready=1),
            none,
            "Progressing",
        ),
        "suspended": (
            {"suspend": True},
            ours("j-train", **job_condition("Suspended")),
            trainjob(("Suspended", "True", "Suspended"), active=0),
            none,
            "Suspended",
        ),
        "queued-by-kueue": (
            queue,
            ours("j-train", **job_condition("Suspended")),
            trainjob(("Suspended", "True", "Suspended"), active=0),
            none,
            "Progressing",
        ),
        "registering": (
            {},
            ours("j-train", **job_condition("Succeeded")),
            trainjob(("Complete", "True", "AllJobsCompleted"), active=0),
            state.RegistrationObservation(True, "Running"),
            "Progressing",
        ),
        "succeeded-registered": (
            {},
            ours("j-train", **job_condition("Succeeded")),
            trainjob(("Complete", "True", "AllJobsCompleted"), active=0),
            registered,
            "Healthy",
        ),
        "succeeded-registration-off": (
            {"registration": {"enabled": False}},
            ours("j-train", **job_condition("Succeeded")),
            trainjob(("Complete", "True", "AllJobsCompleted"), active=0),
            none,
            "Healthy",
        ),
        "failed": (
            {},
            ours("j-train", **job_condition("Failed")),
            trainjob(("Failed", "True", "FailJobSetFailurePolicyAction"), active=0),
            none,
            "Degraded",
        ),
    }


ENGINE_CASES = _engine_cases()


def test_the_engine_cases_cover_every_phase_after_the_preparation() -> None:
    """Every phase the training object decides (``Preparing`` comes before it exists: the cases
    above)."""
    phases = {_status_on("TrainJob", *ENGINE_CASES[c][:2], ENGINE_CASES[c][3])["phase"] for c in ENGINE_CASES}
    assert phases == {p.value for p in Phase} - {Phase.PREPARING.value}


def _status_on(engine: str, spec: dict[str, Any], live: dict[str, Any], registration: Any) -> dict[str, Any]:
    """The status the state machine writes for the job ``j`` on ``engine`` with ``live`` as its
    training object."""
    obs = first(manifest(**spec), engine=state.Engine(engine))
    _, commit = drive(obs, World(children={Child.TRAINING_JOB: live}, registration=registration))
    assert commit.transition is not None
    return dict(commit.transition.status)


@pytest.mark.parametrize("libs", LIBRARIES)
@pytest.mark.parametrize("case", ENGINE_CASES)
def test_a_trainjob_backed_job_has_the_health_of_a_pytorchjob_backed_one(case: str, libs: str) -> None:
    spec, pytorchjob, trainjob, registration, health = ENGINE_CASES[case]
    on_ptj = _status_on("PyTorchJob", spec, pytorchjob, registration)
    on_tj = _status_on("TrainJob", spec, trainjob, registration)
    # the statuses are the engines' own: recorded engine, training child, the same phase
    assert (on_ptj["engine"], on_tj["engine"]) == ("PyTorchJob", "TrainJob")
    assert on_ptj["children"].get("pytorchJob") == on_tj["children"].get("trainJob") == "j-train"
    assert "trainJob" not in on_ptj["children"] and "pytorchJob" not in on_tj["children"]
    assert on_tj["phase"] == on_ptj["phase"]
    ptj_reasons = {c["type"]: c["reason"] for c in on_ptj["conditions"]}
    assert {c["type"]: c["reason"] for c in on_tj["conditions"]} == ptj_reasons
    verdicts = {
        engine: run_health(SCRIPT_PATH, job(status), open_libs=LIBRARIES[libs])
        for engine, status in (("PyTorchJob", on_ptj), ("TrainJob", on_tj))
    }
    assert verdicts["PyTorchJob"]["status"] == verdicts["TrainJob"]["status"] == health, verdicts
    # the message is the operator's words for each engine: the same, but for the engine's own names
    ptj, tj = verdicts["PyTorchJob"]["message"], verdicts["TrainJob"]["message"]
    assert "PyTorchJob" not in tj and "training.kubeflow.org" not in tj and "Training Operator" not in tj
    if case == "failed":  # each quotes its training object's failed condition (Trainer's words here)
        assert ptj.startswith("TrainingFailed: PyTorchJob j-train failed (") and tj.startswith(
            "TrainingFailed: TrainJob j-train failed (FailJobSetFailurePolicyAction: "
        )
        assert "-l jobset.sigs.k8s.io/jobset-name=j-train " in tj
    else:
        assert _as_on_pytorchjob(tj) == ptj


def _as_on_pytorchjob(message: str) -> str:
    """A TrainJob-backed job's message with the engine's names replaced by the PyTorchJob's."""
    for tj_words, ptj_words in (
        ("Kubeflow Trainer v2 controller", "Kubeflow Training Operator"),
        ("jobset.sigs.k8s.io/jobset-name", "training.kubeflow.org/job-name"),
        ("TrainJob", "PyTorchJob"),
    ):
        message = message.replace(tj_words, ptj_words)
    return message
