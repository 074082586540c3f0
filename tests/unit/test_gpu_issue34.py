"""hack/gpu/issue34.py's own logic (issue 34's GPU measurements): the learnable data, TRL's settings
from kubetune's plan, the MoE model's size by the plan's counting, the estimate's errors and the report.
The cases themselves train on the device machine (hack/gpu/issue34.sh)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType, SimpleNamespace

from kubetune_trainer.plan.params import count_params

REPO = Path(__file__).resolve().parents[2]


def _script() -> ModuleType:
    name = "gpu_issue34"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "hack" / "gpu" / "issue34.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_motif_rows_repeat_a_short_motif_from_a_narrow_span_at_the_given_lengths() -> None:
    m = _script()
    lengths = [1024, 300, 17, 850]
    rows = m.motif_rows(lengths, seed=3)
    assert [len(r) for r in rows] == lengths
    for row in rows:
        period = next(p for p in range(*m.MOTIF_LENGTHS) if row[p:] == row[:-p] or len(row) <= p)
        assert m.MOTIF_LENGTHS[0] <= period < m.MOTIF_LENGTHS[1] or len(row) <= period
        assert all(16 <= i < 16 + m.MOTIF_SPAN for i in row)
    assert rows == m.motif_rows(lengths, seed=3)  # the same data in every case's process
    assert rows != m.motif_rows(lengths, seed=4)
    # a vocabulary smaller than the span: ids stay inside it
    assert all(16 <= i < 512 for r in m.motif_rows([200] * 5, vocab=512) for i in r)


def test_trl_gets_kubetune_s_layout_and_the_example_s_hyperparameters() -> None:
    m = _script()
    training = SimpleNamespace(learning_rate=2e-4, weight_decay=0.01, warmup_steps=20)
    plan = {"per_device_batch_size": 1, "gradient_accumulation_steps": 16, "gradient_checkpointing": False}
    s = m.trl_settings(training, plan, max_length=1024)
    assert (s["per_device_train_batch_size"], s["gradient_accumulation_steps"]) == (1, 16)
    assert s["gradient_checkpointing"] is False and s["logging_steps"] == 1
    assert (s["learning_rate"], s["weight_decay"], s["warmup_steps"]) == (2e-4, 0.01, 20)
    assert s["packing"] and s["padding_free"] and s["packing_strategy"] == "bfd" and s["bf16"]
    cpu = m.trl_settings(training, plan, max_length=128, cuda=False)
    assert not cpu["bf16"] and not cpu["use_liger_kernel"] and cpu["optim"] == "adamw_torch"


def test_the_moe_model_is_qwen3_30b_a3b_s_layer_four_deep() -> None:
    m = _script()
    count = count_params(m.MOE_CONFIG)
    assert count.moe and count.num_experts == 128 and count.experts_per_token == 8 and count.moe_layers == 4
    assert 3.0e9 < count.total < 3.2e9  # 4 x 128 experts of 3 x 2048 x 768, two 151,936 x 2048 matrices
    assert 0.8e9 < count.active < 0.9e9
    tiny = count_params({**m.MOE_CONFIG, **m.TINY_MOE})
    assert tiny.moe and tiny.total < 1e6


def test_relative_error_and_the_report(tmp_path: Path) -> None:
    m = _script()
    assert m.relative_error(23.0, 20.0) == 0.15
    assert m.relative_error(None, 1.0) is None and m.relative_error(1.0, None) is None
    qlora = {"case": "qwen3-4b:kubetune-qlora", "runner": "kubetune", "tokens_per_second": 6123.4,
             "peak_memory_gib": 15.2, "peak_reserved_gib": 17.0, "estimated_peak_gib": 18.1, "steps": 27,
             "losses": [12.1, 11.0, 9.5], "cap_gib": 24.0}  # fmt: skip
    moe = {"case": "qwen3-moe-a3b-4l:kubetune", "tokens_per_second": 20000.0, "peak_memory_gib": 40.0,
           "steps_measured": 8, "losses": [], "estimate": {"peakMemoryGib": 44.0}}  # fmt: skip
    (tmp_path / "a.json").write_text(json.dumps(qlora))
    (tmp_path / "b.json").write_text(json.dumps(moe))
    table = m.report(tmp_path, None)
    assert "| qwen3-4b:kubetune-qlora | 6,123 | 15.2 (17.0) | 18.1 | 27 | 12.100 / 9.500 |" in table
    assert "| qwen3-moe-a3b-4l:kubetune | 20,000 | 40.0 (—) | 44.0 | 8 | — |" in table


def test_the_command_line() -> None:
    m = _script()
    args = m.build_parser().parse_args(["qlora", "--runner", "trl", "--out", "/x"])
    assert (args.runner, args.quant, args.cap_gib, args.model) == ("trl", "nf4", 24.0, "qwen3-4b")
    moe = m.build_parser().parse_args(["moe", "--out", "/x", "--no-compile"])
    assert moe.no_compile and not moe.tiny
