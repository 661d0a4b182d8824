"""Brute force over the same spaces as the exact solvers, for tests on small instances."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from solvers.partition_dp import PartitionResult, StageCost, pipeline_objective
from solvers.share_ilp import ShareProblem, ShareSolution, share_objective

__all__ = ["compositions", "oracle_partition", "oracle_shares"]


def compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    """Every way to write ``total`` as ``parts`` positive integers, in order."""
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def oracle_partition(
    num_layers: int, num_stages: int, num_micro_batches: int, stage_cost: StageCost
) -> PartitionResult | None:
    """Try every contiguous split; the best by F (see ``partition_dp``)."""
    best: PartitionResult | None = None
    for sizes in compositions(num_layers, num_stages):
        bounds = [0, *itertools.accumulate(sizes)]
        costs = [stage_cost(s, bounds[s], bounds[s + 1]) for s in range(num_stages)]
        if any(c is None for c in costs):
            continue
        steady = [c[0] for c in costs if c is not None]
        fill = [c[1] for c in costs if c is not None]
        tails = [c[2] for c in costs if c is not None]
        value = pipeline_objective(max(steady), sum(fill), max(tails), num_micro_batches)
        if best is None or value < best.objective:
            best = PartitionResult(tuple(bounds), value, max(steady), sum(fill), max(tails))
    return best


def oracle_shares(problem: ShareProblem) -> ShareSolution | None:
    """Try every m and every tuple of per-class sizes that covers the batch."""
    best: ShareSolution | None = None
    for m in problem.micro_batch_counts:
        if problem.global_batch % m:
            continue
        per_micro = problem.global_batch // m
        for sizes in itertools.product(*(sorted(c.sizes) for c in problem.classes)):
            covered = sum(c.replicas * b for c, b in zip(problem.classes, sizes, strict=True))
            if covered != per_micro:
                continue
            value = share_objective(problem, m, sizes)
            if best is None or value < best.objective:
                best = ShareSolution(m, tuple(sizes), value)
    return best
