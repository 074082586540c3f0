"""Fine-tune a causal LM as a FineTuneJob says: TRL SFTTrainer, LoRA or full, resumable, tracked.

Launched by ``torchrun`` in each PyTorchJob pod (one process per GPU), or as a plain process::

    torchrun --nproc_per_node 8 -m kubetune_trainer.train --config /etc/kubetune/config.yaml
    python -m kubetune_trainer.train --config runs/tiny/config.yaml     # one process, CPU or GPU

What it does, in order: check the data (:mod:`kubetune_trainer.data_check`: every row of local
files, and the data's identity), refuse a folder of another training or of other data, clean up
checkpoints whose save was cut short, load the data (Hub id or JSONL/JSON/Parquet file or folder;
chat ``messages``, prompt/completion or text), open (or re-open) the job's MLflow run on rank 0,
decide the plan for this hardware (:mod:`kubetune_trainer.plan`), load the base model and tokenizer
(ChatML template and pad token when missing, as the notebooks do), train with TRL's SFTTrainer from
the newest complete checkpoint, and write the final model (adapter or full weights + tokenizer) to
``<output_dir>/final`` with its COMPLETE marker, and ``train-result.json`` (the whole run, across
attempts: the resumed checkpoint carries the loss history).

Exit codes: 0 trained (or already trained); 143 (``EXIT_PREEMPTED``) SIGTERM arrived, a checkpoint
was saved, run again to continue; 2 (``EXIT_BAD_INPUT``) bad data or config, or the output folder
holds another training's checkpoints or final model, or this training's on other data (nothing is
touched; one message, no traceback unless ``--debug``); anything else failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubetune_api.spec import DatasetFormat, DatasetSource, Method
from kubetune_api.trainer_config import (
    COMPLETE_MARKER,
    EXIT_PREEMPTED,
    FINAL_DIR,
    TRAIN_RESULT_FILE,
    TrainerConfig,
    dump_json,
)
from kubetune_api.tuning import GPU_MEMORY_ENV, TuningConfig

from . import checkpoints, data_check
from .data_check import (
    COLUMNS,
    EXIT_BAD_INPUT,
    BadInputError,
    DataCheck,
    DataError,
)
from .data_check import data_files as _data_files

log = logging.getLogger("kubetune_trainer.train")

# --- process / distributed environment -------------------------------------------------------------


@dataclass(frozen=True)
class Dist:
    rank: int
    local_rank: int
    world_size: int

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @staticmethod
    def from_env() -> Dist:
        return Dist(
            rank=int(os.environ.get("RANK", "0")),
            local_rank=int(os.environ.get("LOCAL_RANK", "0")),
            world_size=int(os.environ.get("WORLD_SIZE", "1")),
        )


def setup_logging(dist: Dist) -> None:
    level = logging.INFO if dist.is_rank0 else logging.WARNING
    fmt = f"%(asctime)s [rank{dist.rank}] %(levelname)s %(name)s: %(message)s"
    logging.basicConfig(level=level, format=fmt, stream=sys.stderr, force=True)
    # The libraries' own chatter (weight loading bars, deprecation notes) drowns the run's story.
    for noisy in ("transformers", "datasets", "accelerate", "peft", "trl", "mlflow", "alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING if dist.is_rank0 else logging.ERROR)


def hf_token() -> str | None:
    """The Hugging Face token from the environment (a secretKeyRef in a pod); never logged."""
    return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None


# --- model and tokenizer ---------------------------------------------------------------------------


def model_source(cfg: TrainerConfig) -> tuple[str, dict[str, Any]]:
    """Where to load the base model from, and the loading arguments that depend on the source."""
    src = cfg.spec.model
    if src.path:
        return src.path, {}
    assert src.name is not None  # the spec guarantees exactly one of name/path
    return src.name, {"revision": src.revision, "token": hf_token()}


def build_tokenizer(cfg: TrainerConfig) -> Any:
    from transformers import AutoTokenizer

    where, kwargs = model_source(cfg)
    return AutoTokenizer.from_pretrained(where, trust_remote_code=cfg.spec.model.trust_remote_code, **kwargs)


def build_model(cfg: TrainerConfig, plan: Any) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    from . import varlen

    where, kwargs = model_source(cfg)
    dtype = getattr(torch, plan.dtype_name)
    if plan.attn_implementation == varlen.NAME:
        varlen.register()
    model = AutoModelForCausalLM.from_pretrained(
        where,
        dtype=dtype,
        attn_implementation=plan.attn_implementation,
        trust_remote_code=cfg.spec.model.trust_remote_code,
        **kwargs,
    )
    # No KV cache in training: it is useless there, warns with gradient checkpointing, and with a
    # cache transformers would not build the packed-sequence (block-diagonal) mask for SDPA/eager.
    model.config.use_cache = False
    return model


def model_shape(cfg: TrainerConfig) -> Any:
    """Parameter count and sizes from the model config alone (no weights loaded) for the plan."""
    from transformers import AutoConfig

    where, kwargs = model_source(cfg)
    conf = AutoConfig.from_pretrained(where, trust_remote_code=cfg.spec.model.trust_remote_code, **kwargs)
    text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    return shape_from_config(text.to_dict())


def shape_from_config(conf: dict[str, Any]) -> Any:
    """The plan's model shape from a (text) model config as a dict."""
    from .plan import ModelShape

    hidden = int(conf.get("hidden_size") or 0)
    layers = int(conf.get("num_hidden_layers") or 0)
    vocab = int(conf.get("vocab_size") or 0)
    inter = int(conf.get("intermediate_size") or 4 * hidden)
    # Attention (4 h^2) + gated MLP (3 h i) per layer, plus embeddings: close enough for a plan.
    params = layers * (4 * hidden * hidden + 3 * hidden * inter) + 2 * vocab * hidden
    return ModelShape(params=params, hidden_size=hidden, num_layers=layers, vocab_size=vocab)


def build_peft_config(cfg: TrainerConfig) -> Any:
    if cfg.spec.method != Method.LORA:
        return None
    from peft import LoraConfig, TaskType

    lora = cfg.spec.lora_settings()
    targets: Any = lora.target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
    )


# --- data ------------------------------------------------------------------------------------------


def load_splits(src: DatasetSource, *, revision: str | None = None) -> tuple[Any, Any]:
    """(train, eval or None) as the spec says: a split, an eval split, or an eval fraction.

    ``revision``: the Hub commit the data check resolved (what is hashed is what trains).
    """
    from datasets import load_dataset

    if src.path:
        builder, files = _data_files(Path(src.path))
        try:
            data = load_dataset(builder, data_files=files)
        except Exception as e:  # the check read every row; what is left is the library's own verdict
            cause = e.__cause__ or e
            raise DataError(
                f"{src.path}: the datasets library could not read it: {type(cause).__name__}: "
                + " ".join(str(cause).split())[:500]
            ) from e
    else:
        data = load_dataset(src.name, src.subset, revision=revision or src.revision, token=hf_token())
    if src.split not in data:
        raise DataError(f"dataset has no split {src.split!r} (it has {sorted(data)})")
    train = data[src.split]
    evaluation = None
    if src.eval_split:
        if src.eval_split not in data:
            raise DataError(f"dataset has no eval split {src.eval_split!r} (it has {sorted(data)})")
        evaluation = data[src.eval_split]
    elif src.eval_fraction:
        # The fixed seed makes every rank and every restart hold out the same rows.
        parts = train.train_test_split(test_size=src.eval_fraction, seed=src.seed)
        train, evaluation = parts["train"], parts["test"]
    return train, evaluation


def keep_columns(dataset: Any, fmt: str) -> Any:
    """Only the columns TRL should see: extra ones confuse its format detection."""
    if dataset is None:
        return None
    wanted = set(COLUMNS[DatasetFormat(fmt)])
    extra = [c for c in dataset.column_names if c not in wanted]
    return dataset.remove_columns(extra) if extra else dataset


def check_data(cfg: TrainerConfig) -> DataCheck:
    """The data pre-check (:mod:`kubetune_trainer.data_check`): before anything is loaded."""
    return data_check.check(
        cfg.spec.dataset, assistant_only_loss=cfg.spec.training.assistant_only_loss, token=hf_token()
    )


def build_datasets(cfg: TrainerConfig, checked: DataCheck | None = None) -> tuple[Any, Any, str]:
    """The training and eval splits, with only their format's columns, and the format."""
    src = cfg.spec.dataset
    checked = checked or check_data(cfg)
    train, evaluation = load_splits(src, revision=checked.revision)
    if checked.format is not None:
        fmt = checked.format  # every row was read and checked already
    else:
        fmt = data_check.check_loaded(
            train, evaluation, src, assistant_only_loss=cfg.spec.training.assistant_only_loss
        )
    return keep_columns(train, fmt), keep_columns(evaluation, fmt), fmt


# --- trainer ---------------------------------------------------------------------------------------


def build_sft_config(
    cfg: TrainerConfig, plan: Any, *, has_eval: bool, progress_bar: bool, tuning: TuningConfig | None = None
) -> Any:
    """TRL's arguments for ``plan``. ``tuning`` (default: none set) may size DDP's all-reduce buckets
    (MB; PyTorch's 25 otherwise) and keep FSDP2's gathered weights from the forward for the backward
    (``fsdp_reshard`` off: one all-gather a step instead of two, the memory of a replica's weights).
    For measuring on a given machine; the plan does not set them."""
    from trl import SFTConfig

    tuning = tuning or TuningConfig()
    bucket_mb, reshard = tuning.ddp_bucket_mb, tuning.fsdp_reshard

    t = cfg.spec.training
    root = checkpoints.checkpoints_root(cfg.output_dir)
    steps_or_epochs: dict[str, Any] = (
        {"max_steps": t.max_steps} if t.max_steps is not None else {"num_train_epochs": t.epochs}
    )
    warmup: float = t.warmup_steps if t.warmup_steps is not None else (t.warmup_ratio or 0.0)
    evaluation: dict[str, Any] = {"eval_strategy": "no"}
    if has_eval:
        evaluation = {
            "eval_strategy": "steps",
            "eval_steps": t.eval_steps or t.save_steps,
            "per_device_eval_batch_size": plan.per_device_batch_size,
        }
    kwargs: dict[str, Any] = {}
    if t.lr_scheduler == "cosine_with_min_lr":
        # transformers refuses this schedule without a floor; 10% of the peak is the usual one.
        kwargs["lr_scheduler_kwargs"] = {"min_lr_rate": 0.1}
    if plan.liger:
        # The fast path (kubetune_trainer.fast): Liger is applied to the model by build_trainer,
        # fused linear cross-entropy included, and the loss never syncs with the host per
        # micro-step; so no TRL use_liger_kernel (it keeps TRL's chunked head) and no NaN filter
        # (it reads every micro-step's loss back to the host).
        kwargs["logging_nan_inf_filter"] = False
        kwargs["prediction_loss_only"] = True
    fsdp = plan.sharding == "fsdp2"
    if fsdp:
        # FSDP2 through accelerate: every decoder layer (the model's _no_split_modules) sharded, the
        # root too; full state dicts so checkpoints and final/ load like any other model.
        kwargs["fsdp"] = True
        kwargs["fsdp_config"] = {
            "version": 2,
            "reshard_after_forward": reshard,
            "state_dict_type": "FULL_STATE_DICT",
            "activation_checkpointing": plan.gradient_checkpointing,
        }
    return SFTConfig(
        output_dir=str(root),
        **steps_or_epochs,
        per_device_train_batch_size=plan.per_device_batch_size,
        gradient_accumulation_steps=plan.gradient_accumulation_steps,
        learning_rate=t.learning_rate,
        lr_scheduler_type=t.lr_scheduler,
        warmup_steps=warmup,
        weight_decay=t.weight_decay,
        max_grad_norm=t.max_grad_norm,
        seed=t.seed,
        data_seed=t.seed,
        bf16=plan.precision == "bf16",
        fp16=plan.precision == "fp16",
        use_cpu=plan.device == "cpu",
        # under FSDP, recomputation is FSDP's activation_checkpointing (no redundant all-gather)
        gradient_checkpointing=plan.gradient_checkpointing and not fsdp,
        gradient_checkpointing_kwargs={"use_reentrant": False}
        if plan.gradient_checkpointing and not fsdp
        else None,
        # kubetune compiles the decoder layers itself (fast.compile_layers), not the whole model
        torch_compile=False,
        max_length=t.max_length,
        packing=plan.packing,
        packing_strategy="bfd",
        padding_free=plan.padding_free,
        # float8 products need every dimension a multiple of 16, the micro-step's token count too (the
        # inner dimension of the weight gradient's product): up to 15 padding tokens, each its own
        # one-token sequence with no label
        pad_to_multiple_of=16 if plan.fp8 != "off" else None,
        assistant_only_loss=t.assistant_only_loss,
        dataset_text_field="text",
        logging_steps=t.logging_steps,
        logging_first_step=True,
        save_strategy="steps",
        save_steps=t.save_steps,
        # Retention is ours (checkpoints.prune): it only ever counts complete checkpoints.
        save_total_limit=None,
        report_to="none",
        disable_tqdm=not progress_bar,
        dataloader_pin_memory=plan.device == "cuda",
        # accelerate's data loader copies each pinned batch to the GPU without the host waiting for
        # the GPU to drain first (a blocking copy waits for all queued work: ~9 times a step)
        accelerator_config={"non_blocking": plan.device == "cuda"},
        dataloader_num_workers=plan.dataloader_workers,
        dataloader_persistent_workers=plan.dataloader_workers > 0,
        # LoRA freezes most of the model; DDP must not wait for gradients that never come.
        ddp_find_unused_parameters=False,
        # the models' buffers (rotary frequencies) are computed alike on every rank: no broadcast per forward
        ddp_broadcast_buffers=False,
        ddp_bucket_cap_mb=bucket_mb,
        **evaluation,
        **kwargs,
    )


def trainer_class() -> Any:
    """TRL's SFTTrainer with kubetune's fixes; the place for the performance work to hook in."""
    from trl import SFTTrainer

    from .balance import balanced_sampler
    from .callbacks import ScheduledCollection, paused_gc, workers_ignore_sigterm

    class KubetuneSFTTrainer(SFTTrainer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # Python's garbage collector at fixed steps on every rank, not at random (callbacks.paused_gc)
            self.add_callback(ScheduledCollection())

        def train(self, *args: Any, **kwargs: Any) -> Any:
            with paused_gc():
                return super().train(*args, **kwargs)

        # data-loader workers leave SIGTERM to the trainer (it saves a checkpoint, then stops)
        def get_train_dataloader(self) -> Any:
            return workers_ignore_sigterm(super().get_train_dataloader())

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            return workers_ignore_sigterm(super().get_eval_dataloader(eval_dataset))

        def create_accelerator_and_postprocess(self) -> None:
            super().create_accelerator_and_postprocess()
            handler = getattr(self.accelerator, "ddp_handler", None)
            if handler is not None:
                # DDP's gradients live in its all-reduce buckets instead of being copied into them
                # each step (Qwen3-4B: 8 GB of device-to-device copies a step, 5 ms on an H200)
                handler.gradient_as_bucket_view = True

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            # several ranks: each micro-step's packed rows dealt so that every rank has the same work
            dataset = train_dataset if train_dataset is not None else self.train_dataset
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            sampler = balanced_sampler(
                dataset, ranks=self.args.world_size, rows=self.args.per_device_train_batch_size, seed=seed
            )
            return sampler if sampler is not None else super()._get_train_sampler(train_dataset)

        def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
            # Resumed at the last step (killed between its last checkpoint and its final model):
            # transformers 5.17 trains a step past the end before it looks at max_steps.
            if 0 < self.state.max_steps <= self.state.global_step:
                self.control.should_training_stop = True
                return None
            return super()._run_epoch(*args, **kwargs)

        def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
            # transformers maps the optimizer state to args.device, which is "cpu:<n>" under
            # multi-process CPU training, and torch.load refuses that: resuming DDP on gloo fails.
            if checkpoint is None or self.args.device.type != "cpu" or self.args.world_size == 1:
                super()._load_optimizer_and_scheduler(checkpoint)
                return
            import torch
            from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME

            folder = Path(checkpoint)
            assert self.optimizer is not None and self.lr_scheduler is not None  # created before resuming
            if not (folder / OPTIMIZER_NAME).is_file() or not (folder / SCHEDULER_NAME).is_file():
                return
            self.optimizer.load_state_dict(
                torch.load(folder / OPTIMIZER_NAME, map_location="cpu", weights_only=True)
            )
            self.lr_scheduler.load_state_dict(torch.load(folder / SCHEDULER_NAME, weights_only=True))

    return KubetuneSFTTrainer


def build_trainer(
    model: Any,
    tokenizer: Any,
    args: Any,
    *,
    train: Any,
    evaluation: Any,
    peft: Any,
    callbacks: list[Any],
    plan: Any = None,
) -> Any:
    from . import fast

    cls = trainer_class()
    compiled = plan is not None and plan.torch_compile
    if plan is not None and plan.liger and fast.apply_liger(model, layer_kernels=not compiled):
        cls = fast.fast_trainer_class(
            cls, max_length=args.max_length if compiled else None, loss_chunk_factor=plan.loss_chunk_factor
        )
    trainer = cls(
        model=model,
        args=args,
        train_dataset=train,
        eval_dataset=evaluation,
        processing_class=tokenizer,
        peft_config=peft,
        callbacks=callbacks,
    )
    if compiled:
        assert plan is not None
        if plan.fp8 != "off":
            # the plan allows float8 only with compiled layers: inductor fuses its casts and scales
            fast.apply_fp8(trainer.model, plan.fp8)
        # after PEFT has put its adapters into the layers: they are compiled with them
        count = fast.compile_layers(trainer.model)
        log.info("torch.compile: %d decoder layers compiled", count)
    return trainer


# --- the run ---------------------------------------------------------------------------------------


# The output folder holds a complete checkpoint or final model of another training (or of other data)
EXIT_OTHER_TRAINING = EXIT_BAD_INPUT


def other_training(path: Path | None, cfg: TrainerConfig, data_hash: str | None = None) -> str | None:
    """Why ``path`` (a final model or checkpoint folder) must not be resumed or taken as this run's
    result: its COMPLETE marker names another training, or the same training on other data. None:
    the same training on the same data, no marker, or a marker older than the check (no
    ``training_hash`` or no ``data_hash``: kept working as before)."""
    if path is None:
        return None
    written = checkpoints.marked_training(path)
    ours = cfg.training_hash()
    fix = (
        f"Use a new output folder (kubetune run --output-dir, or a new storage claim in a cluster), "
        f"or delete {cfg.output_dir} to start over."
    )
    if written and written != ours:
        return (
            f"{path} was written by another training (model, data, method or hyperparameters differ: "
            f"training hash {written}, this run's {ours}); resuming from it, or taking it as "
            f"this run's result, would mix the two. {fix}"
        )
    written_data = checkpoints.marked_data(path)
    if written and written_data and data_hash and written_data != data_hash:
        src = cfg.spec.dataset
        return (
            f"{path} was written by this training on other data: the content of {src.path or src.name} "
            f"changed since (data hash {written_data}, now {data_hash}); resuming from it, or taking it "
            f"as this run's result, would mix the two. {fix}"
        )
    return None


@dataclass
class Outcome:
    status: str  # succeeded | preempted | already-complete | refused
    exit_code: int
    result: dict[str, Any] = field(default_factory=dict)


def write_final(trainer: Any, tokenizer: Any, final_dir: Path, dist: Dist, info: dict[str, Any]) -> None:
    """Write the trained model + tokenizer to ``final/``, then (rank 0) its COMPLETE marker."""
    import shutil

    from .callbacks import barrier

    # Training ran without a KV cache (it also keeps the packed-sequence mask on); generation wants it.
    trainer.model.config.use_cache = True
    if dist.is_rank0 and final_dir.exists():
        # A previous attempt died while writing it: never mix old and new files.
        shutil.rmtree(final_dir)
    barrier()
    # save_model gathers what it needs from every rank (and writes on rank 0 only).
    trainer.save_model(str(final_dir))
    if dist.is_rank0:
        tokenizer.save_pretrained(str(final_dir))
    barrier()
    if dist.is_rank0:
        checkpoints.mark_complete(final_dir, info)
    barrier()


def _first_last(losses: list[tuple[int, float]]) -> tuple[float | None, float | None]:
    return (losses[0][1], losses[-1][1]) if losses else (None, None)


def mean_loss(losses: list[tuple[int, float]]) -> float | None:
    """The run's mean training loss from its logged (step, loss) pairs: each logged loss is the mean
    over the steps since the previous log, so it weighs as many steps as it covers.

    >>> mean_loss([(1, 4.0), (3, 1.0)])  # step 1: 4.0; steps 2-3: 1.0 each
    2.0
    """
    total, previous = 0.0, 0
    for step, loss in losses:
        total += loss * (step - previous)
        previous = step
    return total / previous if previous > 0 else None


def earlier_history(
    resume: Any, result_path: Path
) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """What earlier attempts logged up to the checkpoint this attempt resumes from: the checkpoint's
    own log history (a killed attempt wrote no train-result.json, but its checkpoints hold it), or
    for a checkpoint without one, the losses of the last ``train-result.json``."""
    if resume is None:
        return [], []
    history = checkpoints.checkpoint_history(resume.path)
    if history is not None:
        losses, evals = history
        return [x for x in losses if x[0] <= resume.step], [x for x in evals if x[0] <= resume.step]
    try:
        earlier = json.loads(result_path.read_text())
        pairs = [(int(s), float(v)) for s, v in earlier.get("losses") or []]
        eval_pairs = [(int(s), float(v)) for s, v in earlier.get("eval_losses") or []]
    except (OSError, ValueError, TypeError, AttributeError):
        return [], []
    return [x for x in pairs if x[0] <= resume.step], [x for x in eval_pairs if x[0] <= resume.step]


def _refuse(message: str, guard: Any, *, debug: bool = False) -> Outcome:
    log.error("%s", message, exc_info=debug)
    guard.uninstall()
    return Outcome("refused", EXIT_BAD_INPUT, {"error": message})


def _finished_earlier(final_dir: Path, root: Path, result_path: Path) -> dict[str, Any]:
    """train-result.json of a training whose final model an earlier attempt wrote: kept when that
    attempt wrote it; else (it died in between) told from the newest checkpoint's history."""
    try:
        result = json.loads(result_path.read_text())
        if isinstance(result, dict) and result.get("status") == "succeeded":
            return result
    except (OSError, ValueError):
        pass
    newest = checkpoints.latest_complete(root)
    losses, evals = earlier_history(newest, result_path)
    first, last = _first_last(losses)
    step = checkpoints.marker_step(final_dir)
    result = {
        "status": "succeeded",
        "global_step": step if step is not None else (newest.step if newest else None),
        "first_loss": first,
        "final_loss": last,
        "train_loss": mean_loss(losses),
        "losses": losses,
        "eval_losses": evals,
        "final_dir": str(final_dir),
        "checkpoints": [str(c.path) for c in checkpoints.complete_checkpoints(root)],
    }
    dump_json(result, result_path)
    return result


def run(
    cfg: TrainerConfig,
    *,
    progress_bar: bool | None = None,
    ctrl_c_saves: bool = False,
    checked: DataCheck | None = None,
    debug: bool = False,
) -> Outcome:
    """Train as ``cfg`` says; the caller turns the outcome into the exit code.

    ``ctrl_c_saves``: treat Ctrl-C (SIGINT) like SIGTERM: checkpoint, stop (for local runs).
    ``checked``: the data pre-check's result when the caller ran it (``kubetune run --local`` does,
    before it builds anything). Bad data or a folder of another training: status ``refused``, exit
    code 2, the message in ``result["error"]`` (and logged; with its traceback when ``debug``).
    """
    from .mlflow_client import redacted_stdio

    # MLflow prints run URLs (the tracking URI with any user:password@ in it) with print()
    with redacted_stdio():
        return _run(cfg, progress_bar=progress_bar, ctrl_c_saves=ctrl_c_saves, checked=checked, debug=debug)


def _run(
    cfg: TrainerConfig,
    *,
    progress_bar: bool | None,
    ctrl_c_saves: bool,
    checked: DataCheck | None,
    debug: bool,
) -> Outcome:
    from .mlflow_client import install_log_redaction

    dist = Dist.from_env()
    setup_logging(dist)
    install_log_redaction()
    started = time.monotonic()
    try:
        # before anything is written or loaded (torch and transformers included): every row of
        # local data, and the data's identity
        checked = checked or check_data(cfg)
    except BadInputError as e:
        log.error("%s", e, exc_info=debug)
        return Outcome("refused", EXIT_BAD_INPUT, {"error": str(e)})

    from .callbacks import PreemptionGuard, RunCallback
    from .chat import ensure_chat_format
    from .plan import Hardware, limit_gpu_memory, make_plan
    from .progress import ProgressReporter, in_cluster_patcher
    from .tracking import MlflowTracker

    guard = PreemptionGuard(ctrl_c=ctrl_c_saves).install()
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    final_dir = output_dir / FINAL_DIR
    root = checkpoints.checkpoints_root(output_dir)
    result_path = output_dir / TRAIN_RESULT_FILE

    newest = checkpoints.latest_complete(root)
    foreign = other_training(final_dir, cfg, checked.data_hash) or other_training(
        newest.path if newest else None, cfg, checked.data_hash
    )
    if foreign:
        return _refuse(foreign, guard)

    if (final_dir / COMPLETE_MARKER).is_file():
        # Training finished in an earlier attempt (which died before it could exit 0).
        log.info("%s is complete: nothing to train", final_dir)
        guard.uninstall()
        result = _finished_earlier(final_dir, root, result_path) if dist.is_rank0 else {}
        return Outcome("already-complete", 0, {**result, "final_dir": str(final_dir)})

    if dist.is_rank0:
        checkpoints.remove_incomplete(root)
    resume = checkpoints.latest_complete(root)
    earlier_losses, earlier_evals = earlier_history(resume, result_path)

    if progress_bar is None:
        progress_bar = sys.stderr.isatty()
    if not progress_bar:
        # In a pod the bars are noise in the logs; the per-step log lines tell the story.
        import datasets
        import transformers

        datasets.disable_progress_bars()
        transformers.utils.logging.disable_progress_bar()
    try:
        # the data before the model: a Hub data set's rows are checked as they load
        train_ds, eval_ds, fmt = build_datasets(cfg, checked)
    except BadInputError as e:
        return _refuse(str(e), guard, debug=debug)
    log.info(
        "data: %d training rows, %s eval rows, format %s, data hash %s",
        len(train_ds),
        len(eval_ds) if eval_ds is not None else "no",
        fmt,
        checked.data_hash or "unknown",
    )

    tracker = MlflowTracker(cfg, output_dir) if dist.is_rank0 else None
    if tracker is not None:
        extra = {"kubetune.worldSize": str(dist.world_size)}
        if checked.data_hash:
            extra["kubetune.dataHash"] = checked.data_hash
        tracker.start(extra)

    status = "FAILED"
    try:
        tuning = TuningConfig.from_env()  # the tuning variables, read once (ValueError naming a bad one)
        hw = Hardware.detect(tuning)
        fraction = limit_gpu_memory(tuning)
        if fraction is not None:
            log.info("GPU memory capped at %.0f%% of the GPU (%s)", 100 * fraction, GPU_MEMORY_ENV)
        plan = make_plan(
            cfg.spec.training, hw, shape=model_shape(cfg), lora=cfg.spec.method == Method.LORA, tuning=tuning
        )
        for what, why in plan.reasons.items():
            log.info("plan: %s: %s", what, why)

        tokenizer = build_tokenizer(cfg)
        model = build_model(cfg, plan)
        ensure_chat_format(model, tokenizer)

        args = build_sft_config(
            cfg, plan, has_eval=eval_ds is not None, progress_bar=progress_bar, tuning=tuning
        )
        patcher = None
        if cfg.report_progress and dist.is_rank0:
            try:
                patcher = in_cluster_patcher(cfg.job.namespace, cfg.job.name)
            except Exception as e:  # not in a cluster, no token: report nothing, train anyway
                log.warning("progress reporting off: %s", e)
        reporter = (
            ProgressReporter(patcher, total_steps=0, mlflow=tracker.status if tracker is not None else None)
            if patcher is not None
            else None
        )
        callback = RunCallback(
            earlier_losses=earlier_losses,
            earlier_eval_losses=earlier_evals,
            checkpoints_root=root,
            save_total_limit=cfg.spec.training.save_total_limit,
            guard=guard,
            tracker=tracker,
            progress=reporter,
            is_rank0=dist.is_rank0,
            world_size=dist.world_size,
            training_hash=cfg.training_hash(),
            data_hash=checked.data_hash,
        )
        trainer = build_trainer(
            model,
            tokenizer,
            args,
            train=train_ds,
            evaluation=eval_ds,
            peft=build_peft_config(cfg),
            callbacks=[callback],
            plan=plan,
        )
        if reporter is not None:
            reporter.state.total_steps = _planned_steps(trainer)

        def preempted() -> Outcome:
            return _finish_preempted(
                cfg,
                dist=dist,
                tracker=tracker,
                callback=callback,
                resume=resume,
                result_path=result_path,
                started=started,
                plan=plan,
            )

        if guard.agreed():
            # SIGTERM while loading: nothing new to save, the next attempt starts where this one did.
            status = "KILLED"
            return preempted()

        if resume is not None:
            log.info("resuming from %s (step %d)", resume.path, resume.step)
        train_output = trainer.train(resume_from_checkpoint=str(resume.path) if resume else None)

        if callback.preempted_at_step is not None:
            status = "KILLED"
            return preempted()

        final_info: dict[str, Any] = {
            "step": trainer.state.global_step,
            "method": str(cfg.spec.method),
            "config_hash": cfg.config_hash(),
            "training_hash": cfg.training_hash(),
        }
        if checked.data_hash:
            final_info["data_hash"] = checked.data_hash
        write_final(trainer, tokenizer, final_dir, dist, final_info)
        first, last = _first_last(callback.losses)
        # transformers' training_loss divides this attempt's losses by every attempt's steps
        train_loss = train_output.training_loss if resume is None else mean_loss(callback.losses)
        result = {
            "status": "succeeded",
            "global_step": trainer.state.global_step,
            "planned_steps": trainer.state.max_steps,
            "steps_this_attempt": trainer.state.global_step - (resume.step if resume else 0),
            "epoch": trainer.state.epoch,
            "first_loss": first,
            "final_loss": last,
            "train_loss": train_loss,
            "losses": callback.losses,
            "eval_losses": callback.eval_losses,
            "resumed_from": str(resume.path) if resume else None,
            "resumed_from_step": resume.step if resume else None,
            "final_dir": str(final_dir),
            "checkpoints": [str(c.path) for c in checkpoints.complete_checkpoints(root)],
            "world_size": dist.world_size,
            "plan": plan.as_dict(),
            "data_format": fmt,
            "data_hash": checked.data_hash,
            "tokens_per_second": callback.tokens_per_second,
            "seconds": round(time.monotonic() - started, 1),
        }
        if tracker is not None and train_loss is not None:
            tracker.log_metrics({"final_train_loss": train_loss}, trainer.state.global_step)
        if tracker is not None:
            tracker.set_tags({"kubetune.final_dir": str(final_dir)})
        status = "FINISHED"
        if dist.is_rank0:
            result.update(tracker.result() if tracker else {})
            dump_json(result, result_path)
            log.info(
                "trained %d steps; loss %s -> %s; final model in %s",
                result["global_step"],
                first,
                last,
                final_dir,
            )
        return Outcome("succeeded", 0, result)
    finally:
        guard.uninstall()
        if tracker is not None:
            tracker.finish(status)


def _planned_steps(trainer: Any) -> int:
    """Optimizer steps the run will take (max_steps, or epochs x batches per epoch)."""
    args = trainer.args
    if args.max_steps and args.max_steps > 0:
        return int(args.max_steps)
    import math

    batches = len(trainer.get_train_dataloader())
    per_epoch = max(1, math.ceil(batches / args.gradient_accumulation_steps))
    return math.ceil(per_epoch * args.num_train_epochs)


def _finish_preempted(
    cfg: TrainerConfig,
    *,
    dist: Dist,
    tracker: Any,
    callback: Any,
    resume: Any,
    result_path: Path,
    started: float,
    plan: Any,
) -> Outcome:
    root = checkpoints.checkpoints_root(cfg.output_dir)
    latest = checkpoints.latest_complete(root)
    first, last = _first_last(callback.losses)
    result = {
        "status": "preempted",
        "preempted_at_step": callback.preempted_at_step,
        # the run so far, across attempts: where the next attempt resumes
        "global_step": latest.step if latest else None,
        "latest_checkpoint": str(latest.path) if latest else None,
        "latest_checkpoint_step": latest.step if latest else None,
        "resumed_from": str(resume.path) if resume else None,
        "resumed_from_step": resume.step if resume else None,
        "first_loss": first,
        "final_loss": last,
        "losses": callback.losses,
        "eval_losses": callback.eval_losses,
        "world_size": dist.world_size,
        "plan": plan.as_dict(),
        "seconds": round(time.monotonic() - started, 1),
    }
    if dist.is_rank0:
        result.update(tracker.result() if tracker else {})
        dump_json(result, result_path)
        log.warning(
            "preempted: checkpoint %s saved; exiting %d so that the run is retried",
            result["latest_checkpoint"],
            EXIT_PREEMPTED,
        )
    return Outcome("preempted", EXIT_PREEMPTED, result)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m kubetune_trainer.train", description=__doc__.split("\n")[0])
    p.add_argument("--config", type=Path, required=True, help="trainer config YAML (TrainerConfig)")
    p.add_argument(
        "--progress-bar",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show a progress bar (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--debug", action="store_true", help="show the traceback of a bad-input error (bad data, bad config)"
    )
    return p


def load_config(path: Path) -> TrainerConfig:
    """The trainer config; :class:`BadInputError` naming the file and the field when it is not one."""
    import yaml
    from pydantic import ValidationError

    try:
        return TrainerConfig.load(path)
    except OSError as e:
        raise BadInputError(f"{path}: cannot read the trainer config ({e.strerror or e})") from e
    except yaml.YAMLError as e:
        raise BadInputError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from e
    except ValidationError as e:
        raise BadInputError("\n".join(f"{path}: {line}" for line in data_check.validation_lines(e))) from e


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = load_config(args.config)
    except BadInputError as e:
        if args.debug:
            traceback.print_exc()
        print(f"kubetune trainer: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    outcome = run(cfg, progress_bar=args.progress_bar, debug=args.debug)
    if outcome.status == "preempted":
        # no collective goodbye: another rank may already be gone
        sys.stderr.flush()
    else:
        close_process_group()
    return outcome.exit_code


def close_process_group() -> None:
    """Leave the process group (NCCL/gloo) cleanly when torchrun started one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    code = main()
    # Leave through the normal path on success; a preempted run must not look like one.
    sys.exit(code)
