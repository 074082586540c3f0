"""LoRA's variants (issue 34 item 2): DoRA, rank-stabilised LoRA, the all-linear preset and QLoRA.

What the spec admits and refuses is the admission table's (tests/support/admission_table.py, run by
test_rules.py against the Python check and by the integration tests against the API server); here:
the PEFT and bitsandbytes settings the trainer builds from the spec, the memory the plan counts for
each method, and QLoRA refused by name wherever it cannot run (the preparation step, from the GPU
product, before anything is downloaded; the trainer, from the GPU it got, before anything is
loaded), without importing bitsandbytes, which the development environment does not have.
"""

from __future__ import annotations

import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from tests.e2e.conftest import TINY_DATA
from tests.support.models import one_layer_qwen2

from kubetune_api.failures import Failure
from kubetune_api.preparation import HINTS, Refusal
from kubetune_api.spec import TrainingSpec
from kubetune_api.trainer_config import TrainerConfig
from kubetune_trainer.plan.plan import (
    NF4_BYTES_PER_PARAM,
    TRAINED_PARAM_BYTES,
    Hardware,
    MethodNotSupported,
    ModelShape,
    estimate_training_bytes,
    make_plan,
    method_of,
    shape_from_config,
)

QWEN3_4B = shape_from_config(
    {
        "hidden_size": 2560,
        "num_hidden_layers": 36,
        "vocab_size": 151936,
        "intermediate_size": 9728,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
)
QWEN3_14B = shape_from_config(
    {
        "hidden_size": 5120,
        "num_hidden_layers": 40,
        "vocab_size": 151936,
        "intermediate_size": 17408,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
    }
)
L4 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=24 * 2**30, capability=(8, 9), name="NVIDIA L4")
T4 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=16 * 2**30, capability=(7, 5), name="Tesla T4")
CPU = Hardware(cuda=False, bf16=False)


def cfg(tmp_path: Path, lora: dict[str, Any] | None = None, **resources: Any) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "job": {"name": "methods", "namespace": "default", "uid": str(uuid.uuid4())},
            "spec": {
                "model": {"path": str(tmp_path / "model")},
                "dataset": {"path": str(TINY_DATA), "format": "messages"},
                "method": "lora",
                "lora": lora or {},
                "training": {"maxSteps": 4, "maxLength": 128},
                "resources": resources,
            },
            "outputDir": str(tmp_path / "out"),
            "experiment": "test/methods",
            "registeredModelName": "methods",
        }
    )


# --- the PEFT and bitsandbytes settings -------------------------------------------------------------


def test_dora_rslora_and_the_all_linear_preset_reach_peft(tmp_path: Path) -> None:
    from kubetune_trainer.training.build import build_peft_config

    built = build_peft_config(
        cfg(tmp_path, {"r": 64, "alpha": 16, "targetModules": ["all-linear"], "dora": True, "rsLora": True})
    )
    # PEFT's preset is the string itself: a list would look for a module named "all-linear"
    assert built.target_modules == "all-linear"
    assert (built.use_dora, built.use_rslora, built.r, built.lora_alpha) == (True, True, 64, 16)

    plain = build_peft_config(cfg(tmp_path, {"targetModules": ["q_proj", "v_proj"]}))
    assert set(plain.target_modules) == {"q_proj", "v_proj"}
    assert (plain.use_dora, plain.use_rslora) == (False, False)


def test_rslora_scales_the_adapter_by_alpha_over_the_root_of_the_rank(tmp_path: Path) -> None:
    import torch
    from peft import get_peft_model

    from kubetune_trainer.training.build import build_peft_config

    tiny = one_layer_qwen2(torch.float32)
    adapter = {"r": 16, "alpha": 8, "targetModules": ["all-linear"]}
    rs = get_peft_model(tiny, build_peft_config(cfg(tmp_path, {**adapter, "rsLora": True})))
    q = rs.base_model.model.model.layers[0].self_attn.q_proj
    assert q.scaling["default"] == pytest.approx(8 / 16**0.5)
    # every linear layer of the decoder adapted, the output head not
    adapted = {n.rsplit(".", 1)[-1] for n, m in rs.named_modules() if hasattr(m, "lora_A")}
    assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def test_qlora_loads_nf4_with_double_quantization_and_bf16_compute_on_the_process_gpu() -> None:
    import torch

    from kubetune_trainer.training import quantization

    kwargs = quantization.load_kwargs(nf4=True, local_rank=3)
    bnb = kwargs["quantization_config"]
    assert bnb.load_in_4bit and not bnb.load_in_8bit
    assert (bnb.bnb_4bit_quant_type, bnb.bnb_4bit_use_double_quant) == ("nf4", True)
    assert bnb.bnb_4bit_compute_dtype == torch.bfloat16
    assert kwargs["device_map"] == {"": 3}
    assert quantization.load_kwargs(nf4=False, local_rank=3) == {}
    assert "bitsandbytes" not in sys.modules, "building the settings must not import bitsandbytes"


def test_a_4bit_model_is_prepared_for_k_bit_training_as_peft_does() -> None:
    """PEFT's preparation on a stand-in for a 4-bit model: the base frozen, its bf16 weights in fp32."""
    import torch

    from kubetune_trainer.training import quantization

    model = one_layer_qwen2(torch.bfloat16)
    model.is_loaded_in_4bit = True  # what transformers sets on a bitsandbytes 4-bit model
    prepared = quantization.prepare(model, nf4=True, gradient_checkpointing=True)
    assert not any(p.requires_grad for p in prepared.parameters())
    assert {p.dtype for p in prepared.parameters()} == {torch.float32}
    assert prepared.is_gradient_checkpointing
    untouched = one_layer_qwen2(torch.float32)
    assert quantization.prepare(untouched, nf4=False, gradient_checkpointing=True) is untouched


# --- the memory each method needs ------------------------------------------------------------------


def test_the_plan_counts_4_bit_base_weights_and_doras_magnitudes_and_outputs() -> None:
    tokens = 4096
    bytes_of = {
        (nf4, dora, recompute): estimate_training_bytes(
            QWEN3_4B, lora=True, tokens=tokens, checkpointing=recompute, nf4=nf4, dora=dora
        )
        for nf4 in (False, True)
        for dora in (False, True)
        for recompute in (False, True)
    }
    lora, qlora = bytes_of[(False, False, True)], bytes_of[(True, False, True)]
    embeddings = 2 * QWEN3_4B.vocab_size * QWEN3_4B.hidden_size
    layers = QWEN3_4B.params - embeddings
    # the decoder layers in 4 bits instead of bf16; embedding and head in fp32; fp32 layer inputs
    saved = 2 * QWEN3_4B.params - (int(NF4_BYTES_PER_PARAM * layers) + 4 * embeddings)
    saved -= 2 * layers // QWEN3_4B.num_layers + tokens * QWEN3_4B.hidden_size * (2 * QWEN3_4B.num_layers + 2)
    assert lora - qlora == saved and qlora < 0.8 * lora
    assert pytest.approx(0.516, abs=1e-3) == NF4_BYTES_PER_PARAM
    # DoRA: fp32 magnitudes per output feature of each layer, and two bf16 copies of the outputs per
    # token for every layer (for the one recomputed with recomputation)
    magnitudes = TRAINED_PARAM_BYTES * QWEN3_4B.adapted_outputs * QWEN3_4B.num_layers
    for nf4 in (False, True):
        for recompute, kept in ((False, QWEN3_4B.num_layers), (True, 1)):
            extra = bytes_of[(nf4, True, recompute)] - bytes_of[(nf4, False, recompute)]
            outputs = tokens * 4 * QWEN3_4B.adapted_outputs * kept
            assert magnitudes + outputs < extra < magnitudes + outputs + 2**28, (nf4, recompute)
    assert bytes_of[(False, True, False)] > 1.5 * bytes_of[(False, False, False)]
    # rsLoRA changes the scaling only: the same memory as LoRA (no argument for it)
    assert QWEN3_4B.adapted_width == 4096 + 2 * 1024 + 2560 + 2 * 9728 + 2560


def test_the_plan_of_each_method_says_what_it_is_and_compiles_qlora_only_when_asked() -> None:
    training = TrainingSpec(max_steps=4, max_length=1024, batch_size=2, gradient_accumulation_steps=8)
    gpu = Hardware(**{**L4.__dict__, "varlen": True})
    qlora = make_plan(training, gpu, shape=QWEN3_4B, nf4=True, dora=True)
    assert qlora.nf4 and qlora.dora and qlora.precision == "bf16"
    assert qlora.reasons["method"].startswith("QLoRA: LoRA on 4-bit NF4 base weights")
    assert "DoRA" in qlora.reasons["method"]
    assert qlora.torch_compile is False and "bitsandbytes" in qlora.reasons["torch_compile"]
    asked = TrainingSpec(max_steps=4, max_length=1024, torch_compile="always")
    assert make_plan(asked, gpu, shape=QWEN3_4B, nf4=True).torch_compile is True
    assert make_plan(training, gpu, shape=QWEN3_4B).torch_compile is True
    assert make_plan(training, gpu, lora=False).reasons["method"] == "full fine-tuning: every weight trained"


def test_qlora_is_refused_by_name_where_it_cannot_run() -> None:
    training = TrainingSpec(max_steps=4)
    with pytest.raises(MethodNotSupported, match=r"^spec\.lora\.quantization nf4 .* no GPU"):
        make_plan(training, CPU, nf4=True)
    with pytest.raises(MethodNotSupported, match=r"Tesla T4: compute capability 7\.5.* 8\.0 or newer"):
        make_plan(training, T4, nf4=True)
    with pytest.raises(MethodNotSupported, match=r"spec\.training\.precision must be bf16"):
        make_plan(TrainingSpec(max_steps=4, precision="fp16"), L4, nf4=True)
    assert make_plan(training, T4, dora=True).dora  # DoRA and plain LoRA run anywhere
    assert make_plan(training, CPU, dora=True).dora


def test_the_estimate_fits_qlora_of_qwen3_4b_on_24_gib_and_offers_it_when_lora_does_not(
    tmp_path: Path,
) -> None:
    from kubetune_api.preparation import DataStats
    from kubetune_trainer.plan.estimate import does_not_fit, estimate

    data = DataStats(
        train_examples=10_000,
        tokens=8_000_000,
        length_p50=800,
        length_p95=1024,
        length_max=1024,
        truncated_fraction=0.1,
        loss_token_fraction=1.0,
    )
    base = {"targetModules": ["all-linear"]}
    asked = {"gpuProduct": "NVIDIA-L4", "gpusPerNode": 1}
    qlora = cfg(tmp_path, {**base, "quantization": "nf4"}, **asked)
    assert method_of(qlora.spec) == {"lora": True, "nf4": True, "dora": False}
    est = estimate(qlora, QWEN3_4B, data)
    assert est.fits and est.gpu_memory_gib == 24 and est.peak_memory_gib < 0.85 * 24

    # Qwen3-14B: LoRA on its bf16 weights (~31 GiB) does not fit, QLoRA (~15 GiB) is what is offered
    lora = cfg(tmp_path, base, **asked)
    est = estimate(lora, QWEN3_14B, data)
    assert not est.fits
    message = does_not_fit(lora, QWEN3_14B, data, est)
    assert message is not None
    assert message.endswith("What would fit: spec.lora.quantization: nf4 (QLoRA: 4-bit base weights)")
    assert estimate(cfg(tmp_path, {**base, "quantization": "nf4"}, **asked), QWEN3_14B, data).fits
    # a full fine-tune that LoRA would fit: LoRA is named, not QLoRA as well
    full = lora.model_copy(update={"spec": lora.spec.model_copy(update={"method": "full", "lora": None})})
    message = does_not_fit(full, QWEN3_4B, data, estimate(full, QWEN3_4B, data))
    assert message is not None and message.endswith("; or method: lora instead of full")
    assert "nf4" not in message


# --- QLoRA refused before anything is held, downloaded or loaded ------------------------------------


def test_the_api_refuses_qlora_on_a_cpu_naming_the_field_and_the_remedy(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as refused:
        cfg(tmp_path, {"quantization": "nf4"}, gpusPerNode=0)
    (error,) = refused.value.errors()
    (problem,) = error["ctx"]["error"].problems
    assert problem.startswith("spec.lora.quantization: spec.lora.quantization nf4 (QLoRA) needs a GPU")
    assert "gpusPerNode above 0, or quantization: none" in problem


def test_preparation_refuses_qlora_on_an_older_gpu_product_before_downloading(tmp_path: Path) -> None:
    from kubetune_trainer.preparation.prepare import Refused, prepare

    job = cfg(tmp_path, {"quantization": "nf4"}, gpuProduct="Tesla-T4", gpusPerNode=1)
    with pytest.raises(Refused) as info:
        prepare(job)
    r = info.value.refusal
    assert r.reason == Refusal.QUANTIZATION_NOT_SUPPORTED and r.hint == HINTS[r.reason]
    assert r.message.startswith(
        "spec.lora.quantization nf4 (QLoRA) cannot run on Tesla-T4: compute capability 7.5"
    )
    assert not Path(job.output_dir).exists(), "nothing written before the refusal"
    # a product of Ampere or newer, or one kubetune does not know, is not refused by its name
    from kubetune_trainer.plan.estimate import method_refusal

    for product in ("NVIDIA-L4", "NVIDIA-A100-SXM4-40GB", "NVIDIA-H200", "Some-Future-GPU"):
        assert method_refusal(cfg(tmp_path, {"quantization": "nf4"}, gpuProduct=product)) is None
    assert method_refusal(cfg(tmp_path, {"dora": True}, gpuProduct="Tesla-T4")) is None


def test_the_trainer_refuses_qlora_on_this_cpu_before_loading_anything(tmp_path: Path) -> None:
    from kubetune_trainer.training import train

    job = cfg(tmp_path, {"quantization": "nf4"})
    outcome = train.run(job, progress_bar=False)
    assert outcome.status == "refused" and outcome.exit_code == 2
    assert outcome.failure is not None and outcome.failure.reason == Failure.QUANTIZATION_NOT_SUPPORTED
    assert (
        "spec.lora.quantization nf4 (QLoRA) cannot run on this machine: it has no GPU"
        in outcome.failure.message
    )
    assert not Path(job.output_dir).exists(), "nothing written before the refusal"
    assert "bitsandbytes" not in sys.modules


def test_without_bitsandbytes_qlora_is_refused_naming_the_group_that_brings_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    from kubetune_trainer.training import quantization

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "bitsandbytes" else real(name, *a)
    )
    message = quantization.missing_library()
    assert (
        message is not None and "trainer-gpu" in message and message.startswith("spec.lora.quantization nf4")
    )


def test_model_shapes_built_by_hand_estimate_their_adapted_width() -> None:
    by_hand = ModelShape(params=10**9, hidden_size=1000, num_layers=10, vocab_size=1000)
    assert by_hand.adapted_outputs == int((5 + 2 * 3.8) * 1000)
