"""Lower bounds on the iteration time of search candidates (``autoplan.solve.search``).

Every bound holds for any layer split and any recompute, so the search may skip whatever a
bound puts at or above the best time found: (1) fractional: spreading layers over the ranks
is a linear program, bounded through its dual; (2) integral: with budget T a rank holds at
most as many layers as the cheapest ones that fit in T and in memory; (3) occupancy: every
rank holds at least one layer, so n ranks of a class need n distinct layers.

Where the stages choose sequence parallelism each for itself (``per_stage_sp``: the uniform
family of the SP-off run, ``autoplan.solve.uniform``), every per-layer figure the bounds read
(time per recompute, saved and parked bytes, parameters) is the least of the layer's with SP
off and on (``layer_tables``): a stage of either setting takes at least the sum of its layers'
least figures, so every bound above holds for each stage's choice. (A stage with SP also adds
its all-gathers at the ends of its runs of blocks: that only adds.)
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.layers import LayerCost
from autoplan.cost.model import CostModel, CostTables
from autoplan.cost.offload import OFFLOAD_SUFFIX, resident_saved_bytes, split_mode
from autoplan.cost.schedule import pipeline_time_ms
from autoplan.solve.space import interleaved_split

__all__ = [
    "Group",
    "Pending",
    "fastest_work",
    "group_bound",
    "integral_bound",
    "interleaved_sizes",
    "layer_tables",
    "least_per_layer",
    "lower_bound",
    "occupancy_bound",
    "rank_bound",
    "static_fits",
]

# The bounds consider every recompute mode, so they hold whatever the options pin; offload
# keeps no saved activations on the device and is never faster than no recompute, so
# "none+offload" (no saved bytes at no recompute's time) relaxes every offloading mode.
MODES = ("none", "selective", "full", "none" + OFFLOAD_SUFFIX)


@dataclass(frozen=True, order=True)
class Pending:
    """One candidate: a pipeline shape with the class of each rank, and its bound."""

    bound: float
    key: tuple
    tp: int
    dp: int
    mbs: int
    m: int
    schedule: str
    chunks: int
    zero1: int  # the most sharded ZeRO level its stages may take (memory bounds use it)
    classes: tuple[int, ...]
    # Each stage runs sequence parallelism off or on, its own choice (module docstring).
    per_stage_sp: bool = False


def layer_tables(
    model: CostModel, k: int, tp: int, mbs: int, per_stage_sp: bool = False
) -> tuple[CostTables, ...]:
    """The tables a stage of class k may be costed with: the view's, and with
    ``per_stage_sp`` at tp > 1 also those with sequence parallelism on (module docstring)."""
    tables = model.tables(k, tp, mbs)
    if per_stage_sp and tp > 1 and not model.sequence_parallel:
        return (tables, model.tables(k, tp, mbs, True))
    return (tables,)


def least_per_layer(
    tables: tuple[CostTables, ...], figure: Callable[[LayerCost], float]
) -> list[float]:
    """Each layer's least ``figure`` over ``tables`` (one set: its own)."""
    values = [figure(c) for c in tables[0].layers]
    for other in tables[1:]:
        values = [min(x, figure(c)) for x, c in zip(values, other.layers, strict=True)]
    return values


def _layer_work(c: LayerCost) -> float:
    """A layer's forward + backward without recompute (no sends)."""
    return c.forward_ms() + c.backward_ms("none")


@functools.lru_cache(maxsize=65536)
def fastest_work(
    model: CostModel, tp: int, mbs: int, used: tuple[int, ...], per_stage_sp: bool = False
) -> tuple[list[float], dict[int, list[float]]]:
    """Each layer's time on its fastest used class, and every used class's layer times
    (forward + backward, no recompute, no sends); with ``per_stage_sp``, the least over
    sequence parallelism off and on (module docstring)."""
    work = {
        k: least_per_layer(layer_tables(model, k, tp, mbs, per_stage_sp), _layer_work) for k in used
    }
    fastest = [min(work[k][i] for k in used) for i in range(model.num_layers)]
    return fastest, work


@functools.lru_cache(maxsize=65536)
def rank_bound(
    model: CostModel,
    tp: int,
    mbs: int,
    counts: tuple[tuple[int, int], ...],
    per_stage_sp: bool = False,
) -> float:
    """A lower bound on the slowest rank's work per micro-batch with ``n_k`` ranks of class k.

    Spreading layers fractionally over the ranks is a linear program whose optimum bounds
    any real split from below; by weak duality every λ ≥ 0 with Σ_k λ_k n_k = 1 gives
    T ≥ Σ_l min_k λ_k w_kl. We take λ_k inversely proportional to class k's total work,
    which is exact when every layer runs the same factor faster on one class than another.
    """
    used = tuple(k for k, _ in counts)
    fastest, work = fastest_work(model, tp, mbs, used, per_stage_sp)
    totals = {k: sum(work[k]) for k in used}
    if not all(totals.values()):
        return max(fastest)
    norm = sum(n / totals[k] for k, n in counts)
    lam = {k: 1.0 / totals[k] / norm for k in used}
    dual = sum(min(lam[k] * work[k][i] for k in used) for i in range(model.num_layers))
    return max(dual, max(fastest))


@functools.lru_cache(maxsize=65536)
def _capacity_steps(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    zero1: bool,
    k: int,
    modes: tuple[str, ...],
    per_stage_sp: bool = False,
) -> tuple[tuple[float, int], ...]:
    """(budget, layers) steps: with ``budget`` ms a rank of class k holds at most ``layers``
    layers, for any layers and position. Relaxation: the cheapest layers by time, by
    parameters and by saved bytes taken separately, one micro-batch in flight, no
    transient; per recompute mode, as many as fit in memory."""
    tables = layer_tables(model, k, tp, mbs, per_stage_sp)
    per_param = model.static_bytes_per_param(dp, zero1)
    least_params = least_per_layer(tables, lambda c: c.params_per_gpu)
    params = [0.0, *itertools.accumulate(sorted(x * per_param for x in least_params))]
    capacity = model.capacity_bytes(k)
    steps: dict[float, int] = {}
    for mode in modes:
        saved, times = _mode_prefixes(model, tp, mbs, k, mode, per_stage_sp)
        fit = max(x for x in range(len(least_params) + 1) if params[x] + saved[x] <= capacity)
        for x in range(1, fit + 1):
            steps[times[x]] = max(steps.get(times[x], 0), x)
    # Keep the monotone staircase: more budget never holds fewer layers.
    out, most = [], 0
    for budget in sorted(steps):
        if steps[budget] > most:
            most = steps[budget]
            out.append((budget, most))
    return tuple(out)


@functools.lru_cache(maxsize=65536)
def _mode_prefixes(
    model: CostModel, tp: int, mbs: int, k: int, mode: str, per_stage_sp: bool = False
) -> tuple[list[float], list[float]]:
    """``_capacity_steps``' prefix sums in one mode over class k's n = 0..L smallest resident
    saved bytes and layer times (each sorted on its own). They depend on neither dp nor the
    ZeRO level: the staircases of every dp share them."""
    tables = layer_tables(model, k, tp, mbs, per_stage_sp)
    recompute = split_mode(mode)[0]
    saved = least_per_layer(tables, lambda c: resident_saved_bytes(c, mode))
    times = least_per_layer(tables, lambda c: c.forward_ms() + c.backward_ms(recompute))
    return (
        [0.0, *itertools.accumulate(sorted(saved))],
        [0.0, *itertools.accumulate(sorted(times))],
    )


def _layers_within(steps: tuple[tuple[float, int], ...], budget: float) -> int:
    index = bisect.bisect_right(steps, (budget, math.inf)) - 1
    return steps[index][1] if index >= 0 else 0


@functools.lru_cache(maxsize=65536)
def _sorted_times(
    model: CostModel, tp: int, mbs: int, k: int, per_stage_sp: bool = False
) -> list[float]:
    """Class k's layer times (no recompute, no sends), ascending."""
    return sorted(fastest_work(model, tp, mbs, (k,), per_stage_sp)[1][k])


@functools.lru_cache(maxsize=65536)
def integral_bound(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    zero1: bool,
    caps: tuple[tuple[int, int], ...],
    pp: int,
    modes: tuple[str, ...],
    per_stage_sp: bool = False,
) -> float:
    """The least T such that pp ranks (at most ``cap`` of class k) can hold every layer
    with each rank's work at most T, under ``_capacity_steps``' relaxation; for fixed T
    filling ranks greedily from the class that holds the most is best. The answer is one
    of the steps' budgets: binary search over them (the count is monotone in T)."""
    steps = {k: _capacity_steps(model, tp, mbs, dp, zero1, k, modes, per_stage_sp) for k, _ in caps}
    cheapest = {k: _sorted_times(model, tp, mbs, k, per_stage_sp) for k, _ in caps}
    total = model.num_layers

    def enough(budget: float) -> bool:
        # Each rank holds at least one layer, so class k offers at most as many ranks as
        # it has layers of time <= budget (distinct layers per rank).
        offers = []
        for k, cap in caps:
            holds = _layers_within(steps[k], budget)
            ranks = min(cap, bisect.bisect_right(cheapest[k], budget))
            if holds >= 1 and ranks >= 1:
                offers.append((holds, ranks))
        offers.sort(reverse=True)
        left, covered = pp, 0
        for holds, ranks in offers:
            take = min(left, ranks)
            covered += take * holds
            left -= take
        return left == 0 and covered >= total

    budgets = sorted(
        {b for k in steps for b, _ in steps[k]} | {t for k in cheapest for t in cheapest[k]}
    )
    if not budgets or not enough(budgets[-1]):
        return math.inf
    low, high = 0, len(budgets) - 1
    while low < high:
        middle = (low + high) // 2
        if enough(budgets[middle]):
            high = middle
        else:
            low = middle + 1
    return budgets[low]


@functools.lru_cache(maxsize=65536)
def occupancy_bound(
    model: CostModel,
    tp: int,
    mbs: int,
    counts: tuple[tuple[int, int], ...],
    per_stage_sp: bool = False,
) -> float:
    """Every rank holds at least one layer, so the n_k ranks of class k hold n_k distinct
    layers and one of them takes at least the n_k-th cheapest layer's time on class k."""
    bound = 0.0
    for k, n in counts:
        times = _sorted_times(model, tp, mbs, k, per_stage_sp)
        bound = max(bound, times[min(n, len(times)) - 1])
    return bound


def interleaved_sizes(
    model: CostModel, classes: tuple[int, ...], tp: int, mbs: int, chunks: int
) -> tuple[int, ...]:
    """The interleaved split of ``space.interleaved_split`` for this pipeline, weighing each
    layer by its time (no recompute) on the slowest class the pipeline uses."""
    # It depends on the set of classes and the rank count only, not on their order: cached
    # on those, as the search asks for every order of every subset.
    return _interleaved_sizes(model, tuple(sorted(set(classes))), len(classes), tp, mbs, chunks)


@functools.lru_cache(maxsize=65536)
def _interleaved_sizes(
    model: CostModel, used: tuple[int, ...], ranks: int, tp: int, mbs: int, chunks: int
) -> tuple[int, ...]:
    # Each layer's time on the slowest used class (the per-class times of ``fastest_work``,
    # computed once per (tp, micro-batch size) rather than once per (classes, ranks, chunks)).
    per_class = [fastest_work(model, tp, mbs, (k,))[1][k] for k in used]
    work = [max(times[i] for times in per_class) for i in range(model.num_layers)]
    kinds = [layer.kind for layer in model.profile.layers]
    return tuple(interleaved_split(kinds, work, ranks, chunks))


def lower_bound(model: CostModel, p: Pending) -> float:
    """A time no split of this candidate beats: the slowest rank at least the fractional
    bound, every layer at least its fastest time, no communication, no tail. An
    interleaved candidate's split is its view's (``interleaved_sizes``), bounded on it:
    its ``per_stage_sp`` is not read (the uniform search bounds both views' splits)."""
    used = tuple(sorted(set(p.classes)))
    if p.chunks > 1:
        # The split is fixed: each rank's work without recompute or sends bounds it.
        per_class = _interleaved_rank_work(model, used, len(p.classes), p.tp, p.mbs, p.chunks)
        ranks = [per_class[k][r] for r, k in enumerate(p.classes)]
        return pipeline_time_ms(ranks, p.m, p.chunks)
    sp = p.per_stage_sp
    fastest, _ = fastest_work(model, p.tp, p.mbs, used, sp)
    counts = tuple((k, p.classes.count(k)) for k in used)
    slowest_rank = max(
        rank_bound(model, p.tp, p.mbs, counts, sp),
        occupancy_bound(model, p.tp, p.mbs, counts, sp),
        integral_bound(model, p.tp, p.mbs, p.dp, p.zero1, counts, len(p.classes), MODES, sp),
    )
    if math.isinf(slowest_rank):  # infeasible; at m = 1, (m - 1) × inf would be NaN
        return math.inf
    return (p.m - 1) * slowest_rank + sum(fastest)


@functools.lru_cache(maxsize=65536)
def _interleaved_rank_work(
    model: CostModel, used: tuple[int, ...], ranks: int, tp: int, mbs: int, chunks: int
) -> dict[int, list[float]]:
    """Per used class k: the work (no recompute, no sends) rank r would have on class k
    under the interleaved split, for every r; the split depends on the set of classes and
    the rank count only (``interleaved_sizes``), so every order of the classes reads it."""
    sizes = _interleaved_sizes(model, used, ranks, tp, mbs, chunks)
    bounds = [0, *itertools.accumulate(sizes)]
    out = {}
    for k in used:
        work = model.tables(k, tp, mbs).work["none"]
        per_rank = [0.0] * ranks
        for s in range(ranks * chunks):
            per_rank[s % ranks] += work[bounds[s + 1]] - work[bounds[s]]
        out[k] = per_rank
    return out


def static_fits(model: CostModel, p: Pending) -> bool:
    """Weights, gradients and optimizer states of all layers fit in the ranks' memory."""
    per_param = model.static_bytes_per_param(p.dp, p.zero1)
    params = model.tables(p.classes[0], p.tp, p.mbs).params[-1]
    have = sum(model.capacity_bytes(k) for k in p.classes)
    return params * per_param <= have


@dataclass(frozen=True, order=True)
class Group:
    """Candidates sharing (tp, dp, mbs, pp); ``bound`` holds for every class sequence."""

    bound: float
    tp: int
    dp: int
    mbs: int
    m: int
    pp: int
    zero1: int  # as Pending.zero1
    caps: tuple[int, ...]
    allowed: tuple[tuple[str, int], ...]
    per_stage_sp: bool = False  # as Pending.per_stage_sp


def group_bound(model: CostModel, g: Group, integral: bool = True) -> float:
    """A lower bound over every class sequence of the group: the fractional bound of
    ``rank_bound`` with λ_k ∝ 1/W_k over all usable classes, its denominator Σ n_k / W_k at
    most what filling the ranks from the fastest classes gives; with ``integral``, also
    ``integral_bound`` (tighter, and most of the cost: the search asks for it only when the
    group comes up, ``uniform_search``)."""
    usable = tuple(k for k, cap in enumerate(g.caps) if cap > 0)
    sp = g.per_stage_sp
    totals, spread, largest, total_fastest = _group_spread(model, g.tp, g.mbs, usable, sp)
    if not all(totals.values()):
        slowest_rank = largest
    else:
        left, capacity = g.pp, 0.0
        for k in sorted(usable, key=lambda k: totals[k]):
            take = min(left, g.caps[k])
            capacity += take / totals[k]
            left -= take
        slowest_rank = max(spread / capacity, largest)
    bounds = []
    integral_ms = (
        integral_bound(
            model,
            g.tp,
            g.mbs,
            g.dp,
            g.zero1,
            tuple((k, g.caps[k]) for k in usable),
            g.pp,
            MODES,
            sp,
        )
        if integral
        else 0.0
    )
    if math.isinf(integral_ms):
        # No split fits even the relaxation: infeasible. (At m = 1, (m - 1) × inf would be
        # NaN, which a heap of bounds cannot order.)
        return math.inf
    for _schedule, chunks in g.allowed:
        if chunks > 1:
            bounds.append(g.m * max(slowest_rank, integral_ms))
        else:
            bounds.append((g.m - 1) * max(slowest_rank, integral_ms) + total_fastest)
    return min(bounds)


@functools.lru_cache(maxsize=65536)
def _group_spread(
    model: CostModel, tp: int, mbs: int, usable: tuple[int, ...], per_stage_sp: bool = False
) -> tuple[dict[int, float], float, float, float]:
    """What ``group_bound`` reads that depends on (tp, micro-batch size, classes) only, not
    on dp or pp: each class's total work W_k, Σ_l min_k w_kl / W_k (0 where some W_k is 0),
    the largest and the sum of the layers' fastest times. The groups of every dp and pp
    share it (on 16,384 GPUs thousands of groups, each a Python pass over the layers)."""
    fastest, work = fastest_work(model, tp, mbs, usable, per_stage_sp)
    totals = {k: sum(work[k]) for k in usable}
    spread = 0.0
    if all(totals.values()):
        spread = sum(min(work[k][i] / totals[k] for k in usable) for i in range(len(fastest)))
    return totals, spread, max(fastest), sum(fastest)
