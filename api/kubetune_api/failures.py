"""Why training failed, in words a user can act on: the reasons, what each means and what to do.

The trainer classifies its own failure (:mod:`kubetune_trainer.training.failures`) and leaves a
:class:`TrainingFailure` as compact JSON in its container's termination message
(``/dev/termination-log``) and in its log. The operator reads it from the PyTorchJob's pods, beside
what the kubelet and the controllers say of them (``OOMKilled``, ``Evicted``), and puts the reason,
the message and the hint on the FineTuneJob's ``Training`` and ``Ready`` conditions and on a
Warning event. This module is the one place the reasons and their remedies are written: the
status, ``kubetune watch`` and the troubleshooting page's table (docs/troubleshooting.md, tested against it) read it.

Exit codes: a failure a new attempt may not have (:data:`RETRYABLE`) exits :data:`EXIT_RETRY`
(128-255: the PyTorchJob's ``restartPolicy: ExitCode`` restarts the pod, up to its backoff limit);
every other one exits :data:`EXIT_FAILED` (1-127: the PyTorchJob fails at once).
"""

from __future__ import annotations

import json
import re
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError, field_validator

from .base import ApiModel
from .cel import QUERY_CREDENTIAL
from .preparation import QLORA_HINT

# A failure a new attempt may not have: the Training Operator restarts the pod (128-255).
EXIT_RETRY = 142
# A failure the same spec meets again: the PyTorchJob fails at once (1-127).
EXIT_FAILED = 3
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096
# The key of the JSON object in the termination message.
MESSAGE_KEY = "failure"


class Failure(StrEnum):
    """Why training failed (or was stopped): the reason of the ``Training`` and ``Ready`` conditions."""

    CUDA_OUT_OF_MEMORY = "CudaOutOfMemory"
    HOST_OUT_OF_MEMORY = "HostOutOfMemory"
    NCCL_TIMEOUT = "NcclTimeout"
    NCCL_ERROR = "NcclError"
    MODEL_NOT_FOUND = "ModelNotFound"
    MODEL_GATED = "ModelGated"
    DATASET_ERROR = "DatasetError"
    DISK_FULL = "DiskFull"
    CHECKPOINT_CORRUPT = "CheckpointCorrupt"
    CHECKPOINT_NOT_FOUND = "CheckpointNotFound"
    LOSS_DIVERGED = "LossDiverged"
    PREEMPTED = "Preempted"
    EVICTED = "Evicted"
    DEADLINE_EXCEEDED = "DeadlineExceeded"
    QUANTIZATION_NOT_SUPPORTED = "QuantizationNotSupported"
    UNKNOWN = "Unknown"


# Failures a new attempt may not have: the trainer exits EXIT_RETRY (or, preempted, 143).
RETRYABLE = frozenset(
    {Failure.CUDA_OUT_OF_MEMORY, Failure.NCCL_TIMEOUT, Failure.NCCL_ERROR, Failure.PREEMPTED, Failure.EVICTED}
)

# What each reason means: the troubleshooting page's table, its middle column.
MEANINGS: dict[Failure, str] = {
    Failure.CUDA_OUT_OF_MEMORY: "a GPU ran out of memory in a training step",
    Failure.HOST_OUT_OF_MEMORY: "the kernel killed the trainer for host (CPU) memory: the pod's "
    "memory limit, often while saving a checkpoint or loading the model",
    Failure.NCCL_TIMEOUT: "a collective operation between the GPUs waited past its timeout: a rank "
    "hung, died or fell far behind",
    Failure.NCCL_ERROR: "the GPUs' communication library failed (a peer went away, a network error)",
    Failure.MODEL_NOT_FOUND: "the base model does not exist at that name, path or revision",
    Failure.MODEL_GATED: "the Hub refused the base model's download (401/403)",
    Failure.DATASET_ERROR: "a row of the data cannot be trained on (the message names it)",
    Failure.DISK_FULL: "the checkpoint volume is full (No space left on device)",
    Failure.CHECKPOINT_CORRUPT: "the checkpoint to resume from cannot be read",
    Failure.CHECKPOINT_NOT_FOUND: "spec.resume names a checkpoint the volume does not hold: a step with no "
    "complete checkpoint, or best when no checkpoint has an eval loss (the message lists the steps there are)",
    Failure.LOSS_DIVERGED: "the training loss became NaN or Inf, or stayed far above its recent median "
    "(the loss watchdog)",
    Failure.PREEMPTED: "the pod was stopped (SIGTERM: preemption, a drained node) after saving a checkpoint",
    Failure.EVICTED: "the kubelet evicted the pod (node pressure: memory, disk)",
    Failure.DEADLINE_EXCEEDED: "the training (the PyTorchJob, or the TrainJob's training Job) ran past its "
    "hard deadline (activeDeadlineSeconds, a margin above spec.budget): the trainer did not stop at the "
    "budget, it hung",
    Failure.QUANTIZATION_NOT_SUPPORTED: "QLoRA was asked on a machine without a GPU it runs on (no GPU, a "
    "GPU older than compute capability 8.0, or no bitsandbytes): refused before the model was loaded",
    Failure.UNKNOWN: "an error kubetune does not recognise: the message holds the last log lines",
}

# What to do about each: the one place the remedies are written (status, watch, README table).
HINTS: dict[Failure, str] = {
    Failure.CUDA_OUT_OF_MEMORY: "kubetune retries with smaller micro-steps and the same tokens per "
    "optimizer step (spec.training.oomRetries times); after that lower spec.training.tokensPerStep or "
    "maxLength, set gradientCheckpointing: always, or use more GPUs or method: lora",
    Failure.HOST_OUT_OF_MEMORY: "raise spec.resources.memory (or remove the limit); the job resumes from its newest checkpoint when re-created on the same claim",
    Failure.NCCL_TIMEOUT: "retried up to the backoff limit; when it recurs, look for a bad node or a rank "
    "that crashed first (kubectl logs of every pod), and check the nodes' network",
    Failure.NCCL_ERROR: "retried up to the backoff limit; when it recurs, check the pods' logs for the "
    "first rank that failed and the nodes' network",
    Failure.MODEL_NOT_FOUND: "check spec.model.name (or path) and spec.model.revision",
    Failure.MODEL_GATED: "accept the model's licence on the Hub and give a token with access through "
    "spec.secrets.huggingFaceToken",
    Failure.DATASET_ERROR: "fix or drop the row the message names (kubetune prepare job.yaml checks every "
    "row locally), or set spec.dataset.format to the rows' format",
    Failure.DISK_FULL: "the previous checkpoint stays usable: give the job a larger volume "
    "(spec.storage.size, or a larger existingClaim) or keep fewer checkpoints "
    "(spec.training.saveTotalLimit), then re-create it on the same claim to resume",
    Failure.CHECKPOINT_CORRUPT: "delete the checkpoint folder the message names from the volume; the next "
    "attempt resumes from the one before it",
    Failure.CHECKPOINT_NOT_FOUND: "re-create the job with spec.resume set to one of the steps the message "
    "lists, latest, or none to start over (spec.resume cannot be changed on an existing job)",
    Failure.LOSS_DIVERGED: "lower spec.training.learningRate, add warm-up (warmupSteps) or keep "
    "maxGradNorm; the last good checkpoint is kept. spec.training.lossWatchdog tunes or turns off the check",
    Failure.PREEMPTED: "nothing: the Training Operator starts a new pod, which resumes from the checkpoint",
    Failure.EVICTED: "retried up to the backoff limit; set spec.resources.memory and cpu requests so that "
    "the pod is not the first one evicted, or use a node pool with more headroom",
    Failure.DEADLINE_EXCEEDED: "read the trainer's logs for where it hung (a stuck collective, a stalled "
    "volume); checkpoints saved before stay on the volume",
    Failure.QUANTIZATION_NOT_SUPPORTED: QLORA_HINT,
    Failure.UNKNOWN: "read the message and the trainer's logs (kubectl logs); report it if it is a kubetune bug",
}


class TrainingFailure(ApiModel):
    """A classified training failure: the trainer's termination message, the operator's condition."""

    reason: Failure = Field(description="Why it failed.")
    message: str = Field(description="What happened, with the numbers that matter.")
    hint: str = Field(default="", description="What to do.")
    step: int | None = Field(default=None, description="Optimizer step it failed at, when known.")
    retryable: bool = Field(default=False, description="Whether a new attempt may not meet it.")

    @field_validator("message")
    @classmethod
    def _without_credentials(cls, message: str) -> str:
        """No credentials, whoever made the failure (the trainer redacts its own; a log tail or a
        message from elsewhere may quote a URL with user:password@ or a ?token=)."""
        return scrub(message)

    @classmethod
    def of(cls, reason: Failure, message: str, step: int | None = None) -> TrainingFailure:
        return cls(
            reason=reason, message=message, hint=HINTS[reason], step=step, retryable=reason in RETRYABLE
        )

    @property
    def exit_code(self) -> int:
        return EXIT_RETRY if self.retryable else EXIT_FAILED

    def describe(self) -> str:
        """The message and the remedy, for a condition or an event."""
        at = f" at step {self.step}" if self.step is not None else ""
        hint = (self.hint or HINTS[Failure(self.reason)]).rstrip(".")
        return f"{self.reason}{at}: {self.message.rstrip('.')}. What to do: {hint}."

    def termination_message(self) -> str:
        """Compact JSON within the kubelet's 4096 bytes, one line. A message too long is shortened to
        fit: its start kept for a bad row (the row is named first), its end for everything else (the
        last log lines matter most). Text that is not valid UTF-8 (a lone surrogate from a file
        name) is escaped, never an error."""
        if self._fits(self.message):
            return self._json(self.message)
        keep_start = self.reason == Failure.DATASET_ERROR
        low, high = 0, len(self.message)  # the longest cut that fits, by characters
        while low < high:
            mid = (low + high + 1) // 2
            if self._fits(self._cut(mid, keep_start)):
                low = mid
            else:
                high = mid - 1
        return self._json(self._cut(low, keep_start))

    def _cut(self, keep: int, keep_start: bool) -> str:
        if keep_start:
            return self.message[:keep] + "..."
        return "..." + self.message[len(self.message) - keep :]

    def _json(self, message: str) -> str:
        wire = {**self.wire(), "message": message}
        text = json.dumps({MESSAGE_KEY: wire}, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        return text.encode("utf-8", errors="backslashreplace").decode("utf-8")

    def _fits(self, message: str) -> bool:
        return len(self._json(message).encode()) <= TERMINATION_MESSAGE_LIMIT


# the user information of a URL, to the authority's last "@" (a password may hold one; a path or query
# after the authority's end is left alone); the trainer's redaction uses it too
USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s]*@")
_QUERY = re.compile(f"({QUERY_CREDENTIAL})[^&#\\s]+")


def scrub(text: str) -> str:
    """``text`` with the user information of its URLs and the values of credential-named query
    parameters replaced by ``***`` (the patterns admission refuses in spec.env values)."""
    without_userinfo = USERINFO.sub(r"\g<scheme>***@", text)
    return _QUERY.sub(r"\1***", without_userinfo)


def parse_failure(text: str | None) -> TrainingFailure | None:
    """The failure in a termination message (the JSON line, also when a log tail surrounds it);
    None for anything else."""
    for raw in reversed((text or "").strip().splitlines()):
        line = raw.strip()
        if not line.startswith("{"):
            continue
        try:
            data: Any = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and isinstance(data.get(MESSAGE_KEY), dict):
            try:
                return TrainingFailure.model_validate(data[MESSAGE_KEY])
            except ValidationError:
                return None
    return None
