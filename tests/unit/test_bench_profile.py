"""The benchmark's profile summary: kernel intervals merged so overlapping streams count once."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from kubetune_trainer.bench import _union_us


def test_union_counts_overlaps_once() -> None:
    # computation 0-10 and 20-30; a collective 5-25 overlapping both: busy 0-30
    assert _union_us([(20.0, 30.0), (0.0, 10.0), (5.0, 25.0)]) == 30.0


def test_union_of_nested_and_disjoint_spans() -> None:
    assert _union_us([(0.0, 10.0), (2.0, 3.0), (40.0, 41.0)]) == 11.0
    assert _union_us([]) == 0.0
