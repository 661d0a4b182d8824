"""The search: every family of the space (``autoplan.solve.space``), best first.

Pipeline plans: for each (tp, dp, micro-batch size, pp, schedule, class of each rank) the
layer split and per-stage recompute come from the exact DP (``solvers.partition_dp``) over
O(1) stage costs from prefix sums. Candidates are visited in order of a lower bound on their
iteration time (compute spread perfectly over the ranks, best class for the fill and drain),
and the search stops once the bound reaches the k-th best time found: exact, and the DP is
given that time as its pruning bound. Two dominance rules shrink the space without losing
the optimum: ZeRO-1 never costs time and saves memory (taken whenever dp > 1 unless
pinned), and GPipe has 1F1B's time with more memory (searched only when 1F1B is not
allowed, m < pp, unless pinned). Recompute per stage is the fastest that fits: more
recompute adds as much time to a stage as it can hide of its all-reduce.

Candidates are grouped by (tp, dp, micro-batch size, pp); a group's bound holds for every
class sequence in it, so whole groups are skipped. The bounds, all valid for any split and
any recompute: (1) fractional: spreading layers over the ranks as a linear program, bounded
through its dual; (2) integral: with budget T a rank holds at most as many layers as the
cheapest ones that fit in T and in memory; (3) occupancy: every rank holds at least one
layer, so n ranks of a class need n distinct layers. The best is exact (pruning compares
with the best found); the alternatives are the best other configurations the search costed,
not necessarily the global 2nd..k-th.

Shared single-stage plans (replicas on several classes with uneven micro-batch sizes) are
solved by the integer program of ``solvers.share_ilp``, once per (tp, set of classes).

Deterministic: candidates are visited in a fixed order and ties keep a canonical key, so the
same inputs give the same plan, unless the time limit stops the search (logged).
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel, PlanCost
from autoplan.cost.schedule import in_flight_chunks, pipeline_time_ms
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import (
    MAX_SHARE_MICRO_BATCH,
    class_caps,
    divisors,
    even_split,
    interleaved_split,
    micro_batch_choices,
    pipeline_degrees,
    recompute_modes,
    schedules,
    tp_choices,
)
from solvers.partition_dp import best_partition, pipeline_objective
from solvers.share_ilp import ShareClass, ShareProblem, solve_shares

__all__ = ["Candidate", "SearchResult", "interleaved_sizes", "search"]

logger = logging.getLogger(__name__)

# The bounds consider every recompute mode, so they hold whatever the options pin.
_MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class Candidate:
    """A costed configuration."""

    iteration_ms: float
    config: PlanConfig
    cost: PlanCost


@dataclass
class SearchResult:
    """Best configurations first, and how the search went."""

    candidates: list[Candidate]
    configs_considered: int
    partitions_solved: int
    timed_out: bool


@dataclass(frozen=True, order=True)
class _Pending:
    bound: float
    key: tuple
    tp: int
    dp: int
    mbs: int
    m: int
    schedule: str
    chunks: int
    zero1: bool
    classes: tuple[int, ...]


def _affine(function: Callable[[float], float]) -> tuple[float, float]:
    """(slope, intercept) of a function affine on x > 0 (the value at 0 may differ)."""
    one, two = function(1.0), function(2.0)
    return two - one, 2 * one - two


class _StageCoster:
    """O(1) stage costs for one (tp, dp, mbs, m, schedule, zero1, classes).

    It mirrors ``CostModel.evaluate`` with prefix sums (the oracle tests hold the two to
    the same answers)."""

    def __init__(self, model: CostModel, p: _Pending, modes: tuple[str, ...]) -> None:
        self.model = model
        self.p = p
        self.modes = modes
        pp = len(p.classes)
        self.tables = [model.tables(k, p.tp, p.mbs) for k in p.classes]
        self.flight = [in_flight_chunks(p.schedule, pp, s, p.m, p.chunks) for s in range(pp)]  # type: ignore[arg-type]
        self.static_per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (
            p.dp if (p.zero1 and p.dp > 1) else 1
        )
        self.capacity = [model.capacity_bytes(k) for k in p.classes]
        self.group = p.dp * p.tp
        # Gradient all-reduce and optimizer step are affine in the stage's parameters.
        self.allreduce = [
            _affine(lambda x, k=k: model.dp_allreduce_ms(x, k, p.dp, p.tp)) for k in p.classes
        ]
        self.optimizer = [model.optimizer_ms(1.0, k, p.dp, p.zero1) for k in p.classes]
        self.sends: list[list[float]] = []
        for s in range(pp):
            if s + 1 < pp:
                self.sends.append(
                    _send_times(model, p.classes[s], p.classes[s + 1], p.tp, p.dp, p.mbs)
                )
            else:
                self.sends.append([0.0] * (model.num_layers + 1))
        self._transient: dict[tuple[int, str], list[list[float]]] = {}
        self._suffix: dict[int, tuple[list[float], int]] = {}

    def _range_max(self, s: int, mode: str, i: int, j: int) -> float:
        key = (self.p.classes[s], mode)
        table = self._transient.get(key)
        if table is None:
            values = [self.model.transient_bytes(c, mode) for c in self.tables[s].layers]
            table = [values]
            width = 1
            while 2 * width <= len(values):
                prev = table[-1]
                table.append([max(prev[x], prev[x + width]) for x in range(len(prev) - width)])
                width *= 2
            self._transient[key] = table
        level = (j - i).bit_length() - 1
        row = table[level]
        return max(row[i], row[j - (1 << level)])

    def recompute_for(self, s: int, i: int, j: int) -> str | None:
        """The fastest recompute mode with which stage s on [i, j) fits, or None."""
        t = self.tables[s]
        static = (t.params[j] - t.params[i]) * self.static_per_param
        flight = self.flight[s]
        capacity = self.capacity[s]
        for mode in self.modes:
            saved = t.saved[mode]
            used = static + flight * (saved[j] - saved[i])
            if used <= capacity and used + self._range_max(s, mode, i, j) <= capacity:
                return mode
        return None

    def __call__(self, s: int, i: int, j: int) -> tuple[float, float, float] | None:
        mode = self.recompute_for(s, i, j)
        if mode is None:
            return None
        t = self.tables[s]
        work = t.work[mode][j] - t.work[mode][i]
        send = self.sends[s][j]
        params = t.params[j] - t.params[i]
        slope, constant = self.allreduce[s]
        allreduce = slope * params + constant if params > 0 else 0.0
        backward = t.backward[mode][j] - t.backward[mode][i]
        tail = max(0.0, allreduce - backward) + self.optimizer[s] * params
        return max(work, send), work + 2 * send, tail

    def floor(self, s: int, i: int, j: int) -> float:
        """A lower bound on the stage's times for every end >= j: its compute, no
        recompute (work only grows with more layers)."""
        work = self.tables[s].work["none"]
        return work[j] - work[i]

    def suffix_bound(self, s: int, j: int) -> tuple[float, float]:
        """Lower bound (max, sum) of stages s.. on layers [j, L): each layer at its fastest
        among the classes of those stages, no recompute, no sends."""
        cached = self._suffix.get(s)
        if cached is None:
            used = tuple(sorted(set(self.p.classes[s:])))
            fastest, _ = _fastest_work(self.model, self.p.tp, self.p.mbs, used)
            suffix = [0.0] * (len(fastest) + 1)
            for x in range(len(fastest) - 1, -1, -1):
                suffix[x] = suffix[x + 1] + fastest[x]
            cached = (suffix, len(self.p.classes) - s)
            self._suffix[s] = cached
        suffix, stages = cached
        return suffix[j] / stages, suffix[j]


@functools.lru_cache(maxsize=65536)
def _send_times(model: CostModel, k: int, k2: int, tp: int, dp: int, mbs: int) -> list[float]:
    """One-way send time of a stage ending at layer j (index j), from class k to k2."""
    layers = model.tables(k, tp, mbs).layers
    return [0.0] + [model.send_ms(c.output_bytes, k, k2, dp * tp) for c in layers]


@functools.lru_cache(maxsize=65536)
def _fastest_work(
    model: CostModel, tp: int, mbs: int, used: tuple[int, ...]
) -> tuple[list[float], dict[int, list[float]]]:
    """Each layer's time on its fastest used class, and every used class's layer times
    (forward + backward, no recompute, no sends)."""
    work = {
        k: [c.forward_ms() + c.backward_ms("none") for c in model.tables(k, tp, mbs).layers]
        for k in used
    }
    fastest = [min(work[k][i] for k in used) for i in range(model.num_layers)]
    return fastest, work


@functools.lru_cache(maxsize=65536)
def _rank_bound(model: CostModel, tp: int, mbs: int, counts: tuple[tuple[int, int], ...]) -> float:
    """A lower bound on the slowest rank's work per micro-batch with ``n_k`` ranks of class k.

    Spreading layers fractionally over the ranks is a linear program whose optimum bounds
    any real split from below; by weak duality every λ ≥ 0 with Σ_k λ_k n_k = 1 gives
    T ≥ Σ_l min_k λ_k w_kl. We take λ_k inversely proportional to class k's total work,
    which is exact when every layer runs the same factor faster on one class than another.
    """
    used = tuple(k for k, _ in counts)
    fastest, work = _fastest_work(model, tp, mbs, used)
    totals = {k: sum(work[k]) for k in used}
    if not all(totals.values()):
        return max(fastest)
    norm = sum(n / totals[k] for k, n in counts)
    lam = {k: 1.0 / totals[k] / norm for k in used}
    dual = sum(min(lam[k] * work[k][i] for k in used) for i in range(model.num_layers))
    return max(dual, max(fastest))


@functools.lru_cache(maxsize=65536)
def _capacity_steps(
    model: CostModel, tp: int, mbs: int, dp: int, zero1: bool, k: int, modes: tuple[str, ...]
) -> tuple[tuple[float, int], ...]:
    """(budget, layers) steps: with ``budget`` ms a rank of class k holds at most ``layers``
    layers, for any layers and position. Relaxation: the cheapest layers by time, by
    parameters and by saved bytes taken separately, one micro-batch in flight, no
    transient; per recompute mode, as many as fit in memory."""
    layers = model.tables(k, tp, mbs).layers
    per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (dp if zero1 else 1)
    params = [0.0, *itertools.accumulate(sorted(c.params_per_gpu * per_param for c in layers))]
    capacity = model.capacity_bytes(k)
    steps: dict[float, int] = {}
    for mode in modes:
        saved = [0.0, *itertools.accumulate(sorted(c.saved_bytes[mode] for c in layers))]
        fit = max(x for x in range(len(layers) + 1) if params[x] + saved[x] <= capacity)
        times = [
            0.0,
            *itertools.accumulate(sorted(c.forward_ms() + c.backward_ms(mode) for c in layers)),
        ]
        for x in range(1, fit + 1):
            steps[times[x]] = max(steps.get(times[x], 0), x)
    # Keep the monotone staircase: more budget never holds fewer layers.
    out, most = [], 0
    for budget in sorted(steps):
        if steps[budget] > most:
            most = steps[budget]
            out.append((budget, most))
    return tuple(out)


def _layers_within(steps: tuple[tuple[float, int], ...], budget: float) -> int:
    index = bisect.bisect_right(steps, (budget, math.inf)) - 1
    return steps[index][1] if index >= 0 else 0


@functools.lru_cache(maxsize=65536)
def _sorted_times(model: CostModel, tp: int, mbs: int, k: int) -> list[float]:
    """Class k's layer times (no recompute, no sends), ascending."""
    return sorted(c.forward_ms() + c.backward_ms("none") for c in model.tables(k, tp, mbs).layers)


@functools.lru_cache(maxsize=65536)
def _integral_bound(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    zero1: bool,
    caps: tuple[tuple[int, int], ...],
    pp: int,
    modes: tuple[str, ...],
) -> float:
    """The least T such that pp ranks (at most ``cap`` of class k) can hold every layer
    with each rank's work at most T, under ``_capacity_steps``' relaxation; for fixed T
    filling ranks greedily from the class that holds the most is best. The answer is one
    of the steps' budgets: binary search over them (the count is monotone in T)."""
    steps = {k: _capacity_steps(model, tp, mbs, dp, zero1, k, modes) for k, _ in caps}
    cheapest = {k: _sorted_times(model, tp, mbs, k) for k, _ in caps}
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
def _occupancy_bound(model: CostModel, tp: int, mbs: int, counts: tuple[tuple[int, int], ...]):
    """Every rank holds at least one layer, so the n_k ranks of class k hold n_k distinct
    layers and one of them takes at least the n_k-th cheapest layer's time on class k."""
    bound = 0.0
    for k, n in counts:
        times = sorted(
            c.forward_ms() + c.backward_ms("none") for c in model.tables(k, tp, mbs).layers
        )
        bound = max(bound, times[min(n, len(times)) - 1])
    return bound


@functools.lru_cache(maxsize=65536)
def interleaved_sizes(
    model: CostModel, classes: tuple[int, ...], tp: int, mbs: int, chunks: int
) -> tuple[int, ...]:
    """The interleaved split of ``space.interleaved_split`` for this pipeline, weighing each
    layer by its time (no recompute) on the slowest class the pipeline uses."""
    used = sorted(set(classes))
    work = [
        max(
            model.tables(k, tp, mbs).layers[i].forward_ms()
            + model.tables(k, tp, mbs).layers[i].backward_ms("none")
            for k in used
        )
        for i in range(model.num_layers)
    ]
    kinds = [layer.kind for layer in model.profile.layers]
    return tuple(interleaved_split(kinds, work, len(classes), chunks))


def _lower_bound(model: CostModel, p: _Pending) -> float:
    """A time no split of this candidate beats: the slowest rank at least the fractional
    bound, every layer at least its fastest time, no communication, no tail."""
    used = tuple(sorted(set(p.classes)))
    fastest, _ = _fastest_work(model, p.tp, p.mbs, used)
    counts = tuple((k, p.classes.count(k)) for k in used)
    slowest_rank = max(
        _rank_bound(model, p.tp, p.mbs, counts),
        _occupancy_bound(model, p.tp, p.mbs, counts),
        _integral_bound(model, p.tp, p.mbs, p.dp, p.zero1, counts, len(p.classes), _MODES)
        if p.chunks == 1
        else 0.0,
    )
    if p.chunks > 1:
        # The split is fixed: each rank's work without recompute or sends bounds it.
        pp = len(p.classes)
        bounds = [
            0,
            *itertools.accumulate(interleaved_sizes(model, p.classes, p.tp, p.mbs, p.chunks)),
        ]
        ranks = [0.0] * pp
        for s in range(pp * p.chunks):
            work = model.tables(p.classes[s % pp], p.tp, p.mbs).work["none"]
            ranks[s % pp] += work[bounds[s + 1]] - work[bounds[s]]
        return pipeline_time_ms(ranks, p.m, p.chunks)
    return (p.m - 1) * slowest_rank + sum(fastest)


def _static_fits(model: CostModel, p: _Pending) -> bool:
    """Weights, gradients and optimizer states of all layers fit in the ranks' memory."""
    per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (
        p.dp if (p.zero1 and p.dp > 1) else 1
    )
    params = model.tables(p.classes[0], p.tp, p.mbs).params[-1]
    have = sum(model.capacity_bytes(k) for k in p.classes)
    return params * per_param <= have


@dataclass(frozen=True, order=True)
class _Group:
    """Candidates sharing (tp, dp, mbs, pp); ``bound`` holds for every class sequence."""

    bound: float
    tp: int
    dp: int
    mbs: int
    m: int
    pp: int
    zero1: bool
    caps: tuple[int, ...]
    allowed: tuple[tuple[str, int], ...]


def _group_bound(model: CostModel, g: _Group) -> float:
    """A lower bound over every class sequence of the group: the fractional bound of
    ``_rank_bound`` with λ_k ∝ 1/W_k over all usable classes, its denominator Σ n_k / W_k at
    most what filling the ranks from the fastest classes gives."""
    usable = tuple(k for k, cap in enumerate(g.caps) if cap > 0)
    fastest, work = _fastest_work(model, g.tp, g.mbs, usable)
    totals = {k: sum(work[k]) for k in usable}
    if not all(totals.values()):
        slowest_rank = max(fastest)
    else:
        spread = sum(min(work[k][i] / totals[k] for k in usable) for i in range(len(fastest)))
        left, capacity = g.pp, 0.0
        for k in sorted(usable, key=lambda k: totals[k]):
            take = min(left, g.caps[k])
            capacity += take / totals[k]
            left -= take
        slowest_rank = max(spread / capacity, max(fastest))
    bounds = []
    integral = _integral_bound(
        model, g.tp, g.mbs, g.dp, g.zero1, tuple((k, g.caps[k]) for k in usable), g.pp, _MODES
    )
    for _schedule, chunks in g.allowed:
        if chunks > 1:
            bounds.append(g.m * max(slowest_rank, integral))
        else:
            bounds.append((g.m - 1) * max(slowest_rank, integral) + sum(fastest))
    return min(bounds)


def _groups(model: CostModel, batch: int, options: SolveOptions) -> list[_Group]:
    out = []
    num_layers = model.num_layers
    for tp in tp_choices(model, options):
        if options.strategy == "data-parallel" and tp != 1:
            continue
        for dp in divisors(batch):
            if options.dp is not None and dp != options.dp:
                continue
            caps = tuple(class_caps(model, tp, dp))
            if not any(caps) or (options.zero1 and dp == 1):
                continue
            zero1 = dp > 1 and options.zero1 is not False
            per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (
                dp if zero1 else 1
            )
            params = model.tables(next(k for k, c in enumerate(caps) if c), tp, 1).params[-1]
            memories = sorted(
                (
                    model.capacity_bytes(k)
                    for k, cap in enumerate(caps)
                    for _ in range(min(cap, 128))
                ),
                reverse=True,
            )
            for mbs in micro_batch_choices(batch // dp, options):
                m = batch // (dp * mbs)
                for pp in pipeline_degrees(num_layers, options):
                    if options.strategy == "data-parallel" and pp != 1:
                        continue
                    if pp > sum(caps) or params * per_param > sum(memories[:pp]):
                        continue
                    allowed = schedules(pp, m, num_layers, options)
                    if options.schedule is None and any(s == "1f1b" for s, _ in allowed):
                        allowed = [(s, v) for s, v in allowed if s != "gpipe"]
                    if not allowed:
                        continue
                    group = _Group(0.0, tp, dp, mbs, m, pp, zero1, caps, tuple(allowed))
                    out.append(
                        _Group(
                            _group_bound(model, group),
                            tp,
                            dp,
                            mbs,
                            m,
                            pp,
                            zero1,
                            caps,
                            tuple(allowed),
                        )
                    )
    out.sort()
    return out


def _expand(model: CostModel, g: _Group, threshold: float) -> list[_Pending]:
    """The group's candidates whose own bound is below ``threshold``, best bound first."""
    out = []
    usable = [k for k, cap in enumerate(g.caps) if cap > 0]
    for size in range(1, len(usable) + 1):
        for subset in itertools.combinations(usable, size):
            for parts in _compositions(g.pp, size):
                if any(n > g.caps[k] for k, n in zip(subset, parts, strict=True)):
                    continue
                counts = tuple(zip(subset, parts, strict=True))
                fastest, _ = _fastest_work(model, g.tp, g.mbs, subset)
                rank = max(
                    _rank_bound(model, g.tp, g.mbs, counts),
                    _occupancy_bound(model, g.tp, g.mbs, counts),
                )
                integral = _integral_bound(model, g.tp, g.mbs, g.dp, g.zero1, counts, g.pp, _MODES)
                if min((g.m - 1) * max(rank, integral) + sum(fastest), g.m * rank) >= threshold:
                    continue
                for order in itertools.permutations(range(size)):
                    classes = tuple(subset[o] for o in order for _ in range(parts[o]))
                    for schedule, chunks in g.allowed:
                        p = _Pending(
                            0.0, (), g.tp, g.dp, g.mbs, g.m, schedule, chunks, g.zero1, classes
                        )
                        if not _static_fits(model, p):
                            continue
                        bound = _lower_bound(model, p)
                        if bound >= threshold:
                            continue
                        key = (g.tp, g.dp, g.mbs, g.pp, schedule, chunks, classes)
                        out.append(
                            _Pending(
                                bound,
                                key,
                                g.tp,
                                g.dp,
                                g.mbs,
                                g.m,
                                schedule,
                                chunks,
                                g.zero1,
                                classes,
                            )
                        )
    out.sort()
    return out


def _compositions(total: int, parts: int):
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def _fixed_split(options: SolveOptions, num_layers: int, pp: int) -> list[int] | None:
    if options.layer_split is not None:
        return list(options.layer_split)
    if options.strategy == "even-split":
        return even_split(num_layers, pp)
    return None


def _solve_pipeline(
    model: CostModel, p: _Pending, options: SolveOptions, bound: float
) -> tuple[PlanConfig, float] | None:
    modes = recompute_modes(options)
    coster = _StageCoster(model, p, modes)
    pp = len(p.classes)
    num_layers = model.num_layers
    if p.chunks > 1:
        return _solve_interleaved(model, p, modes)
    split = _fixed_split(options, num_layers, pp)
    if split is not None:
        bounds = [0, *itertools.accumulate(split)]
        costs = [coster(s, bounds[s], bounds[s + 1]) for s in range(pp)]
        if any(c is None for c in costs):
            return None
        steady = [c[0] for c in costs if c]
        fill = [c[1] for c in costs if c]
        tails = [c[2] for c in costs if c]
        value = pipeline_objective(max(steady), sum(fill), max(tails), p.m)
    else:
        result = best_partition(
            num_layers,
            pp,
            p.m,
            coster,
            upper_bound=bound,
            suffix_bound=coster.suffix_bound,
            stage_floor=coster.floor,
        )
        if result is None:
            return None
        bounds, value = list(result.boundaries), result.objective
    stages = []
    for s in range(pp):
        mode = coster.recompute_for(s, bounds[s], bounds[s + 1])
        assert mode is not None
        stages.append(StageChoice(bounds[s], bounds[s + 1], p.classes[s], mode))
    config = PlanConfig(p.tp, p.dp, p.mbs, p.m, p.schedule, 1, p.zero1, tuple(stages))
    return config, value


def _solve_interleaved(
    model: CostModel, p: _Pending, modes: tuple[str, ...]
) -> tuple[PlanConfig, float] | None:
    pp = len(p.classes)
    sizes = interleaved_sizes(model, p.classes, p.tp, p.mbs, p.chunks)
    bounds = [0, *itertools.accumulate(sizes)]
    chosen = [modes[0]] * pp
    for _ in range(len(modes)):
        stages = tuple(
            StageChoice(bounds[s], bounds[s + 1], p.classes[s % pp], chosen[s % pp])
            for s in range(pp * p.chunks)
        )
        config = PlanConfig(p.tp, p.dp, p.mbs, p.m, p.schedule, p.chunks, p.zero1, stages)
        cost = model.evaluate(config)
        over = [m.pipeline_rank for m in cost.memory if m.total_bytes > m.capacity_bytes]
        if not over:
            return config, cost.iteration_ms
        for r in over:
            position = modes.index(chosen[r])
            if position + 1 == len(modes):
                return None
            chosen[r] = modes[position + 1]
    return None


def _shared_candidates(
    model: CostModel, batch: int, options: SolveOptions, time_limit_s: float
) -> list[PlanConfig]:
    """Single-stage plans with uneven shares over two or more classes (``share_ilp``)."""
    if options.strategy not in ("optimal",) or options.micro_batch_size is not None:
        return []
    if (options.pp not in (None, 1)) or options.layer_split is not None:
        return []
    if options.schedule not in (None, "1f1b"):
        return []
    modes = recompute_modes(options)
    found = []
    for tp in tp_choices(model, options):
        usable = [c.index for c in model.classes if c.gpus_per_node % tp == 0]
        for size in range(2, len(usable) + 1):
            for subset in itertools.combinations(usable, size):
                replicas = [model.classes[k].total_gpus // tp for k in subset]
                dp = sum(replicas)
                if options.dp is not None and dp != options.dp:
                    continue
                zero1 = dp > 1 and options.zero1 is not False
                config = _solve_shares_for(
                    model, batch, options, tp, subset, replicas, zero1, modes, time_limit_s
                )
                if config is not None:
                    found.append(config)
    return found


def share_sizes(
    model: CostModel, tp: int, dp: int, zero1: bool, k: int, limit: int, modes: tuple[str, ...]
) -> dict[int, tuple[float, float, str]]:
    """For class k in a shared plan: per micro-batch size b that fits, (time, backward,
    recompute) with the fastest recompute that fits."""
    out = {}
    n = model.num_layers
    per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (dp if zero1 else 1)
    for b in range(1, limit + 1):
        t = model.tables(k, tp, b)
        static = t.params[n] * per_param
        for mode in modes:
            act = t.saved[mode][n]
            transient = max(model.transient_bytes(c, mode) for c in t.layers)
            if static + act + transient <= model.capacity_bytes(k):
                out[b] = (t.work[mode][n], t.backward[mode][n], mode)
                break
        else:
            break  # larger micro-batches need more memory still
    return out


def _solve_shares_for(model, batch, options, tp, subset, replicas, zero1, modes, limit_s):
    total = sum(replicas)
    counts = [m for m in divisors(batch) if batch // m >= total]
    if options.num_micro_batches is not None:
        counts = [m for m in counts if m == options.num_micro_batches]
    if not counts:
        return None
    tables = {}
    for k, n in zip(subset, replicas, strict=True):
        limit = min(MAX_SHARE_MICRO_BATCH, (batch // min(counts) - (total - n)) // n)
        tables[k] = share_sizes(model, tp, total, zero1, k, limit, modes)
        if not tables[k]:
            return None
    params = model.tables(subset[0], tp, 1).params[-1]
    probe = PlanConfig(
        tp,
        total,
        1,
        1,
        "1f1b",
        1,
        zero1,
        (StageChoice(0, model.num_layers, subset[0], modes[0]),),
        tuple(ReplicaGroup(k, n, 1, modes[0]) for k, n in zip(subset, replicas, strict=True)),
    )
    allreduce = model.shared_allreduce_ms(params, probe)
    optimizer = max(model.optimizer_ms(params, k, total, zero1) for k in subset)
    problem = ShareProblem(
        global_batch=batch,
        micro_batch_counts=tuple(counts),
        classes=tuple(
            ShareClass(n, {b: (v[0], v[1]) for b, v in tables[k].items()})
            for k, n in zip(subset, replicas, strict=True)
        ),
        allreduce_ms=allreduce,
        optimizer_ms=optimizer,
    )
    solution = solve_shares(problem, time_limit_s=limit_s)
    if solution is None:
        return None
    groups = tuple(
        ReplicaGroup(k, n, b, tables[k][b][2])
        for k, n, b in zip(subset, replicas, solution.sizes, strict=True)
    )
    return PlanConfig(
        tp,
        total,
        max(solution.sizes),
        solution.num_micro_batches,
        "1f1b",
        1,
        zero1,
        (StageChoice(0, model.num_layers, subset[0], groups[0].recompute),),
        groups,
    )


def search(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
) -> SearchResult:
    """The ``options.top_k + 1`` best distinct configurations, best first (exact unless the
    time limit stops it; see the module docstring)."""
    start = time.monotonic()
    keep = options.top_k + 1
    best: list[tuple[float, tuple, PlanConfig]] = []
    groups = _groups(model, batch, options)
    solved = considered = 0
    timed_out = False

    def offer(value: float, config: PlanConfig) -> None:
        best.append((value, _key(config), config))
        best.sort(key=lambda item: (item[0], item[1]))
        del best[keep:]

    def threshold() -> float:
        # Pruning against the best found keeps the best exact; the runner-ups are the best
        # of the configurations the search costed, not necessarily the global 2nd..k-th.
        return best[0][0] if best else math.inf

    for config in _shared_candidates(model, batch, options, options.time_limit_s):
        offer(model.evaluate(config).iteration_ms, config)
    for index, group in enumerate(groups):
        if group.bound >= threshold() or timed_out:
            break
        if progress is not None:
            progress(index, len(groups))
        for p in _expand(model, group, threshold()):
            considered += 1
            if p.bound >= threshold():
                break
            if time.monotonic() - start > options.time_limit_s:
                timed_out = True
                logger.warning("time limit reached after %d of %d groups", index, len(groups))
                break
            solved += 1
            found = _solve_pipeline(model, p, options, threshold())
            if found is not None:
                offer(found[1], found[0])
    candidates = []
    for _value, _k, config in best:
        cost = model.evaluate(config)
        candidates.append(Candidate(cost.iteration_ms, config, cost))
    candidates.sort(key=lambda c: (c.iteration_ms, _key(c.config)))
    return SearchResult(candidates, considered, solved, timed_out)


def _key(config: PlanConfig) -> tuple:
    return (
        config.world_size,
        config.pipeline_degree,
        config.tp,
        config.dp,
        config.micro_batch_size,
        config.schedule,
        config.chunks,
        config.stages,
        config.replica_groups,
    )
