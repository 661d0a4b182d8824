"""The min-max split of ``space.interleaved_split`` against every contiguous split."""

from __future__ import annotations

import itertools
import random

from autoplan.solve.space import _min_max_split


def _best_slowest(work_ms: list[float], parts: int) -> float:
    """The least largest chunk over every split of ``work_ms`` into ``parts`` chunks."""
    n = len(work_ms)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = [0, *cuts, n]
        best = min(best, max(sum(work_ms[a:b]) for a, b in itertools.pairwise(bounds)))
    return best


def test_min_max_split_is_optimal_and_has_parts_chunks() -> None:
    rng = random.Random(7)
    for _ in range(300):
        n = rng.randint(1, 9)
        work = [rng.choice([0.5, 1.0, 2.0, 3.5]) * rng.randint(1, 4) for _ in range(n)]
        parts = rng.randint(1, n)
        sizes = _min_max_split(work, parts)
        assert len(sizes) == parts and sum(sizes) == n and min(sizes) >= 1
        bounds = [0, *itertools.accumulate(sizes)]
        slowest = max(sum(work[a:b]) for a, b in itertools.pairwise(bounds))
        assert abs(slowest - _best_slowest(work, parts)) <= 1e-9 * max(1.0, slowest)
