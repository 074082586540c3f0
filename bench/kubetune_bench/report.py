"""The benchmark's report: each row's ratios (against its notebook, against one GPU), the markdown
table and the chart, written as bench.json, bench.md and bench.png beside the cases' own JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .cases import BASELINE, CASES, PEERS
from .peers import is_peer

# the report's name of each peer column
PEER_COLUMNS = {"trl-best": "vs TRL best", "unsloth": "vs Unsloth"}


def ratio_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each kubetune row against its notebook (one GPU each) and each multi-GPU row against one GPU."""

    def plain(r: dict[str, Any]) -> bool:
        return (
            r.get("gpus", 1) == 1
            and not r.get("epoch_training_seconds")
            and not r.get("memory_cap_gib")
            and r.get("fp8", "off") == "off"
            and not r.get("notebook_step_rows")
            and not r.get("training_overrides")
        )

    rows = []
    for r in results:
        row = dict(r)
        if r.get("gpus", 1) > 1:
            single = next(
                (
                    b
                    for b in results
                    if plain(b)
                    and b["model"] == r["model"]
                    and b["kind"] == r["kind"]
                    and b["tokens_per_second"]
                ),
                None,
            )
            if single:
                row["scaling"] = round(r["tokens_per_second"] / single["tokens_per_second"], 2)
        elif not r.get("epoch_training_seconds"):
            base_kind = BASELINE.get(r["kind"])
            base = next(
                (b for b in results if plain(b) and b["model"] == r["model"] and b["kind"] == base_kind), None
            )
            if base and base["tokens_per_second"]:
                row["speedup"] = round(r["tokens_per_second"] / base["tokens_per_second"], 2)
                if base.get("peak_memory_gib") and r.get("peak_memory_gib"):
                    row["memory_ratio"] = round(r["peak_memory_gib"] / base["peak_memory_gib"], 2)
        rows.append(row)
    _peer_ratios(rows)
    return rows


def best_peer_rows(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The fastest row of each peer's sweep, by (model, kind): the peer at its best."""
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rows:
        if is_peer(r["kind"]) and r.get("tokens_per_second") and r.get("gpus", 1) == 1:
            key = (r["model"], r["kind"])
            if key not in best or r["tokens_per_second"] > best[key]["tokens_per_second"]:
                best[key] = r
    return best


def _peer_ratios(rows: list[dict[str, Any]]) -> None:
    """Each kubetune row against each peer at its best (``vs_trl-best``, ``vs_unsloth``, and the
    memory ratio beside each); the best row of each sweep is marked ``sweep_best``."""
    best = best_peer_rows(rows)
    for r in best.values():
        r["sweep_best"] = True
    for r in rows:
        for column, peer_kind in PEERS.get(r["kind"], {}).items():
            peer = best.get((r["model"], peer_kind))
            if peer is None or r.get("gpus", 1) > 1 or r.get("epoch_training_seconds"):
                continue
            r[f"vs_{column}"] = round(r["tokens_per_second"] / peer["tokens_per_second"], 2)
            if peer.get("peak_memory_gib") and r.get("peak_memory_gib"):
                r[f"memory_vs_{column}"] = round(r["peak_memory_gib"] / peer["peak_memory_gib"], 2)


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a markdown table, then a line for each whole epoch and each failed compiled run."""
    head = (
        "| case | GPUs | tokens/s | tokens a step (all GPUs) | step s | peak GiB (per GPU) | MFU | vs notebook "
        "| memory vs notebook | vs 1 GPU | vs TRL best | vs Unsloth |"
        "\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    )
    lines = [head]

    def ratio(value: Any) -> str:
        return f"{value}x" if value else "—"

    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "n/a"
        mem = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") is not None else "n/a"
        cap = f" (cap {r['memory_cap_gib']:g} GiB)" if r.get("memory_cap_gib") else ""
        per_step = f"{r['tokens'] / r['steps_measured']:,.0f}" if r.get("steps_measured") else "n/a"
        lines.append(
            f"| {r['case']}{cap} | {r.get('gpus', 1)} | {r['tokens_per_second']:,.0f} | {per_step} "
            f"| {r['step_seconds']:.3f} "
            f"| {mem} | {mfu} | {ratio(r.get('speedup'))} | {ratio(r.get('memory_ratio'))} "
            f"| {ratio(r.get('scaling'))} | {ratio(r.get('vs_trl-best'))} | {ratio(r.get('vs_unsloth'))} |"
        )
    lines += _peer_lines(rows)
    for r in rows:
        if r.get("epoch_training_seconds"):
            lines.append(
                f"\nOne epoch of {r['tokens']:,} tokens ({r['case']}): {r['steps_measured']} optimizer steps "
                f"in {r['epoch_training_seconds']:.1f} s of training (trainer.train(), compilation included)."
            )
        if r.get("compile_error"):
            lines.append(
                f"\n{r['case']}: the compiled run failed ({r['compile_error']}); measured uncompiled."
            )
    return "\n".join(lines) + "\n"


def _peer_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Under the table: each peer's sweep (its best in bold) and what its best lacked on the machine."""
    lines = []
    sweeps: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        if is_peer(r["kind"]):
            sweeps.setdefault((r["model"], r["kind"]), []).append(r)
    for (model, kind), points in sweeps.items():
        tried = ", ".join(
            ("**{}**" if p.get("sweep_best") else "{}").format(
                f"{p['case'].split('(', 1)[-1].rstrip(')')}: {p['tokens_per_second']:,.0f} tokens/s"
            )
            for p in points
        )
        lines.append(f"\n{model} {kind} sweep: {tried}.")
        lacks = next((p.get("lacks") for p in points if p.get("lacks")), None)
        if lacks:
            lines.append(f"{model} {kind} lacked: " + "; ".join(lacks) + ".")
    return lines


def chart(rows: list[dict[str, Any]], path: Path) -> None:
    """A PNG of tokens/s (with each row's speedup over its notebook) and peak memory per row."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [
        r["case"] + (f"\n(cap {r['memory_cap_gib']:g} GiB)" if r.get("memory_cap_gib") else "") for r in rows
    ]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = [
        "#999999" if r["kind"].startswith("notebook") else ("#e08a2c" if is_peer(r["kind"]) else "#2a7ab9")
        for r in rows
    ]
    ax1.bar(range(len(rows)), [r["tokens_per_second"] for r in rows], color=colors)
    ax1.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax1.set_ylabel("training tokens / s (real tokens)")
    for i, r in enumerate(rows):
        if r.get("speedup"):
            ax1.text(i, r["tokens_per_second"], f"{r['speedup']}x", ha="center", va="bottom", fontsize=9)
    ax2.bar(range(len(rows)), [r.get("peak_memory_gib") or 0 for r in rows], color=colors)
    ax2.set_xticks(range(len(rows)), labels, rotation=30, ha="right", fontsize=8)
    ax2.set_ylabel("peak GPU memory (GiB)")
    fig.suptitle(
        "kubetune defaults (blue) vs the notebooks' configurations (grey) and the peers (orange), "
        "same GPU, model and data"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(out: Path, failed: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """bench.json, bench.md and bench.png from every case result in ``out`` (one run, possibly on several GPUs)."""
    results = [
        json.loads(p.read_text())
        for p in sorted(out.glob("*.json"))
        if p.name != "bench.json" and p.name.startswith(tuple(c.replace(":", "_") for c in CASES))
    ]
    order = {c: i for i, c in enumerate(CASES)}
    results.sort(key=lambda r: (order.get(r["case"].split(" ")[0], 99), r.get("gpus", 1), r["case"]))
    rows_out = ratio_rows(results)
    (out / "bench.json").write_text(json.dumps({"results": rows_out, "failed": failed or []}, indent=2))
    (out / "bench.md").write_text(markdown_table(rows_out))
    if rows_out:
        chart(rows_out, out / "bench.png")
    print(markdown_table(rows_out))
    return rows_out
