"""``kubetune bench --startup`` (issue 22's benchmark) on the CPU: the synthetic conversations have
the token lengths asked for, a trainer process is timed to its first step's line and stopped
there, the estimate is set beside a case's measured result, and the whole restart comparison
(BEFORE over the Hub stand-in, prepare, AFTER offline) runs on the tiny model."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import pytest

from kubetune_bench import startup


def test_conversations_have_the_token_lengths_asked_for(tmp_path: Path) -> None:
    tokenizer, words_per_token = startup.tokenizer_for(1024, sample=200)
    path = tmp_path / "data.jsonl"
    targets = startup.write_conversations(path, 120, words_per_token=words_per_token, max_length=1024)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == 120
    for row in rows:
        roles = [m["role"] for m in row["messages"]]
        assert roles[0] == "user" and "assistant" in roles and len(roles) % 2 == 0
    lengths = [
        len(tokenizer.apply_chat_template(row["messages"], tokenize=True)["input_ids"]) for row in rows
    ]
    # Capybara-like: median ~850 tokens, about 39% above 1024, a tail beyond it
    assert statistics.median(lengths) == pytest.approx(statistics.median(targets), rel=0.1)
    assert 0.25 < sum(n > 1024 for n in lengths) / len(lengths) < 0.55
    assert max(targets) > 1024


def test_a_process_is_timed_to_its_first_step_line_and_stopped_there(tmp_path: Path) -> None:
    child = (
        "import time; print('loading', flush=True); time.sleep(0.5); "
        "print(\"{'loss': '12.4', 'grad_norm': '1.0'}\", flush=True); time.sleep(60)"
    )
    timed = startup.timed_process(
        "child", [sys.executable, "-c", child], {}, tmp_path / "child.log", timeout=30, first_step=True
    )
    assert timed.exit_code == 0 and timed.first_step_seconds is not None
    assert 0.4 < timed.first_step_seconds <= timed.seconds < 20  # killed, not slept out
    assert "'loss'" in (tmp_path / "child.log").read_text()

    quiet = startup.timed_process(
        "quiet",
        [sys.executable, "-c", "print('no step')"],
        {},
        tmp_path / "q.log",
        timeout=30,
        first_step=True,
    )
    assert quiet.first_step_seconds is None and quiet.exit_code == 0


def test_the_estimate_beside_a_measured_case(tmp_path: Path) -> None:
    measured = {
        "case": "qwen3-4b:kubetune",
        "device": "NVIDIA H200",
        "tokens_per_second": 20000.0,
        "peak_memory_gib": 55.0,
        "plan": {
            "per_device_batch_size": 8,
            "gradient_accumulation_steps": 1,
            "gradient_checkpointing": False,
        },
        "steps_measured": 3,
    }
    (tmp_path / "qwen3-4b_kubetune.json").write_text(json.dumps(measured))
    rows = {r["case"]: r for r in startup.estimate_rows(tmp_path, rows=200, steps=6)}
    full, lora = rows["qwen3-4b:kubetune"], rows["qwen2-0.5b:kubetune"]
    est = full["estimate"]
    assert est["gpuProduct"] == "NVIDIA-H200" and est["gpus"] == 1
    assert full["tokens_per_second_error"] == pytest.approx(est["tokensPerSecond"] / 20000 - 1, abs=1e-3)
    assert full["peak_memory_error"] == pytest.approx(est["peakMemoryGib"] / 55 - 1, abs=1e-3)
    assert lora["measured"] is None and lora["estimate"]["gpus"] == 1  # the 8-GPU example, on one GPU
    table = startup.estimate_table(list(rows.values()))
    assert "| qwen3-4b:kubetune (NVIDIA-H200) | 8 rows x 1; 8 rows x 1 |" in table


@pytest.mark.training
def test_restart_comparison_on_the_tiny_model(tmp_path: Path) -> None:
    args = argparse.Namespace(out=tmp_path, startup="restart", smoke=True, rows=40, steps=2, examples=None)
    assert startup.run_from_args(args) == 0
    result = json.loads((tmp_path / "startup-restart.json").read_text())
    before, prepared, after = result["before"], result["prepare"], result["after"]
    assert before["first_step_seconds"] and after["first_step_seconds"] and result["ratio"]
    assert prepared["exit_code"] == 0 and result["report"]["data"]["trainExamples"] == 36
    # BEFORE downloads from the Hub stand-in, preparation too; the restart asks it nothing
    assert before["hub_requests"] > 0 and prepared["hub_requests"] > 0 and after["hub_requests"] == 0

    def first_loss(name: str) -> str:
        text = (tmp_path / f"startup-{name}.log").read_text()
        return next(line.split("]", 1)[1] for line in text.splitlines() if "'loss'" in line)

    assert first_loss("before") == first_loss("after")  # the same tokens, read from the volume
    assert "BEFORE/AFTER" in (tmp_path / "startup-restart.md").read_text()
    assert not (tmp_path / "startup-work").exists()
