"""The spanning-context family of the search: one cp group across two GPU types, the whole model.

A plan of this family is ``autoplan.solve.context_span_plan``'s: one stage (the whole model),
one replica that is a cp group of n1 ranks of device class k1 on one node and n2 ranks of class
k2 (another GPU type) on one node, each rank tp GPUs, sequence parallelism in the tp groups or
not, m micro-batches of b = B / m samples under 1F1B, each rank holding its own number of
every sample's tokens (uneven chunks). Its time is ``span_times``: m × the group's forward and
backward at the split and recompute mode, the exposed gradient all-reduce and the slower
member's step.

The family's space, searched to the end: every pair of classes of two GPU types (k1 < k2, the
ring's order; a ring of two members is the same ring either way round), every tp both classes
run (``autoplan.solve.space.class_tp_choices``), every n1, n2 ≥ 1 with n·tp GPUs within one
node of its class (n1 + n2 = cp where cp is pinned), SP on and off at tp > 1 (as pinned), every
micro-batch size the options allow (``space.micro_batch_choices``), every token split
(``context_span.token_splits``) and every recompute mode (as pinned). It is in the space where
cp > 1 is (``autoplan.solve.context_parallel``: the optimal strategy, a model with attention,
a sequence of at least ``cp_min_seq_len`` tokens or a pinned cp > 1), on the autoplan engine
(the only one that runs uneven chunks) and the heterogeneous space, for a dense model, unless
the options pin what a plan of it cannot be: pp or dp > 1, a layer split, a schedule other
than 1F1B, ZeRO, offload.

What it does not cover: several spanning groups as data-parallel replicas (disjoint node
pairs; a plan of them needs the emitter and the prediction of k groups, which ``span_plan``
does not write), a spanning group as one stage of a pipeline, groups of three types or members
spread over several nodes of a class, the GPUs it leaves idle. The other families' plans keep
every cp group within one class (``autoplan.solve.context_parallel``).

Exact by enumeration with a bound: a unit (classes, n1, n2, tp, SP, micro-batch size) is
bounded below by m × (the least over real token shares of the slower member's compute,
``whole_sequence_compute_ms`` times its share, + the passes' overheads) + the step, and a split
within it by the same at its own shares (a rank computes at least its share of the whole
sequence; the ring, the collectives and recompute only add). Units are searched in the order
of their bounds, splits within a unit likewise, and whatever is bounded above the best plan
held (the other families' included) is not priced; the family's floor is the least of the plans
it priced and the bounds of those it did not (``autoplan.solve.certificate``). Memory grows with the
micro-batch, so where no split of a unit fits, larger micro-batches of the same group are not
tried. Deterministic: ties go to the canonical order of the choice (classes, tp, n1, n2, SP,
micro-batch, t1, mode).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autoplan.cost.context_span import ContextMember, ContextSpan, whole_sequence_compute_ms
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve.context_span import MODES, SpanSplit, split_prices, token_splits
from autoplan.solve.context_span_plan import span_plan, span_times
from autoplan.solve.emit import alternative_records, with_fingerprint
from autoplan.solve.options import SolveOptions
from autoplan.solve.search import Candidate, SearchResult
from autoplan.solve.space import class_tp_choices, micro_batch_choices
from autoplan.solve.stage_degrees import expert_counts

__all__ = [
    "SpanChoice",
    "SpanFamily",
    "in_space",
    "span_choice_plan",
    "span_family",
    "split_bound_ms",
    "with_span_family",
]

# A bound is compared with a priced time computed in another order of operations.
_ROUNDING = 1 - 1e-9


@dataclass(frozen=True)
class SpanChoice:
    """The best plan of the family: its group, micro-batching and priced split."""

    kinds: tuple[tuple[int, int], tuple[int, int]]  # (device class, cp ranks) in ring order
    tp: int
    sequence_parallel: bool
    num_micro_batches: int
    split: SpanSplit
    iteration_ms: float


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
    key: tuple  # canonical order: (k1, k2, tp, n1, n2, SP, micro-batch size)


def in_space(model: CostModel, options: SolveOptions) -> bool:
    """Whether the options' space holds spanning cp groups (module docstring)."""
    profile = model.profile
    cp_pinned = options.cp is not None
    pinned_out = (
        options.pp not in (None, 1)
        or options.dp not in (None, 1)
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
    compute: dict[tuple, tuple[float, float]] = {}
    for c1 in model.classes:
        for c2 in model.classes[c1.index + 1 :]:
            if c1.gpu.name == c2.gpu.name:
                continue
            k1, k2 = c1.index, c2.index
            tps = set(class_tp_choices(model, k2, options))
            for tp in [t for t in class_tp_choices(model, k1, options) if t in tps]:
                settings = [False] if tp == 1 else [False, True]
                if options.sequence_parallel is not None:
                    settings = [s for s in settings if s == options.sequence_parallel]
                for n1 in range(1, c1.gpus_per_node // tp + 1):
                    for n2 in range(1, c2.gpus_per_node // tp + 1):
                        if options.cp is not None and n1 + n2 != options.cp:
                            continue
                        for sp in settings:
                            for micro in micro_batch_choices(batch, options):
                                for k in (k1, k2):
                                    if (k, tp, micro, sp) not in compute:
                                        compute[k, tp, micro, sp] = whole_sequence_compute_ms(
                                            model, k, tp, micro, sp
                                        )
                                (t1, params), (t2, _) = (
                                    compute[k1, tp, micro, sp],
                                    compute[k2, tp, micro, sp],
                                )
                                # The least over real shares of max(x1 T1, x2 T2), n1 x1 + n2
                                # x2 = 1: both equal.
                                work = 1 / (n1 / t1 + n2 / t2) if t1 > 0 and t2 > 0 else 0.0
                                bound = _bound(model, (k1, k2), batch // micro, work, params)
                                out.append(_Unit(bound, (k1, k2, tp, n1, n2, sp, micro)))
    return out


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
) -> float:
    """No recompute mode of ``span`` (two members) at these micro-batches takes less than
    this (module docstring): the bound the family prunes a split by."""
    (k1, t1), (k2, t2) = ((m.device_class, m.tokens) for m in span.members)
    (c1, params), (c2, _) = (
        whole_sequence_compute_ms(model, k, span.tp, micro_batch_size, sequence_parallel)
        for k in (k1, k2)
    )
    work = max(t1 * c1, t2 * c2) / span.seq_len
    return _bound(model, (k1, k2), num_micro_batches, work, params)


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
    # (k1, k2, tp, n1, n2, SP) -> the least micro-batch size at which no split fits
    no_fit: dict[tuple, int] = {}

    def held() -> float:
        return min(incumbent_ms, math.inf if best is None else best.iteration_ms)

    for unit in sorted(_units(model, batch, options)):
        if unit.bound_ms > held():
            floor = min(floor, unit.bound_ms)  # the units are in order: the rest are above
            break
        k1, k2, tp, n1, n2, sp, micro = unit.key
        group = unit.key[:6]
        if micro >= no_fit.get(group, math.inf):
            continue  # memory grows with the micro-batch: nothing fits here either
        if time.monotonic() > deadline:
            timed_out = True
            floor = min(floor, unit.bound_ms)  # the least bound left unpriced
            break
        m = batch // micro
        (t_one, params), (t_two, _) = (
            whole_sequence_compute_ms(model, k, tp, micro, sp) for k in (k1, k2)
        )
        splits = sorted(
            (_bound(model, (k1, k2), m, max(t1 * t_one, t2 * t_two) / seq, params), t1, t2)
            for t1, t2 in token_splits((n1, n2), seq, tp, sp)
        )
        fits = False
        for bound, t1, t2 in splits:
            if bound > held():
                floor = min(floor, bound)
                break
            span = ContextSpan((ContextMember(k1, n1, t1), ContextMember(k2, n2, t2)), tp)
            priced += 1
            for found in split_prices(model, span, micro, layers, 1, modes, sp):
                fits = True
                iteration = span_times(model, found, m).iteration_ms
                floor = min(floor, iteration)  # a plan of the family, held or not
                key = (*unit.key, t1, modes.index(found.recompute))
                if iteration < incumbent_ms and (
                    best is None or (iteration, key) < (best.iteration_ms, best_key)
                ):
                    choice = SpanChoice(((k1, n1), (k2, n2)), tp, sp, m, found, iteration)
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
    )
    if not runners:
        return plan
    others = [(c.config, c.cost) for c in runners]
    records = alternative_records(model, others, inputs.global_batch_size)
    return with_fingerprint(plan.model_copy(update={"alternatives": records}))
