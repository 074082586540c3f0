"""The trainer's pure decisions: the run plan, data format detection, params without secrets, paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kubetune_api.spec import TrainingSpec
from kubetune_api.trainer_config import TrainerConfig
from kubetune_api.tuning import TuningConfig
from kubetune_trainer import tiny_data
from kubetune_trainer.plan.plan import Hardware, ModelShape, estimate_training_bytes, make_plan

REPO = Path(__file__).resolve().parents[2]
CPU = Hardware(cuda=False, bf16=False)
CPU_AMX = Hardware(cuda=False, bf16=True)
H100 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=80 * 2**30, flash_attn=True)
QWEN3_4B = ModelShape(params=4_000_000_000, hidden_size=2560, num_layers=36, vocab_size=151_936)
QWEN2_05B = ModelShape(params=500_000_000, hidden_size=896, num_layers=24, vocab_size=151_936)


def test_cpu_without_native_bf16_trains_in_fp32_and_says_why() -> None:
    plan = make_plan(TrainingSpec(max_steps=1), CPU)
    assert plan.precision == "fp32" and plan.dtype_name == "float32"
    assert "no native bf16" in plan.reasons["precision"]


def test_cpu_with_amx_keeps_bf16() -> None:
    assert make_plan(TrainingSpec(max_steps=1), CPU_AMX).precision == "bf16"


def test_fp16_needs_a_gpu() -> None:
    assert make_plan(TrainingSpec(max_steps=1, precision="fp16"), CPU_AMX).precision == "fp32"
    assert make_plan(TrainingSpec(max_steps=1, precision="fp16"), H100).precision == "fp16"


def test_weights_load_in_a_dtype_the_optimizer_can_train() -> None:
    bf16 = make_plan(TrainingSpec(max_steps=1), H100, lora=False)
    assert bf16.dtype_name == "bfloat16"
    # fp16 AMP cannot unscale fp16 gradients: full fine-tuning keeps fp32 weights.
    assert make_plan(TrainingSpec(max_steps=1, precision="fp16"), H100, lora=False).dtype_name == "float32"
    assert make_plan(TrainingSpec(max_steps=1, precision="fp16"), H100, lora=True).dtype_name == "float16"


def test_liger_is_switched_off_on_cpu_with_a_reason() -> None:
    plan = make_plan(TrainingSpec(max_steps=1, liger=True), CPU)
    assert plan.liger is False and "CUDA" in plan.reasons["liger"]
    assert make_plan(TrainingSpec(max_steps=1, liger=True), H100).liger is True
    assert make_plan(TrainingSpec(max_steps=1, liger=False), H100).liger is False


def test_packing_is_padding_free_with_a_kernel_that_keeps_documents_apart() -> None:
    gpu = make_plan(TrainingSpec(max_steps=1), H100)
    assert gpu.padding_free and gpu.attn_implementation == "flash_attention_2"
    cpu = make_plan(TrainingSpec(max_steps=1), CPU)
    # SDPA over runs of whole examples (tests/unit/test_varlen.py proves it equals each example alone)
    assert cpu.padding_free and cpu.attn_implementation == "kubetune_varlen"
    assert "runs of whole examples" in cpu.reasons["packing"]
    off = make_plan(TrainingSpec(max_steps=1, packing=False), CPU)
    assert not off.packing and not off.padding_free


def test_tokens_per_step_sets_the_micro_batch() -> None:
    plan = make_plan(TrainingSpec(max_steps=1, max_length=1024, tokens_per_step=16384), H100)
    assert plan.per_device_batch_size == 16
    assert make_plan(TrainingSpec(max_steps=1, batch_size=3), H100).per_device_batch_size == 3


@pytest.mark.parametrize(
    ("toggle", "hw", "shape", "lora", "expected"),
    [
        ("always", CPU, None, True, True),
        ("never", H100, QWEN3_4B, False, False),
        ("auto", CPU, QWEN3_4B, False, False),
        # A full fine-tune of a 4B model with 8 x 1024 tokens per micro-step does not fit 80 GB without
        # recomputation, so the memory plan takes smaller packed micro-steps instead (see below).
        ("auto", H100, QWEN3_4B, False, False),
        # Notebook A: LoRA on 0.5B fits easily, so no recomputation.
        ("auto", H100, QWEN2_05B, True, False),
        ("auto", Hardware(cuda=True, bf16=True), None, True, True),
    ],
)
def test_gradient_checkpointing_follows_the_toggle_and_the_memory_plan(
    toggle: str, hw: Hardware, shape: ModelShape | None, lora: bool, expected: bool
) -> None:
    training = TrainingSpec(max_steps=1, gradient_checkpointing=toggle, batch_size=8, max_length=1024)
    plan = make_plan(training, hw, shape=shape, lora=lora)
    assert plan.gradient_checkpointing is expected, plan.reasons["gradient_checkpointing"]


def test_memory_plan_regroups_the_step_into_micro_steps_that_fit() -> None:
    """Same sequences per optimizer step; as few micro-steps as fit without recomputation."""
    h200 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=141 * 10**9, varlen=True)
    gpu64 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=64 * 2**30, varlen=True)
    notebook_b = TrainingSpec(max_steps=1, batch_size=1, gradient_accumulation_steps=8, max_length=1024)
    big = make_plan(notebook_b, h200, shape=QWEN3_4B, lora=False)
    small = make_plan(notebook_b, gpu64, shape=QWEN3_4B, lora=False)
    assert (big.per_device_batch_size, big.gradient_accumulation_steps) == (8, 1)
    assert small.per_device_batch_size * small.gradient_accumulation_steps == 8
    assert small.per_device_batch_size < 8 and not small.gradient_checkpointing
    assert big.attn_implementation == "kubetune_varlen"
    # asked for: always recompute keeps the spec's own batch
    always = make_plan(
        notebook_b.model_copy(update={"gradient_checkpointing": "always"}), gpu64, shape=QWEN3_4B
    )
    assert (always.per_device_batch_size, always.gradient_accumulation_steps) == (1, 8)
    # nothing fits without recomputation: the largest micro-step that fits with it
    tiny_gpu = Hardware(cuda=True, bf16=True, gpu_memory_bytes=38 * 2**30, varlen=True)
    squeezed = make_plan(notebook_b, tiny_gpu, shape=QWEN3_4B, lora=False)
    assert (
        squeezed.gradient_checkpointing
        and squeezed.per_device_batch_size * squeezed.gradient_accumulation_steps == 8
    )


def test_memory_estimate_grows_with_full_fine_tuning_and_shrinks_with_checkpointing() -> None:
    lora = estimate_training_bytes(QWEN2_05B, lora=True, tokens=1024, checkpointing=False)
    full = estimate_training_bytes(QWEN2_05B, lora=False, tokens=1024, checkpointing=False)
    ckpt = estimate_training_bytes(QWEN2_05B, lora=False, tokens=1024, checkpointing=True)
    assert lora < full and ckpt < full


def test_detect_format_from_columns_and_declared_formats() -> None:
    from kubetune_trainer.sources.data_check import detect_format

    assert detect_format(["messages", "source"], "auto") == "messages"
    assert detect_format(["prompt", "completion"], "auto") == "promptCompletion"
    assert detect_format(["text"], "auto") == "text"
    assert detect_format(["text", "messages"], "text") == "text"
    with pytest.raises(ValueError, match="cannot tell the dataset format"):
        detect_format(["question", "answer"], "auto")
    with pytest.raises(ValueError, match=r"needs column\(s\) \['completion'\]"):
        detect_format(["prompt"], "promptCompletion")


def test_data_files_for_a_file_and_a_folder_of_splits(tmp_path: Path) -> None:
    from kubetune_trainer.sources.data_check import data_files as _data_files

    (tmp_path / "train.jsonl").write_text("{}\n")
    (tmp_path / "test.jsonl").write_text("{}\n")
    assert _data_files(tmp_path / "train.jsonl") == ("json", [str(tmp_path / "train.jsonl")])
    builder, files = _data_files(tmp_path)
    assert builder == "json" and set(files) == {"train", "test"}
    (tmp_path / "x.parquet").write_bytes(b"")
    with pytest.raises(ValueError, match="mixes JSON and Parquet"):
        _data_files(tmp_path)
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(ValueError, match="unsupported file type"):
        _data_files(tmp_path / "x.csv")


def _cfg(**spec_extra: object) -> TrainerConfig:
    spec = {
        "model": {"name": "Qwen/Qwen2-0.5B"},
        "dataset": {"name": "trl-lib/Capybara"},
        "training": {"maxSteps": 1},
        "secrets": {"huggingFaceToken": {"name": "hf-token", "key": "token"}},
        "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
        **spec_extra,
    }
    return TrainerConfig.model_validate(
        {"job": {"name": "j"}, "spec": spec, "experiment": "e", "registeredModelName": "m"}
    )


def test_mlflow_params_are_the_spec_without_secret_references_or_env() -> None:
    from kubetune_trainer.mlflow.tracking import spec_params

    params = spec_params(_cfg())
    assert params["model.name"] == "Qwen/Qwen2-0.5B"
    assert params["training.maxSteps"] == "1"
    assert not any(k.startswith(("secrets", "env")) for k in params)
    assert "hf-token" not in json.dumps(params)
    assert params["kubetune.configHash"] == _cfg().config_hash()


def test_redact_drops_credentials_from_uris() -> None:
    from kubetune_trainer.mlflow.run import redact

    assert (
        redact("https://user:pw@mlflow.example:443/x", drop_userinfo=True) == "https://mlflow.example:443/x"
    )
    assert redact("sqlite:////tmp/a.db", drop_userinfo=True) == "sqlite:////tmp/a.db"


def test_shipped_tiny_data_is_what_the_generator_makes() -> None:
    shipped = (REPO / "examples" / "data" / tiny_data.FILE_NAME).read_text().splitlines()
    generated = [json.dumps(r, ensure_ascii=False) for r in tiny_data.conversations()]
    assert shipped == generated, (
        "regenerate: python -m kubetune_trainer.tiny_data --out examples/data/tiny-chat.jsonl"
    )
    assert 200 <= len(shipped) <= 400


def test_local_run_maps_the_tiny_assets_and_relative_paths(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubetune_cli.run import local_config

    # a local run in this process before (mlflow.set_tracking_uri) leaves its URI in the environment,
    # which local runs now honour
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)

    manifest = REPO / "examples" / "tiny-local.yaml"
    cfg, tiny, cache = local_config(
        manifest, output_dir=tmp_path / "run", cache_dir=tmp_path / "cache", tracking_uri=None
    )
    assert tiny and cache == (tmp_path / "cache").resolve()
    assert cfg.spec.model.path == str(cache / "model")
    assert cfg.spec.dataset.path == str(cache / "data" / "tiny-chat.jsonl")
    assert cfg.tracking_uri == f"sqlite:///{(tmp_path / 'run').resolve() / 'mlflow.db'}"
    assert cfg.output_dir == str((tmp_path / "run").resolve())
    assert cfg.report_progress is False

    from kubetune_cli.run import localize_path

    assert localize_path("data/x.jsonl", manifest_dir=tmp_path, cache_dir=cache) == (
        str(tmp_path / "data" / "x.jsonl"),
        False,
    )


@pytest.mark.parametrize(
    "scheduler", ["linear", "cosine", "constant", "constant_with_warmup", "cosine_with_min_lr"]
)
def test_every_scheduler_the_spec_allows_makes_a_valid_sft_config(tmp_path: Path, scheduler: str) -> None:
    from kubetune_trainer.training.train import build_sft_config

    # constant has no warm-up: a warm-up with it is refused (kubetune_api.rules_ignored)
    warmup = 0.0 if scheduler == "constant" else 0.1
    cfg = _cfg(
        training={"maxSteps": 10, "lrScheduler": scheduler, **({"warmupRatio": warmup} if warmup else {})}
    )
    cfg = cfg.model_copy(update={"output_dir": str(tmp_path)})
    plan = make_plan(cfg.spec.training, CPU)
    args = build_sft_config(cfg, plan, has_eval=False, progress_bar=False)
    assert args.lr_scheduler_type == scheduler and args.warmup_steps == warmup
    assert args.output_dir == str(tmp_path / "checkpoints") and args.save_total_limit is None


H200 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=141 * 2**30, varlen=True)


def test_compile_is_planned_on_a_gpu_with_varlen() -> None:
    assert make_plan(TrainingSpec(max_steps=1), H200, shape=QWEN2_05B).torch_compile is True
    # CPU: never by default (compilation would outlast a CPU run); asked for, it is honoured
    cpu = make_plan(TrainingSpec(max_steps=1), CPU)
    assert cpu.torch_compile is False and "CPU" in cpu.reasons["torch_compile"]
    assert make_plan(TrainingSpec(max_steps=1, torch_compile="always"), CPU).torch_compile is True
    assert make_plan(TrainingSpec(max_steps=1, torch_compile="never"), H200).torch_compile is False
    # with gradient checkpointing too (measured: 6.3k against 1.1k tokens/s uncompiled)
    ckpt = make_plan(TrainingSpec(max_steps=1, gradient_checkpointing="always"), H200, shape=QWEN2_05B)
    assert ckpt.torch_compile is True and ckpt.gradient_checkpointing
    # no varlen kernel (padded batches): off
    assert make_plan(TrainingSpec(max_steps=1, packing=False), H200, shape=QWEN2_05B).torch_compile is False


def test_sharding_ddp_for_lora_and_for_a_replica_that_fits_fsdp2_otherwise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBETUNE_SHARDING", raising=False)
    one = make_plan(TrainingSpec(max_steps=1), H200, shape=QWEN3_4B, lora=False)
    assert one.sharding == "none"
    h200x8 = Hardware(cuda=True, bf16=True, world_size=8, gpu_memory_bytes=141 * 2**30, varlen=True)
    h100x8 = Hardware(cuda=True, bf16=True, world_size=8, gpu_memory_bytes=80 * 2**30, varlen=True)
    assert make_plan(TrainingSpec(max_steps=1), h100x8, shape=QWEN3_4B, lora=True).sharding == "ddp"
    # Qwen3-4B full: a bf16 replica (weights, gradients, moments, DDP buckets: ~40 GB) fits either card
    assert make_plan(TrainingSpec(max_steps=1), h200x8, shape=QWEN3_4B, lora=False).sharding == "ddp"
    # an 8B model's replica (~80 GB) does not fit 80 GiB: FSDP2, and the reason says why
    big = ModelShape(params=8_000_000_000, hidden_size=4096, num_layers=36, vocab_size=151_936)
    plan = make_plan(TrainingSpec(max_steps=1), h100x8, shape=big, lora=False)
    assert plan.sharding == "fsdp2" and "FSDP2" in plan.reasons["sharding"]
    # sharded, the states no longer bound the micro-step: the memory plan fits more rows than a replica would
    assert plan.gradient_checkpointing is False
    monkeypatch.setenv("KUBETUNE_SHARDING", "fsdp2")
    forced = make_plan(
        TrainingSpec(max_steps=1), h200x8, shape=QWEN3_4B, lora=False, tuning=TuningConfig.from_env()
    )
    assert forced.sharding == "fsdp2" and "KUBETUNE_SHARDING" in forced.reasons["sharding"]
    # a typo is an error naming the variable, not silently the plan's own choice
    monkeypatch.setenv("KUBETUNE_SHARDING", "fsdp")
    with pytest.raises(ValueError, match="KUBETUNE_SHARDING must be ddp or fsdp2, got 'fsdp'"):
        make_plan(
            TrainingSpec(max_steps=1), h200x8, shape=QWEN3_4B, lora=False, tuning=TuningConfig.from_env()
        )


def test_fsdp2_divides_the_training_states_by_the_gpus() -> None:
    replica = estimate_training_bytes(QWEN3_4B, lora=False, tokens=8192, checkpointing=False, sharding="ddp")
    single = estimate_training_bytes(QWEN3_4B, lora=False, tokens=8192, checkpointing=False)
    sharded = estimate_training_bytes(
        QWEN3_4B, lora=False, tokens=8192, checkpointing=False, sharding="fsdp2", world_size=8
    )
    assert replica - single == 2 * QWEN3_4B.params  # DDP's gradient buckets
    assert sharded < single  # fp32 states over 8 GPUs weigh less than one bf16 replica


def test_multi_process_cpu_full_fine_tuning_is_ddp_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KUBETUNE_SHARDING", "fsdp2")  # cannot be honoured without GPUs
    cpus = Hardware(cuda=False, bf16=False, world_size=8)
    plan = make_plan(TrainingSpec(max_steps=1), cpus, lora=False, tuning=TuningConfig.from_env())
    assert plan.sharding == "ddp" and "FSDP needs GPUs" in plan.reasons["sharding"]


def test_an_fsdp2_plan_makes_accelerate_shard_with_fsdp2(tmp_path: Path) -> None:
    from dataclasses import replace

    from kubetune_trainer.training.train import build_sft_config

    cfg = _cfg(training={"maxSteps": 10}).model_copy(update={"output_dir": str(tmp_path)})
    h100x8 = Hardware(cuda=True, bf16=True, world_size=8, gpu_memory_bytes=80 * 2**30, varlen=True)
    big = ModelShape(params=8_000_000_000, hidden_size=4096, num_layers=36, vocab_size=151_936)
    plan = make_plan(cfg.spec.training, h100x8, shape=big, lora=False)
    assert plan.sharding == "fsdp2"
    # built on this CPU: the same arguments with the device set aside
    args = build_sft_config(
        cfg, replace(plan, device="cpu", precision="fp32"), has_eval=False, progress_bar=False
    )
    assert args.fsdp_plugin_args["fsdp_version"] == 2
    assert args.fsdp_plugin_args["auto_wrap_policy"] == "TRANSFORMER_BASED_WRAP"
    assert args.fsdp_plugin_args["state_dict_type"] == "FULL_STATE_DICT"  # final/ loads like any model
    # recomputation, when planned, is FSDP's own activation checkpointing
    assert args.gradient_checkpointing is False
    ckpt = replace(plan, device="cpu", precision="fp32", gradient_checkpointing=True)
    args = build_sft_config(cfg, ckpt, has_eval=False, progress_bar=False)
    assert args.fsdp_plugin_args["activation_checkpointing"] is True and args.gradient_checkpointing is False


def test_gpu_plans_load_data_in_workers_and_size_the_loss_chunks() -> None:
    """On a GPU: data-loader workers overlap collation with training; the fused loss head gets ~1 GiB chunks."""
    from kubetune_trainer.plan.plan import LOSS_CHUNK_ELEMENTS

    spec = TrainingSpec(max_steps=1, batch_size=1, gradient_accumulation_steps=8, max_length=1024)
    plan = make_plan(spec, H200, shape=QWEN3_4B, lora=False)
    assert plan.dataloader_workers == 2 and "worker" in plan.reasons["dataloader"]
    tokens = plan.per_device_batch_size * 1024
    assert plan.per_device_batch_size == 8  # the whole step in one micro-step on an H200
    # Liger holds factor x tokens x hidden logits at once: about the budget, never over it
    assert plan.loss_chunk_factor == LOSS_CHUNK_ELEMENTS // (tokens * 2560) > 1
    assert plan.loss_chunk_factor * tokens * 2560 <= LOSS_CHUNK_ELEMENTS
    assert "fused linear cross-entropy" in plan.reasons["loss_chunks"]
    # CPU: no Liger, no workers (tests and local runs stay in one process)
    cpu = make_plan(spec, CPU, shape=QWEN3_4B, lora=False)
    assert (cpu.dataloader_workers, cpu.loss_chunk_factor) == (0, 1)


def test_the_plan_reaches_the_trainer_arguments(tmp_path: Path) -> None:
    from dataclasses import replace

    from kubetune_trainer.training.train import build_sft_config

    cfg = _cfg(training={"maxSteps": 10}).model_copy(update={"output_dir": str(tmp_path)})
    plan = make_plan(cfg.spec.training, H200, shape=QWEN2_05B)
    # built on this CPU: the same arguments with the device set aside
    args = build_sft_config(
        cfg, replace(plan, device="cpu", precision="fp32"), has_eval=False, progress_bar=False
    )
    assert args.dataloader_num_workers == 2 and args.dataloader_persistent_workers
    cpu = build_sft_config(cfg, make_plan(cfg.spec.training, CPU), has_eval=False, progress_bar=False)
    assert cpu.dataloader_num_workers == 0 and not cpu.dataloader_persistent_workers
    # on a GPU, pinned batches are copied without a host wait; on the CPU there is nothing to copy
    gpu = build_sft_config(cfg, replace(plan, precision="fp32"), has_eval=False, progress_bar=False)
    assert gpu.dataloader_pin_memory and gpu.accelerator_config.non_blocking
    assert not cpu.dataloader_pin_memory and not cpu.accelerator_config.non_blocking


def test_data_loader_workers_can_be_set_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = TrainingSpec(max_steps=1)
    monkeypatch.setenv("KUBETUNE_DATALOADER_WORKERS", "0")
    plan = make_plan(spec, H200, shape=QWEN2_05B, tuning=TuningConfig.from_env())
    assert plan.dataloader_workers == 0 and "KUBETUNE_DATALOADER_WORKERS" in plan.reasons["dataloader"]
    monkeypatch.setenv("KUBETUNE_DATALOADER_WORKERS", "3")
    assert make_plan(spec, CPU, tuning=TuningConfig.from_env()).dataloader_workers == 3
    monkeypatch.setenv("KUBETUNE_DATALOADER_WORKERS", "many")  # not a count: an error naming it
    with pytest.raises(ValueError, match="KUBETUNE_DATALOADER_WORKERS must be a whole number"):
        make_plan(spec, H200, shape=QWEN2_05B, tuning=TuningConfig.from_env())
    monkeypatch.setenv("KUBETUNE_DATALOADER_WORKERS", "")  # empty: unset, the plan's own choice
    assert make_plan(spec, H200, shape=QWEN2_05B, tuning=TuningConfig.from_env()).dataloader_workers == 2


def test_sharding_overrides_reach_the_trainer_arguments(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dataclasses import replace

    from kubetune_trainer.training.train import build_sft_config

    cfg = _cfg(training={"maxSteps": 10}).model_copy(update={"output_dir": str(tmp_path)})
    h100x8 = Hardware(cuda=True, bf16=True, world_size=8, gpu_memory_bytes=80 * 2**30, varlen=True)
    big = ModelShape(params=8_000_000_000, hidden_size=4096, num_layers=36, vocab_size=151_936)
    plan = replace(
        make_plan(cfg.spec.training, h100x8, shape=big, lora=False), device="cpu", precision="fp32"
    )
    args = build_sft_config(cfg, plan, has_eval=False, progress_bar=False, tuning=TuningConfig.from_env())
    assert args.ddp_bucket_cap_mb is None and args.fsdp_plugin_args["reshard_after_forward"] is True
    monkeypatch.setenv("KUBETUNE_DDP_BUCKET_MB", "200")
    monkeypatch.setenv("KUBETUNE_FSDP_RESHARD", "0")
    args = build_sft_config(cfg, plan, has_eval=False, progress_bar=False, tuning=TuningConfig.from_env())
    assert args.ddp_bucket_cap_mb == 200 and args.fsdp_plugin_args["reshard_after_forward"] is False
    for name, bad in (("KUBETUNE_DDP_BUCKET_MB", "lots"), ("KUBETUNE_FSDP_RESHARD", "yes")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(ValueError, match=name):
            build_sft_config(cfg, plan, has_eval=False, progress_bar=False, tuning=TuningConfig.from_env())
        monkeypatch.setenv(name, "1")


def test_a_gpu_memory_cap_is_validated_and_shrinks_the_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    from kubetune_api.tuning import GPU_MEMORY_ENV
    from kubetune_trainer.plan.plan import limit_gpu_memory

    monkeypatch.setenv(GPU_MEMORY_ENV, "40 GiB")
    with pytest.raises(
        ValueError,
        match="KUBETUNE_GPU_MEMORY_GIB must be a number of GiB, at least 1 and below 10000, got '40 GiB'",
    ):
        TuningConfig.from_env()
    monkeypatch.setenv(GPU_MEMORY_ENV, "40")
    assert TuningConfig.from_env().gpu_memory_cap_bytes == 40 * 2**30

    # Hardware.detect on a (faked) 141 GiB H200 plans with the cap, and limit_gpu_memory holds the
    # allocator of this process's GPU (LOCAL_RANK) to the same 40 GiB
    class Props:
        total_memory = 141 * 2**30
        name = "NVIDIA H200"

    held: list[tuple[float, int]] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: Props())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, d: held.append((f, d)))
    monkeypatch.setenv("LOCAL_RANK", "3")
    hw = Hardware.detect()
    assert hw.cuda and hw.gpu_memory_bytes == 40 * 2**30 and hw.peak_flops == 989.4e12
    assert limit_gpu_memory() == pytest.approx(40 / 141) and held == [(pytest.approx(40 / 141), 3)]
    monkeypatch.delenv(GPU_MEMORY_ENV)
    assert Hardware.detect().gpu_memory_bytes == 141 * 2**30 and limit_gpu_memory() is None

    # Qwen3-4B full no longer fits its 8 rows without recomputation in the capped budget
    training = TrainingSpec(max_steps=1, batch_size=1, gradient_accumulation_steps=8)
    whole = make_plan(training, H200, shape=QWEN3_4B, lora=False)
    capped = make_plan(training, hw, shape=QWEN3_4B, lora=False)
    assert (whole.per_device_batch_size, whole.gradient_checkpointing) == (8, False)
    assert capped.gradient_checkpointing or capped.per_device_batch_size < 8


# The shapes of the benchmark's models (parameters of every matrix multiply, as bench counts them)
QWEN3_4B_BENCH = ModelShape(params=4_020_000_000, hidden_size=2560, num_layers=36, vocab_size=151_936)
QWEN2_05B_BENCH = ModelShape(params=494_000_000, hidden_size=896, num_layers=24, vocab_size=151_936)


def _capped(gib: float) -> Hardware:
    return Hardware(cuda=True, bf16=True, gpu_memory_bytes=int(gib * 2**30), varlen=True, peak_flops=989.4e12)


def test_small_budgets_recompute_rather_than_train_in_one_row_micro_steps() -> None:
    """Held to notebook A's 3.61 GiB, 32 rows in 1-row micro-steps without recomputation ran 8.1k
    tokens/s on an H200 (0.56x notebook A); 16-row micro-steps with recomputation, the plan's choice
    now, ran 59.3k (3.91x) at 3.19 GiB."""
    notebook_a = TrainingSpec(max_steps=1, batch_size=8, gradient_accumulation_steps=4, max_length=1024)
    plan = make_plan(notebook_a, _capped(3.61), shape=QWEN2_05B_BENCH, lora=True)
    assert plan.gradient_checkpointing and plan.torch_compile
    assert plan.per_device_batch_size * plan.gradient_accumulation_steps == 32
    assert plan.per_device_batch_size >= 8, plan.reasons["batch"]
    assert "with recomputation" in plan.reasons["batch"] and "estimated" in plan.reasons["batch"]
    # the micro-step and its loss chunks stay inside the budget
    budget = 0.85 * 3.61 * 2**30
    tokens = plan.per_device_batch_size * 1024
    need = estimate_training_bytes(QWEN2_05B_BENCH, lora=True, tokens=tokens, checkpointing=True)
    assert need + 4 * plan.loss_chunk_factor * tokens * 896 <= budget


def test_a_mid_sized_budget_keeps_small_micro_steps_without_recomputation() -> None:
    """Qwen3-4B full at 48 GiB on an H200: 2 rows x 4 without recomputation 17.8k tokens/s, 8 rows
    with it 15.9k: the plan keeps the first."""
    notebook_b = TrainingSpec(max_steps=1, batch_size=1, gradient_accumulation_steps=8, max_length=1024)
    plan = make_plan(notebook_b, _capped(48), shape=QWEN3_4B_BENCH, lora=False)
    assert (plan.per_device_batch_size, plan.gradient_accumulation_steps) == (2, 4)
    assert not plan.gradient_checkpointing and "without recomputation" in plan.reasons["batch"]
    # the whole GPU: the whole step in one micro-step, no recomputation (unchanged)
    whole = make_plan(notebook_b, _capped(139.8), shape=QWEN3_4B_BENCH, lora=False)
    assert (whole.per_device_batch_size, whole.gradient_checkpointing) == (8, False)
    lora = make_plan(
        TrainingSpec(max_steps=1, batch_size=8, gradient_accumulation_steps=4, max_length=1024),
        _capped(139.8),
        shape=QWEN2_05B_BENCH,
    )
    assert (lora.per_device_batch_size, lora.gradient_checkpointing) == (32, False)


def test_a_budget_too_small_for_one_row_says_so_and_takes_the_leanest_layout() -> None:
    notebook_b = TrainingSpec(max_steps=1, batch_size=1, gradient_accumulation_steps=8, max_length=1024)
    plan = make_plan(notebook_b, _capped(32.7), shape=QWEN3_4B_BENCH, lora=False)
    assert (plan.per_device_batch_size, plan.gradient_accumulation_steps) == (1, 8)
    # the loss head's chunks at their floor (128 MiB of logits), not Liger's thinnest
    assert (
        plan.gradient_checkpointing
        and plan.loss_chunk_factor * 1024 * 2560 <= 2**26 < (plan.loss_chunk_factor + 1) * 1024 * 2560
    )
    assert "not even 1 packed row" in plan.reasons["batch"]


def test_the_step_time_model_ranks_what_was_measured() -> None:
    from kubetune_trainer.plan.plan import estimate_step_seconds

    def t(shape: ModelShape, rows: int, micro: int, rc: bool, peak: float | None = 989.4e12) -> float:
        return estimate_step_seconds(
            shape, tokens=rows * 1024, micro_steps=micro, checkpointing=rc, peak_flops=peak
        )

    # measured (s a step): 3.90, 0.446, 0.500, 0.39
    assert t(QWEN2_05B_BENCH, 1, 32, False) == pytest.approx(3.84)
    assert t(QWEN3_4B_BENCH, 2, 4, False) < t(QWEN3_4B_BENCH, 8, 1, True)
    assert t(QWEN3_4B_BENCH, 8, 1, False) == pytest.approx(0.40, abs=0.01)
    # a slower GPU (or one not listed) spends longer on the same FLOPs
    assert (
        t(QWEN3_4B_BENCH, 8, 1, False, 121e12)
        > t(QWEN3_4B_BENCH, 8, 1, False, None)
        > t(QWEN3_4B_BENCH, 8, 1, False)
    )


def test_make_plan_reads_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuning variables reach the plan as its ``tuning`` argument only: with every one of them
    (and the launcher's) set to nonsense, make_plan plans as in a clean environment."""
    from kubetune_api.tuning import TUNING_ENV

    h100x8 = Hardware(cuda=True, bf16=True, world_size=8, gpu_memory_bytes=80 * 2**30, varlen=True)
    cases = [(CPU, None, True), (H200, QWEN3_4B, False), (h100x8, QWEN3_4B, False), (H200, QWEN2_05B, True)]
    for name in TUNING_ENV:
        monkeypatch.delenv(name, raising=False)
    clean = [make_plan(TrainingSpec(max_steps=1), hw, shape=shape, lora=lora) for hw, shape, lora in cases]
    for name in [*TUNING_ENV, "WORLD_SIZE", "LOCAL_RANK", "RANK"]:
        monkeypatch.setenv(name, "nonsense")
    dirty = [make_plan(TrainingSpec(max_steps=1), hw, shape=shape, lora=lora) for hw, shape, lora in cases]
    assert dirty == clean
    # and the tuning config is where a value does count
    forced = make_plan(
        TrainingSpec(max_steps=1), h100x8, shape=QWEN3_4B, lora=False, tuning=TuningConfig(sharding="fsdp2")
    )
    assert forced.sharding == "fsdp2" and clean[2].sharding == "ddp"
