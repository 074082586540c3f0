"""The benchmark's profile summary: kernel intervals merged so overlapping streams count once."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kubetune_bench.gpu_profile import union_us


def test_union_counts_overlaps_once() -> None:
    # computation 0-10 and 20-30; a collective 5-25 overlapping both: busy 0-30
    assert union_us([(20.0, 30.0), (0.0, 10.0), (5.0, 25.0)]) == 30.0


def test_union_of_nested_and_disjoint_spans() -> None:
    assert union_us([(0.0, 10.0), (2.0, 3.0), (40.0, 41.0)]) == 11.0
    assert union_us([]) == 0.0


def test_idle_gaps_are_attributed_to_the_host_events_in_flight() -> None:
    from kubetune_bench.gpu_profile import idle_gaps

    # kernels busy 0-100, 150-300 (two overlapping streams), 305-400; gaps 100-150 (50 us) and
    # 300-305 (5 us, under the threshold)
    kernels = [(0.0, 100.0), (150.0, 250.0), (200.0, 300.0), (305.0, 400.0)]
    host = [
        (0.0, 400.0, "optimizer step"),  # outermost over everything
        (90.0, 160.0, "aten::copy_"),
        (110.0, 140.0, "cudaStreamSynchronize"),  # innermost at the gap's middle (125)
        (500.0, 600.0, "later"),
    ]
    gaps, by = idle_gaps(kernels, host)
    assert gaps == [(100.0, 150.0)]
    assert by["outermost"] == {"optimizer step": 50.0}
    assert by["innermost"] == {"cudaStreamSynchronize": 50.0}
    # a gap with nothing recorded on the host is said to be so
    gaps, by = idle_gaps([(0.0, 10.0), (100.0, 110.0)], [(0.0, 5.0, "early")])
    assert gaps == [(10.0, 100.0)] and by["innermost"] == {"(nothing recorded)": 90.0}
