"""Equal work for every rank: packed rows dealt across the GPUs of each micro-step by their cost.

Under data parallelism every rank waits, at the gradient all-reduce, for the slowest one. With a
random sampler each rank gets whatever packed rows come up, and rows differ: some are not full, and
a row holding one 1024-token document costs more attention than one holding many short ones.
Profiled on two H200s, the faster rank spent tens of milliseconds a step waiting inside NCCL.

:class:`RankBalancedSampler` keeps the random order of rows across micro-steps (each optimizer
step trains on the same kind of random sample as before) and only decides, inside each micro-step,
which rank trains which row: rows sorted by cost, each given to the rank with the least work so
far. Every process computes the same order from the same seed, so no communication is needed;
accelerate then hands rank ``r`` the ``r``-th batch of each group, as it does for any sampler.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Any

log = logging.getLogger("kubetune_trainer.balance")

# Attention relative to the linear layers: a 1024-token document costs ~15% more than 1024 tokens
# of short documents (attention's share of a step in the H200 profiles of both benchmark models).
ATTENTION_WEIGHT = 0.15 / 1024


def row_cost(seq_lengths: Sequence[int]) -> float:
    """The work of one packed row: its tokens, plus causal attention growing with each document's square.

    >>> row_cost([1024]) > row_cost([512, 512]) > row_cost([512])
    True
    """
    return float(sum(seq_lengths)) + ATTENTION_WEIGHT * float(sum(n * n for n in seq_lengths))


def deal_rows(indices: Sequence[int], costs: Sequence[float], *, ranks: int, rows: int) -> list[list[int]]:
    """Split ``ranks * rows`` row indices into ``ranks`` groups of ``rows`` with near-equal total cost.

    Largest first, each row to the group with the least cost that still has room (LPT scheduling);
    then rows are swapped between the costliest and the cheapest group while that narrows the gap.

    >>> deal_rows([0, 1, 2, 3], [10.0, 9.0, 2.0, 1.0], ranks=2, rows=2)
    [[0, 3], [1, 2]]
    >>> costs = [9.0, 8.0, 7.0, 6.0, 5.0, 1.0]  # LPT alone: 9+6+5 = 20 against 8+7+1 = 16
    >>> [sum(costs[i] for i in g) for g in deal_rows(range(6), costs, ranks=2, rows=3)]
    [18.0, 18.0]
    """
    if len(indices) != ranks * rows:
        raise ValueError(f"deal_rows needs {ranks} x {rows} rows, got {len(indices)}")
    groups: list[list[int]] = [[] for _ in range(ranks)]
    totals = [0.0] * ranks
    for i in sorted(indices, key=lambda i: -costs[i]):
        open_groups = [g for g in range(ranks) if len(groups[g]) < rows]
        g = min(open_groups, key=lambda g: totals[g])
        groups[g].append(i)
        totals[g] += costs[i]
    for _ in range(4 * rows):
        hi = max(range(ranks), key=lambda g: totals[g])
        lo = min(range(ranks), key=lambda g: totals[g])
        gap = totals[hi] - totals[lo]
        # the swap that leaves the two groups closest: moving a - b from hi to lo
        best = min(
            ((a, b) for a in groups[hi] for b in groups[lo] if 0 < costs[a] - costs[b] < gap),
            key=lambda ab: abs(gap - 2 * (costs[ab[0]] - costs[ab[1]])),
            default=None,
        )
        if best is None:
            break
        a, b = best
        groups[hi][groups[hi].index(a)], groups[lo][groups[lo].index(b)] = b, a
        moved = costs[a] - costs[b]
        totals[hi] -= moved
        totals[lo] += moved
    return groups


class RankBalancedSampler:
    """A shuffled order of packed rows whose every ``ranks * rows`` slice is dealt evenly across ranks.

    ``rows`` is the per-device micro-batch (packed rows per rank and micro-step). Deterministic for
    a seed and epoch (``set_epoch``), so resuming skips the same rows it trained.
    """

    def __init__(self, costs: Sequence[float], *, ranks: int, rows: int, seed: int) -> None:
        self.costs = list(costs)
        self.ranks, self.rows, self.seed = ranks, rows, seed
        self.epoch = 0

    def __len__(self) -> int:
        return len(self.costs)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        import torch

        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.costs), generator=generator).tolist()
        chunk = self.ranks * self.rows
        for start in range(0, len(order), chunk):
            group = order[start : start + chunk]
            if len(group) < chunk:  # the tail: as accelerate would deal it
                yield from group
                continue
            for rank_rows in deal_rows(group, self.costs, ranks=self.ranks, rows=self.rows):
                yield from rank_rows


def balanced_sampler(dataset: Any, *, ranks: int, rows: int, seed: int) -> RankBalancedSampler | None:
    """The balanced sampler for a packed dataset trained on several ranks; None where it does not apply.

    Packed rows carry their documents' lengths (``seq_lengths``, from TRL's packing); without them,
    or on one rank, the trainer keeps its usual random sampler.
    """
    if ranks <= 1 or dataset is None or "seq_lengths" not in getattr(dataset, "column_names", ()):
        return None
    costs = [row_cost(lengths) for lengths in dataset["seq_lengths"]]
    log.info("packed rows dealt across %d ranks by cost (%d rows a micro-step each)", ranks, rows)
    return RankBalancedSampler(costs, ranks=ranks, rows=rows, seed=seed)
