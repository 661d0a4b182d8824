r"""Lower bounds on one ordered uniform pipeline (a ``Pending``), for the uniform search.

The group and composition bounds (``autoplan.solve.bounds``, ``solve.compositions``) hold for
every order of the classes at once. Once the order is fixed, three more hold, and the
search takes the largest when the candidate comes up (``order_bound``):

In-flight memory (``flight_bound``). Rank s of class k_s holds f_s micro-batches' saved
activations at its peak (``in_flight_chunks``: p − s under 1F1B, m under GPipe) and its
pipeline transfer buffers (``CostModel.transfer_buffer_bytes``: m × its micro-batch × each
boundary it has, at least the model's least boundary activation). Let X be the slowest rank's
per-micro-batch time of some split. Rank s holds some n_s layers at some ZeRO level (of those
the space allows) in some mode (recompute, offload). Any n layers take at least the sum of the
n least layer times of the mode, the n least parameter bytes, the n least device-resident saved
bytes and the n least parked bytes (each sorted on its own), so n_s ≤ h_s(X): the most layers
for which, at some level and mode,

    time_n ≤ X,   static_n + buffers_s + f_s · saved_n ≤ usable_k,   f_s · parked_n ≤ host_k

and at ZeRO-2/3 also (2 or 3) × half the all-reduce of the n least parameters ≤ X (a pass takes
at least its collectives: ``sharding.exposed_ms``). Transients, sends and sequence-parallel
edges only add. The split covers all L layers, each rank at least one, so X ≥ X* = the least
X with h_s(X) ≥ 1 for every s and Σ_s h_s(X) ≥ L (bisection over the staircases' steps).

Runs of one class (``run_bound``): each maximal run of r ranks of class k holds a contiguous
window of at least r layers at a place the ranks around it leave (from layer 0 when it is
first, to the last layer when it is last): its slowest rank takes at least the window's
largest layer and its mean per rank, and the stages together the window's excess over the
fastest class.

Fill (``fill_bound``): the split's linear program min (m − 1) A + Σ_s a_s, through its dual.

With them the 1F1B and GPipe objective (m − 1) max a + Σ b + max t is at least
max((m − 1) max(X*, runs) + Σ_l min_k w_k(l) + the runs' excess, fill). Only for plans of one
chunk per rank (the interleaved split is fixed and bounded apart) and tables without sub-block
starts (whose stage costs are not prefix differences).

Where each stage chooses sequence parallelism (``Pending.per_stage_sp``), every per-layer
figure above is the least over SP off and on (``bounds.layer_tables``): each rank's stage is
one setting or the other, and its figures are at least those least ones, so each bound holds
for every choice.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable

import numpy as np

from autoplan.cost.layers import LayerCost
from autoplan.cost.model import CostModel
from autoplan.cost.offload import (
    ALL_MODES,
    group_of,
    parked_bytes,
    resident_saved_bytes,
    split_mode,
)
from autoplan.cost.schedule import in_flight_chunks
from autoplan.solve.bounds import Pending, fastest_work, layer_tables

__all__ = ["fill_bound", "flight_bound", "order_bound", "rank_steps", "run_bound"]


_Prefixes = tuple[np.ndarray, dict[str, np.ndarray], dict[str, tuple[np.ndarray, np.ndarray]]]


@functools.lru_cache(maxsize=4096)
def _layer_prefixes(
    model: CostModel, tp: int, mbs: int, k: int, per_stage_sp: bool = False
) -> _Prefixes:
    """What ``_rank_tables`` reads that depends on neither dp nor the ZeRO levels (one set
    for the groups of every dp): the prefix sums over the n = 0..L smallest per-layer values,
    each sorted on its own, of the parameters, of the least time per recompute (offload's
    copies left out: they only add) and of the resident saved and parked bytes per mode
    (with ``per_stage_sp``, each layer's least over SP off and on: module docstring).
    Each figure once per distinct layer cost (a model's repeated blocks share one)."""
    spreads = []
    for tables in layer_tables(model, k, tp, mbs, per_stage_sp):
        layers = tables.layers
        distinct: dict[int, int] = {}
        slots = [distinct.setdefault(id(c), len(distinct)) for c in layers]
        spreads.append((slots, list({id(c): c for c in layers}.values())))

    def prefix(figure: Callable[[LayerCost], float]) -> np.ndarray:
        least = None
        for slots, unique in spreads:
            spread = np.asarray([figure(c) for c in unique], dtype=float)[slots]
            least = spread if least is None else np.minimum(least, spread)
        assert least is not None
        return np.concatenate(([0.0], np.cumsum(np.sort(least))))

    params = prefix(lambda c: c.params_per_gpu)
    times: dict[str, np.ndarray] = {}
    memory: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for mode in ALL_MODES:
        recompute = split_mode(mode)[0]
        if recompute not in times:
            times[recompute] = prefix(functools.partial(_pass_ms, recompute))
        memory[mode] = (
            prefix(functools.partial(_resident, mode)),
            prefix(functools.partial(_parked, mode)),
        )
    return params, times, memory


def _pass_ms(recompute: str, c: LayerCost) -> float:
    return c.forward_ms() + c.backward_ms(recompute)


def _resident(mode: str, c: LayerCost) -> float:
    return resident_saved_bytes(c, mode)


def _parked(mode: str, c: LayerCost) -> float:
    return parked_bytes(c, mode)


@functools.lru_cache(maxsize=4096)
def _rank_tables(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    levels: tuple[int, ...],
    k: int,
    per_stage_sp: bool = False,
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per (ZeRO level, mode): prefix sums over the n = 0..L smallest per-layer values, each
    sorted on its own: static bytes, resident saved bytes, parked bytes, and the least time
    of n layers (their n least times, and at ZeRO-2/3 at least their collectives)."""
    params, times, memory = _layer_prefixes(model, tp, mbs, k, per_stage_sp)
    collective = None  # only ZeRO-2/3 with replicas read it: L + 1 all-reduce costings
    if dp > 1 and any(level >= 2 for level in levels):
        collective = _collectives(model, k, tp, dp, tuple(params.tolist()))
    out = []
    for level, mode in itertools.product(levels, ALL_MODES):
        least = times[split_mode(mode)[0]]
        # ZeRO-2/3: a pass takes at least its collectives (sharding.exposed_ms): one
        # all-gather forward, one (2) or two (3) more backward, each half an all-reduce of the
        # rank's parameters, which grows with them.
        passes = 0 if level <= 1 or dp <= 1 else (2 if level == 2 else 3)
        if passes and collective is not None:
            least = np.maximum(least, passes * collective)
        saved, parked = memory[mode]
        out.append((params * model.static_bytes_per_param(dp, level), saved, parked, least))
    return out


@functools.lru_cache(maxsize=4096)
def _stacked_tables(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    levels: tuple[int, ...],
    k: int,
    per_stage_sp: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``_rank_tables``' rows stacked: (static, saved, parked, least), each (level, mode)
    × (L + 1), so that ``rank_steps`` reads every row in one numpy pass."""
    rows = _rank_tables(model, tp, mbs, dp, levels, k, per_stage_sp)
    stacked = tuple(np.stack([row[x] for row in rows]) for x in range(4))
    for array in stacked:
        array.flags.writeable = False
    return stacked[0], stacked[1], stacked[2], stacked[3]


@functools.lru_cache(maxsize=4096)
def _collectives(
    model: CostModel, k: int, tp: int, dp: int, params: tuple[float, ...]
) -> np.ndarray:
    """Half the gradient all-reduce of each of ``params`` (0 for the first, no layers) over
    dp replicas of tp ranks of class k. The all-reduce reads neither the recompute nor the
    micro-batch size of the group (``CostModel.allreduce_ms``; a test holds it to that), so
    the groups of every micro-batch size share one costing: L + 1 calls each, the larger
    part of ``_rank_tables``' time otherwise."""
    groups = (group_of(k, tp, dp, 1, "none"),)
    collective = np.array([model.allreduce_ms(groups, (x,)) / 2 for x in params])
    collective[0] = 0.0
    return collective


@functools.lru_cache(maxsize=65536)
def rank_steps(
    model: CostModel,
    tp: int,
    mbs: int,
    dp: int,
    levels: tuple[int, ...],
    k: int,
    flight: int,
    reserved: float,
    per_stage_sp: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """(budgets ascending, most layers within each): the staircase h(X) of the module
    docstring for a rank of class k holding ``flight`` micro-batches and ``reserved`` bytes of
    buffers, at any of the ZeRO ``levels`` (``per_stage_sp``: either SP setting)."""
    usable = model.usable_bytes(k) - reserved
    host = model.host_budget_bytes(k)
    # Every (level, mode) row at once: the rows of ``_rank_tables`` stacked.
    static, saved, parked, least = _stacked_tables(model, tp, mbs, dp, levels, k, per_stage_sp)
    fits = (static + flight * saved <= usable) & (flight * parked <= host)
    # The prefixes only grow: the layers that fit in a row are its first ``fit``.
    width = fits.shape[1]
    fit = np.where(fits.all(axis=1), width - 1, np.argmin(fits, axis=1) - 1)
    # Each row's n = 1..fit, row after row (what concatenating row by row gives).
    taken = np.arange(1, width)[None, :] <= fit[:, None]
    if not taken.any():
        return np.empty(0), np.empty(0, dtype=np.int64)
    budget = least[:, 1:][taken]
    count = np.broadcast_to(np.arange(1, width), taken.shape)[taken]
    order = np.lexsort((-count, budget))
    budget, count = budget[order], np.maximum.accumulate(count[order])
    # Keep the monotone staircase: each budget where the count first rises.
    rises = np.concatenate(([True], count[1:] > count[:-1]))
    return budget[rises], count[rises]


def _least_boundary_bytes(model: CostModel) -> float:
    """The least boundary activation a stage can send or receive, per profiled micro-batch."""
    layers = model.profile.layers[:-1]
    return min((x.output_activation_bytes for x in layers), default=0.0)


def flight_bound(model: CostModel, p: Pending, levels: tuple[int, ...]) -> float:
    """The module docstring's bound on candidate ``p`` (one chunk per rank) whose stages take
    ZeRO levels among ``levels``; 0.0 where it does not apply, inf where no split fits."""
    if p.chunks != 1 or model.tables(p.classes[0], p.tp, p.mbs).start_work:
        return 0.0
    pp = len(p.classes)
    boundary = _least_boundary_bytes(model) * p.m * p.mbs / model.profile.micro_batch_size
    if model.transfer_buffer_bytes(p.mbs, 1, 2, p.m) == 0.0:
        boundary = 0.0  # an engine that keeps no receive buffers
    ranks = []
    for s, k in enumerate(p.classes):
        flight = in_flight_chunks(p.schedule, pp, s, p.m)  # type: ignore[arg-type]
        reserved = boundary * ((s > 0) + (s < pp - 1))
        ranks.append(
            rank_steps(model, p.tp, p.mbs, p.dp, levels, k, flight, reserved, p.per_stage_sp)
        )
    num_layers = model.num_layers
    candidates = np.unique(np.concatenate([budgets for budgets, _ in ranks]))
    if not len(candidates):
        return math.inf
    # Every candidate budget at once: whether each rank holds a layer within it and how many
    # layers the ranks hold together. Both only grow with the budget (the staircases rise),
    # so the first candidate that passes is the least X* (what a bisection would find). Ranks
    # of one class and in-flight count share one staircase (``rank_steps`` is cached): each
    # distinct one looked up once, weighted by its ranks.
    distinct: dict[int, tuple[tuple[np.ndarray, np.ndarray], int]] = {}
    for steps in ranks:
        entry = distinct.get(id(steps))
        distinct[id(steps)] = (steps, 1 if entry is None else entry[1] + 1)
    placed = np.ones(len(candidates), dtype=bool)
    covered = np.zeros(len(candidates), dtype=np.int64)
    for (budgets, most), count in distinct.values():
        if not len(budgets):
            # A rank that holds no layer at any budget: no split fits (and ``most`` is
            # empty, which the lookup below cannot index).
            return math.inf
        index = np.searchsorted(budgets, candidates, side="right") - 1
        placed &= index >= 0  # every rank holds a layer
        covered += count * np.where(index >= 0, most[np.maximum(index, 0)], 0)
    passing = np.flatnonzero(placed & (covered >= num_layers))
    if not len(passing):
        return math.inf
    return float(candidates[passing[0]])


def _runs(classes: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The maximal runs of equal classes: (first rank, ranks, class)."""
    out, start = [], 0
    for s in range(1, len(classes) + 1):
        if s == len(classes) or classes[s] != classes[start]:
            out.append((start, s - start, classes[start]))
            start = s
    return out


def run_bound(model: CostModel, p: Pending) -> tuple[float, float]:
    """(least slowest rank, least extra fill): each maximal run of r ranks of one class k
    holds a contiguous range of at least r layers, after at least one layer per earlier rank
    and before at least one per later rank, and from layer 0 when it is first or to the last
    layer when it is last. So it holds some window W of r consecutive layers in those limits:
    its slowest rank takes at least max(max_W w_k, Σ_W w_k / r), and the pipeline's stages
    together at least Σ_l min_j w_j(l) + Σ_runs Σ_W (w_k − min_j w_j) (the runs' windows
    are disjoint); each taken at its least over the windows (no recompute, no sends)."""
    used = tuple(sorted(set(p.classes)))
    fastest, _ = fastest_work(model, p.tp, p.mbs, used, p.per_stage_sp)
    num_layers, pp = len(fastest), len(p.classes)
    slowest = extra = 0.0
    for first, r, k in _runs(p.classes):
        after = pp - first - r
        lowest = 0 if first == 0 else first
        highest = num_layers - r if after == 0 else num_layers - after - r
        if first == 0:
            highest = 0 if after else highest
        if after == 0:
            lowest = num_layers - r if first else 0
        best_slowest, best_extra = _windows(
            model, p.tp, p.mbs, used, k, r, lowest, highest, p.per_stage_sp
        )
        if math.isinf(best_slowest):
            continue  # the run cannot be placed: the DP finds no split (no bound claimed)
        slowest = max(slowest, best_slowest)
        extra += best_extra
    return slowest, extra


@functools.lru_cache(maxsize=65536)
def _windows(
    model: CostModel,
    tp: int,
    mbs: int,
    used: tuple[int, ...],
    k: int,
    r: int,
    lowest: int,
    highest: int,
    per_stage_sp: bool = False,
) -> tuple[float, float]:
    """``run_bound``'s least (slowest rank, extra fill) of a run of r ranks of class k over
    its windows starting at ``lowest``..``highest`` (inf, inf: none). The same run recurs in
    the orders of many compositions and groups (every dp of a (tp, micro-batch size)): it is
    scanned once."""
    fastest, work = fastest_work(model, tp, mbs, used, per_stage_sp)
    times = work[k]
    best_slowest = best_extra = math.inf
    for start in range(lowest, highest + 1):
        window = times[start : start + r]
        best_slowest = min(best_slowest, max(max(window), sum(window) / r))
        best_extra = min(
            best_extra,
            sum(w - f for w, f in zip(window, fastest[start : start + r], strict=True)),
        )
    return best_slowest, best_extra


DUAL_STEPS = 8
"""Grid of the fill bound's dual: each class's share of m − 1 in steps of 1 / DUAL_STEPS."""

DUAL_REFINE = 8
"""Halvings of the step of the fill bound's local search after its grid."""


@functools.lru_cache(maxsize=65536)
def fill_bound(
    model: CostModel,
    tp: int,
    mbs: int,
    m: int,
    counts: tuple[tuple[int, int], ...],
    per_stage_sp: bool = False,
) -> float:
    """A bound on (m − 1) max_s a_s + Σ_s a_s with r_k ranks of class k (``counts``), each
    a_s at least its layers' work w_k(l) (no recompute, no sends), through the dual of the
    fractional split: for every ν ≥ 0 with Σ_k ν_k ≤ m − 1,

        min over splits ≥ Σ_l min_k (1 + ν_k / r_k) w_k(l)

    (the split's linear program: min (m − 1) A + Σ_{s,l} w_s(l) x_sl with Σ_s x_sl = 1 and
    Σ_l w_s(l) x_sl ≤ A; ν_k / r_k is the price of each class-k rank's cap, shared evenly
    among a class's ranks as symmetry allows). It counts where the layers must go when the
    fastest class alone would exceed the slowest rank: ν = 0 is every layer at its fastest.
    The largest over a grid of ν and a local search from its best point is taken."""
    classes = [k for k, _ in counts]
    ranks = np.array([r for _, r in counts], dtype=float)
    _, work = fastest_work(model, tp, mbs, tuple(sorted(classes)), per_stage_sp)
    w = np.array([work[k] for k in classes])  # classes × layers
    grid = np.array(
        [
            c
            for c in itertools.product(range(DUAL_STEPS + 1), repeat=len(classes))
            if sum(c) == DUAL_STEPS
        ],
        dtype=float,
    )

    def values(nu: np.ndarray) -> np.ndarray:  # points × classes -> the bound at each
        return ((1.0 + nu / ranks)[:, :, None] * w[None, :, :]).min(axis=1).sum(axis=1)

    points = grid * (m - 1) / DUAL_STEPS
    found = values(points)
    best, value = points[int(found.argmax())], float(found.max())
    # Then finer: move a share of m − 1 from one class to another while the bound rises
    # (the dual is concave: a grid point's neighbourhood holds the optimum's).
    pairs = [(i, j) for i in range(len(classes)) for j in range(len(classes)) if i != j]
    step = (m - 1) / DUAL_STEPS
    for _ in range(DUAL_REFINE if pairs else 0):
        step /= 2
        for _ in range(2):
            trials = np.repeat(best[None, :], len(pairs), axis=0)
            for row, (i, j) in enumerate(pairs):
                moved = min(step, trials[row, j])
                trials[row, i] += moved
                trials[row, j] -= moved
            found = values(trials)
            if found.max() <= value:
                break
            best, value = trials[int(found.argmax())], float(found.max())
    return value


def order_bound(model: CostModel, p: Pending, levels: tuple[int, ...]) -> float:
    """The bound of the module docstring on candidate ``p`` (one chunk per rank) whose stages
    take ZeRO levels among ``levels``, at least ``p.bound``; inf where no split fits."""
    if p.chunks != 1 or model.tables(p.classes[0], p.tp, p.mbs).start_work:
        return p.bound
    flight = flight_bound(model, p, levels)
    if math.isinf(flight):
        return math.inf
    slowest, extra = run_bound(model, p)
    used = tuple(sorted(set(p.classes)))
    fastest, _ = fastest_work(model, p.tp, p.mbs, used, p.per_stage_sp)
    counts = tuple((k, p.classes.count(k)) for k in used)
    fill = fill_bound(model, p.tp, p.mbs, p.m, counts, p.per_stage_sp)
    return max(p.bound, (p.m - 1) * max(slowest, flight) + sum(fastest) + extra, fill)
