"""Preparation: what the CPU step before training leaves on the volume, reports and refuses.

Before any GPU pod exists, a ``batch/v1`` Job (``<job>-prepare``, the trainer image, no GPU) runs
``python -m kubetune_trainer.prepare``: it resolves the model and data set to commits, downloads
them once onto the checkpoint volume, checks and tokenizes the data with the trainer's own code,
and estimates memory, time and cost with the trainer's own plan. ``kubetune prepare job.yaml``
does the same locally. This module is the contract between the three readers and writers:

- the layout on the volume (:data:`PREPARED_DIR` and below), which the trainer loads from with
  ``HF_HUB_OFFLINE=1`` (no network and no tokenization on a restart);
- the report (:class:`PreparationReport`), written to ``prepared/report.json`` and, compact, to
  the pod's ``/dev/termination-log``, from where the operator copies it into
  ``status.preparation``;
- the refusals (:class:`Refusal`), each with its remedy (:data:`HINTS`): the step exits
  :data:`EXIT_REFUSED` with a :class:`PreparationRefusal` as its termination message, and the
  FineTuneJob ends ``Failed`` with that reason before anything GPU-sized was created.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any

from pydantic import Field, ValidationError

from .base import ApiModel

# On the checkpoint volume (the trainer config's output_dir)
PREPARED_DIR = "prepared"
MODEL_DIR = f"{PREPARED_DIR}/model"  # the base model's files at the resolved commit
DATA_DIR = f"{PREPARED_DIR}/data"  # one folder per tokenization key: data/<key>/{train,eval}/ (Arrow)
MANIFEST_FILE = f"{PREPARED_DIR}/manifest.json"  # sources, revisions, file hashes, the key, the report
REPORT_FILE = f"{PREPARED_DIR}/report.json"

# Exit code of a refused preparation (the same as any input the user must fix): never retried.
EXIT_REFUSED = 2
# The kubelet keeps at most 4096 bytes of a termination message.
TERMINATION_MESSAGE_LIMIT = 4096
# Above this share of examples cut at maxLength the data set is refused (spec.preparation).
DEFAULT_MAX_TRUNCATED_FRACTION = 0.5


class Refusal(StrEnum):
    """Why preparation refused a job: the reason of its ``Prepared`` and ``Ready`` conditions."""

    DATASET_EMPTY = "DatasetEmpty"
    DATASET_SCHEMA = "DatasetSchema"
    DATASET_NOT_FOUND = "DatasetNotFound"
    NO_ASSISTANT_TURNS = "NoAssistantTurns"
    MOSTLY_TRUNCATED = "MostlyTruncated"
    CHAT_TEMPLATE_MISSING = "ChatTemplateMissing"
    MODEL_NOT_FOUND = "ModelNotFound"
    MODEL_GATED = "ModelGated"
    DOES_NOT_FIT = "DoesNotFit"
    QUANTIZATION_NOT_SUPPORTED = "QuantizationNotSupported"
    PREFERENCE_COLUMNS = "PreferenceColumns"
    IDENTICAL_ANSWERS = "IdenticalAnswers"
    PROMPT_TRUNCATED = "PromptTruncated"


# What to do when QLoRA cannot run where the job asks (a preparation refusal, and the trainer's failure).
QLORA_HINT = (
    "QLoRA (spec.lora.quantization nf4) computes in bf16 through bitsandbytes, which needs an NVIDIA GPU "
    "of compute capability 8.0 or newer: name one in spec.resources.gpuProduct (A10, A100, L4, L40S, "
    "H100, H200, ...), or set spec.lora.quantization: none"
)

# What to do about each refusal: the one place the remedies are written (status, CLI, docs/preparation.md's table).
HINTS: dict[Refusal, str] = {
    Refusal.DATASET_EMPTY: "the data set (or the split spec.dataset names) has no rows: point "
    "spec.dataset at a file or split that holds examples",
    Refusal.DATASET_SCHEMA: "a row lacks what its format needs (the message names the column and row): "
    "fix the data, or set spec.dataset.format to the format the rows have, spec.dataset.layout to their "
    "layout (sharegpt, alpaca), or spec.dataset.columns and roles to the data's own names",
    Refusal.DATASET_NOT_FOUND: "check spec.dataset.name/path and revision; a private data set needs "
    "spec.secrets.huggingFaceToken",
    Refusal.NO_ASSISTANT_TURNS: "spec.training.assistantOnlyLoss trains only on assistant turns, and "
    "these examples have none: add assistant messages, or turn assistantOnlyLoss off",
    Refusal.MOSTLY_TRUNCATED: "most examples are longer than spec.training.maxLength and would be cut: "
    "raise maxLength, shorten the examples, or raise spec.preparation.maxTruncatedFraction",
    Refusal.CHAT_TEMPLATE_MISSING: "the tokenizer has no chat template, which chat (messages) data "
    "needs: use an instruct model's tokenizer, or text / prompt-completion data",
    Refusal.MODEL_NOT_FOUND: "check spec.model.name (or path) and spec.model.revision",
    Refusal.MODEL_GATED: "the Hub refused the download (401/403): accept the model's licence on the Hub "
    "and give a token with access through spec.secrets.huggingFaceToken",
    Refusal.DOES_NOT_FIT: "the estimate does not fit the GPU's memory: the message says what would fit "
    "(a smaller spec.training.tokensPerStep, more GPUs, or method: lora instead of full)",
    Refusal.QUANTIZATION_NOT_SUPPORTED: QLORA_HINT,
    Refusal.PREFERENCE_COLUMNS: "preference tuning (spec.objective dpo or orpo) reads the columns prompt, "
    "chosen and rejected (strings, or lists of chat messages): rename the data's columns to them, or set "
    "spec.objective sft for SFT data",
    Refusal.IDENTICAL_ANSWERS: "a pair whose chosen and rejected answers are the same carries no preference: "
    "drop such rows, or fix the answer that was meant to differ (the message names the first)",
    Refusal.PROMPT_TRUNCATED: "prompts that take spec.training.maxLength tokens leave no room for the answers "
    "(TRL would drop or blank those pairs): raise maxLength, or shorten or drop those prompts",
}


class DataStats(ApiModel):
    """The tokenized data, as training will see it (after truncation at maxLength)."""

    train_examples: int = Field(description="Training examples.")
    eval_examples: int = Field(default=0, description="Evaluation examples.")
    tokens: int = Field(description="Training tokens after truncation (one epoch).")
    length_p50: int = Field(description="Median example length in tokens (before truncation).")
    length_p95: int = Field(description="95th percentile example length in tokens (before truncation).")
    length_max: int = Field(description="Longest example in tokens (before truncation).")
    truncated_fraction: float = Field(description="Share of training examples longer than maxLength.")
    loss_token_fraction: float = Field(
        description="Share of training tokens that count in the loss (assistant-only or completion-only)."
    )


class Estimate(ApiModel):
    """The plan's estimate for the GPUs the job asks for (kubetune_trainer.plan's memory and step-time
    models, the same numbers the trainer plans with)."""

    gpu_product: str = Field(description="GPU the estimate is for (spec.resources.gpuProduct, or assumed).")
    gpu_product_assumed: bool = Field(
        default=False,
        description="True when the spec names no GPU product (an H100 80GB is assumed) or one of a "
        "memory size kubetune does not know (80 GiB is assumed, and DoesNotFit is not refused on it).",
    )
    gpus: int = Field(description="GPUs in all (nodes x gpusPerNode).")
    gpu_memory_gib: float = Field(description="Memory of one GPU (GiB).")
    peak_memory_gib: float = Field(description="Estimated peak memory per GPU (GiB).")
    fits: bool = Field(description="Whether the peak fits the plan's share of the GPU's memory.")
    micro_batch_rows: int = Field(description="Packed rows per GPU per micro-step.")
    micro_batch_tokens: int = Field(description="Tokens per GPU per micro-step.")
    gradient_accumulation_steps: int = Field(description="Micro-steps per optimizer step.")
    gradient_checkpointing: bool = Field(description="Whether activations are recomputed.")
    sharding: str = Field(description="none, ddp or fsdp2.")
    steps: int = Field(description="Optimizer steps planned.")
    tokens_per_second: float = Field(description="Estimated training tokens per second (all GPUs).")
    duration_seconds: int = Field(description="Estimated training time.")
    gpu_hours: float = Field(description="Estimated GPU-hours (GPUs x duration).")


class PreparationReport(ApiModel):
    """What preparation found and planned: ``status.preparation``."""

    model_revision: str | None = Field(default=None, description="Resolved commit of the base model (Hub).")
    dataset_revision: str | None = Field(default=None, description="Resolved commit of the data set (Hub).")
    dataset_hash: str | None = Field(default=None, description="Content hash of the data.")
    tokenized_key: str = Field(description="Key of the tokenized data set on the volume.")
    tokenized_hash: str | None = Field(default=None, description="Content hash of the tokenized data.")
    reused: bool = Field(default=False, description="The tokenized data was already on the volume.")
    dataset_layout: str = Field(
        default="native",
        description="The layout the rows were read in (spec.dataset.layout): native, sharegpt or alpaca.",
    )
    converted_rows: int = Field(
        default=0,
        description="Rows of the training and evaluation splits converted into kubetune's own columns "
        "(spec.dataset.layout, columns, roles, systemPrompt); 0 when they were read as they are.",
    )
    data: DataStats = Field(description="Examples, tokens and lengths.")
    estimate: Estimate | None = Field(default=None, description="Memory, speed, time and cost estimate.")
    seconds: float | None = Field(default=None, description="How long preparation took.")

    def summary(self) -> str:
        """One line for a condition message or an event.

        >>> r = PreparationReport(tokenized_key="k", data=DataStats(train_examples=2000, tokens=1_500_000,
        ...     length_p50=600, length_p95=1500, length_max=4000, truncated_fraction=0.031,
        ...     loss_token_fraction=0.4))
        >>> r.summary()
        '2,000 training examples, 1,500,000 tokens (3.1% truncated at maxLength)'
        >>> r.model_copy(update={"dataset_layout": "sharegpt", "converted_rows": 2000}).summary()
        '2,000 training examples, 1,500,000 tokens (3.1% truncated at maxLength); 2,000 rows converted from layout sharegpt'
        """
        d = self.data
        text = f"{d.train_examples:,} training examples, {d.tokens:,} tokens"
        text += f" ({100 * d.truncated_fraction:.1f}% truncated at maxLength)"
        if self.converted_rows:
            text += f"; {self.converted_rows:,} rows converted from layout {self.dataset_layout}"
        e = self.estimate
        if e is not None:
            hours = e.duration_seconds / 3600
            text += (
                f"; estimate on {e.gpus} x {e.gpu_product}: {e.peak_memory_gib:.0f} of {e.gpu_memory_gib:.0f} GiB "
                f"per GPU, {e.tokens_per_second:,.0f} tokens/s, {hours:.1f} h, {e.gpu_hours:.1f} GPU-hours"
            )
        return text


class PreparationRefusal(ApiModel):
    """Why preparation refused the job, and what to do."""

    reason: Refusal
    message: str
    hint: str = ""

    @classmethod
    def of(cls, reason: Refusal, message: str) -> PreparationRefusal:
        return cls(reason=reason, message=message, hint=HINTS[reason])


def termination_message(outcome: PreparationReport | PreparationRefusal) -> str:
    """The compact JSON the preparation pod leaves in ``/dev/termination-log`` (within the kubelet's
    4096 bytes: a refusal's message is shortened to fit)."""
    key = "report" if isinstance(outcome, PreparationReport) else "refusal"
    body = outcome.model_dump(by_alias=True, exclude_none=True, mode="json")
    text = json.dumps({key: body}, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > TERMINATION_MESSAGE_LIMIT and isinstance(outcome, PreparationRefusal):
        over = len(text.encode()) - TERMINATION_MESSAGE_LIMIT
        short = outcome.model_copy(
            update={"message": outcome.message[: max(0, len(outcome.message) - over - 8)]}
        )
        return termination_message(short)
    return text


def parse_termination_message(text: str | None) -> PreparationReport | PreparationRefusal | None:
    """The report or refusal in a termination message; None for anything else (a crash's log tail)."""
    try:
        data: Any = json.loads(text or "")
    except ValueError:
        return None
    kinds: dict[str, type[PreparationReport] | type[PreparationRefusal]] = {
        "report": PreparationReport,
        "refusal": PreparationRefusal,
    }
    for key, model in kinds.items():
        if isinstance(data, dict) and isinstance(data.get(key), dict):
            try:
                return model.model_validate(data[key])
            except ValidationError:
                return None
    return None
