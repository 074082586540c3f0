"""The preparation report and refusal as readable lines, for ``kubetune prepare``, ``kubetune run
--local`` and ``kubetune watch`` (one renderer, the same words everywhere).

>>> from kubetune_api.preparation import PreparationRefusal, Refusal
>>> render_refusal(PreparationRefusal.of(Refusal.DATASET_EMPTY, "data.jsonl has no rows"))[:2]
['refused: DatasetEmpty', '  data.jsonl has no rows']
"""

from __future__ import annotations

from kubetune_api.preparation import Estimate, PreparationRefusal, PreparationReport


def _duration(seconds: float) -> str:
    """``45s``, ``12m30s``, ``3h05m`` (as ``kubetune watch`` writes durations)."""
    s = int(seconds)
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def _percent(fraction: float) -> str:
    return f"{100 * fraction:.1f}%"


def render_estimate(e: Estimate) -> list[str]:
    """The estimate: the GPUs, the peak memory against the GPU's, the layout, speed, time and cost."""
    product = e.gpu_product + (
        " (assumed: spec.resources.gpuProduct is not set)" if e.gpu_product_assumed else ""
    )
    fit = "fits" if e.fits else "DOES NOT FIT"
    layout = (
        f"{e.micro_batch_rows} rows ({e.micro_batch_tokens:,} tokens) a micro-step x "
        f"{e.gradient_accumulation_steps}, recomputation {'on' if e.gradient_checkpointing else 'off'}, "
        f"sharding {e.sharding}"
    )
    return [
        f"  GPUs            {e.gpus} x {product}",
        f"  memory          {e.peak_memory_gib:.1f} of {e.gpu_memory_gib:.0f} GiB per GPU (peak estimate, {fit})",
        f"  layout          {layout}",
        f"  speed           {e.tokens_per_second:,.0f} tokens/s",
        f"  time            {_duration(e.duration_seconds)} for {e.steps:,} steps",
        f"  cost            {e.gpu_hours:,.2f} GPU-hours",
    ]


def render_report(report: PreparationReport) -> list[str]:
    """What preparation found (data, lengths, revisions) and estimated, a few aligned lines."""
    d = report.data
    examples = f"{d.train_examples:,} training" + (
        f", {d.eval_examples:,} evaluation" if d.eval_examples else ""
    )
    lines = [
        "prepared"
        + (" (tokenized data reused)" if report.reused else "")
        + (f" in {report.seconds:.1f}s" if report.seconds is not None else ""),
        f"  examples        {examples}",
        *(
            [f"  converted       {report.converted_rows:,} rows from layout {report.dataset_layout}"]
            if report.converted_rows
            else []
        ),
        f"  tokens          {d.tokens:,} an epoch (after truncation)",
        f"  length          p50 {d.length_p50:,}  p95 {d.length_p95:,}  max {d.length_max:,} tokens",
        f"  truncated       {_percent(d.truncated_fraction)} of the examples cut at maxLength",
        f"  loss tokens     {_percent(d.loss_token_fraction)} of the tokens count in the loss",
    ]
    revisions = [
        f"model {report.model_revision}" if report.model_revision else "",
        f"data set {report.dataset_revision}" if report.dataset_revision else "",
    ]
    if any(revisions):
        lines.append("  revisions       " + ", ".join(r for r in revisions if r))
    lines.append(f"  tokenized       {report.tokenized_key}")
    if report.estimate is not None:
        lines += render_estimate(report.estimate)
    else:
        lines.append("  estimate        none (CPU training: nothing GPU-sized to plan)")
    return lines


def render_refusal(r: PreparationRefusal) -> list[str]:
    """The refusal: its reason, what was found, and what to do."""
    lines = [f"refused: {r.reason}", f"  {r.message}"]
    if r.hint:
        lines.append(f"  what to do: {r.hint}")
    return lines
