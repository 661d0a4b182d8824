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

Shared single-stage plans (replicas on several classes with uneven micro-batch sizes) are
solved by the integer program of ``solvers.share_ilp``, once per (tp, set of classes).
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel, PlanCost
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import (
    MAX_SHARE_MICRO_BATCH,
    class_caps,
    contiguous_class_sequences,
    divisors,
    even_split,
    micro_batch_choices,
    pipeline_degrees,
    recompute_modes,
    schedules,
    tp_choices,
)
from solvers.partition_dp import best_partition, pipeline_objective
from solvers.share_ilp import ShareClass, ShareProblem, solve_shares

__all__ = ["Candidate", "SearchResult", "search"]

logger = logging.getLogger(__name__)


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


class _StageCoster:
    """O(1) stage costs for one (tp, dp, mbs, m, schedule, zero1, classes)."""

    def __init__(self, model: CostModel, p: _Pending, modes: tuple[str, ...]) -> None:
        self.model = model
        self.p = p
        self.modes = modes
        pp = len(p.classes)
        self.tables = [model.tables(k, p.tp, p.mbs) for k in p.classes]
        from autoplan.cost.schedule import in_flight_chunks

        self.flight = [in_flight_chunks(p.schedule, pp, s, p.m, p.chunks) for s in range(pp)]  # type: ignore[arg-type]
        self.static_per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (
            p.dp if (p.zero1 and p.dp > 1) else 1
        )
        self.capacity = [model.capacity_bytes(k) for k in p.classes]
        self.group = p.dp * p.tp
        self._transient: dict[tuple[int, str], list[list[float]]] = {}

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
        params = t.params[j] - t.params[i]
        static = params * self.static_per_param
        for mode in self.modes:
            act = self.flight[s] * (t.saved[mode][j] - t.saved[mode][i])
            if static + act + self._range_max(s, mode, i, j) <= self.capacity[s]:
                return mode
        return None

    def __call__(self, s: int, i: int, j: int) -> tuple[float, float] | None:
        mode = self.recompute_for(s, i, j)
        if mode is None:
            return None
        t = self.tables[s]
        k = self.p.classes[s]
        work = t.work[mode][j] - t.work[mode][i]
        if s + 1 < len(self.p.classes):
            out = t.layers[j - 1].output_bytes
            work += 2 * self.model.send_ms(out, k, self.p.classes[s + 1], self.group)
        params = t.params[j] - t.params[i]
        allreduce = self.model.dp_allreduce_ms(params, k, self.p.dp, self.p.tp)
        backward = t.backward[mode][j] - t.backward[mode][i]
        tail = max(0.0, allreduce - backward)
        tail += self.model.optimizer_ms(params, k, self.p.dp, self.p.zero1)
        return work, tail


@functools.lru_cache(maxsize=65536)
def _fastest_work(
    model: CostModel, tp: int, mbs: int, used: tuple[int, ...]
) -> tuple[float, float]:
    """(Σ, max) over layers of each layer's fastest time on the used classes."""
    per_layer = [model.tables(k, tp, mbs).layers for k in used]
    fastest = [
        min(layers[i].forward_ms() + layers[i].backward_ms("none") for layers in per_layer)
        for i in range(model.num_layers)
    ]
    return sum(fastest), max(fastest)


def _lower_bound(model: CostModel, p: _Pending) -> float:
    """A time no split of this candidate beats: every layer on its fastest used class, the
    work spread perfectly over the ranks, no communication."""
    total, largest = _fastest_work(model, p.tp, p.mbs, tuple(sorted(set(p.classes))))
    slowest_rank = max(total / len(p.classes), largest)
    if p.chunks > 1:
        return p.m * slowest_rank
    return (p.m - 1) * slowest_rank + total


def _static_fits(model: CostModel, p: _Pending) -> bool:
    """Weights, gradients and optimizer states of all layers fit in the ranks' memory."""
    per_param = 2 * model.dtype_bytes + model.optimizer_bytes_per_param / (
        p.dp if (p.zero1 and p.dp > 1) else 1
    )
    params = model.tables(p.classes[0], p.tp, p.mbs).params[-1]
    have = sum(model.capacity_bytes(k) for k in p.classes)
    return params * per_param <= have


def _pending(model: CostModel, batch: int, options: SolveOptions) -> list[_Pending]:
    out = []
    num_layers = model.num_layers
    for tp in tp_choices(model, options):
        for dp in divisors(batch):
            if options.dp is not None and dp != options.dp:
                continue
            if options.strategy == "data-parallel" and tp != 1:
                continue
            caps = class_caps(model, tp, dp)
            if not any(caps):
                continue
            zero1 = dp > 1 if options.zero1 is None else options.zero1 and dp > 1
            if options.zero1 and dp == 1:
                continue
            for mbs in micro_batch_choices(batch // dp, options):
                m = batch // (dp * mbs)
                for pp in pipeline_degrees(num_layers, options):
                    if options.strategy == "data-parallel" and pp != 1:
                        continue
                    if pp > sum(caps):
                        continue
                    allowed = schedules(pp, m, num_layers, options)
                    if options.schedule is None and any(s == "1f1b" for s, _ in allowed):
                        allowed = [(s, v) for s, v in allowed if s != "gpipe"]
                    for classes in contiguous_class_sequences(pp, caps):
                        for schedule, chunks in allowed:
                            p = _Pending(0.0, (), tp, dp, mbs, m, schedule, chunks, zero1, classes)
                            if not _static_fits(model, p):
                                continue
                            key = (tp, dp, mbs, pp, schedule, chunks, classes)
                            out.append(
                                _Pending(
                                    _lower_bound(model, p),
                                    key,
                                    tp,
                                    dp,
                                    mbs,
                                    m,
                                    schedule,
                                    chunks,
                                    zero1,
                                    classes,
                                )
                            )
    out.sort()
    return out


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
        times = [c[0] for c in costs if c]
        tails = [c[1] for c in costs if c]
        value = pipeline_objective(max(times), sum(times), max(tails), p.m)
    else:
        result = best_partition(num_layers, pp, p.m, coster, upper_bound=bound)
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
    sizes = even_split(model.num_layers, pp * p.chunks)
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
    pending = _pending(model, batch, options)
    solved = 0
    timed_out = False

    def offer(value: float, config: PlanConfig) -> None:
        best.append((value, _key(config), config))
        best.sort(key=lambda item: (item[0], item[1]))
        del best[keep:]

    def threshold() -> float:
        return best[-1][0] if len(best) >= keep else math.inf

    for config in _shared_candidates(model, batch, options, options.time_limit_s):
        offer(model.evaluate(config).iteration_ms, config)
    for index, p in enumerate(pending):
        if p.bound >= threshold():
            break
        if time.monotonic() - start > options.time_limit_s:
            timed_out = True
            logger.warning("time limit reached after %d of %d candidates", index, len(pending))
            break
        solved += 1
        found = _solve_pipeline(model, p, options, threshold())
        if found is not None:
            offer(found[1], found[0])
        if progress is not None and index % 64 == 0:
            progress(index, len(pending))
    candidates = []
    for _value, _k, config in best:
        cost = model.evaluate(config)
        candidates.append(Candidate(cost.iteration_ms, config, cost))
    candidates.sort(key=lambda c: (c.iteration_ms, _key(c.config)))
    return SearchResult(candidates, len(pending), solved, timed_out)


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
