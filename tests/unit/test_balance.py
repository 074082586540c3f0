"""Packed rows dealt across ranks: every row once, the same order on every rank, even work per micro-step."""

from __future__ import annotations

import statistics

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("trl")

from accelerate.data_loader import BatchSamplerShard  # noqa: E402
from torch.utils.data import BatchSampler, RandomSampler  # noqa: E402
from trl.data_utils import pack_dataset  # noqa: E402

from kubetune_bench.workload import synthetic_dataset  # noqa: E402
from kubetune_trainer.training.balance import RankBalancedSampler, balanced_sampler, row_cost  # noqa: E402

RANKS, ROWS = 2, 8


@pytest.fixture(scope="module")
def packed() -> object:
    """Capybara-like conversations packed into 1024-token rows as TRL packs them (BFD)."""
    return pack_dataset(synthetic_dataset(1200, 500, seed=3), 1024, strategy="bfd")


def rank_batches(sampler: object, rank: int) -> list[list[int]]:
    """The micro-batches accelerate hands one rank from this sampler (batch i goes to rank i % ranks)."""
    shard = BatchSamplerShard(
        BatchSampler(sampler, ROWS, drop_last=False), num_processes=RANKS, process_index=rank
    )
    return list(shard)


def skew(sampler: object, costs: list[float]) -> float:
    """Mean over micro-steps of the slowest rank's work over the mean rank's, minus one."""
    per_rank = [rank_batches(sampler, r) for r in range(RANKS)]
    steps = min(len(b) for b in per_rank) - 1  # the last may be topped up from the start
    over = []
    for k in range(steps):
        work = [sum(costs[i] for i in per_rank[r][k]) for r in range(RANKS)]
        over.append(max(work) / statistics.mean(work) - 1)
    return statistics.mean(over)


def test_every_row_once_in_a_seeded_order_that_changes_each_epoch(packed: object) -> None:
    sampler = balanced_sampler(packed, ranks=RANKS, rows=ROWS, seed=7)
    assert isinstance(sampler, RankBalancedSampler)
    first = list(sampler)
    assert sorted(first) == list(range(len(packed)))
    assert list(balanced_sampler(packed, ranks=RANKS, rows=ROWS, seed=7)) == first  # every rank agrees
    sampler.set_epoch(1)
    assert list(sampler) != first


def test_ranks_get_even_work_where_a_random_sampler_skews_them(packed: object) -> None:
    costs = [row_cost(lengths) for lengths in packed["seq_lengths"]]
    balanced = skew(balanced_sampler(packed, ranks=RANKS, rows=ROWS, seed=7), costs)
    generator = torch.Generator().manual_seed(7)
    random = skew(RandomSampler(range(len(packed)), generator=generator), costs)
    assert random > 0.005, random  # the problem is real on this data
    assert balanced < random / 5, (balanced, random)


def test_each_rank_trains_different_rows_of_the_same_micro_step(packed: object) -> None:
    sampler = balanced_sampler(packed, ranks=RANKS, rows=ROWS, seed=7)
    r0, r1 = rank_batches(sampler, 0), rank_batches(sampler, 1)
    order = list(sampler)
    for k in range(3):
        step = order[k * RANKS * ROWS : (k + 1) * RANKS * ROWS]
        assert sorted(r0[k] + r1[k]) == sorted(step)  # the micro-step's rows, split between the ranks
        assert not set(r0[k]) & set(r1[k])


def test_one_rank_or_unpacked_rows_keep_the_usual_sampler(packed: object) -> None:
    assert balanced_sampler(packed, ranks=1, rows=ROWS, seed=7) is None
    assert balanced_sampler(packed.remove_columns("seq_lengths"), ranks=RANKS, rows=ROWS, seed=7) is None
