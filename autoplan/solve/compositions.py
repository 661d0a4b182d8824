r"""The class compositions of a uniform group, all bounded at once in numpy.

A group (tp, dp, micro-batch size, pp) of the uniform search (``autoplan.solve.uniform``)
holds, for every composition n = (n_k) of its pp ranks over the classes (Σ n_k = pp,
n_k ≤ the ranks class k can field), every order of those ranks. A bound that does not depend
on the order bounds them all, so the search queues compositions and only puts a composition's
orders in its queue when the composition comes up: on 16,384 GPUs of four types a group of
pp = 24 has 2,600 compositions and 60,000 orders, and the first groups alone queued a million
orders before this.

The composition bound, for the rank work w_k(l) (forward + backward, no recompute, no sends) of
the layers on class k, S the classes with n_k > 0 and F_S(l) = min_{k ∈ S} w_k(l):

- fractional (``bounds.rank_bound``): the slowest rank takes at least
  max(Σ_l min_{k∈S} w_k(l) / W_k / Σ_{k∈S} n_k / W_k, max_l F_S(l)), W_k = Σ_l w_k(l);
- occupancy (``bounds.occupancy_bound``): the n_k ranks of class k hold n_k distinct layers,
  so one takes at least the n_k-th least w_k;
- integral (as ``bounds.integral_bound``, with ``flight_bound``'s staircase at one micro-batch
  in flight, which every rank holds): with the slowest rank at X, every rank of class k
  holds at least one layer of w_k ≤ X (so n_k such layers exist) and at most h_k(X) layers,
  and Σ_k n_k h_k(X) ≥ L; the least such X among the staircases' steps, by bisection;

and for a plan of one chunk per rank (m − 1) × the largest of the three + Σ_l F_S(l); for an
interleaved one m × the largest (every rank runs m micro-batches of its chunks). Weights,
gradients and optimizer states of all layers must fit the ranks' memory at the most sharded
ZeRO level (``bounds.static_fits``). A composition queues with the least over its allowed
schedules; each is scaled by 1 − 1e-12 so that rounding never lifts it above a plan. Where the
stages choose sequence parallelism each (``Group.per_stage_sp``), the layer figures are the
least over SP off and on (``bounds.layer_tables``), which every stage's are at least.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import numpy as np

from autoplan.cost.model import CostModel
from autoplan.solve.bounds import Group, fastest_work
from autoplan.solve.flight_bound import rank_steps

__all__ = ["Composition", "compositions"]

ROUNDING = 1.0 - 1e-12
"""What the numpy bounds are scaled by: their sums run in another order than the Python ones."""


@dataclass(frozen=True)
class Composition:
    """One composition of a group: ``counts`` ranks of each class of ``subset``, and a
    bound on every order of them."""

    bound: float  # the least of the two below over the group's allowed schedules
    subset: tuple[int, ...]
    counts: tuple[int, ...]
    single_ms: float  # bound on the orders with one chunk per rank (inf: none allowed)
    interleaved_ms: float  # bound on the interleaved orders (inf: none allowed)


@functools.lru_cache(maxsize=4096)
def _count_vectors(caps: tuple[int, ...], total: int) -> np.ndarray:
    """Every vector of len(caps) integers 0 ≤ n_k ≤ caps[k] with Σ n = total, one a row, in
    lexicographic order (cached: the groups of every micro-batch size of a (tp, dp) share
    their caps; read-only)."""
    rows: list[tuple[int, ...]] = []

    def fill(prefix: tuple[int, ...], left: int) -> None:
        k = len(prefix)
        if k == len(caps) - 1:
            if left <= caps[k]:
                rows.append((*prefix, left))
            return
        for n in range(min(caps[k], left) + 1):
            fill((*prefix, n), left - n)

    fill((), total)
    out = np.array(rows, dtype=np.int64).reshape(len(rows), len(caps))
    out.flags.writeable = False
    return out


def compositions(
    model: CostModel, g: Group, levels: tuple[int, ...], threshold: float
) -> list[Composition]:
    """The group's compositions whose bound (module docstring) is below ``threshold``, in the
    order of the classes' subsets by size, then of the counts (deterministic)."""
    usable = [k for k, cap in enumerate(g.caps) if cap > 0]
    if not usable:
        return []
    counts = _count_vectors(tuple(g.caps[k] for k in usable), g.pp)
    if not len(counts):
        return []
    _, work = fastest_work(model, g.tp, g.mbs, tuple(usable), g.per_stage_sp)
    w = np.array([work[k] for k in usable])  # classes × layers
    num_layers = w.shape[1]
    totals = w.sum(axis=1)
    present = counts > 0
    single = np.full(len(counts), math.inf)
    interleaved = np.full(len(counts), math.inf)
    # Per subset of classes: what depends on the subset only.
    masks = present @ (1 << np.arange(len(usable)))
    for mask in np.unique(masks):
        rows = np.flatnonzero(masks == mask)
        members = [x for x in range(len(usable)) if mask >> x & 1]
        fastest = w[members].min(axis=0)
        n = counts[rows][:, members]
        slowest = np.full(len(rows), fastest.max())
        if (totals[members] > 0).all():
            dual = (w[members] / totals[members, None]).min(axis=0).sum()
            slowest = np.maximum(slowest, dual / (n / totals[members]).sum(axis=1))
        for column, x in enumerate(members):
            ordered = np.sort(w[x])
            slowest = np.maximum(slowest, ordered[np.minimum(n[:, column], num_layers) - 1])
        integral = _integral(model, g, levels, [usable[x] for x in members], n, num_layers)
        slowest = np.maximum(slowest, integral)
        # The schedules allowed: one chunk per rank, or interleaved.
        fits = np.isfinite(integral)  # else no split fits even the relaxation
        if any(chunks == 1 for _, chunks in g.allowed):
            value = (g.m - 1) * slowest + fastest.sum() if g.m > 1 else fastest.sum()
            single[rows] = np.where(fits, value * ROUNDING, math.inf)
        if any(chunks > 1 for _, chunks in g.allowed):
            interleaved[rows] = np.where(fits, g.m * slowest * ROUNDING, math.inf)
    # Weights, gradients and optimizer states of all layers fit the ranks (static_fits).
    params = model.tables(usable[0], g.tp, g.mbs).params[-1] * model.static_bytes_per_param(
        g.dp, g.zero1
    )
    capacity = np.array([model.capacity_bytes(k) for k in usable], dtype=float)
    short = counts @ capacity < params
    single[short] = interleaved[short] = math.inf
    bound = np.minimum(single, interleaved)
    keep = np.flatnonzero(bound < threshold)
    # Subsets by size, then counts in order: the enumeration the search has always used.
    # The subsets are few (at most 2^classes): each ranked once in Python by (size, its
    # members), the rows then sorted by (that rank, row) in numpy.
    subsets = {int(mask): _subset_key(int(mask), len(usable)) for mask in np.unique(masks[keep])}
    ranked = sorted(subsets, key=lambda mask: (len(subsets[mask]), subsets[mask]))
    rank_of = {mask: position for position, mask in enumerate(ranked)}
    order = keep[np.lexsort((keep, np.array([rank_of[int(x)] for x in masks[keep]])))]
    values = counts[order].tolist()
    out = []
    for r, row in zip(order.tolist(), values, strict=True):
        columns = subsets[int(masks[r])]
        subset = tuple(usable[x] for x in columns)
        parts = tuple(row[x] for x in columns)
        out.append(
            Composition(float(bound[r]), subset, parts, float(single[r]), float(interleaved[r]))
        )
    return out


def _subset_key(mask: int, classes: int) -> tuple[int, ...]:
    """The members (indices into the usable classes) of a subset given as a bit mask."""
    return tuple(x for x in range(classes) if mask >> x & 1)


def _integral(
    model: CostModel,
    g: Group,
    levels: tuple[int, ...],
    classes: list[int],
    n: np.ndarray,
    num_layers: int,
) -> np.ndarray:
    """The integral bound (module docstring) of each row of ``n`` (counts of ``classes``):
    inf where no budget suffices."""
    sp = g.per_stage_sp
    steps = [rank_steps(model, g.tp, g.mbs, g.dp, levels, k, 1, 0.0, sp) for k in classes]
    cheapest = [_sorted_work(model, g.tp, g.mbs, k, sp) for k in classes]
    grid = np.unique(np.concatenate([s for s, _ in steps] + cheapest))
    if not len(grid):
        return np.full(len(n), math.inf)
    # Per budget of the grid and class: most layers a rank holds, ranks it can field.
    holds = np.zeros((len(grid), len(classes)), dtype=np.int64)
    fields = np.zeros((len(grid), len(classes)), dtype=np.int64)
    for x, ((budgets, most), times) in enumerate(zip(steps, cheapest, strict=True)):
        if len(budgets):  # else a rank of the class holds no layer in any mode: 0
            index = np.searchsorted(budgets, grid, side="right") - 1
            holds[:, x] = np.where(index >= 0, most[np.maximum(index, 0)], 0)
        fields[:, x] = np.searchsorted(times, grid, side="right")

    def enough(at: np.ndarray) -> np.ndarray:
        h, f = holds[at], fields[at]  # rows × classes
        placed = ((h >= 1) & (f >= n)).all(axis=1)
        return placed & ((n * h).sum(axis=1) >= num_layers)

    low = np.zeros(len(n), dtype=np.int64)
    high = np.full(len(n), len(grid) - 1, dtype=np.int64)
    feasible = enough(high)
    for _ in range(math.ceil(math.log2(len(grid))) + 1):
        middle = (low + high) // 2
        ok = enough(middle)
        high = np.where(ok, middle, high)
        low = np.where(ok, low, middle + 1)
        low = np.minimum(low, high)
    return np.where(feasible, grid[high], math.inf)


@functools.lru_cache(maxsize=4096)
def _sorted_work(
    model: CostModel, tp: int, mbs: int, k: int, per_stage_sp: bool = False
) -> np.ndarray:
    """Class k's layer times (forward + backward, no recompute), ascending; read-only."""
    out = np.sort(np.array(fastest_work(model, tp, mbs, (k,), per_stage_sp)[1][k]))
    out.flags.writeable = False
    return out


def orders(subset: tuple[int, ...], counts: tuple[int, ...]):
    """Every order of a composition's ranks as a class per rank, runs of one class kept
    together (the uniform space: one class per run; ``uniform._expand``)."""
    for order in itertools.permutations(range(len(subset))):
        yield tuple(subset[o] for o in order for _ in range(counts[o]))
