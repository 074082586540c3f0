"""The FineTuneJob's status: its model, and the names of its phases, condition types and reasons.

The operator (one state machine, :mod:`kubetune_operator.state`) and the trainer (its progress
reports) write the status, each its own fields (:mod:`kubetune_api.ownership`); readers match on
these names: ``kubetune watch`` imports them, and the Argo CD health check
(``deploy/argocd/health/finetunejob.lua``), which cannot, is tied to them by a test.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from .base import ApiModel
from .engines import Engine
from .preparation import PreparationReport


class Phase(StrEnum):
    PENDING = "Pending"
    PREPARING = "Preparing"
    TRAINING = "Training"
    SUSPENDED = "Suspended"
    REGISTERING = "Registering"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def final(self) -> bool:
        """Succeeded and Failed: nothing more happens unless asked (a registration retried or turned
        on, an alias moved, a refused child's spec changed)."""
        return self in (Phase.SUCCEEDED, Phase.FAILED)


class ConditionType(StrEnum):
    READY = "Ready"  # True once the model is trained and registered (phase Succeeded)
    CHILDREN_READY = "ChildrenReady"  # the PVC, ConfigMap and PyTorchJob exist and are ours
    # True once the preparation Job has downloaded, checked and tokenized (status.preparation);
    # False with a preparation.Refusal reason when it refused the job
    PREPARED = "Prepared"
    TRAINING = "Training"  # True while the PyTorchJob runs
    SUSPENDED = "Suspended"  # True while suspended (spec.suspend), queued or preempted by Kueue
    REGISTERED = "Registered"  # True once MLflow has the model version
    # after Succeeded: whether the registered version carries the spec's registration.alias
    ALIAS_SYNCED = "AliasSynced"
    # True when training stopped at spec.budget (the job still Succeeds with what it trained)
    BUDGET_REACHED = "BudgetReached"
    # spec.model.fromJob: True once the parent job Succeeded (its model is what this job trains from)
    PARENT_READY = "ParentReady"


class Reason(StrEnum):
    """The reasons of the conditions (CamelCase, Kubernetes conventions)."""

    CHILDREN_CREATED = "ChildrenCreated"
    CREATING_CHILDREN = "CreatingChildren"
    CHILD_CONFLICT = "ChildConflict"
    CHILD_REJECTED = "ChildRejected"
    CHILD_FORBIDDEN = "ChildForbidden"
    CHILD_API_ERROR = "ChildApiError"
    INVALID_SPEC = "InvalidSpec"
    MODEL_NAME_NOT_ALLOWED = "ModelNameNotAllowed"  # outside its namespace's registry names (tenancy)
    WAITING_FOR_TRAINING_OPERATOR = "WaitingForTrainingOperator"
    # the training engine cannot be had (ChildrenReady, Training, Ready; the job waits, nothing created)
    NO_TRAINING_ENGINE = "NoTrainingEngine"  # auto: neither engine's resource is served
    ENGINE_NOT_SERVED = "EngineNotServed"  # forced (spec.engine or the operator's default): not served
    ENGINE_NOT_IMPLEMENTED = "EngineNotImplemented"  # chosen, but this operator version cannot run it yet
    PREPARING = "Preparing"
    PREPARED = "Prepared"
    PREPARATION_FAILED = "PreparationFailed"  # the step crashed (not a refusal with a named reason)
    TRAINING_CREATED = "TrainingCreated"
    TRAINING_RUNNING = "TrainingRunning"
    TRAINING_RESTARTING = "TrainingRestarting"
    TRAINING_SUCCEEDED = "TrainingSucceeded"
    TRAINING_FAILED = "TrainingFailed"
    SUSPENDED_BY_USER = "SuspendedByUser"
    QUEUED = "Queued"
    # Kueue took back the admission of training that had run (its Workload's Evicted condition): to
    # make room for another workload (PreemptedByKueue), or for another of Kueue's reasons
    # (EvictedByKueue: PodsReadyTimeout, ClusterQueueStopped, Deactivated...); it waits to be
    # admitted again and resumes from its newest checkpoint (status.preemptions)
    PREEMPTED_BY_KUEUE = "PreemptedByKueue"
    EVICTED_BY_KUEUE = "EvictedByKueue"
    RESUMING = "Resuming"
    NOT_SUSPENDED = "NotSuspended"
    REGISTRATION_PENDING = "RegistrationPending"
    REGISTRATION_RUNNING = "RegistrationRunning"
    REGISTRATION_FAILED = "RegistrationFailed"
    REGISTRATION_DISABLED = "RegistrationDisabled"
    REGISTRATION_RESULT_PENDING = "RegistrationResultPending"
    MODEL_REGISTERED = "ModelRegistered"
    SUCCEEDED = "Succeeded"
    NOT_READY = "NotReady"
    # the training pods cannot start (Training, and Ready while not trained)
    PODS_NOT_CREATED = "PodsNotCreated"
    UNSCHEDULABLE = "Unschedulable"
    IMAGE_PULL_FAILED = "ImagePullFailed"
    MOUNT_FAILED = "MountFailed"
    # the training pods restarted too often without progress (the reason when the cause is unknown)
    RESTART_LIMIT = "RestartLimitReached"
    # the BudgetReached condition's
    BUDGET_REACHED = "BudgetReached"
    # the Registered condition's, when spec.registration.gate was not met (the job still Succeeds)
    GATE_NOT_MET = "GateNotMet"
    # the ParentReady condition's (spec.model.fromJob)
    WAITING_FOR_PARENT = "WaitingForParent"
    PARENT_SUCCEEDED = "ParentSucceeded"
    PARENT_FAILED = "ParentFailed"
    PARENT_MISSING = "ParentMissing"
    PARENT_CYCLE = "ParentCycle"
    # the AliasSynced condition's
    MOVING_ALIAS = "MovingAlias"
    ALIAS_MOVED = "AliasMoved"
    ALIAS_FAILED = "AliasFailed"


class EventReason(StrEnum):
    """The reasons of the events emitted on transitions, beside the conditions' reasons."""

    PREPARATION_STARTED = "PreparationStarted"
    PREPARED = "Prepared"
    TRAINING_STARTED = "TrainingStarted"
    REGISTRATION_STARTED = "RegistrationStarted"
    RESUMED = "Resumed"
    # Kueue admitted again the training it had preempted (or evicted): its pods resume from a checkpoint
    READMITTED = "Readmitted"
    FAILED = "Failed"
    REGISTRATION_RETRIED = "RegistrationRetried"
    REGISTRATION_ENABLED = "RegistrationEnabled"
    # a new spec generation of a job Failed with ChildRejected: the children are created again
    CHILDREN_RETRIED = "ChildrenRetried"


# --- the status model -------------------------------------------------------------------------------


class Condition(ApiModel):
    """A Kubernetes-style condition."""

    type: str = Field(description="Condition type (CamelCase).")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(description="CamelCase reason.")
    message: str = Field(default="", description="What happened, for a person.")
    last_transition_time: str = Field(description="When status last changed (RFC 3339).")
    observed_generation: int | None = Field(default=None, description="spec generation this reflects.")


class Progress(ApiModel):
    step: int | None = Field(default=None, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, description="Optimizer steps planned.")
    percent: int | None = Field(default=None, description="step / totalSteps in percent.")
    epoch: float | None = Field(default=None, description="Epochs done (fractional).")
    loss: float | None = Field(default=None, description="Latest training loss.")
    eval_loss: float | None = Field(default=None, description="Latest evaluation loss.")
    base_eval_loss: float | None = Field(
        default=None,
        description="The base model's eval loss, measured before the first step (registration.gate "
        "minImprovement); status.evaluation repeats it with the gate's verdict.",
    )
    reward_margin: float | None = Field(
        default=None,
        description="Preference tuning (objective dpo or orpo): the latest logged mean of the chosen answer's "
        "reward minus the rejected one's, on training pairs (TRL's rewards/margins).",
    )
    reward_accuracy: float | None = Field(
        default=None,
        description="Preference tuning: the latest logged share of training pairs whose chosen answer has the "
        "higher reward (TRL's rewards/accuracies; 0.5 is chance).",
    )
    eval_reward_margin: float | None = Field(
        default=None, description="Preference tuning: the reward margin at the latest evaluation."
    )
    eval_reward_accuracy: float | None = Field(
        default=None, description="Preference tuning: the reward accuracy at the latest evaluation."
    )
    tokens_per_second: float | None = Field(
        default=None, description="Training tokens per second (all GPUs)."
    )
    eta_seconds: int | None = Field(default=None, description="Estimated seconds to the end of training.")
    updated_at: str | None = Field(default=None, description="When the trainer last reported (RFC 3339).")


class CheckpointEntry(ApiModel):
    """One complete checkpoint on the volume."""

    step: int = Field(description="Optimizer step it was saved at.")
    epoch: float | None = Field(default=None, description="Epochs done at that step.")
    loss: float | None = Field(default=None, description="Training loss last logged at or before that step.")
    eval_loss: float | None = Field(
        default=None, description="Eval loss at that step (when evaluated there)."
    )
    time: str | None = Field(default=None, description="When the save completed (RFC 3339).")
    size_bytes: int | None = Field(default=None, description="Size on the volume.")
    path: str | None = Field(default=None, description="Folder on the checkpoint volume.")


class CheckpointStatus(ApiModel):
    latest: str | None = Field(default=None, description="Newest complete checkpoint (path on the volume).")
    latest_step: int | None = Field(default=None, description="Step of the newest complete checkpoint.")
    count: int | None = Field(default=None, description="Complete checkpoints kept.")
    best_step: int | None = Field(
        default=None,
        description="Step of the checkpoint with the lowest eval loss (kept even when older than "
        "saveTotalLimit's window).",
    )
    items: list[CheckpointEntry] | None = Field(
        default=None, description="Every complete checkpoint on the volume, oldest first."
    )


class EvaluationStatus(ApiModel):
    """The eval losses behind what was registered (spec.registration.select and gate)."""

    base_eval_loss: float | None = Field(
        default=None, description="The base model's eval loss on the same eval tokens, before training."
    )
    eval_loss: float | None = Field(
        default=None, description="The registered (or refused) model's eval loss."
    )
    selected: str | None = Field(default=None, description="What was chosen: final, or checkpoint-<step>.")
    threshold: float | None = Field(default=None, description="The eval loss the gate asked to reach.")
    gate_passed: bool | None = Field(default=None, description="Whether the gate was met (unset: no gate).")
    forced: bool | None = Field(
        default=None, description="Registered on request although the gate was not met."
    )


class Goodput(ApiModel):
    """Where the GPU time went, across attempts (reported by the trainer; GPU-seconds = seconds x GPUs)."""

    held_gpu_seconds: float = Field(
        default=0, description="GPU-seconds the training pods held, from process start."
    )
    productive_gpu_seconds: float = Field(default=0, description="Spent in optimizer steps that count.")
    restart_lost_gpu_seconds: float = Field(
        default=0,
        description="Spent in steps redone after a restart (done after the checkpoint resumed from); "
        "after a preemption: preemptionLostGpuSeconds.",
    )
    preemption_lost_gpu_seconds: float = Field(
        default=0,
        description="Spent in steps redone after a preemption (an attempt stopped on SIGTERM: Kueue, the "
        "scheduler, a drained node, spec.suspend).",
    )
    startup_gpu_seconds: float = Field(
        default=0, description="From process start to the first step, per attempt."
    )
    checkpoint_gpu_seconds: float = Field(default=0, description="Spent saving checkpoints.")
    restarts: int = Field(default=0, description="Attempts after the first (preemptions included).")
    preemptions: int = Field(default=0, description="Attempts that stopped on SIGTERM (preempted).")
    preempted_seconds: float = Field(
        default=0,
        description="Wall seconds from each preempted attempt's end to the next one's start: no GPUs "
        "held (not in heldGpuSeconds, nor in spec.budget), waiting to run again.",
    )
    goodput_percent: float | None = Field(default=None, description="productive / held, in percent.")


class BudgetStatus(ApiModel):
    """Training stopped at spec.budget (reported by the trainer)."""

    reached: bool = Field(description="Whether training stopped at the budget.")
    limit: str = Field(description="Which limit, e.g. maxDuration 2h or maxGpuHours 16.")
    step: int | None = Field(default=None, description="Optimizer steps done.")
    total_steps: int | None = Field(default=None, description="Optimizer steps planned.")


class MemoryRetry(ApiModel):
    """A retry after CUDA out of memory, with a smaller micro-step and the same tokens per optimizer step."""

    attempt: int = Field(description="Retry number (1, 2, ...).")
    step: int | None = Field(default=None, description="Optimizer step the attempt failed at.")
    before: str = Field(description="The micro-step layout that ran out of memory.")
    after: str = Field(description="The layout of the retry.")


class PodIncarnations(ApiModel):
    """The incarnations of one PyTorchJob pod the operator has seen: the Training Operator recreates a
    restarted pod under the same name, with a new UID."""

    name: str = Field(description="The pod's name (one replica: <job>-train-master-0, ...-worker-<i>).")
    uids: list[str] = Field(
        default_factory=list, description="The UIDs seen under that name, the newest last (a few kept)."
    )


class TrainingRestarts(ApiModel):
    """The training pods' restarts the operator has counted, once per restart, and how many came
    since training last made progress (a new complete checkpoint). A PyTorchJob's: each training pod
    the Training Operator recreated (a new UID under the pod's name); a TrainJob's: its JobSet's
    ``status.restarts`` (one per restart of every node)."""

    total: int = Field(default=0, description="Restarts of the training pods so far.")
    since_progress: int = Field(
        default=0, description="Restarts since the newest complete checkpoint appeared (or since the start)."
    )
    checkpoint_step: int | None = Field(
        default=None, description="The newest complete checkpoint's step when sinceProgress was last reset."
    )
    last: str | None = Field(
        default=None, description="Why the last attempt ended, when the operator saw it."
    )
    last_reason: str | None = Field(default=None, description="Its reason (a failure reason), when known.")
    pods: list[PodIncarnations] | None = Field(
        default=None,
        description="PyTorchJob: each training pod's incarnations seen so far; one seen under a new UID "
        "was recreated, one restart. Emptied while the PyTorchJob is suspended (its pods deleted), so a "
        "resume is no restart. Incarnations that came and went while no operator watched count as one.",
    )
    job_set_restarts: int | None = Field(
        default=None, description="TrainJob: its JobSet's status.restarts when the operator last read it."
    )
    events: int | None = Field(
        default=None,
        description="No longer written: an older operator's count of the Training Operator's restart "
        "events (two per restart) or, for a TrainJob, its JobSet's status.restarts.",
    )


class Preemptions(ApiModel):
    """The times Kueue took back the training's admission (its Workload ``Evicted``: preempted for a
    higher-priority workload, or evicted for another of Kueue's reasons) and the time spent waiting
    to be admitted again (no GPUs held: it is not in status.goodput's held time)."""

    count: int = Field(default=0, description="Evictions by Kueue so far.")
    last_time: str | None = Field(
        default=None, description="When Kueue evicted the training last (its Workload's Evicted condition)."
    )
    last_reason: str | None = Field(
        default=None,
        description="Kueue's reason: Preempted, or another eviction reason (PodsReadyTimeout, Deactivated...).",
    )
    last_preemption_reason: str | None = Field(
        default=None,
        description="Why Kueue preempted it (its Preempted condition): InClusterQueue, InCohortReclamation, "
        "InCohortFairSharing, InCohortReclaimWhileBorrowing.",
    )
    last_message: str | None = Field(default=None, description="Kueue's message (names the preemptor).")
    workload: str | None = Field(default=None, description="Kueue's Workload of the training object.")
    resume_from: str | None = Field(
        default=None,
        description="The checkpoint the training resumes from when admitted again (the newest complete one, "
        "status.checkpoints.latest); unset: from the start.",
    )
    resume_step: int | None = Field(default=None, description="Its step.")
    readmitted_time: str | None = Field(
        default=None, description="When the training left the last eviction (admitted again)."
    )
    preempted_seconds: float = Field(
        default=0,
        description="Seconds spent evicted, from each eviction to the training's next start (the current "
        "one counted once it ends).",
    )


class MlflowStatus(ApiModel):
    tracking_uri: str | None = Field(default=None, description="Tracking server used.")
    experiment_id: str | None = Field(default=None, description="MLflow experiment id.")
    run_id: str | None = Field(
        default=None, description="MLflow run (one per FineTuneJob, kept across restarts)."
    )
    run_url: str | None = Field(default=None, description="The run in the MLflow UI (http(s) servers).")


class RegisteredModelStatus(ApiModel):
    name: str | None = Field(default=None, description="Registered model name.")
    version: str | None = Field(default=None, description="Registered model version.")
    uri: str | None = Field(default=None, description="models:/<name>/<version>.")
    alias: str | None = Field(default=None, description="Alias set on that version.")
    url: str | None = Field(default=None, description="The version in the MLflow UI (http(s) servers).")
    run_id: str | None = Field(
        default=None,
        description="The MLflow run the version was logged from (status.mlflow's run, normally).",
    )
    run_url: str | None = Field(default=None, description="That run in the MLflow UI (http(s) servers).")


class ParentStatus(ApiModel):
    """Where this job's starting model came from (lineage)."""

    job: str | None = Field(default=None, description="The parent FineTuneJob (spec.model.fromJob).")
    uid: str | None = Field(default=None, description="Its uid when this job started from it.")
    run_id: str | None = Field(default=None, description="The parent's MLflow run.")
    model_uri: str | None = Field(
        default=None, description="The registered model version started from (models:/<name>/<version>)."
    )
    path: str | None = Field(default=None, description="The folder trained from, on the parent's volume.")
    claim: str | None = Field(
        default=None,
        description="The parent's checkpoint volume (PVC), mounted read-only in this job's pods.",
    )
    method: str | None = Field(
        default=None, description="How the parent trained: lora (path holds an adapter for base) or full."
    )
    base: str | None = Field(
        default=None,
        description="A LoRA parent's base model, which its adapter is merged into: a folder in the pods, or "
        "a Hub id.",
    )
    base_claim: str | None = Field(
        default=None, description="The volume (PVC) holding base when it is not on the parent's volume."
    )
    base_sub_path: str | None = Field(default=None, description="Sub-path of base_claim mounted at base.")


class ChildrenStatus(ApiModel):
    checkpoint_claim: str | None = Field(
        default=None, description="PersistentVolumeClaim with the checkpoints."
    )
    config_map: str | None = Field(default=None, description="ConfigMap with the trainer config.")
    py_torch_job: str | None = Field(
        default=None, alias="pytorchJob", description="Kubeflow PyTorchJob (engine PyTorchJob)."
    )
    train_job: str | None = Field(
        default=None,
        description="Kubeflow Trainer v2 TrainJob and its TrainingRuntime, of the same name (engine TrainJob).",
    )
    registration_job: str | None = Field(default=None, description="Registration batch/v1 Job.")
    preparation_job: str | None = Field(default=None, description="Preparation batch/v1 Job.")


class FineTuneJobStatus(ApiModel):
    model_config = ConfigDict(extra="ignore")

    phase: Phase | None = Field(
        default=None, description="Pending, Preparing, Training, Suspended, Registering, Succeeded, Failed."
    )
    observed_generation: int | None = Field(default=None, description="Latest spec generation acted on.")
    conditions: list[Condition] | None = Field(
        default=None,
        description="Ready, Training, Registered, Suspended, ... (Kubernetes conventions).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    preparation: PreparationReport | None = Field(
        default=None, description="What preparation found and estimated, before any GPU was held."
    )
    progress: Progress | None = Field(default=None, description="Training progress reported by the trainer.")
    checkpoints: CheckpointStatus | None = Field(default=None, description="Checkpoints on the volume.")
    mlflow: MlflowStatus | None = Field(default=None, description="MLflow tracking.")
    goodput: Goodput | None = Field(default=None, description="Where the GPU time went (trainer-reported).")
    budget: BudgetStatus | None = Field(default=None, description="Training stopped at spec.budget.")
    training_restarts: TrainingRestarts | None = Field(
        default=None,
        description="Restarts of the training pods; too many in a row without progress fail the job.",
    )
    preemptions: Preemptions | None = Field(
        default=None,
        description="Evictions by Kueue (preemption): how many, the last one's reason, the checkpoint it "
        "resumes from, the time spent waiting.",
    )
    memory_retries: list[MemoryRetry] | None = Field(
        default=None, description="Retries after CUDA out of memory, each with its old and new layout."
    )
    registered_model: RegisteredModelStatus | None = Field(default=None, description="The registered model.")
    evaluation: EvaluationStatus | None = Field(
        default=None, description="Eval losses of the base and the registered model, and the gate's verdict."
    )
    parent: ParentStatus | None = Field(
        default=None, description="The model this job started from (spec.model.fromJob or registered)."
    )
    engine: Engine | None = Field(
        default=None,
        description="The training engine the job runs on, chosen once (spec.engine, else the operator's "
        "default) and never changed.",
    )
    children: ChildrenStatus | None = Field(
        default=None, description="Names of the objects kubetune created."
    )
    start_time: str | None = Field(default=None, description="When training started (RFC 3339).")
    completion_time: str | None = Field(
        default=None, description="When the job succeeded or failed (RFC 3339)."
    )
    registration_retry: str | None = Field(
        default=None,
        description="The kubetune.io/retry-registration annotation's value last acted on: a failed "
        "registration was retried (or, with registration turned off, finished without registering).",
    )
