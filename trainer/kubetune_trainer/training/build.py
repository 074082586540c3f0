"""What one training is built from: the base model and tokenizer, the data, TRL's arguments and the
trainer, as the plan (:mod:`kubetune_trainer.plan.plan`) says. :mod:`kubetune_trainer.training.train`
runs them; the benchmark (``kubetune_bench``) builds its kubetune cases from the same functions.
The model and the data come from :mod:`kubetune_trainer.sources` (prepared on the volume, or as the
spec names them).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from kubetune_api.rules import ALL_LINEAR
from kubetune_api.spec import Method, Objective
from kubetune_api.trainer_config import TrainerConfig
from kubetune_api.tuning import TuningConfig

from .. import settings
from ..plan.plan import ModelShape, shape_from_config, training_of
from ..sources.data import check_raw_data, raw_datasets
from ..sources.data_check import DataCheck
from ..sources.model import model_source
from ..sources.prepared import prepared, prepared_check
from ..volume import checkpoints
from . import fast, quantization, varlen
from .balance import balanced_sampler

log = logging.getLogger("kubetune_trainer.train")


# --- model and tokenizer ---------------------------------------------------------------------------


def build_tokenizer(cfg: TrainerConfig) -> Any:
    from transformers import AutoTokenizer

    where, kwargs = model_source(cfg)
    return AutoTokenizer.from_pretrained(where, trust_remote_code=cfg.spec.model.trust_remote_code, **kwargs)


def build_model(cfg: TrainerConfig, plan: Any, *, varlen_kernel: str | None = None) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    where, kwargs = model_source(cfg)
    dtype = getattr(torch, plan.dtype_name)
    if plan.attn_implementation == varlen.NAME:
        varlen.register(varlen_kernel)
    model = AutoModelForCausalLM.from_pretrained(
        where,
        dtype=dtype,
        attn_implementation=plan.attn_implementation,
        trust_remote_code=cfg.spec.model.trust_remote_code,
        **kwargs,
        # QLoRA: 4-bit NF4 weights on this process's GPU (nothing without it)
        **quantization.load_kwargs(nf4=plan.nf4, local_rank=settings.current().local_rank),
    )
    # No KV cache in training: it is useless there, warns with gradient checkpointing, and with a
    # cache transformers would not build the packed-sequence (block-diagonal) mask for SDPA/eager.
    model.config.use_cache = False
    return quantization.prepare(model, nf4=plan.nf4, gradient_checkpointing=plan.gradient_checkpointing)


def model_shape(cfg: TrainerConfig) -> ModelShape:
    """Parameter count and sizes from the model config alone (no weights loaded) for the plan."""
    from transformers import AutoConfig

    where, kwargs = model_source(cfg)
    conf = AutoConfig.from_pretrained(where, trust_remote_code=cfg.spec.model.trust_remote_code, **kwargs)
    text = conf.get_text_config() if hasattr(conf, "get_text_config") else conf
    return shape_from_config(text.to_dict())


def build_peft_config(cfg: TrainerConfig) -> Any:
    """PEFT's LoraConfig for spec.lora (None for full fine-tuning): the rank, scaling and dropout, the
    modules (the preset ``all-linear`` as PEFT spells it: every linear layer but the output head),
    DoRA's magnitudes and rsLoRA's alpha / sqrt(r) scaling as switched. QLoRA's 4-bit base is the
    model's (:mod:`.quantization`); the adapter on it is the same LoRA."""
    if cfg.spec.method != Method.LORA:
        return None
    from peft import LoraConfig, TaskType

    lora = cfg.spec.lora_settings()
    targets: Any = lora.target_modules
    if targets == [ALL_LINEAR]:
        targets = ALL_LINEAR  # PEFT's preset is a string; a list would name a module "all-linear"
    return LoraConfig(
        task_type=TaskType.CAUSAL_LM,
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=targets,
        bias="none",
        use_dora=lora.dora,
        use_rslora=lora.rs_lora,
    )


# --- data ------------------------------------------------------------------------------------------


def check_data(cfg: TrainerConfig) -> DataCheck:
    """The data pre-check (:mod:`kubetune_trainer.sources.data_check`): before anything is loaded.
    Prepared data was checked by the preparation step: its recorded result (no network, no second
    read)."""
    found = prepared(cfg)
    if found is not None:
        return prepared_check(found)
    return check_raw_data(cfg)


def build_datasets(cfg: TrainerConfig, checked: DataCheck | None = None) -> tuple[Any, Any, str]:
    """The training and eval splits, with only their format's columns, and the format; prepared
    data: its tokenized splits from the volume (``input_ids``, ``labels``), which TRL packs or
    truncates without tokenizing again."""
    found = prepared(cfg)
    if found is not None:
        from datasets import load_from_disk

        log.info("data: tokenized by the preparation step (%s), read from the volume", found.key)
        evaluation = load_from_disk(str(found.eval_dir)) if found.eval_dir is not None else None
        return load_from_disk(str(found.train_dir)), evaluation, found.format
    return raw_datasets(cfg, checked or check_data(cfg))


# --- trainer ---------------------------------------------------------------------------------------


def plan_training(cfg: TrainerConfig) -> Any:
    """spec.training as the plan reads it (:func:`..plan.plan.training_of`: no packing for pairs)."""
    return training_of(cfg.spec)


# long: one TRL argument list, each argument beside the reason it has that value
def training_arguments(
    cfg: TrainerConfig, plan: Any, *, has_eval: bool, progress_bar: bool, tuning: TuningConfig | None = None
) -> dict[str, Any]:
    """The arguments every TRL trainer of a job takes for ``plan`` (transformers' own: steps, batches,
    schedule, precision, saving, logging, DDP or FSDP). ``tuning`` (default: none set) may size DDP's
    all-reduce buckets (MB; PyTorch's 25 otherwise) and keep FSDP2's gathered weights from the forward
    for the backward (``fsdp_reshard`` off: one all-gather a step instead of two, the memory of a
    replica's weights). For measuring on a given machine; the plan does not set them."""
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
    # No NaN filter: it reads every micro-step's loss back to the host, and it hides a NaN loss
    # from the logs, which the loss watchdog (kubetune_trainer.training.watchdog) must see.
    kwargs["logging_nan_inf_filter"] = False
    if plan.liger:
        # The fast path (kubetune_trainer.training.fast): Liger is applied to the model by build_trainer,
        # fused linear cross-entropy included, and the loss never syncs with the host per
        # micro-step; so no TRL use_liger_kernel (it keeps TRL's chunked head).
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
    return dict(
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


def build_sft_config(
    cfg: TrainerConfig, plan: Any, *, has_eval: bool, progress_bar: bool, tuning: TuningConfig | None = None
) -> Any:
    """TRL's SFTConfig for ``plan``: :func:`training_arguments` and SFT's packing and masks."""
    from trl import SFTConfig

    t = cfg.spec.training
    return SFTConfig(
        **training_arguments(cfg, plan, has_eval=has_eval, progress_bar=progress_bar, tuning=tuning),
        packing=plan.packing,
        packing_strategy="bfd",
        padding_free=plan.padding_free,
        # float8 products need every dimension a multiple of 16, the micro-step's token count too (the
        # inner dimension of the weight gradient's product): up to 15 padding tokens, each its own
        # one-token sequence with no label
        pad_to_multiple_of=16 if plan.fp8 != "off" else None,
        # prepared data carries its labels (the assistant mask applied): TRL must not look for chat rows
        assistant_only_loss=t.assistant_only_loss and prepared(cfg) is None,
        dataset_text_field="text",
    )


def build_preference_config(
    cfg: TrainerConfig, plan: Any, *, has_eval: bool, progress_bar: bool, tuning: TuningConfig | None = None
) -> Any:
    """TRL's DPOConfig or ORPOConfig (spec.objective) for ``plan``: :func:`training_arguments` and beta.
    Dropout stays as the spec sets it (TRL turns it off by default; spec.lora.dropout is the user's)."""
    common = training_arguments(cfg, plan, has_eval=has_eval, progress_bar=progress_bar, tuning=tuning)
    beta = cfg.spec.preference_settings().beta
    if cfg.spec.objective == Objective.ORPO:
        from trl.experimental.orpo import ORPOConfig

        return ORPOConfig(**common, beta=beta, disable_dropout=False)
    from trl import DPOConfig

    return DPOConfig(**common, beta=beta, disable_dropout=False)


def build_config(
    cfg: TrainerConfig, plan: Any, *, has_eval: bool, progress_bar: bool, tuning: TuningConfig | None = None
) -> Any:
    """TRL's arguments for the job's objective."""
    build = build_preference_config if cfg.spec.prefers else build_sft_config
    return build(cfg, plan, has_eval=has_eval, progress_bar=progress_bar, tuning=tuning)


def preference_trainer(cfg: TrainerConfig) -> Any:
    """TRL's trainer for spec.objective dpo (DPOTrainer) or orpo (ORPOTrainer, in trl.experimental)."""
    if cfg.spec.objective == Objective.ORPO:
        from trl.experimental.orpo import ORPOTrainer

        return ORPOTrainer
    from trl import DPOTrainer

    return DPOTrainer


def trainer_class(base: Any = None) -> Any:
    """TRL's trainer (SFTTrainer, or ``base``: a preference trainer) with kubetune's fixes; the place
    for the performance work to hook in."""
    from trl import SFTTrainer

    from .callbacks import ScheduledCollection, paused_gc
    from .preemption import workers_ignore_sigterm

    class KubetuneTrainer(base or SFTTrainer):  # type: ignore[misc]
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

    return KubetuneTrainer


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
    cfg: TrainerConfig | None = None,
) -> Any:
    common: dict[str, Any] = {
        "model": model,
        "args": args,
        "train_dataset": train,
        "eval_dataset": evaluation,
        "processing_class": tokenizer,
        "peft_config": peft,
        "callbacks": callbacks,
    }
    if cfg is not None and cfg.spec.prefers:
        # pairs, padded: no packing, Liger's fused loss or compiled layers (the plan turned them off).
        # DPO's reference model is TRL's: under LoRA the model with its adapter off, else a frozen copy
        # loaded from the model's own folder; ORPO has none.
        return trainer_class(preference_trainer(cfg))(**common)
    cls = trainer_class()
    compiled = plan is not None and plan.torch_compile
    if plan is not None and plan.liger and fast.apply_liger(model, layer_kernels=not compiled):
        cls = fast.fast_trainer_class(
            cls, max_length=args.max_length if compiled else None, loss_chunk_factor=plan.loss_chunk_factor
        )
    trainer = cls(**common)
    if compiled:
        assert plan is not None
        if plan.fp8 != "off":
            # the plan allows float8 only with compiled layers: inductor fuses its casts and scales
            fast.apply_fp8(trainer.model, plan.fp8)
        # after PEFT has put its adapters into the layers: they are compiled with them
        count = fast.compile_layers(trainer.model)
        log.info("torch.compile: %d decoder layers compiled", count)
    return trainer
