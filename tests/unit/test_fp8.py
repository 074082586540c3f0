"""KUBETUNE_FP8: when the plan turns float8 products on, and what the conversion does to a model.

The conversion runs here on the CPU (PyTorch emulates float8 products there); its speed is a GPU
matter, measured by ``hack/gpu/run.sh fp8`` (docs/benchmarks-history.md), and its GPU numerics are checked
by tests/gpu.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kubetune_api.spec import TrainingSpec
from kubetune_api.trainer_config import TrainerConfig
from kubetune_api.tuning import FP8_ENV, TuningConfig
from kubetune_trainer.plan.plan import Hardware, ModelShape, Plan, make_plan

H200 = Hardware(cuda=True, bf16=True, gpu_memory_bytes=141 * 2**30, varlen=True, fp8=True)
A100 = replace(H200, gpu_memory_bytes=80 * 2**30, fp8=False)
QWEN3_4B = ModelShape(params=4_000_000_000, hidden_size=2560, num_layers=36, vocab_size=151_936)


def _plan(hw: Hardware = H200, *, lora: bool = False, **training: object) -> Plan:
    return make_plan(
        TrainingSpec(max_steps=1, **training), hw, shape=QWEN3_4B, lora=lora, tuning=TuningConfig.from_env()
    )  # type: ignore[arg-type]


def test_fp8_is_off_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FP8_ENV, raising=False)
    plan = _plan()
    assert plan.fp8 == "off" and plan.reasons["fp8"] == "off (KUBETUNE_FP8 unset or off)"


def test_fp8_asked_for_a_full_fine_tune_on_an_fp8_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FP8_ENV, "tensorwise")
    plan = _plan()
    assert plan.fp8 == "tensorwise" and plan.torch_compile
    assert FP8_ENV in plan.reasons["fp8"]


@pytest.mark.parametrize(
    ("hw", "lora", "training", "why"),
    [
        (H200, True, {}, "LoRA trains small adapters"),
        (A100, False, {}, "fp8 tensor cores (compute capability 8.9+)"),
        (Hardware(cuda=False, bf16=True), False, {}, "fp8 tensor cores"),
        (H200, False, {"precision": "fp32"}, "bf16 weights, the run is fp32"),
        (H200, False, {"torch_compile": "never"}, "compiled decoder layers"),
    ],
)
def test_fp8_asked_where_it_cannot_pay_is_off_with_the_reason(
    monkeypatch: pytest.MonkeyPatch, hw: Hardware, lora: bool, training: dict[str, object], why: str
) -> None:
    monkeypatch.setenv(FP8_ENV, "tensorwise")
    plan = _plan(hw, lora=lora, **training)
    assert plan.fp8 == "off"
    assert why in plan.reasons["fp8"] and plan.reasons["fp8"].endswith(": off")


def test_fp8_is_off_for_a_model_too_small_for_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FP8_ENV, "tensorwise")
    qwen2_05b = ModelShape(params=500_000_000, hidden_size=896, num_layers=24, vocab_size=151_936)
    plan = make_plan(
        TrainingSpec(max_steps=1), H200, shape=qwen2_05b, lora=False, tuning=TuningConfig.from_env()
    )
    assert plan.fp8 == "off" and "hidden size (896) is below 2048" in plan.reasons["fp8"]


def test_the_trainer_converts_the_layers_to_fp8_before_compiling_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """build_trainer, as a pod and the benchmark run it: float8 first, then compilation (inductor
    must see the float8 layers to fuse their casts); neither without the plan asking."""
    from kubetune_trainer.training import build as builders
    from kubetune_trainer.training import fast

    calls: list[str] = []

    class Trainer:
        def __init__(self, model: object, **_: object) -> None:
            self.model = model

    monkeypatch.setattr(builders, "trainer_class", lambda: Trainer)
    monkeypatch.setattr(fast, "apply_fp8", lambda model, recipe: calls.append(f"fp8 {recipe}") or 10)
    monkeypatch.setattr(fast, "compile_layers", lambda model: calls.append("compile") or 2)
    monkeypatch.setenv(FP8_ENV, "tensorwise")
    plan = replace(_plan(), liger=False)
    assert plan.fp8 == "tensorwise"

    def build(p: Plan) -> None:
        builders.build_trainer(
            object(), None, None, train=None, evaluation=None, peft=None, callbacks=[], plan=p
        )

    build(plan)
    assert calls == ["fp8 tensorwise", "compile"]
    calls.clear()
    build(replace(plan, fp8="off"))
    assert calls == ["compile"]


def test_an_unknown_recipe_is_refused_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FP8_ENV, "rowwise")  # measured at a quarter of bf16's speed: not offered
    with pytest.raises(ValueError, match="KUBETUNE_FP8 must be off or tensorwise, got 'rowwise'"):
        _plan()


def test_fp8_micro_steps_are_padded_to_multiples_of_16(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kubetune_trainer.training.train import build_sft_config

    cfg = TrainerConfig.model_validate(
        {
            "job": {"name": "j"},
            "spec": {
                "model": {"name": "Qwen/Qwen3-4B"},
                "dataset": {"name": "trl-lib/Capybara"},
                "training": {"maxSteps": 10},
            },
            "experiment": "e",
            "registeredModelName": "m",
            "output_dir": str(tmp_path),
        }
    )
    monkeypatch.setenv(FP8_ENV, "tensorwise")
    plan = make_plan(cfg.spec.training, H200, shape=QWEN3_4B, lora=False, tuning=TuningConfig.from_env())
    # built on this CPU: the same arguments with the device set aside
    on = build_sft_config(cfg, replace(plan, device="cpu"), has_eval=False, progress_bar=False)
    off = build_sft_config(cfg, replace(plan, device="cpu", fp8="off"), has_eval=False, progress_bar=False)
    assert on.pad_to_multiple_of == 16 and on.padding_free
    assert off.pad_to_multiple_of is None


def test_conversion_swaps_the_large_layer_products_and_keeps_weights_and_loss() -> None:
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchao.float8")
    from tests.support.models import fp8_sized_llama
    from torchao.float8.float8_linear import Float8Linear

    from kubetune_trainer.training import fast

    model = fp8_sized_llama()
    # four tokens: on a CPU a float8 product is a plain loop (torch._scaled_mm, some 20 million
    # multiply-adds a second), and 2 x 64 tokens through the model's ten converted layers took 815 s
    # of the whole suite; four take about 30 s and go through every converted layer the same way
    ids = torch.randint(0, 4096, (1, 4))
    keys = set(model.state_dict())
    with torch.no_grad():
        reference = float(model(input_ids=ids, labels=ids).loss)

    # q, o, gate, up and down in each layer; k and v (512 features out), the LM head and the
    # embeddings stay bf16
    assert fast.apply_fp8(model, "tensorwise") == 10
    layer = model.model.layers[0]
    assert isinstance(layer.mlp.down_proj, Float8Linear) and isinstance(layer.self_attn.q_proj, Float8Linear)
    assert not isinstance(layer.self_attn.k_proj, Float8Linear)
    assert not isinstance(model.lm_head, Float8Linear)
    # checkpoints and the final model hold the same bf16 weights under the same names
    assert set(model.state_dict()) == keys
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())

    loss = model(input_ids=ids, labels=ids).loss
    assert abs(loss.item() - reference) / reference < 0.02, (loss.item(), reference)
    loss.backward()
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and bool(torch.isfinite(g).all()) for g in grads)


def test_the_padded_packed_row_keeps_every_example_apart_and_unlabelled_padding() -> None:
    """What ``pad_to_multiple_of=16`` makes of a padding-free micro-step (TRL's collator, as the trainer
    builds it): the row is a multiple of 16 long, and each padding token is a sequence of its own
    without a label, so no example attends to it and the loss ignores it."""
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    collate = DataCollatorForLanguageModeling(pad_token_id=0, padding_free=True, pad_to_multiple_of=16)
    batch = collate([{"input_ids": list(range(10, 15))}, {"input_ids": list(range(20, 27))}])
    assert batch["input_ids"].shape == (1, 16)
    assert batch["cu_seq_lens_q"].tolist() == [0, 5, 12, 13, 14, 15, 16]
    labels = batch["labels"][0].tolist()
    assert labels[:12] == [-100, 11, 12, 13, 14, -100, 21, 22, 23, 24, 25, 26]
    assert labels[12:] == [-100] * 4
