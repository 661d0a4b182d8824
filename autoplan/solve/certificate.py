r"""The search's certificate: a proven lower bound on the optimum beside the plan found.

Every family of the search (``autoplan.solve.search``) reports a *floor*: every plan of the
family that it did not return costs at least that much. A family searched to the end by
branch and bound has the threshold it pruned against as its floor (``incumbent × (1 − gap)``
with ``--gap``); a part the time limit cut off has the bound of what it left unexplored; a
part with no bound of its own (never started, or a heuristic space such as the zero-bubble
schedules tried at the best partitions) has the *work bound* below. So

    lower_bound = min(best plan found, every family's floor)

is a lower bound on the best plan of the space, and ``gap = (found − lower_bound) / found``.

The work bound, valid for every plan of the space whatever its schedule (``work_bound_ms``).
For a plan with m micro-batches of b = B / m samples, pipeline rank r's iteration is at
least m × its per-micro-batch work plus its tail (1F1B: (m − 1) max_r a_r + Σ_r b_r ≥ m a_r;
interleaved the same over a rank's chunks; zero bubble plays every pass of every rank; the
tail holds at least one optimizer step overhead). A replica of kind (class k, tp t) taking x
of a stage's b samples spends t · m · time_{k,t}(l, x) GPU-ms on layer l per iteration, and
time(x) / x does not grow with x in the cost model (its terms are linear in the samples or
fixed per pass), so t · m · x / b · time_{k,t}(l, b) is less. Summing over the replicas of
the stage (Σ x = b) and weighing class k's GPU-ms by λ_k ≥ 0 with Σ_k λ_k N_k = 1 (N_k GPUs
of class k; weak duality of the fractional assignment of layers to GPUs):

    T ≥ min_k (2 m ovh_k + step_k) + Σ_l min_k λ_k ω_k(l),
    ω_k(l) = min_t t · m · time_{k,t}(l, b)   (no recompute, sequence parallelism either way)

It ignores the bubble and every communication, so it is loose; the exact families are what
close the gap. λ_k ∝ 1 / Ω_k (Ω_k = Σ_l ω_k(l)) is exact when every layer is the same factor
faster on one class than on another.

The zero-bubble bound (``zero_bubble_bound_ms``), valid for every zero-bubble plan whatever
its partition: torch runs those schedules at dp 1 only, so each pipeline rank is one tp group
of t GPUs of one class k taking every sample of its layers, and it plays all its passes one
after another: T ≥ m Σ_{l ∈ rank} w_{k,t}(l) + 2 m ovh + step, w_{k,t}(l) = time_{k,t}(l, b)
(no recompute; sequence parallelism either way). Whole layers, not fractions, go to a rank,
and its weights, gradients and optimizer states must fit its memory. So if every rank's
work is at most X, a rank of kind (k, t) holds at most n_{k,t}(X) layers: the most layers
whose c least works add up to at most X and whose c least parameter memories fit (any c
layers cost at least the c least). With r_{k,t} ranks of each kind, Σ_t t r_{k,t} ≤ N_k, the
layers covered are Σ r_{k,t} n_{k,t}(X) ≤ Σ_k N_k max_t n_{k,t}(X) / t; a plan needs all L, so
its X is at least the least X where that reaches L (a threshold among the prefix sums of the
sorted works). It is the work bound's integrality gap: at a few layers per GPU one layer more
on the slowest rank is most of the iteration. Transfers block both sides
(``autoplan.cost.zero_bubble``): with two ranks or more, every rank sends and receives at
least once per micro-batch (a forward out and its gradient back, or the reverse), each at
least the least boundary transfer between two such ranks; with one rank, that rank holds
every layer. So the bound is also at least min(one rank's whole work, X + 2 m × that
transfer). m × time(B / m) does not fall as m grows (per-sample time does not grow with the
share), nor does m × transfer(B / m) (a latency per transfer plus bytes that scale with the
samples), so the least m of the space bounds every m.

That count lets every rank claim the same light layers (one head on every rank), and charges
transfers as if every rank sat next to its cheapest neighbour. Where the layers are of few
types (a transformer's blocks, embedding and head: ``_typed_cover_threshold``), the bound also
packs whole layers of each type exactly (each layer on one rank, each rank's layers within
its time and memory, its tp groups within its class's GPUs) and charges each rank its
transfers: with two ranks or more every rank has a neighbour (two transfers per micro-batch
with the cheapest it can have), and a plan spanning two classes or more has, in every class
it uses, a rank next to another class (the chain of stages passes through every rank: two
transfers per micro-batch across classes, on the slow link between them). Llama-2-7B on
h100-a100-l4 is the case it was made for: the count let an L4 tp-8 rank hold the head, which
costs it 0.69 s of transfers to its neighbours, and let the H100s hold three blocks per tp-2
rank where the rank next to the A100s cannot.

Both count no activations, and so hold at the space's least m, where one micro-batch of B / m
samples is the most a rank could keep. A zero-bubble rank keeps its saved activations from each
forward to its W: at least q(p, m) = min(p, (m + 1) / 2) micro-batches' worth on every rank of a
p-rank pipeline (``autoplan.solve.zero_bubble_bound``, which states the proof). Per micro-batch
count m the packings are run again with each rank's memory counted (weights and optimizer
states, plus q times its layers' saved activations in the recompute and offload mode that
serves it best, each mode at its own time), and the bound is the least over m of the larger of
that and the count above. Llama-2-13B on h100-a100-l4 is the case it was made for: without the
activations the bound let 256 samples' activations sit in one micro-batch (m = 1) on ranks of
seven blocks; counted, m <= 32 forces full recompute (+30% work) and m >= 64 pays its
transfers' latencies, and the bound passes the 1F1B plan found.
"""

from __future__ import annotations

import bisect
import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

from autoplan.cost.model import CostModel, LinkSide
from autoplan.plan.schema import SearchRecord
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import class_tp_choices, divisors
from autoplan.solve.zero_bubble_bound import (
    RankKind,
    in_flight_floor,
    rank_kinds,
    ranked_cover_threshold,
    typed_cover_threshold,
)

__all__ = ["Floors", "search_record", "work_bound_ms", "zero_bubble_bound_ms"]

PROVEN_TOLERANCE = 1e-9
"""Relative gap below which the plan is proven optimal (floating-point noise of the costs)."""


@dataclass
class Floors:
    """What a search proved: the least floor of its parts (``math.inf`` where every part was
    searched to the end and found nothing better than what it returned)."""

    floor_ms: float = math.inf

    def add(self, value: float) -> None:
        """Another part's floor."""
        self.floor_ms = min(self.floor_ms, value)


def _per_layer_gpu_ms(
    model: CostModel, batch: int, m: int, tp: int | None, sequence_parallel: bool | None
) -> list[list[float] | None]:
    """ω_k(l) of the module docstring, per class (a list of L values; None when the class
    runs no tp degree of the space)."""
    b = batch // m
    out: list[list[float] | None] = []
    pinned = SolveOptions(tp=tp)
    for c in model.classes:
        best: list[float] | None = None
        for t in class_tp_choices(model, c.index, pinned):
            settings = [False] if t == 1 or sequence_parallel is False else [False, True]
            for sp in settings:
                layers = model.tables(c.index, t, b, sp).layers
                values = [t * m * (x.forward_ms() + x.backward_ms("none")) for x in layers]
                best = (
                    values
                    if best is None
                    else [min(a, v) for a, v in zip(best, values, strict=True)]
                )
        out.append(best)
    return out


def _lambda_bound(omega: list[list[float] | None], counts: list[int]) -> float:
    """max over a few λ of Σ_l min_k λ_k ω_k(l), with Σ_k λ_k N_k = 1 (module docstring)."""
    present = {k: values for k, values in enumerate(omega) if values is not None and counts[k] > 0}
    usable = list(present)
    if not usable:
        return math.inf
    totals = {k: sum(values) for k, values in present.items()}
    if any(total <= 0 for total in totals.values()):
        return 0.0
    layers = len(present[usable[0]])

    def value(weights: dict[int, float]) -> float:
        norm = sum(weights[k] * counts[k] for k in usable)
        if norm <= 0:
            return 0.0
        return (
            sum(
                min(weights[k] * present[k][l] for k in usable)
                for l in range(layers)  # noqa: E741
            )
            / norm
        )

    base = {k: 1.0 / totals[k] for k in usable}
    best = value(base)
    # A few multiplicative steps per class: the dual is concave in λ, any λ is valid.
    for k in usable:
        for factor in (0.5, 0.8, 1.25, 2.0):
            trial = dict(base)
            trial[k] *= factor
            best = max(best, value(trial))
    return best


def _view_key(model: CostModel) -> tuple[object, ...]:
    """What the layer tables differ by between the views of one solve's model: their classes
    and cp and ep degrees (views with sequence parallelism on or off share it: ω takes both
    settings)."""
    classes = tuple((c.index, c.total_gpus, c.gpus_per_node, c.gpu.name) for c in model.classes)
    return (classes, getattr(model, "context_parallel", 1), getattr(model, "expert_parallel", 1))


@dataclass
class _BoundCache:
    """The bounds computed for one model and its views, by what they were computed for."""

    spread: dict[tuple[object, ...], tuple[float, float, float]] = field(default_factory=dict)
    # (bound, exact): exact unless it stopped at the cap it was asked with (the bound is then
    # at least that value)
    zero_bubble: dict[tuple[object, ...], tuple[float, bool]] = field(default_factory=dict)


def _cache_of(model: CostModel) -> _BoundCache:
    """The bounds computed for this model and its views: kept in the model itself, which
    the views copied from it after its creation share (``copy.copy``), and which dies with
    the solve (never keyed by ``id``, which a later solve's objects may reuse)."""
    cache: _BoundCache = vars(model).setdefault("_work_bound_cache", _BoundCache())
    return cache


def _spread_and_overheads(
    model: CostModel, batch: int, m: int, tp: int | None, sequence_parallel: bool | None
) -> tuple[float, float, float]:
    """(B Σ_l min_k λ_k ω_k(l) / m-free part, least 2 × pass overhead, least step overhead)
    at share B / m, cached in the model for its views (``_cache_of``)."""
    cache = _cache_of(model).spread
    key = (_view_key(model), batch, m, tp, sequence_parallel)
    found = cache.get(key)
    if found is None:
        omega = _per_layer_gpu_ms(model, batch, m, tp, sequence_parallel)
        counts = [c.total_gpus for c in model.classes]
        spread = _lambda_bound(omega, counts)
        usable = [c.index for c, values in zip(model.classes, omega, strict=True) if values]
        if not usable:
            found = (math.inf, 0.0, 0.0)
        else:
            found = (
                spread,
                min(2 * model.pass_overhead_ms(k) for k in usable),
                min(model.step_overhead_ms(k) for k in usable),
            )
        cache[key] = found
    return found


def work_bound_ms(
    model: CostModel, batch: int, options: SolveOptions, counts: list[int] | None = None
) -> float:
    """The work bound of the module docstring over the micro-batch counts ``counts``
    (default: every divisor of ``batch``, a superset of every family's).

    One table set serves every count: ω is taken at the space's largest share (B over its
    least m), which per-sample time only favours (it does not grow with the share), and the
    pass overheads at the least of ``counts``: never above the per-m bound of any count."""
    every = divisors(batch)
    if options.num_micro_batches is not None:
        every = [m for m in every if m == options.num_micro_batches]
    counts = every if counts is None else [m for m in counts if m in every]
    if not counts:
        return math.inf
    # Sequence parallelism pinned on still leaves tp 1 stages off: either setting counts.
    sequence_parallel = False if options.sequence_parallel is False else None
    # The table set at the space's largest share serves every count (one per model view).
    spread, passes, step = _spread_and_overheads(
        model, batch, min(every), options.tp, sequence_parallel
    )
    if math.isinf(spread):
        return math.inf
    # ω scales as m × time(B / m) = B × per-sample time: the spread holds at any m >= least.
    return spread + step + min(counts) * passes


def _zero_bubble_works(
    model: CostModel, batch: int, m: int, tp: int | None, sequence_parallel: bool | None
) -> list[tuple[int, int, list[float], list[float]]]:
    """Per rank kind (class k, tp t): (k, t, each layer's iteration work m · w_{k,t}(l), each
    layer's least parameter bytes per GPU); the zero-bubble bound's ingredients (module
    docstring)."""
    b = batch // m
    pinned = SolveOptions(tp=tp)
    # The least bytes a parameter can take on a dp-1 rank: of the ZeRO levels, the most sharded
    # (over a view's cp ranks); the rank's activations and transients only add.
    per_param = min(model.static_bytes_per_param(1, level) for level in range(4))
    out = []
    for c in model.classes:
        for t in class_tp_choices(model, c.index, pinned):
            if t > c.total_gpus:
                continue
            settings = [False] if t == 1 or sequence_parallel is False else [False, True]
            works: list[float] | None = None
            params: list[float] = []
            for sp in settings:
                layers = model.tables(c.index, t, b, sp).layers
                values = [m * (x.forward_ms() + x.backward_ms("none")) for x in layers]
                works = values if works is None else list(map(min, works, values))
                params = [x.params_per_gpu * per_param for x in layers]
            assert works is not None
            out.append((c.index, t, works, params))
    return out


def _cover_threshold(
    model: CostModel, kinds: list[tuple[int, int, list[float], list[float]]], heavy: list[int]
) -> float:
    """The least X at which ranks of work at most X can hold the layers ``heavy`` (module
    docstring), inf when their parameters never fit."""
    total = {c.index: c.total_gpus for c in model.classes}
    limits = []
    for k, t, works, params in kinds:
        memory = list(itertools.accumulate(sorted(params[l] for l in heavy)))  # noqa: E741
        fit = bisect.bisect_right(memory, model.usable_bytes(k))
        prefix = [0.0, *itertools.accumulate(sorted(works[l] for l in heavy))]  # noqa: E741
        limits.append((k, t, prefix, fit))

    def covered(limit: float) -> float:
        """An upper bound on the layers of ``heavy`` ranks of work <= ``limit`` can hold."""
        best: dict[int, float] = {}
        for k, t, prefix, fit in limits:
            n = min(bisect.bisect_right(prefix, limit) - 1, fit)
            best[k] = max(best.get(k, 0.0), n / t)
        return sum(total[k] * value for k, value in best.items())

    # covered() only changes at the prefix sums: the least one that covers, by bisection.
    thresholds = sorted({value for _, _, prefix, _ in limits for value in prefix})
    low, high = 0, len(thresholds)
    while low < high:
        middle = (low + high) // 2
        if covered(thresholds[middle]) >= len(heavy):
            high = middle
        else:
            low = middle + 1
    return thresholds[low] if low < len(thresholds) else math.inf


def _least_transfer_ms(model: CostModel, b: int, classes: list[int]) -> float:
    """The least time one boundary transfer of a b-sample micro-batch can take between two
    dp-1 ranks (each one tp group holding the whole micro-batch) of ``classes``: over every
    ordered pair of classes, ``CostModel.boundary_ms`` with each side's samples b, at the
    smallest boundary activation of the model."""
    layers = model.profile.layers[:-1]
    if not layers:
        return 0.0
    size = min(x.output_activation_bytes for x in layers) / model.profile.micro_batch_size

    def side(k: int) -> LinkSide:
        return LinkSide((k,), b, b, k if model.classes[k].num_nodes == 1 else None)

    return min(model.boundary_ms(side(a), side(z), size) for a in classes for z in classes)


def _rank_sides(
    model: CostModel, b: int, m: int, classes: list[int]
) -> dict[int, tuple[float, float]]:
    """Per class k of ``classes``: (what a rank of k spends on the transfers with its
    cheapest neighbour, what it spends next to another class of ``classes``) per iteration,
    two transfers per micro-batch (a forward out and its gradient back, or the reverse) of m
    micro-batches of b samples (``_least_transfer_ms``'s sides and size; inf across classes
    when k is the only one)."""
    layers = model.profile.layers[:-1]
    size = (
        min(x.output_activation_bytes for x in layers) / model.profile.micro_batch_size
        if layers
        else 0.0
    )

    def side(k: int) -> LinkSide:
        return LinkSide((k,), b, b, k if model.classes[k].num_nodes == 1 else None)

    out = {}
    for k in classes:
        same = model.boundary_ms(side(k), side(k), size)
        across = min(
            (
                min(
                    model.boundary_ms(side(k), side(z), size),
                    model.boundary_ms(side(z), side(k), size),
                )
                for z in classes
                if z != k
            ),
            default=math.inf,
        )
        out[k] = (2 * m * min(same, across), 2 * m * across)
    return out


HEAVY_SETS = 8
"""How many sets of heaviest layers the zero-bubble bound tries: all but the 0..7 lightest
(an embedding, a final norm, a head: what every rank could otherwise claim); fewer layers
than that only lower the count to cover."""


def zero_bubble_bound_ms(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    packing: bool = True,
    memory: bool = True,
    cap_ms: float = math.inf,
) -> float:
    """The zero-bubble bound of the module docstring: no zero-bubble plan of the space (dp 1)
    is faster; inf when none can exist (no count, or the layers never fit).

    Cheap layers (an embedding, a final norm) would let every rank claim them: the count is
    taken over the h heaviest layers for the ``HEAVY_SETS`` largest h (any set of layers must
    be covered too) and the largest kept; with ``packing`` (the default; off only for the
    tests that compare the two) the exact packing of layer types with each rank's transfers
    (``zero_bubble_bound.typed_cover_threshold``) raises it where the types are few; with
    ``memory`` too, per micro-batch count, the packings that count each rank's memory
    (``_memory_bound_ms``). At most ``cap_ms`` where the bound would be above it (a plan of
    that time is in hand: the bound only has to say no zero-bubble plan beats it)."""
    counts = divisors(batch)
    if options.num_micro_batches is not None:
        counts = [m for m in counts if m == options.num_micro_batches]
    if not counts:
        return math.inf
    m = min(counts)
    sequence_parallel = False if options.sequence_parallel is False else None
    cache = _cache_of(model).zero_bubble
    key = (
        _view_key(model),
        batch,
        m,
        options.tp,
        sequence_parallel,
        packing,
        memory,
        options.recompute,
        options.offload,
    )
    known = cache.get(key)
    if known is not None and (known[1] or cap_ms <= known[0]):
        return min(known[0], cap_ms)  # exact, or at least a cap above this one
    kinds = _zero_bubble_works(model, batch, m, options.tp, sequence_parallel)
    if not kinds:
        found = math.inf
    else:
        # One rank holds every layer (its work only grows with m: this holds at every count).
        single = min(
            (sum(works) for k, _, works, params in kinds if sum(params) <= model.usable_bytes(k)),
            default=math.inf,
        )
        # The bound without activations first (cheap: one count): the answer is the least
        # of the cap and the larger of it and the counts' least, so where it reaches the cap
        # the answer is the cap, whatever the counts' (most of the cost) would say.
        free = _free_bound_ms(model, batch, m, options, kinds, single, packing)
        found = -math.inf
        if packing and memory and not free >= cap_ms:  # (a NaN too: the counts decide)
            found = min(
                _memory_bound_ms(model, batch, count, options, sequence_parallel, single, cap_ms)
                for count in counts
            )
        if found < cap_ms:
            found = max(found, free)
        found = min(found, cap_ms)
    # Below the cap it is the bound itself (every count's part stops only at the cap).
    cache[key] = (found, found < cap_ms)
    return found


def _free_bound_ms(
    model: CostModel,
    batch: int,
    m: int,
    options: SolveOptions,
    kinds: list[tuple[int, int, list[float], list[float]]],
    single: float,
    packing: bool,
) -> float:
    """The zero-bubble bound without the ranks' activations, at the space's least count m
    (module docstring: it holds at every count)."""
    sequence_parallel = False if options.sequence_parallel is False else None
    # Heaviest first by the layers' least work over the kinds (a fixed order: any prefix
    # of it is a set of layers every plan covers).
    least = [min(works[l] for _, _, works, _ in kinds) for l in range(model.num_layers)]  # noqa: E741
    order = sorted(range(model.num_layers), key=lambda l: (-least[l], l))  # noqa: E741
    sizes = range(max(1, len(order) - HEAVY_SETS + 1), len(order) + 1)
    work = max(_cover_threshold(model, kinds, order[:h]) for h in sizes)
    usable = sorted({k for k, _, _, _ in kinds})
    passes = min(2 * model.pass_overhead_ms(k) for k in usable)
    step = min(model.step_overhead_ms(k) for k in usable)
    # One rank holds every layer, or each rank also spends two transfers per micro-batch.
    apart = work + 2 * m * _least_transfer_ms(model, batch // m, usable)
    if packing:
        sides = _rank_sides(model, batch // m, m, usable)
        free = rank_kinds(model, batch, m, options, sequence_parallel, memory=False)
        typed = typed_cover_threshold(model, free, sides, 0.0)
        if typed is not None:
            apart = max(apart, typed)
    return max(work, min(single, apart)) + m * passes + step


def _single_rank_ms(kinds: list[RankKind]) -> float:
    """The least work of one rank holding every layer with its activations (one micro-batch
    in flight at least: q(1, m) = 1), over the kinds and variants whose memory fits it."""
    best = math.inf
    for kind in kinds:
        for v in kind.variants:
            device = float(v.statics.sum() + v.saved.sum())
            if device <= kind.room and float(v.parked.sum()) <= kind.host:
                best = min(best, float(v.works.sum()))
    return best


def _memory_bound_ms(
    model: CostModel,
    batch: int,
    m: int,
    options: SolveOptions,
    sequence_parallel: bool | None,
    single: float,
    cap_ms: float,
) -> float:
    """No zero-bubble plan of m micro-batches is faster (``autoplan.solve.zero_bubble_bound``:
    its rank counts p >= (m + 1) / 2 by the typed packing at q = (m + 1) / 2, the fewer by the
    rank-limited relaxation at q = p; one rank by ``single``); at most ``cap_ms``."""
    kinds = rank_kinds(model, batch, m, options, sequence_parallel)
    usable = sorted({kind.k for kind in kinds})
    if not usable:
        return math.inf
    passes = m * min(2 * model.pass_overhead_ms(k) for k in usable)
    step = min(model.step_overhead_ms(k) for k in usable)
    cap = cap_ms - passes - step
    sides = _rank_sides(model, batch // m, m, usable)
    most = min(sum(c.total_gpus for c in model.classes), model.num_layers)
    q = (m + 1) / 2  # every rank count p >= q holds q micro-batches in flight; fewer, p
    few = [(p, in_flight_floor(p, m)) for p in range(2, min(most, math.ceil(q) - 1) + 1)]
    many = math.inf
    if most >= max(2, math.ceil(q)):  # some rank count p >= q exists
        # The blocks alone first (cheap): where they do not fit below the cap, neither does
        # the exact packing, which only adds constraints.
        many = ranked_cover_threshold(model, kinds, sides, [(most, q)], cap)
        if many < cap:
            typed = typed_cover_threshold(model, kinds, sides, q, cap)
            many = many if typed is None else max(many, typed)
    below = ranked_cover_threshold(model, kinds, sides, few, cap) if few else math.inf
    found = min(_single_rank_ms(kinds), many, below)
    if found < cap:  # the packing of types without activations, at this count, may be above
        free = rank_kinds(model, batch, m, options, sequence_parallel, memory=False)
        typed = typed_cover_threshold(model, free, sides, 0.0, cap)
        if typed is not None:
            found = max(found, min(single, typed))
    return found + passes + step


def search_record(
    found_ms: float, lower_bound_ms: float, timed_out: bool, explored: int
) -> SearchRecord:
    """The plan's ``search`` record: proven when the search ran to its end and the bound
    reaches the plan's time (within floating-point noise); else the gap, and 'limit' when the
    time limit stopped the search."""
    # Rounded down to the plan's precision (its figures have six decimals): still a bound.
    bound = math.floor(min(max(lower_bound_ms, 0.0), found_ms) * 1e6) / 1e6
    gap = (found_ms - bound) / found_ms if found_ms > 0 else 0.0
    status: Literal["proven", "gap", "limit"]
    if timed_out:
        status = "limit"  # stopped by the clock: never called proven, whatever the bound
    elif gap <= PROVEN_TOLERANCE or found_ms - bound <= 2e-6:
        status, gap, bound = "proven", 0.0, found_ms
    else:
        status = "gap"
    return SearchRecord(
        status=status,
        lower_bound_ms=bound if bound > 0 else None,
        gap=gap if bound > 0 else None,
        explored=explored,
    )
