"""The spanning-context family of the search: cp groups across two GPU types, the whole model.

A plan of this family is ``autoplan.solve.context_span_plan``'s: one stage (the whole model),
k replicas, each a cp group of n1 ranks of device class k1 on one node and n2 ranks of class
k2 (another GPU type) on one node (replica d on the d-th node of each class: disjoint node
pairs), each rank tp GPUs, sequence parallelism in the tp groups or not, m micro-batches of
b = B / (k·m) samples a replica under 1F1B, each rank holding its own number of every sample's
tokens (uneven chunks, the same in every replica). Its time is ``span_times``: m × a group's
forward and backward at the split and recompute mode, the exposed gradient all-reduce over the
k × cp ranks and the slower member's step.

The family's space, searched to the end: every pair of classes of two GPU types (k1 < k2, the
ring's order; a ring of two members is the same ring either way round), every tp both classes
run (``autoplan.solve.space.class_tp_choices``), every n1, n2 ≥ 1 with n·tp GPUs within one
node of its class (n1 + n2 = cp where cp is pinned), SP on and off at tp > 1 (as pinned), every
k from 1 to the smaller class's node count dividing B (as dp is pinned), every micro-batch size
the options allow (``space.micro_batch_choices`` of B / k), every token split
(``context_span.token_splits``) and every recompute mode (as pinned). It is in the space where
cp > 1 is (``autoplan.solve.context_parallel``: the optimal strategy, a model with attention,
a sequence of at least ``cp_min_seq_len`` tokens or a pinned cp > 1), on the autoplan engine
(the only one that runs uneven chunks) and the heterogeneous space, for a dense model, unless
the options pin what a plan of it cannot be: pp > 1, a layer split, a schedule other than 1F1B,
ZeRO, offload.

What it does not cover: a spanning group as one stage of a pipeline, groups of three types or
members spread over several nodes of a class, replicas of different shapes or splits, spanning
groups beside replicas of one type, the GPUs it leaves idle. The other families' plans keep
every cp group within one class (``autoplan.solve.context_parallel``).

Exact by enumeration with a bound. A rank of class g holding x_g = t_g / s of the tokens
computes at least x_g times each part of ``cost.context_span.whole_sequence``'s rank holding
them all (outside its attention cores O_g, a layer's core K_g per pass); the ring, the
collectives and recompute only add (a recompute mode's backward is at least mode none's). A
layer of the group takes, for each member, its ranks' time outside the core + the ring's
phase (``lockstep_ring``, the same for every rank), and a phase's step is at least any rank's
max(attend, send): rank r attends chunk q for core_r · t_q / s and sends it on, p2p of its
K, V (twice in backward, which ends with a hop of one chunk's dK, dV). Two ranks always send
between the members' nodes (``context_span.crossing_link``): the last of member 1 (at steps
0..n1 − 1 a chunk of member 1, then of member 2) and the last of member 2 (at 0..n2 − 1 of
member 2, then of member 1), and neither sends at the last step. So a split's micro-batch
works at least

    max_g x_g O_g + Σ_layers Σ_steps max(x_1 K_1 t_a / s, x_2 K_2 t_b / s, p2p(t_a, t_b))

(t_a, t_b the two crossing ranks' chunks at the step, p2p of the larger one's bytes, none at
the last step, backward's last hop added), which is at least max_g x_g (O_g + K_g), the
compute bound (each crossing rank attends every chunk once); every term grows with t1 and
with t2, so at lower values of them it bounds every split above them (``_split_work_ms``).
A recompute mode's backward redoes at least x_g times the whole's (selective: the cores'
forward, full: the forward), added to O_g, and a mode fits only where each member's weights,
gradients, optimizer states and saved activations (x_g times the whole's, exactly) are within
its GPU: the work bound is the least over the modes searched that may fit (inf where none may;
``_mode_limits``). A split is bounded below by m × (that + the passes' overheads) + the slower
member's step (``split_bound_ms``). A unit (classes, tp, n1, n2, SP, k, micro-batch size) is
bounded first by the least over real shares of the compute bound and of the outside-core bound
plus the crossing's sends (a crossing rank sends every chunk but one, at least s − s/cp tokens
a pass, the least chunk being at most the mean), then, in its turn, by the least over 32 pieces
of t1's range of the split bound at each piece's least t1 and t2 (``unit_bound_ms``). Units are
searched in the order of their bounds, splits within a unit likewise, and whatever is bounded
above the best plan held (the other families' included) is not priced; the family's floor is
the least of the plans it priced and the bounds of those it did not
(``autoplan.solve.certificate``). Memory grows with the micro-batch, so where no split of a
unit fits, larger micro-batches of the same group are not tried. Deterministic: ties go to the
canonical order of the choice (classes, tp, n1, n2, SP, k, micro-batch, t1, mode).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
import time
from dataclasses import dataclass

from autoplan.cost.comm import p2p_ms
from autoplan.cost.context_span import (
    ContextMember,
    ContextSpan,
    WholeSequence,
    crossing_link,
    whole_sequence,
)
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve.context_span import MODES, SpanSplit, split_prices, token_splits
from autoplan.solve.context_span_plan import span_plan, span_times
from autoplan.solve.emit import alternative_records, with_fingerprint
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, SearchResult
from autoplan.solve.space import class_tp_choices, micro_batch_choices
from autoplan.solve.stage_degrees import expert_counts

__all__ = [
    "SpanChoice",
    "SpanFamily",
    "in_space",
    "span_choice_plan",
    "span_family",
    "split_bound_ms",
    "unit_bound_ms",
    "with_span_family",
]

# A bound is compared with a priced time computed in another order of operations.
_ROUNDING = 1 - 1e-9
# Pieces of the range of t1 a unit's refined bound takes the least over (``_pieces_work_ms``).
_PIECES = 32


@dataclass(frozen=True)
class SpanChoice:
    """The best plan of the family: its group, micro-batching and priced split."""

    kinds: tuple[tuple[int, int], tuple[int, int]]  # (device class, cp ranks) in ring order
    tp: int
    sequence_parallel: bool
    num_micro_batches: int
    split: SpanSplit
    iteration_ms: float
    replicas: int = 1  # identical groups as data-parallel replicas, on disjoint node pairs


@dataclass(frozen=True)
class SpanFamily:
    """What the family found: its best plan (None: none fits or none beats the best held),
    its floor (no plan of the family is faster), the splits priced, and whether the deadline
    stopped it."""

    best: SpanChoice | None
    floor_ms: float
    splits_priced: int
    timed_out: bool


@dataclass(frozen=True, order=True)
class _Unit:
    bound_ms: float
    key: tuple  # canonical order: (k1, k2, tp, n1, n2, SP, replicas, micro-batch size)
    refined: bool = False  # bound_ms is the unit's bound over its pieces (``_pieces_work_ms``)


def in_space(model: CostModel, options: SolveOptions) -> bool:
    """Whether the options' space holds spanning cp groups (module docstring)."""
    profile = model.profile
    cp_pinned = options.cp is not None
    pinned_out = (
        options.pp not in (None, 1)
        or (options.layer_split is not None and len(options.layer_split) != 1)
        or options.schedule not in (None, "1f1b")
        or options.schedule in ZERO_BUBBLE_SCHEDULES
        or bool(options.zero1)
        or options.zero_stage not in (None, 0)
        or bool(options.offload)
        or options.expert_parallel not in (None, 1)
        or (cp_pinned and options.cp == 1)
    )
    attention = any(layer.selective_recompute_flops > 0 for layer in profile.layers)
    return (
        options.strategy == "optimal"
        and options.space == "heterogeneous"
        and options.engine == "autoplan"
        and not pinned_out
        and attention
        and not expert_counts(profile)
        and (cp_pinned or profile.seq_len >= options.cp_min_seq_len)
        and len({c.gpu.name for c in model.classes}) >= 2
    )


def _units(model: CostModel, batch: int, options: SolveOptions) -> list[_Unit]:
    """Every unit of the space with its bound (module docstring), in canonical order."""
    out: list[_Unit] = []

    @functools.cache
    def whole(k: int, tp: int, micro: int, sp: bool) -> WholeSequence:
        return whole_sequence(model, k, tp, micro, sp)

    for c1, c2 in itertools.combinations(model.classes, 2):
        if c1.gpu.name == c2.gpu.name:
            continue
        k1, k2 = c1.index, c2.index
        tps = set(class_tp_choices(model, k2, options))
        for tp in [t for t in class_tp_choices(model, k1, options) if t in tps]:
            settings = [False] if tp == 1 else [False, True]
            if options.sequence_parallel is not None:
                settings = [s for s in settings if s == options.sequence_parallel]
            pairs = min(c1.num_nodes, c2.num_nodes)
            replica_counts = [
                k for k in range(1, pairs + 1) if batch % k == 0 and options.dp in (None, k)
            ]
            link = crossing_link(model, (k1, k2), tp)
            shapes = itertools.product(
                range(1, c1.gpus_per_node // tp + 1),
                range(1, c2.gpus_per_node // tp + 1),
                settings,
                replica_counts,
            )
            for n1, n2, sp, k in shapes:
                if options.cp is not None and n1 + n2 != options.cp:
                    continue
                for micro in micro_batch_choices(batch // k, options):
                    one, two = whole(k1, tp, micro, sp), whole(k2, tp, micro, sp)
                    work = _unit_work_ms(one, two, (n1, n2), model.profile.seq_len, link)
                    m = batch // (k * micro)
                    bound = _bound(model, (k1, k2), m, work, one.params_per_gpu)
                    out.append(_Unit(bound, (k1, k2, tp, n1, n2, sp, k, micro)))
    return out


def _least(n1: int, a: float, n2: int, b: float) -> float:
    """The least over real shares x1, x2 ≥ 0 with n1 x1 + n2 x2 = 1 of max(x1 a, x2 b): both
    equal (0 where either time is)."""
    return 1 / (n1 / a + n2 / b) if a > 0 and b > 0 else 0.0


def _unit_work_ms(
    one: WholeSequence,
    two: WholeSequence,
    ranks: tuple[int, int],
    seq: int,
    link: tuple[float, float],
) -> float:
    """No split of ``ranks`` (members' classes ``one``, ``two``) takes less than this for one
    micro-batch's forward and backward, the passes' overheads aside (module docstring: the
    larger of the compute bound and the outside-core bound with the crossing's sends)."""
    n1, n2 = ranks
    cp = n1 + n2
    bandwidth, latency = link
    # A crossing rank sends every chunk but one: at least s − s/cp tokens a pass (the least
    # chunk is at most the mean), in cp − 1 sends; backward twice the bytes, and its last hop
    # a chunk of at least the mean.
    volume = (seq - seq / cp) / (bandwidth * 1e6)  # ms per byte of one token's K, V
    sends = sum(
        core.layers
        * (
            2 * (cp - 1) * latency * 1e-3
            + 3 * core.kv_bytes_per_token * volume
            + p2p_ms(core.kv_bytes_per_token * seq / cp, bandwidth, latency)
        )
        for core in one.cores
    )
    return max(
        _least(n1, one.compute_ms, n2, two.compute_ms),
        _least(n1, one.outside_core_ms, n2, two.outside_core_ms) + sends,
    )


def _pieces_work_ms(
    one: WholeSequence,
    two: WholeSequence,
    ranks: tuple[int, int],
    seq: int,
    link: tuple[float, float],
    limits: list[tuple[float, float, float, float]],
) -> float:
    """No split of ``ranks`` takes less than this for one micro-batch's work (module
    docstring): t1 in [0, s / n1] cut into ``_PIECES`` pieces, on each ``_split_work_ms`` at
    the least t1 and t2 of the piece, the least of them."""
    n1, n2 = ranks
    steps = _steps(ranks)
    top = seq / n1
    return min(
        _split_work_ms(
            one,
            two,
            (top * i / _PIECES, max(0.0, (seq - n1 * top * (i + 1) / _PIECES) / n2)),
            seq,
            link,
            steps,
            limits,
        )
        for i in range(_PIECES)
    )


def _steps(ranks: tuple[int, int]) -> list[tuple[bool, bool, int]]:
    """The ring's sending steps at its two crossing ranks (module docstring): (whether the
    last rank of member 1 attends and sends a chunk of member 1, whether the last of member 2
    does, how many steps)."""
    n1, n2 = ranks
    counts: dict[tuple[bool, bool], int] = {}
    for step in range(n1 + n2 - 1):
        key = (step < n1, step >= n2)
        counts[key] = counts.get(key, 0) + 1
    return [(a, b, n) for (a, b), n in sorted(counts.items())]


def _mode_limits(
    model: CostModel,
    one: WholeSequence,
    two: WholeSequence,
    classes: tuple[int, int],
    cp: int,
    modes: tuple[str, ...],
) -> list[tuple[float, float, float, float]]:
    """Per recompute mode of ``modes``: (the compute each member's backward redoes and the
    largest share of the sequence each member's rank holds with its weights, gradients,
    optimizer states and saved activations within its GPU, as ``split_prices`` checks, its
    transient left out) for one micro-batch in flight, of a cp group of ``cp`` ranks."""
    static = sum(model.static_bytes(one.params_per_gpu, cp, 0))
    out = []
    for mode in modes:
        limits = [
            (model.usable_bytes(k) - static) / whole.saved_bytes[mode]
            if whole.saved_bytes[mode] > 0
            else (math.inf if model.usable_bytes(k) >= static else -math.inf)
            for k, whole in zip(classes, (one, two), strict=True)
        ]
        out.append((one.recompute_ms[mode], two.recompute_ms[mode], limits[0], limits[1]))
    return out


def _split_work_ms(
    one: WholeSequence,
    two: WholeSequence,
    tokens: tuple[float, float],
    seq: int,
    link: tuple[float, float],
    steps: list[tuple[bool, bool, int]],
    limits: list[tuple[float, float, float, float]],
) -> float:
    """No recompute mode of a split of ``seq`` tokens whose members' ranks (classes ``one``,
    ``two``) hold ``tokens`` each, or at least ``tokens`` (every term grows with each), takes
    less than this for one micro-batch's forward and backward, the passes' overheads aside
    (module docstring: the slower member outside its cores, with what its mode redoes, + the
    ring's steps at the two crossing ranks; inf where no mode fits). ``steps``: ``_steps`` of
    the members' ranks; ``limits``: ``_mode_limits`` of the modes searched."""
    t1, t2 = tokens
    x1, x2 = t1 / seq, t2 / seq
    bandwidth, latency = link
    ring = 0.0
    for c1, c2 in zip(one.cores, two.cores, strict=True):
        kv = c1.kv_bytes_per_token
        for core1, core2, times in (
            (c1.forward_ms, c2.forward_ms, 1),
            (c1.backward_ms, c2.backward_ms, 2),
        ):
            # Rank r attends chunk q at a step for at least x_r × its class's core × t_q / s.
            a1, a2 = x1 * core1 / seq, x2 * core2 / seq
            phase = max(a1 * t2, a2 * t1)  # the last step: the chunk after one's own, no send
            for first, second, count in steps:
                ta = t1 if first else t2
                tb = t1 if second else t2
                phase += count * max(
                    a1 * ta, a2 * tb, p2p_ms(times * kv * max(ta, tb), bandwidth, latency)
                )
            if times == 2:  # backward's last hop: each chunk's dK, dV to its owner
                phase += p2p_ms(kv * max(t1, t2), bandwidth, latency)
            ring += c1.layers * phase
    work = math.inf
    for redo1, redo2, limit1, limit2 in limits:
        # Saved activations are the share's exactly: a mode whose saved bytes alone exceed a
        # member's room fits no split at these shares or above (rounding spared).
        if x1 * _ROUNDING > limit1 or x2 * _ROUNDING > limit2:
            continue
        outside = max(x1 * (one.outside_core_ms + redo1), x2 * (two.outside_core_ms + redo2))
        # The compute bound (that a rank computes its share), which the ring's part implies
        # but for rounding.
        compute = max(x1 * (one.compute_ms + redo1), x2 * (two.compute_ms + redo2))
        work = min(work, max(outside + ring, compute))
    return work


def _bound(
    model: CostModel, classes: tuple[int, int], m: int, work_ms: float, params: float
) -> float:
    """m × (work + the two passes' overheads) + the slower member's step (module docstring)."""
    overhead = max(model.pass_overhead_ms(k) for k in classes)
    step = max(model.optimizer_ms(params, k, 1, 0) + model.step_overhead_ms(k) for k in classes)
    return (m * (work_ms + 2 * overhead) + step) * _ROUNDING


def split_bound_ms(
    model: CostModel,
    span: ContextSpan,
    micro_batch_size: int,
    num_micro_batches: int,
    sequence_parallel: bool = False,
    modes: tuple[str, ...] = MODES,
) -> float:
    """No recompute mode of ``modes`` of ``span`` (two members) at these micro-batches takes
    less than this (module docstring; inf where none fits): the bound the family prunes a
    split by."""
    (k1, n1, t1), (k2, n2, t2) = ((m.device_class, m.ranks, m.tokens) for m in span.members)
    one, two = (
        whole_sequence(model, k, span.tp, micro_batch_size, sequence_parallel) for k in (k1, k2)
    )
    link = crossing_link(model, (k1, k2), span.tp)
    limits = _mode_limits(model, one, two, (k1, k2), span.cp, modes)
    work = _split_work_ms(one, two, (t1, t2), span.seq_len, link, _steps((n1, n2)), limits)
    return _bound(model, (k1, k2), num_micro_batches, work, one.params_per_gpu)


def unit_bound_ms(
    model: CostModel,
    kinds: tuple[tuple[int, int], tuple[int, int]],
    tp: int,
    micro_batch_size: int,
    num_micro_batches: int,
    sequence_parallel: bool = False,
    modes: tuple[str, ...] = MODES,
) -> float:
    """No split of a cp group of ``kinds`` ((device class, cp ranks) in ring order) at these
    micro-batches and a recompute mode of ``modes`` takes less than this (module docstring;
    inf where none fits): the bound the family orders and prunes its units by."""
    (k1, n1), (k2, n2) = kinds
    one, two = (whole_sequence(model, k, tp, micro_batch_size, sequence_parallel) for k in (k1, k2))
    link = crossing_link(model, (k1, k2), tp)
    seq = model.profile.seq_len
    limits = _mode_limits(model, one, two, (k1, k2), n1 + n2, modes)
    work = max(
        _unit_work_ms(one, two, (n1, n2), seq, link),
        _pieces_work_ms(one, two, (n1, n2), seq, link, limits),
    )
    return _bound(model, (k1, k2), num_micro_batches, work, one.params_per_gpu)


def span_family(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    incumbent_ms: float = math.inf,
    deadline: float = math.inf,
) -> SpanFamily:
    """The family's best plan faster than ``incumbent_ms`` (module docstring), searched until
    ``deadline`` (a ``time.monotonic()`` value)."""
    if not in_space(model, options):
        return SpanFamily(None, math.inf, 0, False)
    modes = MODES if options.recompute is None else (options.recompute,)
    seq = model.profile.seq_len
    layers = (0, len(model.profile.layers))
    best: SpanChoice | None = None
    best_key: tuple = ()
    floor = math.inf
    priced = 0
    timed_out = False
    # (k1, k2, tp, n1, n2, SP, replicas) -> the least micro-batch size at which no split fits
    no_fit: dict[tuple, int] = {}

    def held() -> float:
        return min(incumbent_ms, math.inf if best is None else best.iteration_ms)

    units = _units(model, batch, options)
    heapq.heapify(units)
    while units:
        unit = heapq.heappop(units)
        if unit.bound_ms > held():
            floor = min(floor, unit.bound_ms)  # the units are in order: the rest are above
            break
        k1, k2, tp, n1, n2, sp, replicas, micro = unit.key
        group = unit.key[:7]
        if micro >= no_fit.get(group, math.inf):
            continue  # memory grows with the micro-batch: nothing fits here either
        if not unit.refined:  # its bound over its pieces, then in its turn again
            m = batch // (replicas * micro)
            refined = unit_bound_ms(model, ((k1, n1), (k2, n2)), tp, micro, m, sp, modes)
            if math.isinf(refined):  # no split fits at any mode searched
                no_fit[group] = min(micro, no_fit.get(group, micro))
                continue
            heapq.heappush(units, _Unit(max(unit.bound_ms, refined), unit.key, True))
            continue
        if time.monotonic() > deadline:
            timed_out = True
            floor = min(floor, unit.bound_ms)  # the least bound left unpriced
            break
        m = batch // (replicas * micro)
        one, two = (whole_sequence(model, k, tp, micro, sp) for k in (k1, k2))
        link = crossing_link(model, (k1, k2), tp)
        steps = _steps((n1, n2))
        limits = _mode_limits(model, one, two, (k1, k2), n1 + n2, modes)
        splits = sorted(
            (
                _bound(
                    model,
                    (k1, k2),
                    m,
                    _split_work_ms(one, two, (t1, t2), seq, link, steps, limits),
                    one.params_per_gpu,
                ),
                t1,
                t2,
            )
            for t1, t2 in token_splits((n1, n2), seq, tp, sp)
        )
        fits = False
        for bound, t1, t2 in splits:
            if math.isinf(bound):
                break  # this split and the rest fit no mode searched
            if bound > held():
                floor = min(floor, bound)
                break
            span = ContextSpan((ContextMember(k1, n1, t1), ContextMember(k2, n2, t2)), tp)
            priced += 1
            for found in split_prices(model, span, micro, layers, 1, modes, sp):
                fits = True
                iteration = span_times(model, found, m, replicas).iteration_ms
                floor = min(floor, iteration)  # a plan of the family, held or not
                key = (*unit.key, t1, modes.index(found.recompute))
                if iteration < incumbent_ms and (
                    best is None or (iteration, key) < (best.iteration_ms, best_key)
                ):
                    kinds = ((k1, n1), (k2, n2))
                    choice = SpanChoice(kinds, tp, sp, m, found, iteration, replicas)
                    best, best_key = choice, key
        else:  # every split priced
            if not fits:
                no_fit[group] = min(micro, no_fit.get(group, micro))
    return SpanFamily(best, floor, priced, timed_out)


def with_span_family(
    model: CostModel, batch: int, options: SolveOptions, result: SearchResult, deadline: float
) -> tuple[SearchResult, SpanChoice | None]:
    """``result`` (the other families') with the family's floor in its bound, its splits
    priced among the configurations considered and its time-out, and the family's best plan
    where it is faster than ``result``'s best feasible one (else None): a few lines of
    ``autoplan.solve.solve_outcome``."""
    held = min((c.iteration_ms for c in result.candidates if c.cost.feasible), default=math.inf)
    family = span_family(model, batch, options, held, deadline)
    if family.best is None and not family.timed_out and family.floor_ms >= held:
        return result, None  # nothing of it bears on the result: as it was
    merged = SearchResult(
        result.candidates,
        result.configs_considered + family.splits_priced,
        result.partitions_solved,
        result.timed_out or family.timed_out,
        min(result.lower_bound_ms, family.floor_ms),
    )
    return merged, family.best


def span_choice_plan(
    model: CostModel,
    inputs: PlanInputs,
    choice: SpanChoice,
    runners: list[Candidate] | None = None,
) -> Plan:
    """The plan of the family's ``choice`` (``context_span_plan.span_plan`` at its split),
    the other families' best ``runners`` (best first) as its alternatives."""
    plan = span_plan(
        model,
        inputs,
        choice.kinds,
        choice.tp,
        choice.num_micro_batches,
        sequence_parallel=choice.sequence_parallel,
        found=choice.split,
        replicas=choice.replicas,
    )
    if not runners:
        return plan
    others = [(c.config, c.cost) for c in runners]
    records = alternative_records(model, others, inputs.global_batch_size)
    return with_fingerprint(plan.model_copy(update={"alternatives": records}))
