"""The benchmark's cases: the models, the notebooks' settings, what each case is compared with, one
case's result and one benchmark process (a job)."""

from __future__ import annotations

import importlib.resources
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Published architecture configs (facts: sizes of the public Qwen2-0.5B and Qwen3-4B checkpoints).
MODEL_CONFIGS: dict[str, dict[str, Any]] = {
    "qwen2-0.5b": {
        "model_type": "qwen2",
        "vocab_size": 151936,
        "hidden_size": 896,
        "intermediate_size": 4864,
        "num_hidden_layers": 24,
        "num_attention_heads": 14,
        "num_key_value_heads": 2,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "qwen3-4b": {
        "model_type": "qwen3",
        "vocab_size": 151936,
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 40960,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
    },
    "tiny": {
        "model_type": "qwen2",
        "vocab_size": 512,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
        "tie_word_embeddings": True,
    },
}

# The notebooks' SFTConfig, as they set it (facts from the two notebooks).
NOTEBOOK_A: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 4,
    "learning_rate": 1e-3,  # 1e-4 x 10 "for LoRA"
    "warmup_steps": 50,
    "logging_steps": 25,
    "weight_decay": 0.01,
    "dataloader_pin_memory": False,
    "remove_unused_columns": False,
    "use_liger_kernel": True,
    "fp16": True,
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
}
NOTEBOOK_B: dict[str, Any] = {
    "per_device_train_batch_size": 1,
    "gradient_accumulation_steps": 8,
    "learning_rate": 2e-5,
    "warmup_steps": 10,
    "logging_steps": 10,
    "weight_decay": 0.01,
    "dataloader_pin_memory": False,
    "remove_unused_columns": False,
    "bf16": True,
    "gradient_checkpointing": True,
    "gradient_checkpointing_kwargs": {"use_reentrant": False},
}
LORA: dict[str, Any] = {
    "r": 8,
    "alpha": 32,
    "dropout": 0.1,
    "targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
}

# (model, kind) -> what it is
CASES = {
    "qwen2-0.5b:notebook-a": ("qwen2-0.5b", "notebook-a"),
    "qwen2-0.5b:kubetune": ("qwen2-0.5b", "kubetune-lora"),
    "qwen3-4b:notebook-b": ("qwen3-4b", "notebook-b"),
    "qwen3-4b:kubetune": ("qwen3-4b", "kubetune-full"),
    "tiny:notebook-a": ("tiny", "notebook-a"),
    "tiny:kubetune-lora": ("tiny", "kubetune-lora"),
    "tiny:notebook-b": ("tiny", "notebook-b"),
    "tiny:kubetune-full": ("tiny", "kubetune-full"),
    # the peers (kubetune_bench.peers): TRL at its best and Unsloth, training what kubetune's case trains
    "qwen2-0.5b:trl-best": ("qwen2-0.5b", "trl-best-lora"),
    "qwen2-0.5b:unsloth": ("qwen2-0.5b", "unsloth-lora"),
    "qwen3-4b:trl-best": ("qwen3-4b", "trl-best-full"),
    "qwen3-4b:unsloth": ("qwen3-4b", "unsloth-full"),
    "tiny:trl-best-lora": ("tiny", "trl-best-lora"),
    "tiny:trl-best-full": ("tiny", "trl-best-full"),
    "tiny:unsloth-lora": ("tiny", "unsloth-lora"),
    "tiny:unsloth-full": ("tiny", "unsloth-full"),
}
GPU_CASES = ["qwen2-0.5b:notebook-a", "qwen2-0.5b:kubetune", "qwen3-4b:notebook-b", "qwen3-4b:kubetune"]
SMOKE_CASES = ["tiny:notebook-a", "tiny:kubetune-lora", "tiny:notebook-b", "tiny:kubetune-full"]
# Which case each kubetune case is compared with.
BASELINE = {"kubetune-lora": "notebook-a", "kubetune-full": "notebook-b"}
# The peers each kubetune case is compared with (kubetune_bench.peers), by the report's column.
PEERS = {
    "kubetune-lora": {"trl-best": "trl-best-lora", "unsloth": "unsloth-lora"},
    "kubetune-full": {"trl-best": "trl-best-full", "unsloth": "unsloth-full"},
}
# The notebook's FineTuneJob example each kubetune case trains (a file of the examples folder); a
# peer trains its kubetune case's example.
EXAMPLES = {"kubetune-lora": "qwen2-0.5b-lora-8gpu.yaml", "kubetune-full": "qwen3-4b-full.yaml"}
EXAMPLES.update({peer: EXAMPLES[own] for own, peers in PEERS.items() for peer in peers.values()})

MAX_LENGTH = 1024
# A model's own cut where it is not MAX_LENGTH: the tiny model's conversations are eight times
# shorter (median ~106 tokens, cut at 128), so that the CPU smoke takes every path in seconds.
MODEL_MAX_LENGTH = {"tiny": 128}


def max_length_of(model: str) -> int:
    """The longest conversation of a model's cases, in tokens (their data is cut there).

    >>> max_length_of("qwen3-4b"), max_length_of("tiny")
    (1024, 128)
    """
    return MODEL_MAX_LENGTH.get(model, MAX_LENGTH)


def is_kubetune(kind: str) -> bool:
    """Whether a case kind runs kubetune's own trainer (else TRL's, as a notebook sets it).

    >>> is_kubetune("kubetune-lora"), is_kubetune("notebook-a")
    (True, False)
    """
    return kind.startswith("kubetune")


def with_peers(cases: list[str]) -> list[str]:
    """The cases with the peers of each kubetune case's model added after them (``--peers``).

    >>> with_peers(["qwen2-0.5b:notebook-a", "qwen2-0.5b:kubetune"])
    ['qwen2-0.5b:notebook-a', 'qwen2-0.5b:kubetune', 'qwen2-0.5b:trl-best', 'qwen2-0.5b:unsloth']
    >>> with_peers(["tiny:kubetune-full"])
    ['tiny:kubetune-full', 'tiny:trl-best-full', 'tiny:unsloth-full']
    """
    out = list(cases)
    for case in cases:
        model, kind = CASES[case]
        for peer_kind in PEERS.get(kind, {}).values():
            out += [c for c, (m, k) in CASES.items() if m == model and k == peer_kind and c not in out]
    return out


def is_lora(kind: str) -> bool:
    """Whether a case kind trains LoRA adapters (notebook A, its kubetune case and their peers) or every weight.

    >>> is_lora("trl-best-lora"), is_lora("unsloth-full"), is_lora("notebook-a")
    (True, False, True)
    """
    return kind == "notebook-a" or kind.endswith("-lora")


def default_examples_dir() -> Path:
    """Where the kubetune cases find the notebooks' FineTuneJob examples unless ``--examples`` says.

    An installed wheel carries them as package data (``kubetune_bench/examples``, copied there from
    the repository's ``examples/`` when the wheel is built); a source checkout, editable installs
    included, has none there and uses ``examples`` in the current folder: the repository's own when
    run from its root, as CI and ``hack/gpu/run.sh`` do.
    """
    packaged = Path(str(importlib.resources.files("kubetune_bench"))) / "examples"
    return packaged if packaged.is_dir() else Path("examples")


def example_path(kind: str, examples: Path | None) -> Path:
    """The FineTuneJob example of a kubetune case kind, with a clear error when the folder lacks it."""
    folder = examples if examples is not None else default_examples_dir()
    path = folder / EXAMPLES[kind]
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the {kind} case trains this FineTuneJob example; pass --examples with the folder "
            "that holds the repository's examples/"
        )
    return path


@dataclass
class CaseResult:
    case: str
    model: str
    kind: str
    steps_measured: int
    seconds: float
    tokens: int
    tokens_per_second: float
    step_seconds: float
    peak_memory_gib: float | None
    mfu: float | None
    flops_per_token: float
    losses: list[float] = field(default_factory=list)
    plan: dict[str, Any] = field(default_factory=dict)
    packing_check: dict[str, Any] | None = None
    memory_cap_gib: float | None = None
    device: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    gpus: int = 1
    sharding: str = "none"
    # the plan's float8 recipe (KUBETUNE_FP8): such a row is compared with its notebook, but is never
    # the baseline of another
    fp8: str = "off"
    # set when the case trained one whole epoch instead of warm-up + measured steps
    epoch_training_seconds: float | None = None
    # packed rows a step when a kubetune case was given its notebook's tokens a step (--notebook-steps)
    # instead of its example's batch; such a row is compared with its notebook, never a baseline
    notebook_step_rows: int | None = None
    # spec.training fields the call set (--training): such a row is compared with its notebook, never a baseline
    training_overrides: dict[str, str] = field(default_factory=dict)
    compile_error: str | None = None
    step_times: list[float] = field(default_factory=list)
    # graphs dynamo compiled in the process (compiled layers: 1 forward graph when nothing recompiles)
    compiled_graphs: int | None = None
    # where compilation time went (seconds per dynamo/inductor phase, those over 0.5 s) and the
    # compile caches' hits and misses (FX graph and AOT autograd caches)
    compile_seconds: dict[str, float] = field(default_factory=dict)
    compile_cache: dict[str, int] = field(default_factory=dict)
    # a peer's exact settings (kubetune_bench.peers: SFTConfig's arguments, attention, loading) and
    # what its best lacked on this machine
    settings: dict[str, Any] = field(default_factory=dict)
    lacks: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Job:
    """One benchmark process: a case, optionally capped, on ``gpus`` GPUs, or one whole epoch."""

    case: str
    cap: float | None = None
    gpus: int = 1
    epoch_tokens: int | None = None
    sharding: str | None = None  # forced (KUBETUNE_SHARDING) instead of the plan's choice
    fp8: bool = False  # KUBETUNE_FP8=tensorwise (opt-in float8 products)
    notebook_steps: bool = False  # the notebook's tokens an optimizer step (notebook_step_rows)
    # capped at the peak memory its notebook case reached in the same output folder
    notebook_memory: bool = False
    # spec.training fields set for a kubetune case (camelCase name, value), e.g. gradientCheckpointing
    training: tuple[tuple[str, str], ...] = ()
    # a peer's point of its sweep: micro-batch (packed rows) and attention (None: its best available)
    peer_batch: int | None = None
    peer_attn: str | None = None

    @property
    def stem(self) -> str:
        name = self.case.replace(":", "_")
        name += "_nbmem" if self.notebook_memory else ("_cap" if self.cap else "")
        name += f"_x{self.gpus}" if self.gpus > 1 else ""
        name += f"_{self.sharding}" if self.sharding else ""
        name += "_fp8" if self.fp8 else ""
        name += "_nbsteps" if self.notebook_steps else ""
        name += "".join(f"_{key}-{value}" for key, value in self.training)
        name += f"_b{self.peer_batch}" if self.peer_batch else ""
        name += f"_{self.peer_attn}" if self.peer_attn else ""
        return name + ("_epoch" if self.epoch_tokens else "")


def notebook_of(case: str) -> str:
    """The notebook case a kubetune case is compared with: ``qwen3-4b:kubetune`` -> ``qwen3-4b:notebook-b``."""
    model, kind = CASES[case]
    return next(c for c, (m, k) in CASES.items() if m == model and k == BASELINE[kind])


def parse_training_overrides(items: list[str] | None) -> tuple[tuple[str, str], ...]:
    """``--training KEY=VALUE`` items, each checked against the FineTuneJob's ``spec.training`` fields.

    >>> parse_training_overrides(["gradientCheckpointing=always", "tokensPerStep=32768"])
    (('gradientCheckpointing', 'always'), ('tokensPerStep', '32768'))
    >>> parse_training_overrides(["batch=3"])
    Traceback (most recent call last):
    ...
    ValueError: --training batch=3: spec.training has no field 'batch'
    """
    from kubetune_api.spec import TrainingSpec

    fields = {f.alias or name for name, f in TrainingSpec.model_fields.items()}
    pairs = []
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not value:
            raise ValueError(f"--training {item}: expected KEY=VALUE (a spec.training field, camelCase)")
        if key not in fields:
            raise ValueError(f"--training {item}: spec.training has no field {key!r}")
        pairs.append((key, value))
    return tuple(pairs)


def apply_training_overrides(training: Any, pairs: tuple[tuple[str, str], ...]) -> Any:
    """A copy of ``training`` (a TrainingSpec) with the pairs set, validated as the API server would."""
    from kubetune_api.spec import TrainingSpec

    if not pairs:
        return training
    data = training.model_dump(by_alias=True, exclude_none=True)
    data.update(dict(pairs))
    return TrainingSpec.model_validate(data)
