"""Round 1's space: uniform pipelines, one (dp, tp) and micro-batch size for every stage.

It holds the plans of one DeviceMesh, interleaved 1F1B among them, and the baselines; the
driver (``autoplan.solve.search``) uses its best as the first bound of the heterogeneous
search. For each (tp, dp, micro-batch size, pp, schedule, class of each rank) the
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
layer, so n ranks of a class need n distinct layers. Three levels queue together, best bound
first: a group, when it comes up, queues its class compositions (``solve.compositions``: the
ranks per class, bounded in numpy all at once); a composition, when it comes up, queues its
orders; an order, when it comes up, takes its own bound (``solve.flight_bound``: each rank's
in-flight memory, the window each run of one class must hold, the fill) and queues again if
that is higher, else its DP runs. The best is exact (pruning compares with the best found);
the alternatives are the best other configurations the search costed, not necessarily the
global 2nd..k-th.

Sequence parallelism per stage (``per_stage_sp``: the SP-off run of
``autoplan.solve.sequence_parallel`` where SP is not pinned). SP is local to a stage: it
changes the stage's own time, tail and memory only (the boundary transfer is the whole
activation either way, and ``CostModel.evaluate`` costs each stage with its own setting,
``StageChoice.sequence_parallel``), so a stage with tp > 1 is costed both ways, each way
with its own fastest fitting recompute and ZeRO level as above, on the view of the model
with SP off and the one with it on. The faster feasible setting is not always the better
one: the objective (m − 1) max a + Σ b + max t is nondecreasing in each stage's time and tail,
but SP can shorten a stage's backward by more than its whole time (its forward may grow with
the all-gathers at the ends of its runs of blocks), and on the mesh executor the tail is the
all-reduce less that backward, so the faster setting can have the longer tail. Where one
setting is no slower and its tail grows by no more than its time shrinks, it is no worse in
any pipeline and alone is kept (``_EitherCoster``); else both are choices of the partition
DP (``solvers.partition_dp``'s ``choices``), whose Pareto fronts over (max, sum, tail) keep
it exact over every stage's setting. Interleaved candidates keep SP for the whole
plan, both settings tried (their ranks' stages share memory, and the split is the view's):
today's space for them. The bounds (``bounds``, ``compositions``, ``flight_bound``) read every
per-layer figure as the least over SP off and on (``bounds.layer_tables``), so they hold for
every choice; an interleaved candidate's own bound is the lesser of its two views'.

Deterministic: candidates are visited in a fixed order and ties keep a canonical key, so the
same inputs give the same plan, unless the time limit stops the search (logged).
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from autoplan.cost.config import (
    PlanConfig,
    ReplicaGroup,
    StageChoice,
    canonical_sequence_parallel,
)
from autoplan.cost.engines import ENGINES
from autoplan.cost.model import CostModel, LinkSide
from autoplan.cost.offload import group_of
from autoplan.cost.schedule import in_flight_chunks
from autoplan.cost.sharding import exposed_ms
from autoplan.solve.bounds import (
    Group,
    Pending,
    fastest_work,
    group_bound,
    interleaved_sizes,
    lower_bound,
)
from autoplan.solve.compositions import Composition, compositions, orders
from autoplan.solve.flight_bound import order_bound
from autoplan.solve.options import SolveOptions
from autoplan.solve.progress import report_found
from autoplan.solve.ranking import Candidate, SearchResult, config_key
from autoplan.solve.space import (
    class_caps,
    divisors,
    even_split,
    micro_batch_choices,
    pipeline_degrees,
    recompute_modes,
    schedules,
    tp_choices,
    zero_levels,
)
from solvers.partition_dp import Costs, best_partition

__all__ = ["rank_groups", "uniform_search"]

logger = logging.getLogger(__name__)


@dataclass
class StageTable:
    """Stage figures one search's pipelines share (one model view and options): a stage's
    choice (ZeRO level, recompute, work, backward) depends on its class, its in-flight count
    and its layers beside the pipeline's (tp, dp, micro-batch size, m), and its
    sequence-parallel edges on its class and layers at (tp, micro-batch size), and a
    boundary's send times on the two classes at (tp, dp, micro-batch size); the orders of one
    composition and the compositions of one group ask for the same ones again."""

    # (ZeRO level, recompute, work, backward, tail) of a stage, or None where none fits: by
    # (tp, dp, micro-batch size, m, class, in-flight count, the levels allowed), then by (i, j).
    choices: dict[
        tuple[int, ...], dict[tuple[int, int], tuple[int, str, float, float, float] | None]
    ] = field(default_factory=dict)
    edges: dict[tuple[int, ...], float] = field(default_factory=dict)
    # A boundary's send time per end layer, by (tp, dp, micro-batch size, class, next class).
    sends: dict[tuple[int, ...], list[float]] = field(default_factory=dict)


@dataclass
class _Span:
    """What a stage's choice on one layer span [i, j) reads at every ZeRO level
    (``_StageCoster._choose``): its parameters and transfer buffers, each mode's work, the
    modes by it, and each mode's (in-flight activation bytes, whether its offload fits the
    host's share) and largest transient as the levels first ask for them."""

    params: float
    buffers: float
    works: dict[str, float]
    ordered: list[str]
    memory: dict[str, tuple[float, bool]]
    transient: dict[str, float]


class _StageCoster:
    """O(1) stage costs for one (tp, dp, mbs, m, schedule, zero1, classes).

    It mirrors ``CostModel.evaluate`` with prefix sums (the oracle tests hold the two to
    the same answers)."""

    def __init__(
        self,
        model: CostModel,
        p: Pending,
        modes: tuple[str, ...],
        levels: tuple[int, ...],
        shared: StageTable | None = None,
    ) -> None:
        self.model = model
        self._shared = StageTable() if shared is None else shared
        self.p = p
        self.modes = modes
        self.levels = levels
        pp = len(p.classes)
        self.tables = [model.tables(k, p.tp, p.mbs) for k in p.classes]
        self.flight = [in_flight_chunks(p.schedule, pp, s, p.m, p.chunks) for s in range(pp)]  # type: ignore[arg-type]
        self.static_per_param = {z: model.static_bytes_per_param(p.dp, z) for z in levels}
        self.zero_transient = {z: model.zero_transient_bytes(p.tp, p.dp, z) for z in levels}
        self.capacity = [model.usable_bytes(k) for k in p.classes]
        self.host_budget = [model.host_budget_bytes(k) for k in p.classes]
        self.group = p.dp * p.tp
        self.overhead = [2 * model.pass_overhead_ms(k) for k in p.classes]
        self.backward_overhead = [model.pass_overhead_ms(k) for k in p.classes]
        # The optimizer step is linear in the stage's parameters; the all-reduce is not
        # (NCCL's ring or tree, whichever is faster for the size), so it is costed per stage.
        self.rank_groups = [rank_groups(p, k, "none") for k in p.classes]
        self.optimizer = {
            z: [model.optimizer_ms(1.0, k, p.dp, z) for k in p.classes] for z in levels
        }
        self.step_overhead = [model.step_overhead_ms(k) for k in p.classes]
        self.sends: list[list[float]] = []
        for s in range(pp):
            if s + 1 < pp:
                key = (p.tp, p.dp, p.mbs, p.classes[s], p.classes[s + 1])
                sends = self._shared.sends.get(key)
                if sends is None:
                    sends = _send_times(model, p, p.classes[s], p.classes[s + 1])
                    self._shared.sends[key] = sends
                self.sends.append(sends)
            else:
                self.sends.append([0.0] * (model.num_layers + 1))
        # Stage s's choices in the shared table: the figures depend on the stage's class and
        # in-flight count beside the pipeline's shape and levels (an engine may allow fewer
        # in a pipeline than at pp 1), not on its neighbours.
        self._choices = [
            self._shared.choices.setdefault(
                (p.tp, p.dp, p.mbs, p.m, p.classes[s], self.flight[s], *levels), {}
            )
            for s in range(pp)
        ]
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

    def recompute_for(self, s: int, i: int, j: int, level: int) -> str | None:
        """The fastest recompute mode with which stage s on [i, j) fits at ZeRO ``level``,
        or None."""
        return self._fitting(s, i, j, level, self._span(s, i, j))

    def _span(self, s: int, i: int, j: int) -> _Span:
        """What stage s on [i, j) reads at every ZeRO level (``_Span``)."""
        t = self.tables[s]
        works = {mode: t.span_work(mode, i, j) for mode in self.modes}
        return _Span(
            t.params[j] - t.params[i],
            self.model.transfer_buffer_bytes(self.p.mbs, i, j, self.p.m),
            works,
            # The modes by their time, ties in the space's order (a stable sort).
            sorted(self.modes, key=works.__getitem__),
            {},
            {},
        )

    def _fitting(self, s: int, i: int, j: int, level: int, span: _Span) -> str | None:
        """``recompute_for`` of ``span`` (stage s on [i, j))."""
        static = span.params * self.static_per_param[level]
        capacity = self.capacity[s] - self.zero_transient[level]
        if static > capacity:
            return None  # every mode holds the same parameters
        # The fastest mode that fits (with offload the order is the hardware's): the first
        # of the modes by time that fits; slower modes' memory is never looked at.
        for mode in span.ordered:
            found = span.memory.get(mode)
            if found is None:
                t = self.tables[s]
                saved = t.saved[mode]
                flight = self.flight[s]
                found = span.memory[mode] = (
                    flight * (saved[j] - saved[i]),
                    # offload parks no more than the GPU's share of host memory
                    flight * (t.parked[mode][j] - t.parked[mode][i]) <= self.host_budget[s],
                )
            activations, parks = found
            used = static + span.buffers + activations
            if used > capacity or not parks:
                continue
            transient = span.transient.get(mode)
            if transient is None:
                transient = span.transient[mode] = self._range_max(s, mode, i, j)
            if used + transient <= capacity:
                return mode
        return None

    def _edges(self, s: int, i: int, j: int) -> float:
        """Stage s's sequence-parallel all-gathers per pass on [i, j) (zero without SP or tp):
        ``CostModel.evaluate`` adds them to the forward and to the backward."""
        if not self.model.sequence_parallel or self.p.tp <= 1:
            return 0.0
        key = (self.p.tp, self.p.mbs, self.p.classes[s], i, j)
        found = self._shared.edges.get(key)
        if found is None:
            group = group_of(self.p.classes[s], self.p.tp, 1, self.p.mbs, "none")
            found = self.model.sequence_edges_ms(StageChoice(i, j, (group,)), group, None)
            self._shared.edges[key] = found
        return found

    def _plain_work(self, s: int, i: int, j: int, mode: str, span: _Span) -> tuple[float, float]:
        """(work, backward) of stage s in ``mode`` before any ZeRO-2/3 collective."""
        t = self.tables[s]
        edges = self._edges(s, i, j)
        work = span.works[mode] + self.overhead[s] + 2 * edges
        backward = t.span_backward(mode, i, j) + self.backward_overhead[s] + edges
        return work, backward

    def _sharded(
        self, s: int, params: float, level: int, work: float, backward: float
    ) -> tuple[float, float]:
        """``_plain_work``'s (work, backward) of stage s holding ``params`` with ZeRO
        ``level``'s exposed collectives."""
        if level <= 1 or self.p.dp <= 1:
            return work, backward
        collective = _allreduce_ms(self.model, self.rank_groups[s], params) / 2
        forward_extra, backward_extra = exposed_ms(level, collective, work - backward, backward)
        return work + forward_extra + backward_extra, backward + backward_extra

    def choice_for(self, s: int, i: int, j: int) -> tuple[int, str] | None:
        """(ZeRO level, recompute) of stage s on [i, j): of the levels, the one whose
        fastest fitting recompute gives the least work, then the least tail, the lower on
        ties (``HeteroSource.stage_groups`` says why the tail breaks ties); None if none
        fits."""
        found = self._choice(s, i, j)
        return None if found is None else (found[0], found[1])

    def _choice(self, s: int, i: int, j: int) -> tuple[int, str, float, float, float] | None:
        """``choice_for`` with the chosen (work, backward) (``_sharded``) and the stage's
        tail (exposed all-reduce, optimizer step: what ``__call__`` adds after the pipeline)."""
        choices = self._choices[s]
        key = (i, j)
        if key in choices:
            return choices[key]
        found = self._choose(s, i, j)
        choices[key] = found
        return found

    def _tail(self, s: int, i: int, j: int, level: int, backward: float) -> float:
        """Stage s's work after its last backward on [i, j) at ZeRO ``level``: the exposed
        part of its all-reduce, its optimizer step and the step's overhead."""
        params = self.tables[s].params[j] - self.tables[s].params[i]
        allreduce = 0.0
        if params > 0 and level <= 1:
            allreduce = _allreduce_ms(self.model, self.rank_groups[s], params)
        return (
            self.model.exposed_allreduce_ms(allreduce, backward, self.model.uniform_executor())
            + self.optimizer[level][s] * params
            + self.step_overhead[s]
        )

    def _choose(self, s: int, i: int, j: int) -> tuple[int, str, float, float, float] | None:
        """``_choice`` computed."""
        # The modes' times, order and memory and the buffers do not depend on the level:
        # once here for every level.
        span = self._span(s, i, j)
        best = None  # (work, level, mode, backward, tail)
        # The compute of a mode does not depend on the level (only ZeRO-2/3's collectives
        # are added to it): levels that pick the same mode cost it once.
        plain: dict[str, tuple[float, float]] = {}
        least_tail = (
            min(self.optimizer[z][s] for z in self.levels) * span.params + self.step_overhead[s]
        )
        for level in self.levels:
            mode = self._fitting(s, i, j, level, span)
            if mode is None:
                continue
            found = plain.get(mode)
            if found is None:
                found = plain[mode] = self._plain_work(s, i, j, mode, span)
            work, backward = self._sharded(s, span.params, level, *found)
            if best is None or work < best[0]:
                best = (work, level, mode, backward, self._tail(s, i, j, level, backward))
            elif work == best[0]:
                tail = self._tail(s, i, j, level, backward)
                if tail < best[4]:
                    best = (work, level, mode, backward, tail)
            if mode == span.ordered[0] and best[0] <= found[0] and best[4] <= least_tail:
                # At the fastest mode's work before any collective and the least tail of any
                # level: a later level only adds its collectives (never negative) to a mode's
                # work, no less than this one's, and no tail is shorter (a tie keeps the lower
                # level).
                break
        return None if best is None else (best[1], best[2], best[0], best[3], best[4])

    def __call__(self, s: int, i: int, j: int) -> tuple[float, float, float] | None:
        choice = self._choice(s, i, j)
        if choice is None:
            return None
        work, tail = choice[2], choice[4]
        send = self.sends[s][j]
        # Blocking transfers (``autoplan.cost.schedule``): the stage pays both directions of
        # the boundary to the next stage and of the one from the previous stage.
        received = self.sends[s - 1][i] if s > 0 else 0.0
        time = work + 2 * send + 2 * received
        return time, time, tail

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
            fastest, _ = fastest_work(self.model, self.p.tp, self.p.mbs, used)
            suffix = [0.0] * (len(fastest) + 1)
            for x in range(len(fastest) - 1, -1, -1):
                suffix[x] = suffix[x + 1] + fastest[x]
            cached = (suffix, len(self.p.classes) - s)
            self._suffix[s] = cached
        suffix, stages = cached
        return suffix[j] / stages, suffix[j]


def _no_worse(x: Costs, y: Costs) -> bool:
    """Whether a stage costing ``x`` is no worse than one costing ``y`` in every pipeline
    around it (``_EitherCoster``): (time, time, tail) triples, the uniform DP's."""
    # The DP's steady and fill are both the stage's time (``_StageCoster.__call__``).
    return x[0] <= y[0] and x[0] + x[2] <= y[0] + y[2]


class _EitherCoster:
    """Stage costs with each stage's sequence parallelism its own choice (module
    docstring): ``off`` and ``on`` cost the same pipeline on the views with SP off and on;
    a call gives the partition DP's choices (off, on), each None where it does not fit or
    where the other is no worse (ties keep SP off). Setting x with time a_x and tail t_x is
    no worse than y when a_x <= a_y and a_x + t_x <= a_y + t_y: in any pipeline around the
    stage, F = (m − 1) max a + Σ a + max t changes from y to x by at most
    (a_x − a_y) + max(0, t_x − t_y) <= 0 (the max term cannot grow)."""

    def __init__(self, off: _StageCoster, on: _StageCoster) -> None:
        self.off = off
        self.on = on
        self._suffix: dict[int, tuple[list[float], int]] = {}

    def __call__(self, s: int, i: int, j: int) -> tuple[Costs | None, Costs | None] | None:
        off = self.off(s, i, j)
        on = self.on(s, i, j)
        if off is None or on is None:
            return None if off is None and on is None else (off, on)
        if _no_worse(off, on):
            return (off, None)
        if _no_worse(on, off):
            return (None, on)
        return (off, on)

    def floor(self, s: int, i: int, j: int) -> float:
        """The lesser of the two settings' floors (each holds for every end >= j)."""
        return min(self.off.floor(s, i, j), self.on.floor(s, i, j))

    def suffix_bound(self, s: int, j: int) -> tuple[float, float]:
        """``_StageCoster.suffix_bound`` with each layer's least time over both settings
        (the stages s.. may take either, each its own)."""
        cached = self._suffix.get(s)
        if cached is None:
            p = self.off.p
            used = tuple(sorted(set(p.classes[s:])))
            fastest, _ = fastest_work(self.off.model, p.tp, p.mbs, used, True)
            suffix = [0.0] * (len(fastest) + 1)
            for x in range(len(fastest) - 1, -1, -1):
                suffix[x] = suffix[x + 1] + fastest[x]
            cached = (suffix, len(p.classes) - s)
            self._suffix[s] = cached
        suffix, stages = cached
        return suffix[j] / stages, suffix[j]


def rank_groups(p: Pending, device_class: int, recompute: str) -> tuple[ReplicaGroup, ...]:
    """The one replica group of a uniform pipeline rank on ``device_class``."""
    return (group_of(device_class, p.tp, p.dp, p.mbs, recompute),)


@functools.lru_cache(maxsize=1 << 18)
def _allreduce_ms(model: CostModel, groups: tuple[ReplicaGroup, ...], params: float) -> float:
    # The same (rank group, stage parameters) recurs across the partitions of every group of
    # the search with that tp, dp and class; the α-β collective is costed once for each.
    return model.allreduce_ms(groups, (params,))


@functools.lru_cache(maxsize=65536)
def _side(model: CostModel, p: Pending, k: int) -> LinkSide:
    return model.link_side(rank_groups(p, k, "none"))


def _send_times(model: CostModel, p: Pending, k: int, k2: int) -> list[float]:
    """One-way send time of a stage ending at layer j (index j), from class k to k2."""
    first, second = _side(model, p, k), _side(model, p, k2)
    per_sample = [
        layer.output_activation_bytes / model.profile.micro_batch_size
        for layer in model.profile.layers
    ]
    return [0.0] + [model.boundary_ms(first, second, value) for value in per_sample]


def _groups(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    tensor_parallel_only: bool = False,
    per_stage_sp: bool = False,
) -> list[Group]:
    out = []
    num_layers = model.num_layers
    for tp in tp_choices(model, options):
        if options.strategy == "data-parallel" and tp != 1:
            continue
        if tensor_parallel_only and tp == 1:
            continue
        for dp in divisors(batch):
            if options.dp is not None and dp != options.dp:
                continue
            if dp % model.expert_parallel:
                continue  # expert groups of ep replicas (autoplan.solve.expert_parallel)
            caps = tuple(class_caps(model, tp, dp))
            if not any(caps) or ((options.zero1 or options.zero_stage) and dp == 1):
                continue
            # The most sharded level allowed: the bounds' memory (``Pending.zero1``).
            zero1 = max(zero_levels(dp, True, options))
            per_param = model.static_bytes_per_param(dp, zero1)
            params = model.tables(next(k for k, c in enumerate(caps) if c), tp, 1).params[-1]
            memories = sorted(
                (model.usable_bytes(k) for k, cap in enumerate(caps) for _ in range(min(cap, 128))),
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
                    # Each stage's SP setting its own where it has tp (module docstring).
                    sp = per_stage_sp and tp > 1
                    group = Group(0.0, tp, dp, mbs, m, pp, zero1, caps, tuple(allowed), sp)
                    # The cheap bound: refined when the group comes up (uniform_search).
                    bound = group_bound(model, group, integral=False)
                    out.append(dataclasses.replace(group, bound=bound))
    out.sort()
    return out


def _expand(
    model: CostModel, g: Group, threshold: float, levels: tuple[int, ...] = (0, 1, 2, 3)
) -> list[Pending]:
    """The group's candidates whose own bound is below ``threshold``, best bound first (all
    orders of every composition; the search itself expands a composition only when it comes
    up). ``levels``: the ZeRO levels the stages may take (the default relaxes every level)."""
    out = []
    for composition in compositions(model, g, levels, threshold):
        out += _orders_of(model, g, composition, threshold)
    out.sort()
    return out


def _orders_of(
    model: CostModel, g: Group, composition: Composition, threshold: float
) -> list[Pending]:
    """The candidates of one composition (every order, every allowed schedule) whose bound
    is below ``threshold``: the composition's for one chunk per rank (it does not depend on
    the order), the interleaved split's own (``bounds.lower_bound``) for more; with SP per
    stage, the lesser of that of the views with SP off and on (each its own split)."""
    out = []
    for classes in orders(composition.subset, composition.counts):
        for schedule, chunks in g.allowed:
            if chunks == 1:
                bound = composition.single_ms
            elif composition.interleaved_ms >= threshold:
                continue  # pruned whatever the order's own bound
            else:
                p = Pending(0.0, (), g.tp, g.dp, g.mbs, g.m, schedule, chunks, g.zero1, classes)
                own = lower_bound(model, p)
                if g.per_stage_sp and own > composition.interleaved_ms:
                    # (At or below the composition's bound, the lesser cannot lift it.)
                    own = min(own, lower_bound(_sp_view(model), p))
                bound = max(composition.interleaved_ms, own)
            if bound >= threshold:
                continue
            key = (g.tp, g.dp, g.mbs, g.pp, schedule, chunks, classes)
            out.append(
                Pending(
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
                    g.per_stage_sp,
                )
            )
    return out


@functools.lru_cache(maxsize=16)
def _sp_view(model: CostModel) -> CostModel:
    """``model`` with sequence parallelism on, one view per model (the bounds' and stage
    tables' caches are keyed on it)."""
    return model.with_sequence_parallel(True)


def _fixed_split(options: SolveOptions, num_layers: int, pp: int) -> list[int] | None:
    if options.layer_split is not None:
        return list(options.layer_split)
    if options.strategy == "even-split":
        return even_split(num_layers, pp)
    return None


def _solve_pipeline(
    model: CostModel,
    p: Pending,
    options: SolveOptions,
    bound: float,
    shared: StageTable | None = None,
    shared_sp: StageTable | None = None,
) -> tuple[PlanConfig, float] | None:
    """The best split of pipeline ``p`` below ``bound`` (its config and time), or None;
    ``shared``: the stage figures of the search's earlier pipelines (``StageTable``), and
    ``shared_sp`` those with SP on where ``p`` chooses SP per stage (module docstring)."""
    modes = recompute_modes(options)
    levels = zero_levels(p.dp, True, options)
    if len(p.classes) > 1:
        # The levels the engine runs in a pipeline (Megatron-DeepSpeed: 0 and 1). The bounds
        # that queued ``p`` read every level: a larger space, so they still hold.
        most = ENGINES[model.engine].pipeline_zero_max
        levels = tuple(z for z in levels if z <= most)
        if not levels:
            return None  # a pinned level the engine does not run in a pipeline
    if p.chunks > 1:
        found = _solve_interleaved(model, p, modes, levels)
        if p.per_stage_sp:
            # SP for the whole plan, on its own view's split (module docstring).
            on = _solve_interleaved(_sp_view(model), p, modes, levels)
            if on is not None and (found is None or on[1] < found[1]):
                found = (dataclasses.replace(on[0], sequence_parallel=True), on[1])
        return found
    costers, coster = _pipeline_coster(model, p, modes, levels, shared, shared_sp)
    off = costers[0]
    pp = len(p.classes)
    split = _fixed_split(options, model.num_layers, pp)
    if split is not None:
        # The one split: the DP over its stages alone (stage s spans [s, s + 1) of them),
        # which chooses each stage's SP setting where it has the choice.
        bounds = [0, *itertools.accumulate(split)]
        if isinstance(coster, _EitherCoster):
            either = coster
            result = best_partition(
                pp, pp, p.m, lambda s, i, j: either(s, bounds[i], bounds[j]), choices=True
            )
        else:
            result = best_partition(pp, pp, p.m, lambda s, i, j: off(s, bounds[i], bounds[j]))
        if result is None:
            return None
    else:
        result = best_partition(
            model.num_layers,
            pp,
            p.m,
            coster,
            upper_bound=bound,
            suffix_bound=coster.suffix_bound,
            stage_floor=coster.floor,
            choices=p.per_stage_sp,
        )
        if result is None:
            return None
        bounds = list(result.boundaries)
    value = result.objective
    chosen = result.choices or (0,) * pp
    stages = []
    for s in range(pp):
        choice = costers[chosen[s]].choice_for(s, bounds[s], bounds[s + 1])
        assert choice is not None
        level, mode = choice
        stages.append(
            StageChoice(
                bounds[s],
                bounds[s + 1],
                rank_groups(p, p.classes[s], mode),
                level,
                sequence_parallel=chosen[s] == 1,
            )
        )
    config = PlanConfig(p.m, p.schedule, 1, tuple(stages), executor=model.uniform_executor())
    # Said one way (plan-wide where every stage runs SP): equal plans compare equal.
    return canonical_sequence_parallel(config), value


def _pipeline_coster(
    model: CostModel,
    p: Pending,
    modes: tuple[str, ...],
    levels: tuple[int, ...],
    shared: StageTable | None = None,
    shared_sp: StageTable | None = None,
) -> tuple[list[_StageCoster], _StageCoster | _EitherCoster]:
    """The stage costers of pipeline ``p`` (one chunk per rank), SP off then (where it
    chooses SP per stage) on, and what its DP reads: the one, or both as choices."""
    off = _StageCoster(model, p, modes, levels, shared)
    if not p.per_stage_sp:
        return [off], off
    if shared_sp is None:
        shared_sp = StageTable(sends={} if shared is None else shared.sends)
    on = _StageCoster(_sp_view(model), p, modes, levels, shared_sp)
    return [off, on], _EitherCoster(off, on)


def _solve_interleaved(
    model: CostModel, p: Pending, modes: tuple[str, ...], levels: tuple[int, ...]
) -> tuple[PlanConfig, float] | None:
    """The fixed interleaved split: the lowest ZeRO level (for all chunks) at which raising
    the recompute of the ranks that do not fit makes every rank fit."""
    sizes = interleaved_sizes(model, p.classes, p.tp, p.mbs, p.chunks)
    bounds = [0, *itertools.accumulate(sizes)]
    for level in levels:
        found = _interleaved_at(model, p, modes, bounds, level)
        if found is not None:
            return found
    return None


def _interleaved_at(
    model: CostModel, p: Pending, modes: tuple[str, ...], bounds: list[int], level: int
) -> tuple[PlanConfig, float] | None:
    """Each rank in the fastest mode (by its chunks' work) with which it fits, as the
    non-interleaved path and the heterogeneous search choose; None if a rank fits in none.
    A rank's memory and work depend on its own mode only, so one evaluation per mode, with
    every rank in it, tells each rank's fit and work in that mode."""
    pp = len(p.classes)

    def config_of(chosen: list[str]) -> PlanConfig:
        stages = tuple(
            StageChoice(
                bounds[s],
                bounds[s + 1],
                rank_groups(p, p.classes[s % pp], chosen[s % pp]),
                level,
            )
            for s in range(pp * p.chunks)
        )
        return PlanConfig(p.m, p.schedule, p.chunks, stages, executor=model.uniform_executor())

    best: list[tuple[float, str] | None] = [None] * pp
    for mode in modes:  # ties keep the earlier mode: the order of ``modes``
        cost = model.evaluate(config_of([mode] * pp))
        over = {m.pipeline_rank for m in cost.memory if not m.fits}
        for r in range(pp):
            if r in over:
                continue
            work = sum(cost.stages[s].work_ms for s in range(r, pp * p.chunks, pp))
            current = best[r]
            if current is None or work < current[0]:
                best[r] = (work, mode)
    if any(choice is None for choice in best):
        return None
    config = config_of([choice[1] for choice in best if choice is not None])
    cost = model.evaluate(config)
    return (config, cost.iteration_ms) if cost.feasible else None


def uniform_search(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    deadline: float | None = None,
    incumbent_ms: float = math.inf,
    tensor_parallel_only: bool = False,
    per_stage_sp: bool = False,
) -> SearchResult:
    """The ``options.top_k + 1`` best distinct uniform configurations, best first (exact
    unless the deadline, a ``time.monotonic()`` value, stops it; module docstring); with an
    ``incumbent_ms`` (a plan the caller holds), only those faster than it. With
    ``options.gap`` it prunes what cannot beat the best by more than that fraction.
    ``tensor_parallel_only``: only configurations with tp > 1 (a caller that searched the
    tp-1 ones in another run where they are the same plans: ``solve.sequence_parallel``).
    ``per_stage_sp``: ``model`` has SP off and each stage with tp > 1 chooses SP for itself
    (module docstring); the configurations come back in ``canonical_sequence_parallel``
    form.

    The result's ``lower_bound_ms`` is the family's floor (``autoplan.solve.certificate``):
    everything pruned was bounded at or above the threshold when it was pruned, and the
    threshold only falls; a stop by the deadline leaves the least bound still queued."""
    deadline = time.monotonic() + options.time_limit_s if deadline is None else deadline
    keep = options.top_k + 1
    best: list[tuple[float, tuple, PlanConfig]] = []
    per_stage_sp = per_stage_sp and not model.sequence_parallel
    groups = _groups(model, batch, options, tensor_parallel_only, per_stage_sp)
    solved = considered = 0
    timed_out = False

    def offer(value: float, config: PlanConfig) -> None:
        report_found(value)
        best.append((value, config_key(config), config))
        best.sort(key=lambda item: (item[0], item[1]))
        del best[keep:]

    def threshold() -> float:
        # Pruning against the best found keeps the best exact; the runner-ups are the best
        # of the configurations the search costed, not necessarily the global 2nd..k-th.
        return min(best[0][0] if best else math.inf, incumbent_ms) * (1.0 - options.gap)

    # Best bound first over groups and their candidates together: a group's bound is looser
    # than its candidates' (one pp=12 group bounded at 15 s may hold only candidates bounded
    # at 22 s), so a group is expanded when its bound comes up and its candidates queue with
    # everyone else's; the search stops when the least bound queued reaches the best found.
    # Groups queue first with their cheap bound (kind 2); when one comes up its full bound
    # (the integral one: most of the cost, ~5 ms a group) is computed and, if higher, it
    # queues again with it (kind 0): on 16,384 GPUs most of the 5,792 groups never need it.
    # A group expanded queues its compositions (kind 4), a composition its orders (kind 1),
    # an order refined by its own bound queues again (kind 3) if that bound is higher.
    queue: list[tuple[float, int, int]] = [(g.bound, 2, x) for x, g in enumerate(groups)]
    heapq.heapify(queue)
    pending: list[Pending] = []
    shared = StageTable()
    # The SP-on view's stage figures; the boundaries' sends are the same either way.
    shared_sp = StageTable(sends=shared.sends)
    parts: list[tuple[int, Composition]] = []  # (group, composition) of the queue's kind 4
    expanded = 0
    unexplored = math.inf  # the least bound the deadline left in the queue
    while queue:
        bound, kind, item = heapq.heappop(queue)
        if bound >= threshold():
            break
        if time.monotonic() > deadline:
            timed_out = True
            unexplored = bound
            logger.warning("time limit reached after %d of %d groups", expanded, len(groups))
            break
        if kind == 2:
            full = group_bound(model, groups[item])
            if full > bound:
                heapq.heappush(queue, (full, 0, item))
                continue
            kind = 0
        if kind == 0:
            if progress is not None:
                progress(expanded, len(groups))
            expanded += 1
            # Its compositions queue with their bound; their orders only when they come up.
            levels = zero_levels(groups[item].dp, True, options)
            for composition in compositions(model, groups[item], levels, threshold()):
                heapq.heappush(queue, (composition.bound, 4, len(parts)))
                parts.append((item, composition))
            continue
        if kind == 4:
            group, composition = parts[item]
            for p in _orders_of(model, groups[group], composition, threshold()):
                considered += 1
                heapq.heappush(queue, (p.bound, 1, len(pending)))
                pending.append(p)
            continue
        p = pending[item]
        if kind == 1:
            # The order's own bound (``flight_bound``: in-flight memory and where each run of
            # one class must sit), a few ms against a DP's tens: when it is higher, the
            # candidate queues again with it and often never comes up.
            refined = order_bound(model, p, zero_levels(p.dp, True, options))
            if refined > bound:
                heapq.heappush(queue, (refined, 3, item))
                continue
        solved += 1
        found = _solve_pipeline(model, p, options, threshold(), shared, shared_sp)
        if found is not None:
            offer(found[1], found[0])
    candidates = []
    for _value, _k, config in best:
        cost = model.evaluate(config)
        candidates.append(Candidate(cost.iteration_ms, config, cost))
    candidates.sort(key=lambda c: (c.iteration_ms, config_key(c.config)))
    floor = min(threshold(), unexplored)
    return SearchResult(candidates, considered, solved, timed_out, floor)
