"""The FineTuneJob API (kubetune.io/v1alpha1): the typed spec and status.

This module is the one source of truth for the API. The CRD in ``crds/`` is generated from it
(``python -m kubetune_api.crd > crds/kubetune.io_finetunejobs.yaml``) and a test fails when they
drift. It imports nothing heavy so that the operator, the trainer and the CLI all use it.

Wire names are camelCase (``gradientAccumulationSteps``); Python names are snake_case. Every model
is strict about unknown fields, as the API server is (the CRD is a structural schema).

What a field's type says (types, enums, bounds, lengths, patterns) is declared here, on the field;
every other rule (CEL, ``x-kubernetes-validations``) is declared once in :mod:`kubetune_api.rules`,
with its Python twin. Validating a ``FineTuneJobSpec`` or ``FineTuneJob`` applies both, unless the
validation context says the spec was admitted already (:func:`parse_job`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, model_validator

from . import rules as _rules
from .base import ApiModel
from .cel import MAX_NAME_LENGTH, NAME_PATTERN
from .engines import Engine
from .pod_env import OPERATOR_ENV  # noqa: F401 (kubetune_api.spec.OPERATOR_ENV, as before pod_env)
from .rules import ALL_LINEAR
from .rules_ignored import DEFAULT_ACCESS_MODE, DEFAULT_DATASET_SEED, DEFAULT_STORAGE_SIZE
from .schema import structural
from .status import FineTuneJobStatus

GROUP = "kubetune.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "FineTuneJob"
PLURAL = "finetunejobs"
SINGULAR = "finetunejob"
SHORT_NAMES = ("ftj",)
# Set (to any new value, e.g. a timestamp) on a FineTuneJob that failed in registration: the
# operator registers the trained model again (status.registrationRetry records the value acted on)
RETRY_REGISTRATION_ANNOTATION = f"{GROUP}/retry-registration"

# The name's length and pattern (MAX_NAME_LENGTH, NAME_PATTERN), the names of secret-like variables
# (SECRET_LIKE_ENV) and the alias names MLflow reserves (RESERVED_ALIAS_MESSAGE): kubetune_api.cel,
# which the rules share. The variables kubetune sets on the pods (OPERATOR_ENV, DEFAULTED_ENV):
# kubetune_api.pod_env.

# A Kubernetes quantity (resource.Quantity): a number, then a binary or decimal suffix or an exponent.
# No sign and no bare '.': what the API server takes and the Python twin reads (rules.positive_quantity).
QUANTITY_PATTERN = r"^[0-9]+([.][0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E|[eE][-+]?[0-9]{1,2})?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
# Strings that reach other systems (MLflow, the Hub) as names: no control characters, no newlines.
NO_CONTROL_PATTERN = r"^[^\x00-\x1f\x7f]+$"
# A Git branch, tag or commit: none of the characters git check-ref-format refuses (the rest of its
# rules are CEL, rules.BAD_GIT_REF)
GIT_REF_PATTERN = r"^[^\x00-\x20\x7f~^:?*\[\\]+$"
# A container image reference: [registry[:port]/]path[:tag][@digest], the path in lowercase
IMAGE_PATTERN = (
    r"^([A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?([.][A-Za-z0-9]([-A-Za-z0-9]*[A-Za-z0-9])?)*(:[0-9]+)?/)?"
    r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@[A-Za-z][A-Za-z0-9]*([-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$"
)


# --- enums ------------------------------------------------------------------------------------------


class Method(StrEnum):
    LORA = "lora"
    FULL = "full"


class Objective(StrEnum):
    """What training optimises: the likelihood of example answers (sft), or a preference for one answer
    over another to the same prompt (dpo: against a reference model; orpo: no reference, an odds-ratio
    term beside the chosen answer's own loss)."""

    SFT = "sft"
    DPO = "dpo"
    ORPO = "orpo"


class Quantization(StrEnum):
    """How a LoRA job holds its frozen base weights: as loaded (none), or in 4-bit NormalFloat (QLoRA)."""

    NONE = "none"
    NF4 = "nf4"


class Precision(StrEnum):
    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"


class Toggle(StrEnum):
    """A three-way switch. Not on/off: YAML 1.1 reads those as booleans."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"


class CheckpointChoice(StrEnum):
    """Which of a training's models: the final one, or the checkpoint with the lowest eval loss."""

    FINAL = "final"
    BEST_EVAL = "bestEval"


class DatasetFormat(StrEnum):
    AUTO = "auto"
    MESSAGES = "messages"
    PROMPT_COMPLETION = "promptCompletion"
    TEXT = "text"


class DatasetLayout(StrEnum):
    """How the rows hold their examples: kubetune's own columns, or a common layout converted to them."""

    NATIVE = "native"
    SHAREGPT = "sharegpt"
    ALPACA = "alpaca"


# The roles chat templates render; spec.dataset.roles maps a data set's own role names onto them.
ChatRole = Literal["system", "user", "assistant", "tool"]
# A column of the data, or a key of its turns
ColumnName = Annotated[str, Field(min_length=1, max_length=200, pattern=NO_CONTROL_PATTERN)]


# --- references -----------------------------------------------------------------------------------


class SecretKeyRef(ApiModel):
    """A key in a Secret in the FineTuneJob's namespace. Secrets are only ever referenced."""

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] = Field(
        description="Name of the Secret (in the FineTuneJob's namespace)."
    )
    key: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key inside the Secret."
    )


class VolumeSource(ApiModel):
    """A PersistentVolumeClaim that holds a model or data set, mounted read-only."""

    claim_name: Annotated[str, Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] = Field(
        description="PersistentVolumeClaim to mount read-only."
    )
    sub_path: str | None = Field(
        default=None, max_length=1024, description="Sub-path inside the claim (relative, without '..')."
    )


HUB_ID_PATTERN = r"^[A-Za-z0-9][-A-Za-z0-9_.]*(/[A-Za-z0-9][-A-Za-z0-9_.]*)?$"


# A registered MLflow model: models:/<name>@<alias> or models:/<name>/<version>
REGISTERED_MODEL_PATTERN = r"^models:/[^/@:%\x00-\x1f\x7f]+(@[A-Za-z_][A-Za-z0-9_-]*|/[1-9][0-9]{0,9})$"


class JobModelRef(ApiModel):
    """Another FineTuneJob of the same namespace whose trained model this job starts from."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_NAME_LENGTH, pattern=NAME_PATTERN)] = Field(
        description="FineTuneJob name (same namespace; a name a FineTuneJob can have). This job waits "
        "(Pending) until it has Succeeded."
    )
    checkpoint: CheckpointChoice = Field(
        default=CheckpointChoice.FINAL,
        description="final (its final model) or bestEval (its checkpoint with the lowest eval loss).",
    )


class ModelSource(ApiModel):
    """The base model: a Hugging Face Hub id with a revision, a path on a volume, another
    FineTuneJob's trained model (fromJob), or a registered MLflow model (registered)."""

    name: Annotated[str, Field(max_length=200, pattern=HUB_ID_PATTERN)] | None = Field(
        default=None, description="Hugging Face Hub model id, e.g. Qwen/Qwen2-0.5B."
    )
    revision: Annotated[str, Field(min_length=1, max_length=200, pattern=GIT_REF_PATTERN)] = Field(
        default="main", description="Hub revision (branch, tag or commit). Pin a commit for repeatable runs."
    )
    path: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None,
        description="Absolute path of a model folder: inside the mounted volume (see volume) or the image.",
    )
    volume: VolumeSource | None = Field(default=None, description="Volume that holds path, mounted at path.")
    from_job: JobModelRef | None = Field(
        default=None,
        description="Start from the model another FineTuneJob trained (same namespace; a LoRA adapter is "
        "merged into its base first).",
    )
    registered: Annotated[str, Field(max_length=512, pattern=REGISTERED_MODEL_PATTERN)] | None = Field(
        default=None,
        description="Start from a registered MLflow model: models:/<name>@<alias> or models:/<name>/<version> "
        "(resolved to a version once, when preparation runs).",
    )
    trust_remote_code: bool = Field(
        default=False, description="Run model code shipped with the model (only for models you trust)."
    )


class DatasetColumns(ApiModel):
    """Where the layout's fields are in the data, for data whose names differ from the layout's own
    (each unset field: the layout's name, in parentheses)."""

    messages: ColumnName | None = Field(
        default=None,
        description="Column that holds the conversation, a list of turns (native: messages; sharegpt: "
        "conversations).",
    )
    role: ColumnName | None = Field(
        default=None, description="Key of each turn that holds its role (native: role; sharegpt: from)."
    )
    content: ColumnName | None = Field(
        default=None, description="Key of each turn that holds its text (native: content; sharegpt: value)."
    )
    system: ColumnName | None = Field(
        default=None,
        description="Column that holds a row's own system prompt (sharegpt and alpaca: system; used where a "
        "row has one).",
    )
    instruction: ColumnName | None = Field(
        default=None, description="Column of the instruction (alpaca: instruction)."
    )
    input: ColumnName | None = Field(
        default=None,
        description="Column of the instruction's optional input, appended to it (alpaca: input).",
    )
    output: ColumnName | None = Field(default=None, description="Column of the answer (alpaca: output).")
    prompt: ColumnName | None = Field(default=None, description="Column of the prompt (native: prompt).")
    completion: ColumnName | None = Field(
        default=None, description="Column of the completion (native: completion)."
    )
    text: ColumnName | None = Field(default=None, description="Column of the text (native: text).")


class DatasetSource(ApiModel):
    """The training data: a Hub data set, or a JSONL/Parquet file or folder on a volume, in kubetune's
    own layout or one converted to it (layout, columns, roles, systemPrompt) by the preparation step."""

    name: Annotated[str, Field(max_length=200, pattern=HUB_ID_PATTERN)] | None = Field(
        default=None, description="Hugging Face Hub data set id, e.g. trl-lib/Capybara."
    )
    revision: Annotated[str, Field(min_length=1, max_length=200, pattern=GIT_REF_PATTERN)] = Field(
        default="main", description="Hub revision of the data set (only with name)."
    )
    subset: Annotated[str, Field(max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")] | None = Field(
        default=None,
        description="Data set configuration (subset) name: letters, digits, '.', '_' and '-' (a folder of "
        "the data set's repository, at its top or under data/; only with name).",
    )
    path: Annotated[str, Field(max_length=1024)] | None = Field(
        default=None, description="Absolute path of a .jsonl/.json/.parquet file or a folder of them."
    )
    volume: VolumeSource | None = Field(default=None, description="Volume that holds path, mounted at path.")
    split: Annotated[str, Field(min_length=1, max_length=100, pattern=NO_CONTROL_PATTERN)] = Field(
        default="train", description="Split to train on."
    )
    format: DatasetFormat = Field(
        default=DatasetFormat.AUTO,
        description="Row format: messages (chat), promptCompletion, text, or auto (detected from columns).",
    )
    layout: DatasetLayout = Field(
        default=DatasetLayout.NATIVE,
        description="How the rows hold their examples: native (kubetune's columns: messages, prompt and "
        "completion, or text), sharegpt (a 'conversations' list of turns {from, value}, roles human, gpt and "
        "system) or alpaca (instruction, optional input, output, optional system). sharegpt and alpaca are "
        "converted into chat messages before tokenizing (format messages).",
    )
    columns: DatasetColumns | None = Field(
        default=None,
        description="The data's own names for the layout's columns and turn keys, where they differ "
        "(e.g. messages: dialog, role: speaker).",
    )
    roles: Annotated[dict[str, ChatRole], Field(max_length=32)] | None = Field(
        default=None,
        description="The data's role names mapped onto system, user, assistant or tool (e.g. human: user, "
        "bot: assistant); sharegpt maps human, gpt and system itself. A role left unmapped that is none of "
        "the four is refused.",
    )
    system_prompt: Annotated[str, Field(min_length=1, max_length=16384)] | None = Field(
        default=None,
        description="A system message put first in each conversation that has none (chat data only).",
    )
    eval_split: Annotated[str, Field(min_length=1, max_length=100, pattern=NO_CONTROL_PATTERN)] | None = (
        Field(default=None, description="Split to evaluate on (e.g. test).")
    )
    eval_fraction: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None, description="Hold out this fraction of the training split for evaluation."
    )
    seed: Annotated[int, Field(ge=0)] = Field(
        default=DEFAULT_DATASET_SEED,
        description="Seed for the eval hold-out shuffle (only with evalFraction; the training's seed is "
        "training.seed).",
    )


class LoraSpec(ApiModel):
    """LoRA adapter settings (method: lora)."""

    r: Annotated[int, Field(ge=1, le=1024)] = Field(default=8, description="Adapter rank.")
    alpha: Annotated[int, Field(ge=1, le=4096)] = Field(default=32, description="Scaling factor (alpha / r).")
    dropout: Annotated[float, Field(ge=0, lt=1)] = Field(default=0.1, description="Adapter dropout.")
    target_modules: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=100)]], Field(min_length=1, max_length=64)
    ] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        description=f"Module names to adapt (e.g. q_proj, v_proj), or the preset '{ALL_LINEAR}' alone: every "
        "linear layer but the output head.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    dora: bool = Field(
        default=False,
        description="Weight-decomposed LoRA (DoRA): a trained magnitude per output feature of each adapted "
        "layer beside the adapter; more memory and time a step than LoRA (the plan counts them).",
    )
    rs_lora: bool = Field(
        default=False,
        description="Rank-stabilised LoRA: the adapter scaled by alpha / sqrt(r) instead of alpha / r "
        "(keeps high ranks learning).",
    )
    quantization: Quantization = Field(
        default=Quantization.NONE,
        description="The frozen base weights: none (as loaded, in the training precision) or nf4 (QLoRA: "
        "4-bit NormalFloat with double quantization and bf16 compute, through bitsandbytes; needs a GPU "
        "of compute capability 8.0 or newer and precision bf16).",
    )


class PreferenceSpec(ApiModel):
    """Preference tuning settings (objective: dpo or orpo); the defaults are TRL's."""

    beta: Annotated[float, Field(gt=0, le=100)] = Field(
        default=0.1,
        description="dpo: how far the model may move from the reference model (higher: closer to it); orpo: "
        "the weight of the odds-ratio term beside the chosen answer's loss (the paper's lambda).",
    )


class LossWatchdog(ApiModel):
    """Stop a run whose loss diverged (LossDiverged) instead of letting it burn GPU-hours to the end."""

    enabled: bool = Field(default=True, description="Watch the training loss (false: never stop for it).")
    spike_factor: Annotated[float, Field(gt=1, le=1000)] = Field(
        default=3.0,
        description="A logged loss above this many times the median of the recent logged losses is a spike.",
    )
    patience: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=3, description="Spikes in a row that stop the run (a NaN or Inf loss stops it at once)."
    )
    window: Annotated[int, Field(ge=3, le=10_000)] = Field(
        default=20, description="Recent logged losses whose median a spike is measured against."
    )


class TrainingSpec(ApiModel):
    """Hyperparameters. Defaults follow the notebooks where they are sane, and are fast."""

    epochs: Annotated[float, Field(gt=0, le=1000)] | None = Field(
        default=None, description="Passes over the training data (may be fractional)."
    )
    max_steps: Annotated[int, Field(ge=1, le=100_000_000)] | None = Field(
        default=None, description="Optimizer steps to train for (instead of epochs)."
    )
    batch_size: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=8,
        description=(
            "Sequences per GPU per micro-step; with packing, packed rows of up to maxLength tokens, "
            "each holding one or more whole sequences (TRL's packing)."
        ),
    )
    gradient_accumulation_steps: Annotated[int, Field(ge=1, le=4096)] = Field(
        default=4,
        description=(
            "Micro-steps per optimizer step. With packing on a GPU the plan may regroup the step's "
            "batchSize x gradientAccumulationSteps rows into fewer, larger micro-steps."
        ),
    )
    tokens_per_step: Annotated[int, Field(ge=256, le=4_194_304)] | None = Field(
        default=None,
        description=(
            "With packing: tokens per GPU per micro-step. Unset: planned from the GPU's memory "
            "(batchSize x maxLength at most)."
        ),
    )
    learning_rate: Annotated[float, Field(gt=0, le=1)] = Field(
        default=1e-4, description="Peak learning rate."
    )
    lr_scheduler: Literal["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr"] = (
        Field(default="linear", description="Learning-rate schedule.")
    )
    warmup_steps: Annotated[int, Field(ge=0, le=1_000_000)] | None = Field(
        default=None, description="Warm-up steps (the notebooks use 50 and 10)."
    )
    warmup_ratio: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        default=None, description="Warm-up as a fraction of all steps."
    )
    weight_decay: Annotated[float, Field(ge=0, le=1)] = Field(default=0.01, description="AdamW weight decay.")
    max_grad_norm: Annotated[float, Field(gt=0, le=1000)] = Field(
        default=1.0, description="Gradient clipping."
    )
    max_length: Annotated[int, Field(ge=16, le=1_048_576)] = Field(
        default=1024, description="Longest sequence in tokens; longer examples are truncated."
    )
    precision: Precision = Field(
        default=Precision.BF16, description="Training precision: bf16, fp16 or fp32."
    )
    gradient_checkpointing: Toggle = Field(
        default=Toggle.AUTO,
        description="Recompute activations to save memory: auto (when the memory plan needs it: the whole step "
        "does not fit, and recomputing in bigger micro-steps is estimated faster than more, smaller ones without), "
        "always, never.",
    )
    liger: bool = Field(
        default=True, description="Use Liger fused kernels (RMSNorm, RoPE, SwiGLU, fused CE)."
    )
    packing: bool = Field(
        default=True,
        description="Padding-free packing: no pad tokens, no attention across examples (varlen attention). "
        "SFT only: preference pairs (objective dpo or orpo) are padded, never packed.",
    )
    torch_compile: Toggle = Field(
        default=Toggle.AUTO,
        description="torch.compile of the decoder layers: auto (on a GPU with packing and the varlen kernel), "
        "always or never.",
    )
    assistant_only_loss: bool = Field(default=False, description="Train only on assistant turns (chat data).")
    logging_steps: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=25, description="Log every N steps."
    )
    eval_steps: Annotated[int, Field(ge=1, le=1_000_000)] | None = Field(
        default=None, description="Evaluate every N steps (default: at each checkpoint)."
    )
    save_steps: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=100, description="Checkpoint every N steps."
    )
    save_total_limit: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=2, description="Complete checkpoints to keep on the volume."
    )
    seed: Annotated[int, Field(ge=0)] = Field(default=42, description="Training seed.")
    loss_watchdog: LossWatchdog = Field(
        default_factory=LossWatchdog, description="Stop with LossDiverged when the loss is NaN/Inf or spikes."
    )
    oom_retries: Annotated[int, Field(ge=0, le=8)] = Field(
        default=2,
        description="After a CUDA out-of-memory error, retry this many times with smaller micro-steps and "
        "the same tokens per optimizer step, from the newest checkpoint. 0: fail at once. Each retry is a new "
        "pod, within the operator's restart limit for training (Helm trainer.trainBackoffLimit, default 6).",
    )


class Toleration(ApiModel):
    """A pod toleration (same fields as in a Pod spec)."""

    key: Annotated[str, Field(max_length=317)] | None = Field(
        default=None, description="Taint key (a label key; empty with operator Exists: every taint)."
    )
    operator: Literal["Exists", "Equal"] | None = Field(default=None, description="Exists or Equal.")
    value: Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)] | None = Field(
        default=None, description="Taint value (a label value; empty with operator Exists)."
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to tolerate."
    )
    toleration_seconds: int | None = Field(default=None, description="For NoExecute: seconds to stay bound.")


class ResourcesSpec(ApiModel):
    """Where and on what the training runs."""

    gpus_per_node: Annotated[int, Field(ge=0, le=16)] = Field(
        default=1, description="GPUs per node (= processes per node). 0 trains on CPU."
    )
    nodes: Annotated[int, Field(ge=1, le=512)] = Field(default=1, description="Nodes (pods) to train on.")
    gpu_product: (
        Annotated[str, Field(max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")] | None
    ) = Field(
        default=None, description="GPU model label (nvidia.com/gpu.product), e.g. NVIDIA-H100-80GB-HBM3."
    )
    cpu: Annotated[str, Field(max_length=32, pattern=QUANTITY_PATTERN)] | None = Field(
        default=None, description="CPU request per pod (quantity, e.g. '16')."
    )
    memory: Annotated[str, Field(max_length=32, pattern=QUANTITY_PATTERN)] | None = Field(
        default=None, description="Memory request and limit per pod (quantity, e.g. 128Gi)."
    )
    shared_memory: Annotated[str, Field(max_length=32, pattern=QUANTITY_PATTERN)] = Field(
        default="16Gi", description="Size of the memory-backed /dev/shm (data loaders, NCCL)."
    )
    node_selector: (
        Annotated[
            dict[str, Annotated[str, Field(max_length=63, pattern=LABEL_VALUE_PATTERN)]], Field(max_length=32)
        ]
        | None
    ) = Field(default=None, description="Node labels the pods must match.")
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = Field(
        default=None, description="Tolerations for the pods (e.g. for GPU node taints)."
    )
    priority_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None, description="PriorityClass of the pods (preemption)."
    )
    queue_name: Annotated[str, Field(max_length=63, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")] | None = (
        Field(default=None, description="Kueue LocalQueue: sets kueue.x-k8s.io/queue-name on the PyTorchJob.")
    )


class StorageSpec(ApiModel):
    """The checkpoint volume: a new PVC, or an existing claim."""

    size: Annotated[str, Field(max_length=32, pattern=QUANTITY_PATTERN)] = Field(
        default=DEFAULT_STORAGE_SIZE,
        description="Size of the checkpoint PVC kubetune creates (not with existingClaim).",
    )
    storage_class_name: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None, description="StorageClass of the new PVC (cluster default if unset)."
    )
    access_mode: Literal["ReadWriteOnce", "ReadWriteMany", "ReadWriteOncePod"] = Field(
        default=DEFAULT_ACCESS_MODE,
        description="Access mode of the new PVC (not with existingClaim). Multi-node training needs "
        "ReadWriteMany.",
    )
    existing_claim: Annotated[str, Field(max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)] | None = Field(
        default=None, description="Use this PVC instead of creating one (never deleted by kubetune)."
    )
    keep_on_delete: bool = Field(
        default=False,
        description="Keep the created PVC (and its checkpoints) when the FineTuneJob is deleted (not with "
        "existingClaim: kubetune never deletes it).",
    )


# The schemes MLflow takes as a registry URI (mlflow.set_registry_uri) that fit a job: an MLflow
# server, Databricks (its workspace registry, or Unity Catalog: databricks-uc), a local store
REGISTRY_URI_PATTERN = (
    r"^(((https?|file|sqlite|databricks|databricks-uc):/|/)[^\x00-\x20\x7f]*|databricks|databricks-uc)$"
)


def registration_error(alias: str | None, tracking_uri: str | None) -> str | None:
    """The first rule of ``spec.registration`` (:mod:`kubetune_api.rules`) that this alias or tracking
    URI breaks: for a tracking URI given outside a manifest (``kubetune run --local --tracking-uri``).

    >>> registration_error("latest", None)
    "spec.registration.alias must not be 'latest' or v<number>: MLflow reserves them for versions"
    >>> registration_error("champion", "https://mlflow.example.com") is None
    True
    """
    wire = {k: v for k, v in (("alias", alias), ("trackingUri", tracking_uri)) if v is not None}
    for rule in _rules.rules_at("spec.registration"):
        if not rule.check(wire):
            return rule.message
    return None


class GateSpec(ApiModel):
    """The eval loss the trained model must beat to be registered (set exactly one)."""

    max_eval_loss: Annotated[float, Field(gt=0, le=1e6)] | None = Field(
        default=None, description="Register only when the model's eval loss is at most this."
    )
    min_improvement: Annotated[float, Field(ge=0, lt=1)] | None = Field(
        default=None,
        description="Register only when the model's eval loss is below the base model's own eval loss on the "
        "same eval tokens (measured once, before training) by at least this share: 0 means any improvement, "
        "0.05 at least 5%.",
    )


class RegistrationSpec(ApiModel):
    """Registering the trained model in MLflow."""

    enabled: bool = Field(
        default=True,
        description="Register the model after training. May be changed later: while false, the other "
        "registration fields (and budget.register) do nothing yet and take effect once it is turned on "
        "(the job's Succeeded event and Registered condition name the ones set; a changed alias waits, "
        "AliasSynced False with reason RegistrationDisabled).",
    )
    tracking_uri: (
        Annotated[str, Field(max_length=2048, pattern=r"^((https?|file|databricks):/|/)[^\x00-\x20\x7f]*$")]
        | None
    ) = Field(
        default=None,
        description="MLflow tracking URI (http(s)://...). Unset: the operator's default (Helm value mlflow.trackingUri).",
    )
    registry_uri: Annotated[str, Field(max_length=2048, pattern=REGISTRY_URI_PATTERN)] | None = Field(
        default=None,
        description="MLflow model registry URI, when the registry is not the tracking server's: http(s)://..., "
        "databricks-uc (Unity Catalog, or databricks-uc://<profile>), databricks, file: or sqlite:. Unset: the "
        "operator's default (Helm value mlflow.registryUri), else the tracking server's registry. The "
        "credentials are the tracking server's (spec.secrets.mlflowTracking*), never in the URI.",
    )
    experiment: Annotated[str, Field(min_length=1, max_length=500, pattern=NO_CONTROL_PATTERN)] | None = (
        Field(default=None, description="MLflow experiment (default: kubetune/<namespace>).")
    )
    model_name: (
        Annotated[str, Field(min_length=1, max_length=256, pattern=r"^[^/:%\x00-\x1f\x7f]+$")] | None
    ) = Field(default=None, description="Registered model name (default: the FineTuneJob's name).")
    merge_lora: bool = Field(
        default=True,
        description="Merge the LoRA adapter into the base model before logging (method: lora only).",
    )
    alias: Annotated[str, Field(max_length=255, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")] | None = Field(
        default=None,
        description="Alias to point at the new version (e.g. champion). May be changed later: once the "
        "model is registered, the operator runs the registration again to move the alias (condition "
        "AliasSynced).",
    )
    select: CheckpointChoice = Field(
        default=CheckpointChoice.FINAL,
        description="What is registered: final (the model at the end of training) or bestEval (the "
        "checkpoint, or final model, with the lowest eval loss; needs eval data).",
    )
    gate: GateSpec | None = Field(
        default=None,
        description="Register only a model whose eval loss beats this (needs eval data). Not met: the job "
        "Succeeds with Registered=False (GateNotMet), the model kept; set the kubetune.io/retry-registration "
        "annotation to register it anyway.",
    )


class SecretsSpec(ApiModel):
    """Credentials, by reference only. They reach the pods as secretKeyRef environment variables."""

    hugging_face_token: SecretKeyRef | None = Field(
        default=None, description="Hugging Face token (HF_TOKEN) for gated models and data sets."
    )
    mlflow_tracking_token: SecretKeyRef | None = Field(
        default=None, description="MLflow bearer token (MLFLOW_TRACKING_TOKEN)."
    )
    mlflow_tracking_username: SecretKeyRef | None = Field(
        default=None, description="MLflow basic-auth user (MLFLOW_TRACKING_USERNAME)."
    )
    mlflow_tracking_password: SecretKeyRef | None = Field(
        default=None, description="MLflow basic-auth password (MLFLOW_TRACKING_PASSWORD)."
    )


class EnvFromSecret(ApiModel):
    secret_key_ref: SecretKeyRef = Field(description="Secret key to read the value from.")


class EnvVar(ApiModel):
    """An extra environment variable for the trainer (e.g. NCCL settings)."""

    name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")] = Field(
        description="Variable name."
    )
    value: Annotated[str, Field(max_length=4096)] | None = Field(default=None, description="Plain value.")
    value_from: EnvFromSecret | None = Field(default=None, description="Value from a Secret.")


class PreparationSpec(ApiModel):
    """The CPU step before training: download once, check and tokenize the data, estimate the cost."""

    max_truncated_fraction: Annotated[float, Field(ge=0, le=1)] = Field(
        default=0.5,
        description="Refuse the data (MostlyTruncated) when more than this share of the training examples "
        "is longer than training.maxLength. 1 never refuses. Checked by the preparation step: not where the "
        "platform turned it off (Helm trainer.preparation.enabled).",
    )


DURATION_PATTERN = r"^([0-9]{1,5}h)?([0-9]{1,7}m)?([0-9]{1,9}s)?$"


def duration_seconds(text: str) -> int:
    """Seconds in a duration such as ``90m``, ``2h30m`` or ``45s``.

    >>> duration_seconds("2h30m"), duration_seconds("45s")
    (9000, 45)
    """
    import re

    match = re.fullmatch(DURATION_PATTERN, text)
    if not text or match is None:
        raise ValueError(f"not a duration (e.g. 90m, 2h30m, 45s): {text!r}")
    h, m, s = (int(g[:-1]) if g else 0 for g in match.groups())
    return 3600 * h + 60 * m + s


# The hard deadline sits this far above spec.budget (at least BUDGET_MARGIN_MIN_S seconds).
BUDGET_MARGIN = 0.25
BUDGET_MARGIN_MIN_S = 900


class BudgetSpec(ApiModel):
    """Where training stops cleanly, keeping and registering what it has (condition BudgetReached)."""

    max_duration: Annotated[str, Field(max_length=24, pattern=DURATION_PATTERN, min_length=2)] | None = Field(
        default=None,
        description="Wall time of training (e.g. 90m, 2h30m): each attempt from its trainer's start, summed "
        "over attempts. Once the pods run, the training's activeDeadlineSeconds (the PyTorchJob's, or the "
        "TrainJob's training Job's) is set a margin above it, for each attempt.",
    )
    max_gpu_hours: Annotated[float, Field(gt=0, le=1_000_000)] | None = Field(
        default=None, description="GPU-hours of training (wall time x GPUs) across attempts."
    )
    register_model: bool = Field(
        default=True,
        alias="register",
        description="Register the model trained up to the budget (false: keep it on the volume).",
    )

    def seconds(self) -> int | None:
        return duration_seconds(self.max_duration) if self.max_duration else None

    def deadline_seconds(self, gpus: int) -> int | None:
        """The training's hard deadline (``activeDeadlineSeconds`` of the PyTorchJob, or of the
        TrainJob's training Job): the tighter limit (GPU-hours over the job's GPUs) plus a margin,
        so only a job that hung reaches it.

        >>> BudgetSpec(maxDuration="2h").deadline_seconds(8), BudgetSpec(maxGpuHours=4).deadline_seconds(8)
        (9000, 2700)
        """
        limits = [s for s in (self.seconds(),) if s is not None]
        if self.max_gpu_hours is not None:
            limits.append(int(self.max_gpu_hours * 3600 / max(1, gpus)))
        if not limits:
            return None
        limit = min(limits)
        return limit + max(BUDGET_MARGIN_MIN_S, int(limit * BUDGET_MARGIN))


RESUME_PATTERN = r"^(latest|best|none|[1-9][0-9]{0,8})$"


# The one list of what may change after creation, as paths below spec: everything else shapes the
# training or where and whether its model is registered (the evaluation gate, the checkpoint that is
# registered), and the API server refuses changing it (transition rules generated from this list:
# kubetune_api.admission.immutable_parts). docs/api.md says it from this list, and a test holds
# docs/guide.md to it.
MUTABLE_SPEC_PATHS = ("suspend", "registration.enabled", "registration.alias")


class FineTuneJobSpec(ApiModel):
    """What to fine-tune, on what data, how, where, and where to register the result."""

    model: ModelSource = Field(description="Base model to fine-tune.")
    dataset: DatasetSource = Field(description="Training (and evaluation) data.")
    objective: Objective = Field(
        default=Objective.SFT,
        description="What training optimises: sft (the data's answers), or preference tuning on pairs of a "
        "chosen and a rejected answer to one prompt: dpo (Direct Preference Optimization, against a reference "
        "model: the base with the adapter off under lora, a frozen copy under full) or orpo (Odds-Ratio "
        "Preference Optimization, no reference model). Independent of method and of QLoRA.",
    )
    preference: PreferenceSpec | None = Field(
        default=None, description="Preference tuning settings; only with objective dpo or orpo."
    )
    method: Method = Field(default=Method.LORA, description="lora (adapter) or full (all weights).")
    lora: LoraSpec | None = Field(default=None, description="LoRA settings; only with method: lora.")
    training: TrainingSpec = Field(description="Hyperparameters; set exactly one of epochs or maxSteps.")
    resources: ResourcesSpec = Field(default_factory=ResourcesSpec, description="GPUs, nodes and scheduling.")
    storage: StorageSpec = Field(default_factory=StorageSpec, description="Checkpoint volume.")
    registration: RegistrationSpec = Field(
        default_factory=RegistrationSpec, description="MLflow tracking and model registration."
    )
    preparation: PreparationSpec = Field(
        default_factory=PreparationSpec, description="Checks before any GPU is held (preparation step)."
    )
    budget: BudgetSpec | None = Field(
        default=None,
        description="Stop training cleanly at a wall time or GPU-hours, and register what it has.",
    )
    resume: Annotated[str, Field(max_length=10, pattern=RESUME_PATTERN)] = Field(
        default="latest",
        description="Where training starts when the checkpoint volume already holds this training's "
        "checkpoints (a reused claim): latest (the newest), best (lowest eval loss), none (start over; the "
        'old checkpoints are kept until the new run saves its own), or a step as a string ("400"). '
        "Applied once, at the job's first start; restarts continue from the job's own newest checkpoint.",
    )
    secrets: SecretsSpec | None = Field(default=None, description="Credentials, by Secret reference only.")
    env: Annotated[list[EnvVar], Field(max_length=64)] | None = Field(
        default=None,
        description="Extra trainer environment variables (each name once); credentials only via valueFrom.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )
    image: Annotated[str, Field(max_length=512, pattern=IMAGE_PATTERN)] | None = Field(
        default=None, description="Trainer image override (default: the operator's trainer image)."
    )
    suspend: bool = Field(
        default=False, description="Suspend training (pods are removed; resumes from checkpoint)."
    )
    engine: Engine | None = Field(
        default=None,
        description="The training engine to run on: PyTorchJob (Kubeflow Training Operator v1) or TrainJob "
        "(Kubeflow Trainer v2). Unset: the operator's default (status.engine records the choice). Forced: "
        "never another one; while its resource is not served the job waits (EngineNotServed).",
    )

    @model_validator(mode="after")
    def _rules(self, info: ValidationInfo) -> FineTuneJobSpec:
        """Every rule of kubetune_api.rules at or below spec, unless the spec was admitted already."""
        if not (info.context or {}).get(_rules.ADMITTED):
            problems = _rules.check(self.wire(), structural(FineTuneJobSpec), under="spec")
            if problems:
                raise _rules.RuleError(problems)
        return self

    def lora_settings(self) -> LoraSpec:
        return self.lora or LoraSpec()

    def preference_settings(self) -> PreferenceSpec:
        return self.preference or PreferenceSpec()

    @property
    def prefers(self) -> bool:
        """Preference tuning (objective dpo or orpo): the data are pairs of a chosen and a rejected answer."""
        return self.objective != Objective.SFT


# --- the whole object -----------------------------------------------------------------------------


class ObjectMeta(ApiModel):
    model_config = ConfigDict(extra="allow", alias_generator=None)

    name: str
    namespace: str = "default"
    uid: str | None = None
    generation: int | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class FineTuneJob(ApiModel):
    model_config = ConfigDict(extra="ignore")

    api_version: Literal["kubetune.io/v1alpha1"] = Field(default="kubetune.io/v1alpha1", alias="apiVersion")
    kind: Literal["FineTuneJob"] = "FineTuneJob"
    metadata: ObjectMeta
    spec: FineTuneJobSpec
    status: FineTuneJobStatus | None = None

    @model_validator(mode="after")
    def _name_fits_children(self, info: ValidationInfo) -> FineTuneJob:
        if not (info.context or {}).get(_rules.ADMITTED):
            problems = _rules.check(self.wire(), {}, only_root=True)
            if problems:
                raise _rules.RuleError(problems)
        return self


def parse_job(obj: dict[str, Any]) -> FineTuneJob:
    """Parse a FineTuneJob manifest (or a stored object) into the typed model.

    A job that has not started (no status.phase) is checked against every rule
    (:mod:`kubetune_api.rules`): an API server with an older CRD may have admitted what this version
    refuses, and the operator would otherwise create children the API server then refuses one by one.
    A job that started keeps the admission it had: one admitted before a rule existed does not turn
    Failed when the operator is upgraded; its fields' types are still checked.
    """
    started = bool((obj.get("status") or {}).get("phase"))
    return FineTuneJob.model_validate(obj, context={_rules.ADMITTED: True} if started else None)
