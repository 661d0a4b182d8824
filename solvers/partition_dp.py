"""Exact dynamic programming over contiguous layer partitions of a pipeline.

Problem. Split layers 0..L-1 into p contiguous, non-empty stages (stage s = layers
[b_s, b_{s+1}), b_0 = 0, b_p = L). Stage s on layers [i, j) has a steady-state time per
micro-batch a_s(i, j), a fill-and-drain time b_s(i, j) and a tail t_s(i, j) (work after the
last backward: exposed gradient all-reduce, optimizer step), or is infeasible (does not fit
in memory). Minimise

    F = (m - 1) · max_s a_s + Σ_s b_s + max_s t_s

the 1F1B / GPipe iteration time with m micro-batches plus the slowest tail.

Method. F is nondecreasing in each of (M, S, U) = (max a, Σ b, max t) and what later stages
add depends only on where the prefix ends, so for every (stages placed s, layers covered i) it
suffices to keep the Pareto front of (M, S, U) over partial partitions: a dominated triple can
never end better. The answer is the best F on the front at (p, L). Optional pruning by an
upper bound u: a partial triple with (m-1)·M + S + U >= u cannot beat u (F only grows).

The stage-cost callback may signal that stage s from i is infeasible for every end >= j by
returning None at j (memory only grows with more layers); the DP then stops extending i.

Choices per stage (``choices``): the callback may give several (a, b, t) for one stage on
[i, j) (a stage with a setting of its own, e.g. sequence parallelism off or on, neither of
whose triples is no larger in all three), each None where that choice does not fit; every
feasible one extends the fronts, so the answer is the best over the choices of every stage
too, and ``PartitionResult.choices`` says which each stage took.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

__all__ = [
    "PartitionResult",
    "StageChoices",
    "StageCost",
    "StageFloor",
    "SuffixBound",
    "best_partition",
    "pipeline_objective",
]

# (steady time, fill-and-drain time, tail) of stage s on layers [i, j), or None if it does
# not fit; None at j promises None at every larger j (so the search stops there).
Costs = tuple[float, float, float]
StageCost = Callable[[int, int, int], Costs | None]
# The same with several choices per stage (module docstring): each choice's costs or None
# where it does not fit; None where none fits (the same promise as ``StageCost``'s).
StageChoices = Callable[[int, int, int], tuple[Costs | None, ...] | None]
# Lower bound (max stage, sum of stages) of stages s..p-1 covering layers [j, L).
SuffixBound = Callable[[int, int], tuple[float, float]]
# Lower bound on a_s and b_s of stage s on [i, j') for all j' >= j.
StageFloor = Callable[[int, int, int], float]


@dataclass(frozen=True)
class PartitionResult:
    """The best split: ``boundaries`` = [0, b_1, ..., L]; ``objective`` = F."""

    boundaries: tuple[int, ...]
    objective: float
    max_stage_ms: float
    sum_stage_ms: float
    max_tail_ms: float
    # The choice each stage took (``best_partition``'s ``choices``; empty without them).
    choices: tuple[int, ...] = ()


def pipeline_objective(max_stage: float, sum_stage: float, max_tail: float, m: int) -> float:
    """F = (m - 1) · max + sum + tail (module docstring)."""
    return (m - 1) * max_stage + sum_stage + max_tail


# A partial partition: (max stage, sum of stages, max tail, previous entry, end layer, the
# last stage's choice). A tuple, not a dataclass: the DP makes and reads hundreds of
# thousands of them per solve.
_Entry = tuple[float, float, float, "_Entry | None", int, int]


def _insert(front: list[_Entry], new: _Entry) -> None:
    """Add ``new`` to the Pareto front of (max, sum, tail) unless an entry there is no
    larger in all three; drop the entries it is no larger than in all three. Order kept:
    survivors as they were, ``new`` last (the DP's ties keep the first found)."""
    a, b, t = new[0], new[1], new[2]
    dominates = False
    for high, total, tail, _previous, _end, _choice in front:
        if high <= a and total <= b and tail <= t:
            return
        if not dominates and a <= high and b <= total and t <= tail:
            dominates = True
    if dominates:
        front[:] = [old for old in front if not (a <= old[0] and b <= old[1] and t <= old[2])]
    front.append(new)


def best_partition(
    num_layers: int,
    num_stages: int,
    num_micro_batches: int,
    stage_cost: StageCost | StageChoices,
    upper_bound: float = float("inf"),
    suffix_bound: SuffixBound | None = None,
    stage_floor: StageFloor | None = None,
    choices: bool = False,
) -> PartitionResult | None:
    """The partition minimising F, or None when none is feasible (or none beats
    ``upper_bound``). Ties keep the first found, scanning ends in increasing order, so the
    answer is deterministic.

    ``suffix_bound(s, j)``, if given, is a lower bound (max stage, sum of stages) on what
    stages s..p-1 add when they cover layers [j, L); with ``upper_bound`` it prunes partial
    splits that cannot finish below the bound. ``stage_floor(s, i, j)``, if given, is a lower
    bound on a_s and b_s of stage s on [i, j') for every j' >= j; once even the best entry
    of the front cannot stay below ``upper_bound`` with it, longer stages are not tried
    (with ``choices``, a floor of every choice). ``choices``: ``stage_cost`` is a
    ``StageChoices`` (module docstring); ties keep the earlier choice."""
    m = num_micro_batches
    if num_stages > num_layers or num_stages < 1:
        return None
    # F = (m - 1) · M + S + U is written out below rather than through
    # ``pipeline_objective`` (the same expression, in the same order): the inner loop runs
    # once per (entry, end) and a call there is a third of the DP's time.
    waits = m - 1
    fronts: list[dict[int, list[_Entry]]] = [{0: [(0.0, 0.0, 0.0, None, 0, 0)]}]
    for s in range(num_stages):
        last = s == num_stages - 1
        nxt: dict[int, list[_Entry]] = {}
        max_end = num_layers - (num_stages - s - 1)
        for i in sorted(fronts[s]):
            front = fronts[s][i]
            if not front:
                continue
            least_max = min(e[0] for e in front)
            least_sum = min(e[1] for e in front)
            least_tail = min(e[2] for e in front)
            ends = [num_layers] if last else range(i + 1, max_end + 1)
            for j in ends:
                if stage_floor is not None:
                    floor = stage_floor(s, i, j)
                    reach = (
                        waits * (least_max if least_max >= floor else floor)
                        + (least_sum + floor)
                        + least_tail
                    )
                    if reach >= upper_bound:
                        break
                found = stage_cost(s, i, j)
                if found is None:
                    break
                options = (
                    cast("tuple[Costs | None, ...]", found) if choices else (cast(Costs, found),)
                )
                if suffix_bound is not None and not last:
                    rest_max, rest_sum = suffix_bound(s + 1, j)
                else:
                    rest_max, rest_sum = 0.0, 0.0
                target = nxt.setdefault(j, [])
                for choice, cost in enumerate(options):
                    if cost is None:
                        continue
                    a, b, t = cost
                    for entry in front:
                        max_stage = entry[0] if entry[0] >= a else a
                        sum_stage = entry[1] + b
                        max_tail = entry[2] if entry[2] >= t else t
                        bound = (
                            waits * (max_stage if max_stage >= rest_max else rest_max)
                            + (sum_stage + rest_sum)
                            + max_tail
                        )
                        if bound >= upper_bound:
                            continue
                        _insert(target, (max_stage, sum_stage, max_tail, entry, j, choice))
        fronts.append(nxt)
    final = fronts[num_stages].get(num_layers, [])
    if not final:
        return None
    best = min(final, key=lambda e: pipeline_objective(e[0], e[1], e[2], m))
    boundaries, taken = [], []
    step: _Entry | None = best
    while step is not None:
        boundaries.append(step[4])
        taken.append(step[5])
        step = step[3]
    return PartitionResult(
        boundaries=tuple(reversed(boundaries)),
        objective=pipeline_objective(best[0], best[1], best[2], m),
        max_stage_ms=best[0],
        sum_stage_ms=best[1],
        max_tail_ms=best[2],
        # The root entry's (the last taken) is no stage's.
        choices=tuple(reversed(taken[:-1])) if choices else (),
    )
