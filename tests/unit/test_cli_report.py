"""The preparation report and refusal as the CLI prints them (kubetune prepare, run --local, watch),
from contract models, and ``kubetune watch`` showing status.preparation once when it appears."""

from __future__ import annotations

import io
from typing import Any

from kubetune_api.preparation import (
    HINTS,
    DataStats,
    Estimate,
    PreparationRefusal,
    PreparationReport,
    Refusal,
)
from kubetune_cli import watch
from kubetune_cli.main import build_parser
from kubetune_cli.report import render_refusal, render_report

DATA = DataStats(
    train_examples=14_400,
    eval_examples=1_600,
    tokens=11_234_567,
    length_p50=612,
    length_p95=2_480,
    length_max=9_001,
    truncated_fraction=0.0812,
    loss_token_fraction=0.4215,
)
ESTIMATE = Estimate(
    gpu_product="NVIDIA-H100-80GB-HBM3",
    gpu_product_assumed=True,
    gpus=8,
    gpu_memory_gib=80,
    peak_memory_gib=46.3,
    fits=True,
    micro_batch_rows=32,
    micro_batch_tokens=32_768,
    gradient_accumulation_steps=1,
    gradient_checkpointing=False,
    sharding="ddp",
    steps=43,
    tokens_per_second=91_234.5,
    duration_seconds=3_725,
    gpu_hours=8.28,
)
REPORT = PreparationReport(
    model_revision="aaaa1111",
    dataset_revision="bbbb2222",
    tokenized_key="k123",
    reused=True,
    data=DATA,
    estimate=ESTIMATE,
    seconds=12.34,
)


def test_the_report_lines_carry_every_number() -> None:
    text = "\n".join(render_report(REPORT))
    for part in (
        "prepared (tokenized data reused) in 12.3s",
        "14,400 training, 1,600 evaluation",
        "11,234,567 an epoch",
        "p50 612  p95 2,480  max 9,001 tokens",
        "8.1% of the examples cut at maxLength",
        "42.1% of the tokens count in the loss",
        "model aaaa1111, data set bbbb2222",
        "8 x NVIDIA-H100-80GB-HBM3 (assumed: spec.resources.gpuProduct is not set)",
        "46.3 of 80 GiB per GPU (peak estimate, fits)",
        "32 rows (32,768 tokens) a micro-step x 1, recomputation off, sharding ddp",
        "91,234 tokens/s",
        "1h02m for 43 steps",
        "8.28 GPU-hours",
    ):
        assert part in text, (part, text)


def test_a_report_without_estimate_or_revisions() -> None:
    lines = render_report(PreparationReport(tokenized_key="k", data=DATA))
    text = "\n".join(lines)
    assert lines[0] == "prepared" and "revisions" not in text and "assumed" not in text
    assert "estimate        none (CPU training" in text
    late = ESTIMATE.model_copy(update={"fits": False, "gpu_product_assumed": False})
    text = "\n".join(render_report(REPORT.model_copy(update={"estimate": late})))
    assert "(peak estimate, DOES NOT FIT)" in text and "8 x NVIDIA-H100-80GB-HBM3\n" in text


def test_rows_converted_from_another_layout_are_a_line_of_their_own() -> None:
    assert not any("converted" in line for line in render_report(REPORT))
    lines = render_report(REPORT.model_copy(update={"dataset_layout": "alpaca", "converted_rows": 16_000}))
    assert lines[2] == "  converted       16,000 rows from layout alpaca"


def test_the_refusal_lines_say_why_and_what_to_do() -> None:
    lines = render_refusal(
        PreparationRefusal.of(Refusal.MOSTLY_TRUNCATED, "72% of 1,000 examples are longer")
    )
    assert lines == [
        "refused: MostlyTruncated",
        "  72% of 1,000 examples are longer",
        f"  what to do: {HINTS[Refusal.MOSTLY_TRUNCATED]}",
    ]


def job(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "j", "namespace": "ns"}, "status": {"phase": phase, **status}}


def test_watch_shows_the_report_once_when_it_appears() -> None:
    report = REPORT.wire()
    progress = {"step": 1, "totalSteps": 43, "percent": 2.3}
    stream = [
        job("Preparing"),
        job("Preparing", preparation=report),
        job("Training", preparation=report),
        job("Training", preparation=report, progress=progress),
        job("Succeeded", preparation=report),
    ]
    out = io.StringIO()
    assert watch.follow(stream, out) == 0
    text = out.getvalue()
    assert text.count("46.3 of 80 GiB per GPU") == 1 and text.count("14,400 training") == 1
    # after the phase it came with, before training's progress
    assert (
        text.index("Preparing")
        < text.index("8.28 GPU-hours")
        < text.index("Training")
        < text.index("step 1/43")
    )


def test_watch_ignores_an_unreadable_report() -> None:
    out = io.StringIO()
    watch.follow([job("Preparing", preparation={"data": "?"}), job("Succeeded")], out)
    assert "GPU-hours" not in out.getvalue()


def test_prepare_is_a_subcommand() -> None:
    args = build_parser().parse_args(["prepare", "job.yaml", "--output-dir", "/tmp/x"])
    assert args.command == "prepare" and str(args.manifest) == "job.yaml"
