r"""The zero-bubble bound's packings, with what each rank's memory must hold.

``autoplan.solve.certificate.zero_bubble_bound_ms`` states the bound: torch runs the
zero-bubble schedules at dp 1 only, so each pipeline rank is one tp group of t GPUs of one
class k taking every sample of its layers, and plays all its passes one after another; with
every rank's time at most X, whole layers must go to ranks within their time and memory. This
module holds the two packings that find the least such X, and the per-rank memory they count.

Memory. ``CostModel.evaluate`` holds, on a rank, its weights, gradients and optimizer states
(one rank: nothing to shard, every ZeRO level alike) plus ``flight_r × max_c S_c`` of saved
activations (S_c one micro-batch's device-resident saved bytes of the rank's chunk c, in the
rank's recompute and offload mode; flight_r the most chunk-forwards rank r holds at once,
``cost.zero_bubble.peak_in_flight``) plus transfer buffers and transients (>= 0, left out).
With v chunks per rank, ``flight_r × max_c S_c >= (flight_r / v) Σ_c S_c``, and over every
zero-bubble schedule of the space (ZB-H1 and ZB1P at any v, ZB-V, DualPipeV), every rank r of a
pipeline of p ranks and m micro-batches has ``flight_r / v >= q(p, m) = min(p, (m + 1) / 2)``
(``in_flight_floor``; ZB-V's first rank is the least, tests/test_zero_bubble_bound_oracle.py
checks the formula against the schedules' action lists). Offloaded activations are parked in
host memory instead, ``flight_r × parked``, within the GPU's host budget. A rank's groups are
one mode for all its chunks (``evaluate`` requires it), so a rank of kind (k, t) holding layers
A fits in mode μ (sequence parallelism either way) only if

    Σ_A static_l + q Σ_A S_l(μ) <= usable_k   and   q Σ_A parked_l(μ) <= host_k,

and then plays at least m Σ_A (F_l + B_l)(μ) (a recomputed forward, an exposed copy: the
mode's own times). Each packing takes, per rank, the most layers over the modes that fit.

Which q applies depends on the pipeline's rank count p, which the packings do not all track:

- p >= (m + 1) / 2: q = (m + 1) / 2 for every p; the exact packing of layer types with each
  rank's transfers (``typed_cover_threshold``, GPUs per class, any rank count) with that q.
- 2 <= p < (m + 1) / 2: q = p, and the plan has at most p ranks. Per p, the blocks (the
  most numerous layer type; the others only add) must fit in ranks of time at most X less
  their least transfers: with n_{k,t} the most blocks a rank of kind (k, t) can hold, the
  linear relaxation of "at most p ranks, at most N_k GPUs of class k" covers at most
  ``min_λ≥0 λ p + Σ_k N_k max_t max(0, (n_{k,t} − λ) / t)`` blocks (weak duality on the rank
  count; ``ranked_cover_threshold``), and X is at least the least value where that reaches
  the block count.

Both are lower bounds on the slowest rank of every plan of their rank counts, so the least of
the two (and of the one-rank plan) bounds every zero-bubble plan of m micro-batches; the bound
over the space is the least over m.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from autoplan.cost.layers import LayerCost
from autoplan.cost.model import CostModel
from autoplan.cost.offload import (
    mode_backward_ms,
    mode_forward_ms,
    parked_bytes,
    resident_saved_bytes,
)
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import class_tp_choices, recompute_modes

__all__ = [
    "RankKind",
    "Variant",
    "in_flight_floor",
    "rank_kinds",
    "ranked_cover_threshold",
    "typed_cover_threshold",
]

TYPED_STATES = 64
"""Most combinations of the non-bulk layer types (``typed_cover_threshold``) the exact
packing of layer types tracks; past it only the sorted-prefix count."""

TYPED_WORK = 400_000
"""Most packing steps (GPUs × rank kinds × combinations²) one feasibility test of the typed
packing may take; past it only the sorted-prefix count."""


def in_flight_floor(pipeline_degree: int, num_micro_batches: int) -> float:
    """q(p, m) of the module docstring: the least micro-batches' worth of a rank's saved
    activations any rank of any zero-bubble schedule of p ranks and m micro-batches holds."""
    return min(float(pipeline_degree), (num_micro_batches + 1) / 2)


@dataclass(frozen=True, eq=False)
class Variant:
    """One way a rank of a kind runs its layers (a mode, sequence parallelism on or off):
    per layer, its iteration work (m passes, ms), static bytes per GPU (weights, gradients,
    optimizer states), device-resident saved bytes and host-parked bytes of one
    micro-batch."""

    works: np.ndarray
    statics: np.ndarray
    saved: np.ndarray
    parked: np.ndarray


@dataclass(frozen=True)
class RankKind:
    """Ranks of class ``k`` and tp ``t``: the variants they may run, the memory they may
    fill and the host memory they may park in (per GPU)."""

    k: int
    t: int
    variants: tuple[Variant, ...]
    room: float
    host: float


def rank_kinds(
    model: CostModel,
    batch: int,
    m: int,
    options: SolveOptions,
    sequence_parallel: bool | None,
    memory: bool = True,
) -> list[RankKind]:
    """Every rank kind of the space at m micro-batches, with its variants (module docstring);
    without ``memory`` one variant per sequence-parallel setting, no recompute, and no saved
    activations (the memory-free count). None where every mode of the space is one zero bubble
    refuses (selective recompute pinned)."""
    b = batch // m
    pinned = SolveOptions(tp=options.tp)
    # The least bytes a parameter can take on a dp-1 rank: of the ZeRO levels, the most
    # sharded (over a view's cp ranks).
    per_param = min(model.static_bytes_per_param(1, level) for level in range(4))
    # Zero bubble refuses selective recompute (schedule.zero_bubble.zero_bubble_problem).
    modes = [x for x in recompute_modes(options) if not x.startswith("selective")]
    out = []
    for c in model.classes:
        host_link = c.host_link_bandwidth_gb_per_s
        for t in class_tp_choices(model, c.index, pinned):
            if t > c.total_gpus:
                continue
            settings = [False] if t == 1 or sequence_parallel is False else [False, True]
            variants = []
            for sp in settings:
                tables = model.tables(c.index, t, b, sp)
                # Repeated blocks share one LayerCost: each figure once per distinct object.
                index: dict[int, int] = {}
                distinct: list[LayerCost] = []
                for x in tables.layers:
                    if id(x) not in index:
                        index[id(x)] = len(distinct)
                        distinct.append(x)
                where = np.array([index[id(x)] for x in tables.layers])
                statics = np.array([x.params_per_gpu * per_param for x in distinct])[where]
                # At sub-block grain a stage costs whole blocks as blocks (block_parts): the
                # layer figures are not its memory; count none there (only lowers the bound).
                counted = memory and not tables.blocks
                for mode in modes if counted else ["none"]:
                    figures = np.array(
                        [
                            (
                                m
                                * (
                                    mode_forward_ms(x, mode, host_link)
                                    + mode_backward_ms(x, mode, host_link)
                                ),
                                resident_saved_bytes(x, mode) if counted else 0.0,
                                parked_bytes(x, mode) if counted else 0.0,
                            )
                            for x in distinct
                        ]
                    )[where]
                    variants.append(Variant(figures[:, 0], statics, figures[:, 1], figures[:, 2]))
            if not variants:
                continue  # every mode of the space is one zero bubble refuses: no such rank
            out.append(
                RankKind(
                    c.index,
                    t,
                    tuple(variants),
                    float(model.usable_bytes(c.index)),
                    model.host_budget_bytes(c.index),
                )
            )
    return out


def _layer_types(kinds: list[RankKind], num_layers: int) -> list[list[int]]:
    """The layers grouped by type (the same figures in every variant of every kind), in
    first-layer order."""
    columns = np.array(
        [
            f
            for kind in kinds
            for v in kind.variants
            for f in (v.works, v.statics, v.saved, v.parked)
        ]
    ).reshape(-1, num_layers)
    groups: dict[bytes, list[int]] = {}
    for l in range(num_layers):  # noqa: E741
        groups.setdefault(columns[:, l].tobytes(), []).append(l)
    return list(groups.values())  # in first-layer order (dicts keep insertion order)


def _bulk(kinds: list[RankKind], num_layers: int) -> tuple[list[int], list[list[int]]]:
    """The most numerous layer type (earliest on ties) and the others."""
    members = _layer_types(kinds, num_layers)
    index = max(range(len(members)), key=lambda i: (len(members[i]), -i))
    return members[index], [g for i, g in enumerate(members) if i != index]


class _Rows:
    """Every (kind, variant) of a packing as arrays, the rows of one kind together: per row
    and per non-bulk vector s the four figures (work, static, saved, parked) of what s holds
    (``fixed``, [R, S, 4]), the bulk's per layer (``unit``, [R, 4]), the kind's device and
    host memory; the most bulk layers each row can add is then a few array operations."""

    def __init__(self, kinds: list[RankKind], fixed: list[np.ndarray], unit: list[np.ndarray]):
        sizes = [len(kind.variants) for kind in kinds]
        self.starts = np.cumsum([0, *sizes[:-1]])
        self.fixed = np.concatenate(fixed)  # [R, S, 4]
        self.unit = np.concatenate(unit)  # [R, 4]
        self.room = np.repeat([kind.room for kind in kinds], sizes)[:, None]
        self.host = np.repeat([kind.host for kind in kinds], sizes)[:, None]
        self.kind_class = [kind.k for kind in kinds]
        self.row_class = np.repeat(self.kind_class, sizes)

    def memory_caps(self, q: float, cap: int) -> np.ndarray:
        """[R, S]: the most bulk layers memory lets each row add beside s at q micro-batches
        in flight (at most ``cap``), −1 where s alone does not fit."""
        device = self.fixed[:, :, 1] + q * self.fixed[:, :, 2]
        parking = q * self.fixed[:, :, 3]
        per = (self.unit[:, 1] + q * self.unit[:, 2])[:, None]
        per_host = (q * self.unit[:, 3])[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_device = np.where(per > 0, np.floor((self.room - device) / per + 1e-9), cap)
            by_host = np.where(
                (per_host > 0) & np.isfinite(self.host),
                np.floor((self.host - parking) / per_host + 1e-9),
                cap,
            )
        n = np.clip(np.minimum(by_device, by_host), 0, cap)
        # A little slack: the figures are sums of the same floats.
        fits = (device <= self.room * (1 + 1e-12)) & (parking <= self.host * (1 + 1e-12))
        return np.where(fits, n, -1)

    def gains(self, limits: np.ndarray, memory: np.ndarray, cap: int) -> np.ndarray:
        """[K, S]: per kind the most bulk layers a rank of time at most ``limits`` (per row)
        can add beside s, over its variants (−1: s alone fits in none)."""
        # A little slack on both sides: the candidates are sums of these same figures, and a
        # rounding below one must not make it infeasible (more slack only lowers the bound).
        limit = (limits * (1 + 1e-12) + 1e-9)[:, None]
        work = self.fixed[:, :, 0]
        w = self.unit[:, 0][:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            by_time = np.where(w > 0, np.floor((limit - work) / w + 1e-9), cap)
        n = np.where(
            (work > limit) | (memory < 0), -1, np.clip(np.minimum(by_time, memory), 0, cap)
        )
        return np.maximum.reduceat(n, self.starts, axis=0).astype(int)


def _least_feasible(candidates: np.ndarray, feasible: Callable[[float], bool], cap: float) -> float:
    """The least of the ascending ``candidates`` that is ``feasible`` (monotone: feasible at
    X, feasible above X), by bisection; ``cap`` when none is. Often nothing up to the cap is
    feasible (a plan in hand beats every zero-bubble one): one test of the largest says so."""
    if not len(candidates) or not feasible(float(candidates[-1])):
        return cap
    low, high = 0, len(candidates) - 1
    while low < high:
        middle = (low + high) // 2
        if feasible(float(candidates[middle])):
            high = middle
        else:
            low = middle + 1
    return float(candidates[low])


def typed_cover_threshold(
    model: CostModel,
    kinds: list[RankKind],
    sides: dict[int, tuple[float, float]],
    q: float,
    cap: float = math.inf,
) -> float | None:
    r"""The least X at which ranks of two or more (each of time at most X) can hold every
    layer, counting whole layers of each type, each rank's transfers and its memory at q
    micro-batches in flight (module docstring); None when the types are too many to count
    (``TYPED_STATES``, ``TYPED_WORK``). At most ``cap``: when no X up to it is feasible the
    answer is ``cap`` (still a bound: every plan's X is above it).

    Types: layers with the same figures in every variant of every rank kind (a transformer's
    blocks; its embedding and head each alone). The most numerous type is the bulk; the
    others' counts form a mixed-radix vector s (how many of each a set of ranks holds). A rank
    of class k spends its layers' work plus, per iteration, its transfers: with two ranks or
    more every rank has a neighbour, so at least ``sides[k][0]`` (two transfers per
    micro-batch with the cheapest neighbour it can have); and when the plan spans two classes
    or more, each class it uses has a rank next to another class (the chain of stages passes
    through every rank), which spends at least ``sides[k][1]`` (two transfers per
    micro-batch across classes) instead. For a rank of kind (k, t) holding non-bulk layers s',
    n_{k,t}(s') is the most bulk layers it can add within time X and memory, over its
    variants (−1 when s' alone does not fit). Per class and flag β (a rank next to another
    class placed or not), best_k[g][β][s] = the most bulk layers ranks using at most g of its
    GPUs can hold beside non-bulk layers s: an unbounded knapsack over the rank kinds (tp
    groups are whole; their placement in nodes only constrains further). The classes combine
    by their vectors (capped at the counts), each used class with β = 1, or one class alone
    with either. X is feasible when a combination holds every non-bulk layer and at least
    the bulk's count. Every constraint is one a dp-1 plan of two ranks or more meets (the
    order of the pipeline and the nodes only constrain further), so the least feasible X
    among the rank times that can occur is a lower bound on such a plan's slowest rank."""
    num_layers = model.num_layers
    bulk, others_groups = _bulk(kinds, num_layers)
    bulk_layer, bulk_count = bulk[0], len(bulk)
    others = [(g[0], len(g)) for g in others_groups]
    radix = [count + 1 for _, count in others]
    states = math.prod(radix)
    if states > TYPED_STATES:
        return None
    budgets = {
        c.index: min(
            c.total_gpus, num_layers * max((x.t for x in kinds if x.k == c.index), default=0)
        )
        for c in model.classes
    }
    steps = 2 * sum(budgets[x.k] for x in kinds) * states * states
    if steps > TYPED_WORK:
        return None
    # vectors[state]: the counts of each non-bulk type, the first type varying fastest.
    vectors = [tuple(reversed(v)) for v in itertools.product(*(range(r) for r in reversed(radix)))]
    position = {v: i for i, v in enumerate(vectors)}
    add = [
        [
            position[tuple(min(x + y, r - 1) for x, y, r in zip(u, v, radix, strict=True))]
            for v in vectors
        ]
        for u in vectors
    ]
    full = states - 1

    # Per kind and variant: per non-bulk vector its four figures; the bulk's per layer.
    counts_of = np.array(vectors, dtype=float)  # [S, types]
    fixed, unit = [], []
    for kind in kinds:
        figures = np.array(
            [[v.works, v.statics, v.saved, v.parked] for v in kind.variants]
        )  # [V, 4, L]
        layers = [i for i, _ in others]
        fixed.append(np.einsum("st,vjt->vsj", counts_of, figures[:, :, layers]))
        unit.append(figures[:, :, bulk_layer])
    rows = _Rows(kinds, fixed, unit)
    memory = rows.memory_caps(q, bulk_count)
    plain_of = np.array([sides[k][0] for k in rows.row_class])
    crossing_of = np.array([sides[k][1] for k in rows.row_class])

    def merge(left: list[int], right: list[int]) -> list[int]:
        """The most bulk layers per vector of two disjoint sets of ranks together."""
        out = [-1] * states
        for s, held in enumerate(left):
            if held < 0:
                continue
            row = add[s]
            for extra, n in enumerate(right):
                if n >= 0 and held + n > out[row[extra]]:
                    out[row[extra]] = held + n
        return out

    def feasible(limit: float) -> bool:
        """Whether ranks of time at most ``limit`` hold every layer (the docstring's test)."""
        plain_gains = rows.gains(limit - plain_of, memory, bulk_count).tolist()
        crossing_gains = rows.gains(limit - crossing_of, memory, bulk_count).tolist()
        total = [-1] * states
        total[0] = 0
        alone = False
        for c in model.classes:
            if c.index not in sides:
                continue  # no rank kind of this class (no tp degree of the space fits it)
            items = [
                (kind.t, plain_gains[i], crossing_gains[i])
                for i, kind in enumerate(kinds)
                if kind.k == c.index
            ]
            if not items:
                continue
            budget = budgets[c.index]
            # best[g][beta]: per vector, the most bulk layers (-1: unreachable).
            best = [[[-1] * states, [-1] * states] for _ in range(budget + 1)]
            best[0][0][0] = 0
            for g in range(1, budget + 1):
                rows_g = [list(best[g - 1][0]), list(best[g - 1][1])]  # a GPU left unused
                for t, plain_gain, crossing_gain in items:
                    if t > g:
                        continue
                    before = best[g - t]
                    for beta in (0, 1):
                        for gain, after in ((plain_gain, beta), (crossing_gain, 1)):
                            row = rows_g[after]
                            for s, held in enumerate(before[beta]):
                                if held < 0:
                                    continue
                                into = add[s]
                                for extra, n in enumerate(gain):
                                    if n >= 0 and held + n > row[into[extra]]:
                                        row[into[extra]] = held + n
                best[g] = rows_g
            alone = alone or best[budget][0][full] >= bulk_count
            used = best[budget][1]
            total = [max(x, y) for x, y in zip(total, merge(total, used), strict=True)]
        return alone or total[full] >= bulk_count

    # The candidates: every time a rank of some kind can have (non-bulk set plus n bulk, plus
    # one of its class's two allowances): feasibility only changes there.
    counts = np.arange(bulk_count + 1, dtype=float)
    bases = rows.fixed[:, :, 0]  # [R, S]
    values = np.concatenate(
        [
            (bases[:, :, None] + counts[None, None, :] * rows.unit[:, 0, None, None]).ravel()
            + allowance
            for allowance in (
                plain_of.repeat(states * len(counts)),
                crossing_of.repeat(states * len(counts)),
            )
        ]
    )
    values = values[np.isfinite(values)]
    candidates = np.unique(values[values <= cap])
    return _least_feasible(candidates, feasible, cap)


def ranked_cover_threshold(
    model: CostModel,
    kinds: list[RankKind],
    sides: dict[int, tuple[float, float]],
    ranks: list[tuple[int, float]],
    cap: float = math.inf,
) -> float:
    r"""The least X at which, for some (p, q) of ``ranks``, at most p ranks (each of time at
    most X less its least transfers, at q micro-batches in flight) can hold the bulk's
    layers by the linear relaxation of the module docstring; ``cap`` when none up to it is
    (inf when ``ranks`` is empty and no cap)."""
    usable = [kind for kind in kinds if kind.k in sides]
    if not ranks or not usable:
        return cap if ranks else math.inf
    bulk, _ = _bulk(usable, model.num_layers)
    layer, count = bulk[0], len(bulk)
    rows = _Rows(
        usable,
        [np.zeros((len(kind.variants), 1, 4)) for kind in usable],
        [
            np.array(
                [
                    [v.works[layer], v.statics[layer], v.saved[layer], v.parked[layer]]
                    for v in kind.variants
                ]
            )
            for kind in usable
        ],
    )
    # Per (p, q): the memory caps, and the GPUs and tp of each kind.
    memory = np.stack([rows.memory_caps(q, count)[:, 0] for _, q in ranks])  # [P, R]
    limits = np.array([p for p, _ in ranks], dtype=float)[:, None]  # [P, 1]
    plain_of = np.array([sides[k][0] for k in rows.row_class])  # its least transfers
    w = rows.unit[:, 0]
    tp = np.array([kind.t for kind in usable], dtype=float)
    classes = sorted(set(rows.kind_class))
    member = np.array([[kind.k == k for kind in usable] for k in classes])  # [C, K]
    gpus = np.array([model.classes[k].total_gpus for k in classes], dtype=float)

    def feasible(limit: float) -> bool:
        """Whether, for some (p, q), the relaxation covers the bulk (module docstring)."""
        # ``_Rows.gains`` for every (p, q) at once (nothing beside the bulk: s = 0).
        spare = (limit - plain_of) * (1 + 1e-12) + 1e-9
        with np.errstate(divide="ignore", invalid="ignore"):
            by_time = np.where(w > 0, np.floor(spare / w + 1e-9), count)
        n = np.where(
            (spare < 0)[None, :] | (memory < 0),
            -1,
            np.clip(np.minimum(by_time[None, :], memory), 0, count),
        )
        held = np.maximum.reduceat(n, rows.starts, axis=1).astype(float)  # [P, K]
        held = np.where(held > 0, held, 0.0)
        # Weak duality on "at most p ranks": any price λ >= 0 bounds; the least over the
        # breakpoints (λ = 0 or some n) is the relaxation's value.
        prices = np.concatenate([np.zeros((len(ranks), 1)), held], axis=1)  # [P, Λ]
        per_gpu = (held[:, None, :] - prices[:, :, None]) / tp  # [P, Λ, K]
        best = np.where(member[None, None], per_gpu[:, :, None, :], 0.0).max(axis=3)  # [P, Λ, C]
        value = prices * limits + (np.maximum(best, 0.0) * gpus).sum(axis=2)
        return bool((value.min(axis=1) >= count - 1e-9).any())

    # Feasibility only changes where a rank's blocks and its class's allowance add up.
    counts = np.arange(1, count + 1, dtype=float)
    values = (counts[None, :] * rows.unit[:, 0, None] + plain_of[:, None]).ravel()
    candidates = np.unique(values[np.isfinite(values) & (values <= cap)])
    return _least_feasible(candidates, feasible, cap)
