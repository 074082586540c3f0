"""What the GPU did during a case's measured steps (``kubetune bench --profile``): busy time as the union
of its kernels' intervals, the idle gaps and the host work in flight during each, the costliest ops."""

from __future__ import annotations

import heapq
import itertools
from collections import defaultdict
from typing import Any


def merged_spans(spans: list[tuple[float, float]]) -> list[list[float]]:
    """[start, end) intervals merged where they overlap or touch, in time order."""
    merged: list[list[float]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def union_us(spans: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (overlaps count once)."""
    return sum(end - start for start, end in merged_spans(spans))


def idle_gaps(
    kernels: list[tuple[float, float]], host: list[tuple[float, float, str]], *, min_gap_us: float = 20.0
) -> tuple[list[tuple[float, float]], dict[str, dict[str, float]]]:
    """The GPU's idle gaps (between the union of its kernels' intervals, at least ``min_gap_us``) and,
    for each, the host events in flight at its middle: the time of the gaps by the outermost (longest)
    and by the innermost (shortest) of them, i.e. what the host was doing while the GPU waited."""
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(merged_spans(kernels)) if b[0] - a[1] >= min_gap_us]
    by: dict[str, dict[str, float]] = {"outermost": defaultdict(float), "innermost": defaultdict(float)}
    events = sorted(host)
    active: list[tuple[float, float, float, str]] = []  # (end, -length, start, name): a heap by end
    i = 0
    for g0, g1 in gaps:  # gaps come in time order
        mid = (g0 + g1) / 2
        while i < len(events) and events[i][0] <= mid:
            start, end, name = events[i]
            heapq.heappush(active, (end, start - end, start, name))
            i += 1
        while active and active[0][0] <= mid:
            heapq.heappop(active)
        if not active:
            by["outermost"]["(nothing recorded)"] += g1 - g0
            by["innermost"]["(nothing recorded)"] += g1 - g0
            continue
        outer = min(active, key=lambda e: e[1])  # longest
        inner = max(active, key=lambda e: e[1])  # shortest
        by["outermost"][outer[3]] += g1 - g0
        by["innermost"][inner[3]] += g1 - g0
    return gaps, by


def profile_summary(profiler: Any, *, wall: float, steps: int) -> str:
    """What the GPU did during the measured steps: busy fraction, then the costliest kernels and ops.

    Busy time is the union of the device kernels' intervals (overlapping streams count once), so
    ``1 - busy / wall`` is the time the GPU waited for the host. Under DDP/FSDP the computation's
    own union (every kernel but NCCL's) is given too: busy minus it is communication nothing hid,
    and the computation's summed time against one GPU's shows what sharing the SMs cost it.
    """
    from torch.autograd import DeviceType

    events = [e for e in profiler.events() if e.time_range.end > e.time_range.start]
    kernels = [
        (e.time_range.start, e.time_range.end, "nccl" in e.name.lower())
        for e in events
        if e.device_type == DeviceType.CUDA
    ]
    busy_s = union_us([(a, b) for a, b, _ in kernels]) / 1e6
    compute_s = union_us([(a, b) for a, b, comm in kernels if not comm]) / 1e6
    compute_sum_s = sum(b - a for a, b, comm in kernels if not comm) / 1e6
    per = max(steps, 1)
    head = (
        f"measured steps: {steps}, wall {wall:.3f} s ({wall / per:.3f} s/step), "
        f"GPU kernels {len(kernels)} ({len(kernels) / per:.0f}/step), "
        f"busy {busy_s:.3f} s = {busy_s / wall:.1%} of wall\n"
        f"per step: computation (kernels other than NCCL's) busy {compute_s / per * 1e3:.1f} ms "
        f"(their summed time {compute_sum_s / per * 1e3:.1f} ms), communication alone "
        f"{(busy_s - compute_s) / per * 1e3:.1f} ms, GPU idle {(wall - busy_s) / per * 1e3:.1f} ms\n\n"
        if wall > 0
        else ""
    )
    host = [(e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == DeviceType.CPU]
    gaps, by = idle_gaps([(a, b) for a, b, _ in kernels], host)
    idle = (
        f"GPU idle gaps of 20 us or more: {len(gaps) / per:.0f}/step, "
        f"{sum(b - a for a, b in gaps) / per / 1e3:.1f} ms/step; the host meanwhile (ms/step):\n"
    )
    for kind, spent in by.items():
        top = sorted(spent.items(), key=lambda kv: -kv[1])[:12]
        idle += f"  by the {kind} host event in flight:\n" + "".join(
            f"    {us / per / 1e3:8.2f}  {name[:110]}\n" for name, us in top
        )
    averages = profiler.key_averages()
    by_device = averages.table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90)
    by_cpu = averages.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=90)
    return head + idle + "\nby device time\n" + by_device + "\n\nby host time\n" + by_cpu + "\n"
