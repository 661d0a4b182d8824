"""Heterogeneous pipelines: each stage its own device classes, tp, replicas and shares.

For one micro-batch count m (b = B / m samples per micro-batch) and schedule (1F1B, or GPipe
with more stages than micro-batches), ``solvers.pipeline_dp`` finds the best pipeline exactly
over the space of ``autoplan.solve.space``; ``HeteroSource`` gives it the stage options (the
replica allocations of a stage: one or two (class, tp, replicas) kinds), their costs and the
bounds it prunes with:

- stage floor: with n_κ replicas of kind κ and W_κ the per-replica time of one sample of the
  stage's layers at its cheapest share (forward + backward, no recompute), a replica taking x
  samples spends at least x W_κ; the least over the splits of b into whole shares of at least
  one sample each (``_two_kind_floor``) bounds the stage. The per-sample time of a share does
  not grow with the share in the cost model (its terms scale linearly with the samples, fixed
  terms only shrink per sample), so the cheapest share is the largest. A one-kind stage's
  floor is also at least its time in the fastest mode whose memory fits at some ZeRO level
  with two micro-batches in flight (one for a stage ending at the last layer: any other has a
  stage after it), inf where none fits (``_fitting_floors``): on Llama-2-70B on h100-a100-l4
  (batch 256) the root bounds of the m = 16/64/128 1F1B runs rise from 44,368/43,357/43,742 to
  45,502/45,876/48,339 ms (plan 49,091 ms);
- prefix bound: stages covering layers [0, i) with free GPUs f_k per class: with ω_k(l) the
  least GPU-milliseconds one sample of layer l takes on class k (over its tp degrees) and
  Ω_k = Σ_l ω_k(l), any λ_k >= 0 with Σ_k λ_k f_k = 1 gives max_s T_s >= b Σ_{l<i}
  min_k λ_k ω_k(l) (each stage's GPUs times its time cover its samples' work; weak duality);
  λ_k ∝ 1/Ω_k is exact when every layer is the same factor faster on one class than on
  another. The sum of the stages' times is at least their max. Where the DP's options are
  several views' (``autoplan.solve.stage_degrees``: cp, ep and SP per stage), ω is the least
  over them: with SP options, over SP off and on (``bound_sequence_parallel``).

Costs mirror ``CostModel.evaluate`` stage by stage (the oracle tests hold the two to the same
answers): balanced shares (space.py), per group the fastest recompute that fits, ZeRO-1 by
dominance, the boundary transfer to the next stage (its ``LinkSide`` is the DP's link key),
the gradient all-reduce as the groups executor runs it (summed after the last backward: all of
it exposed, but for a stage with cp > 1, which runs on the mesh only), the slowest optimizer
step. The family's plans are priced and recorded for that executor (``PlanConfig.executor``),
even the few that one mesh could hold (every stage the same replicas, tp and shares): the
executor of a plan is global and the DP's stage costs are local, so those run on the groups
executor, as priced; the uniform and shared-stage families price theirs for the mesh.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

import numpy as np

from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel, LinkSide
from autoplan.cost.offload import group_of, mode_key
from autoplan.cost.sharding import exposed_ms
from autoplan.solve.certificate import work_bound_ms
from autoplan.solve.levels import LEVEL_STEP, TIME_SHARE, LevelCosts, next_level
from autoplan.solve.options import SolveOptions
from autoplan.solve.progress import report_found
from autoplan.solve.space import (
    MAX_CLASSES_PER_STAGE,
    MIXED_STAGE_NODES,
    class_gpu_counts,
    class_tp_choices,
    micro_batch_counts,
    recompute_modes,
    zero_levels,
)
from solvers.pipeline_dp import StageCostResult, StageSource, best_pipelines
from solvers.relaxed_bound import RunRelaxation, stage_floors

__all__ = [
    "Allocation",
    "HeteroResult",
    "HeteroSource",
    "HeteroState",
    "RunFloors",
    "hetero_candidates",
]

logger = logging.getLogger(__name__)

HEURISTIC_BEAM = 8
"""Labels per position the incumbent-finding pass extends (``hetero_candidates``)."""


Kind = tuple[int, int]  # (device class, tp)
Allocation = tuple[tuple[int, int, int], ...]  # ((class, tp, replicas), ...)
# (model, batch, micro-batches, schedule, options) -> a run's stage source
SourceType = Callable[[CostModel, int, int, str, SolveOptions], StageSource]
# (each option's resources, the least transfers out of / into a stage per layer, the floors)
RunFloors = tuple[np.ndarray, list[tuple[np.ndarray, np.ndarray]], np.ndarray]


@functools.cache
def _cell_order(num_layers: int) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends) of every cell [i, j) of ``num_layers`` layers, by end, then start: the
    order ``HeteroSource._floor_tables_of`` takes them in."""
    ends = np.concatenate([np.full(j, j) for j in range(1, num_layers + 1)])
    starts = np.concatenate([np.arange(j) for j in range(1, num_layers + 1)])
    return starts, ends


def _end_cells(first: int, last: int) -> slice:
    """Where the cells of ends first..last lie in ``_cell_order`` (end j has j cells)."""
    return slice(first * (first - 1) // 2, last * (last + 1) // 2)


@dataclass(frozen=True)
class _Core:
    payload: tuple  # (groups, ZeRO level, and the source's ``degrees``: ``_config``)
    work_ms: float
    tail_ms: float
    side: LinkSide


_FLOOR_CELLS = 1 << 18
"""About how many (option, cell) figures ``HeteroSource.floor_table`` computes in one pass."""

_TWO_KIND_CELLS = 1 << 14
"""About how many (option, cell) figures of two-kind options ``_two_kind_floor`` takes at a
time: its arrays then stay in the cache across its passes."""


def _two_kind_floor(
    w1: np.ndarray, w2: np.ndarray, n1: np.ndarray, n2: np.ndarray, b: int
) -> np.ndarray:
    """A lower bound on a two-kind stage's time: n1 replicas of per-sample time w1 and n2 of
    w2 (at the largest share: a replica taking x samples spends at least x w), sharing b
    samples, each replica at least one (elementwise over arrays of one shape).

    Kind 1 takes S samples, n1 <= S <= b − n2, so one of its replicas takes x = ⌈S / n1⌉ and
    one of kind 2's at least (b − S) / n2; with S <= min(n1 x, b − n2), the stage takes at
    least h(x) = max(x w1, (b − min(n1 x, b − n2)) w2 / n2) over whole x in [1, X], X =
    ⌈(b − n2) / n1⌉. The first term grows with x and the second does not, so the least h is
    at a whole number next to where the two (continuous, piecewise linear) terms cross, or
    at an end. Only kind 1's shares are whole here: the caller also takes the bound with the
    kinds swapped, and the larger of the two."""
    top = np.ceil((b - n2) / n1)
    most = b - n2
    # Where x w1 meets the line (b − n1 x) w2 / n2; past x = (b − n2) / n1 the second term is
    # the constant w2, met at x = w2 / w1. In place where a temporary would be (the arrays
    # are every option × cell: memory-bound), each figure the same operations in the same
    # order as the formula.
    denominator = n2 * w1
    denominator += n1 * w2
    cross = b * w2
    cross /= denominator
    # w2 / w1 only where it is taken (the same figures as a np.where of both).
    np.divide(w2, w1, out=cross, where=~(cross <= most / n1))
    best = None
    for x in (np.floor(cross), np.ceil(cross)):
        # np.clip's own overhead is most of its time here; the same figures (no NaN).
        np.maximum(x, 1.0, out=x)
        np.minimum(x, top, out=x)
        second = n1 * x
        np.minimum(second, most, out=second)
        np.subtract(b, second, out=second)
        second *= w2
        second /= n2
        x *= w1
        np.maximum(x, second, out=x)
        best = x if best is None else np.minimum(best, x, out=best)
    assert best is not None
    return best


class HeteroSource:
    """Stage options, costs and bounds for one (m, schedule); see the module docstring."""

    def __init__(
        self,
        model: CostModel,
        batch: int,
        num_micro_batches: int,
        schedule: str,
        options: SolveOptions,
        *,
        tensor_parallel_only: bool = False,
        bound_sequence_parallel: bool = False,
        degrees: tuple[int, int, bool] | None = None,
    ) -> None:
        """``tensor_parallel_only``: only the allocations with a kind at tp > 1 (a source
        joined beside another view's of the same model, which holds the rest:
        ``autoplan.solve.stage_degrees``); ``bound_sequence_parallel``: the prefix bound's
        ω_k(l) is the least over sequence parallelism off and on (the bound then holds for
        the options of a view with it on joined beside this one); ``degrees``: the (cp, ep,
        SP) of a joined view, which its stages' payloads carry (its groups at that cp, and
        ``StageChoice``'s ep and sequence_parallel: ``_config``), made once per stage kept."""
        self.model = model
        self.m = num_micro_batches
        self.b = batch // num_micro_batches
        self.schedule = schedule
        self.pinned = options
        self._tensor_parallel_only = tensor_parallel_only
        self._bound_sequence_parallel = bound_sequence_parallel
        self._degrees = degrees
        self.modes = recompute_modes(options)
        self.kinds: list[Kind] = [
            (c.index, t) for c in model.classes for t in class_tp_choices(model, c.index, options)
        ]
        self.allocations = self._allocations()
        self._uses = [self._use(a) for a in self.allocations]
        self._per_sample = {kind: self._per_sample_prefix(kind) for kind in self.kinds}
        self._per_sample_array = {kind: np.array(v) for kind, v in self._per_sample.items()}
        # Option o's kinds (index into self.kinds) and replica counts, 0 for a missing kind.
        self._per_sample_matrix = np.array([self._per_sample[kind] for kind in self.kinds])
        # By layer, then kind (``_floor_tables_of`` lays its two-kind figures out so).
        self._per_sample_by_layer = np.ascontiguousarray(self._per_sample_matrix.T)
        kind_of = {kind: index for index, kind in enumerate(self.kinds)}
        self._kind_index = np.zeros((len(self.allocations), 2), dtype=np.int64)
        self._counts = np.zeros((len(self.allocations), 2))
        self._is_single = np.array([len(a) == 1 for a in self.allocations], dtype=bool)
        self._single_rows = np.flatnonzero(self._is_single)
        self._pair_rows = np.flatnonzero(~self._is_single)
        self._single_prefix = np.zeros((len(self.allocations), model.num_layers + 1))
        self._overhead = np.zeros(len(self.allocations))
        for option, allocation in enumerate(self.allocations):
            for slot, (k, t, n) in enumerate(allocation):
                self._kind_index[option, slot] = kind_of[(k, t)]
                self._counts[option, slot] = n
            self._overhead[option] = 2 * min(model.pass_overhead_ms(k) for k, _, _ in allocation)
            if len(allocation) == 1:
                ((k, t, n),) = allocation
                share = -(-self.b // n)
                if self.pinned.micro_batch_size is not None:
                    share = self.pinned.micro_batch_size
                # The work prefix alone (``CostModel.work_prefix``): of most of these shares
                # no stage is ever costed, and a whole table set costs ~5x more.
                self._single_prefix[option] = model.work_prefix(k, t, share, "none")
        self._prefix_matrix = self._prefix_tables()
        self._cores: dict[tuple[int, int, int, int], _Core | None] = {}
        self._sends: dict[tuple[LinkSide, LinkSide, int], float] = {}
        self._out_bytes = [
            layer.output_activation_bytes / model.profile.micro_batch_size
            for layer in model.profile.layers
        ]
        # Each option's side of a boundary (``send_floor``, ``edge_floors``).
        self._least_sides = [self._least_side(a) for a in self.allocations]
        self._send_floors: dict[tuple[float, LinkSide], np.ndarray] = {}
        self._edge_floors: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        self._floor_tables: dict[int, np.ndarray] = {}
        # ``front_floor_table``'s, by flight (shared with the twin, as ``_floor_tables``).
        self._front_tables: dict[int, dict[int, np.ndarray]] = {}
        self._fitting_kept: dict[int | None, list[tuple[list[int], np.ndarray]]] = {}
        # ``_run_floors``' answer, by layer count: it reads only the options, floor tables and
        # edge floors, so the twin of the other schedule (``with_schedule``) shares it too.
        self.kept_run_floors: dict[int, RunFloors] = {}

    def with_schedule(self, schedule: str) -> HeteroSource:
        """This source for ``schedule`` at the same m: the schedule only sets how many
        micro-batches a stage holds in flight where ``cost`` asks for it (every table and
        cache here is keyed by that count or holds none), so the copy shares all of them (the
        1F1B and GPipe runs of one m: one source's options, floors and stage costs)."""
        twin = copy.copy(self)
        twin.schedule = schedule
        return twin

    # ---- the options ---------------------------------------------------------------------
    def _replica_counts(self, kind: Kind) -> list[int]:
        k, t = kind
        # Expert groups of ep replicas (autoplan.solve.expert_parallel): ep divides each count.
        ep = self.model.expert_parallel
        return [
            g // t
            for g in class_gpu_counts(self.model, k, t)
            if g // t <= self.b and (g // t) % ep == 0
        ]

    def _allocations(self) -> list[Allocation]:
        pinned = self.pinned
        single: list[Allocation] = [
            ((k, t, n),) for k, t in self.kinds for n in self._replica_counts((k, t))
        ]
        found = list(single)
        total_nodes = sum(c.num_nodes for c in self.model.classes)
        if MAX_CLASSES_PER_STAGE >= 2 and total_nodes <= MIXED_STAGE_NODES:
            for (one,), (two,) in itertools.combinations(single, 2):
                if one[0] != two[0] and one[2] + two[2] <= self.b:
                    found.append((one, two) if one < two else (two, one))

        def allowed(allocation: Allocation) -> bool:
            replicas = sum(n for _, _, n in allocation)
            if pinned.dp is not None and replicas != pinned.dp:
                return False
            if pinned.micro_batch_size is not None:
                return replicas * pinned.micro_batch_size == self.b
            if self._tensor_parallel_only and all(t == 1 for _, t, _ in allocation):
                return False
            return replicas <= self.b

        return sorted(a for a in found if allowed(a))

    def _use(self, allocation: Allocation) -> tuple[int, ...]:
        use = [0] * len(self.model.classes)
        for k, t, n in allocation:
            use[k] += t * n
        return tuple(use)

    def options(self) -> list[tuple[int, ...]]:
        return self._uses

    # ---- bounds --------------------------------------------------------------------------
    def _per_sample_prefix(self, kind: Kind, sequence_parallel: bool | None = None) -> list[float]:
        """Prefix sums of each layer's per-replica time for one sample at the largest share
        (forward + backward, no recompute; module docstring), with sequence parallelism as
        the view has it (None) or as said."""
        k, t = kind
        layers = self.model.tables(k, t, self.b, sequence_parallel).layers
        return [
            0.0,
            *itertools.accumulate(
                (c.forward_ms() + c.backward_ms("none")) / self.b for c in layers
            ),
        ]

    def _prefix_tables(self) -> np.ndarray:
        """Row ``Σ_x 2^x`` for each set S of classes (x = position in ``_omega_classes``):
        prefix sums of min_{k∈S} ω_k(l) / Ω_k (module docstring); row 0 (no class) is inf
        but at i = 0, and a set with a class of Ω_k = 0 gives no bound (zeros)."""
        num_layers = self.model.num_layers
        omega: dict[int, np.ndarray] = {}
        for k, t in self.kinds:
            per = self._per_sample_array[(k, t)]
            values = t * np.diff(per)
            if self._bound_sequence_parallel and t > 1:
                # A layer can take less with SP on (its replicated part split t ways) than
                # off: the bound holds for the options of both only at the least of the two.
                on = np.array(self._per_sample_prefix(kind=(k, t), sequence_parallel=True))
                values = np.minimum(values, t * np.diff(on))
            omega[k] = np.minimum(omega[k], values) if k in omega else values
        classes = sorted(omega)
        self._omega_classes = classes
        self._omega_total = {k: float(omega[k].sum()) for k in classes}
        rows = np.zeros((1 << len(classes), num_layers + 1))
        rows[0, 1:] = math.inf
        for subset in range(1, 1 << len(classes)):
            members = [classes[x] for x in range(len(classes)) if subset >> x & 1]
            if any(self._omega_total[k] <= 0 for k in members):
                continue
            ratios = np.min([omega[k] / self._omega_total[k] for k in members], axis=0)
            rows[subset, 1:] = np.cumsum(ratios)
        return rows

    def floor_table(self, j: int) -> np.ndarray:
        """``out[o, i]`` for i < j: a one-kind stage's time with its largest share and no
        recompute; a two-kind stage's best split in whole samples (``_two_kind_floor``);
        plus the fixed per-pass times. Kept: the root bound and the DP both read it. Every
        end j at the first ask, a few ends per numpy pass (elementwise the same figures; the
        root bound reads them all)."""
        if not self._floor_tables:
            # In place: a source of the other schedule shares this dict (``with_schedule``).
            for first, last in self._end_passes():
                self._floor_tables.update(self._floor_tables_of(first, last))
        return self._floor_tables[j]

    def _end_passes(self) -> list[tuple[int, int]]:
        """(first, last) ends of each numpy pass over the floor tables' cells: a few ends
        at a time, so that one pass holds about ``_FLOOR_CELLS`` figures."""
        n = self.model.num_layers
        most = max(1, _FLOOR_CELLS // max(1, len(self.allocations)))
        passes = []
        first = 1
        while first <= n:
            last, cells = first, first
            while last < n and cells + last + 1 <= most:
                last += 1
                cells += last
            passes.append((first, last))
            first = last + 1
        return passes

    @staticmethod
    def _by_end(out: np.ndarray, first: int, last: int) -> dict[int, np.ndarray]:
        """``out``'s columns (the cells of ends first..last in ``_cell_order``) by end."""
        offsets = np.cumsum([0, *range(first, last + 1)])
        return {
            j: out[:, offsets[x] : offsets[x + 1]] for x, j in enumerate(range(first, last + 1))
        }

    def front_floor_table(self, j: int, flight: int) -> np.ndarray:
        """``floor_table(j)`` for a stage holding ``flight`` micro-batches in flight or more
        (capped at m): a one-kind option's floor no lower than its fastest mode that fits
        with them (``_fitting_floors``). A stage with q stages after it holds min(m, q + 1)
        under 1F1B and m under GPipe, so this bounds the stages in front of a partial
        pipeline of ``flight`` − 2 stages (``front_relaxations``)."""
        tables = self._front_tables.setdefault(flight, {})
        if not tables:
            for first, last in self._end_passes():
                out = np.concatenate([self.floor_table(e) for e in range(first, last + 1)], axis=1)
                span = _end_cells(first, last)
                for rows, fitting in self._fitting_all(flight):
                    out[rows] = np.maximum(out[rows], fitting[:, span] + self._overhead[rows, None])
                tables.update(self._by_end(out, first, last))
        return tables[j]

    def _floor_tables_of(self, first: int, last: int) -> dict[int, np.ndarray]:
        """``floor_table(j)`` for j in [first, last], in one pass over their cells (i, j)."""
        all_starts, all_ends = _cell_order(self.model.num_layers)
        cells = _end_cells(first, last)
        starts, ends = all_starts[cells], all_ends[cells]
        out = np.empty((len(self.allocations), len(ends)))
        # One-kind options: their own prefix; the split's floor only for the two-kind rows
        # (the same figures, elementwise, as computing it for every row and choosing).
        single, pair = self._single_rows, self._pair_rows
        out[single] = self._single_prefix[single][:, ends] - self._single_prefix[single][:, starts]
        # Memory (``_fitting_floors``): a stage ending before the last layer has a stage after
        # it, so two micro-batches in flight or more (1F1B: min(m, stages from the end); GPipe:
        # m); the last stage holds one or more.
        for rows, fitting in self._fitting_all(None):
            out[rows] = np.maximum(out[rows], fitting[:, cells])
        if len(pair):
            # Laid out (cells, two-kind options): the replica counts then vary along the
            # contiguous axis, and numpy's loops over two arrays of one shape, or one and a
            # row, run ~3x faster than with a column broadcast along it; and a few cells at a
            # time, so that the dozens of passes of ``_two_kind_floor`` stay in the cache
            # (twice as fast again). The figures are elementwise the same.
            work = self._per_sample_by_layer[ends] - self._per_sample_by_layer[starts]
            kinds1, kinds2 = self._kind_index[pair, 0], self._kind_index[pair, 1]
            n1, n2 = self._counts[pair, 0], self._counts[pair, 1]
            floors = np.empty((len(ends), len(pair)))
            step = max(1, _TWO_KIND_CELLS // len(pair))
            for at in range(0, len(ends), step):
                part = work[at : at + step]
                one, other = part[:, kinds1], part[:, kinds2]
                missing = (one <= 0) | (other <= 0)
                one = np.where(one > 0, one, 1.0)
                other = np.where(other > 0, other, 1.0)
                balanced = _two_kind_floor(one, other, n1, n2, self.b)
                np.maximum(balanced, _two_kind_floor(other, one, n2, n1, self.b), out=balanced)
                balanced[missing] = 0.0
                floors[at : at + step] = balanced
            out[pair] = floors.T
        out += self._overhead[:, None]
        return self._by_end(out, first, last)

    def _fitting_all(self, flight: int | None) -> list[tuple[list[int], np.ndarray]]:
        """``_fitting_floors`` of every one-kind option on every cell of ``_cell_order``, by
        (class, tp, largest share): (its rows, their floors), at ``flight`` micro-batches in
        flight (capped at m), or with None two before the last layer and one at it. Kept: one
        numpy pass per kind over all cells rather than one per pass of ``_floor_tables_of``
        (their calls were most of the time on GPT-3 175B on 16,384 GPUs)."""
        found = self._fitting_kept.get(flight)
        if found is not None:
            return found
        num_layers = self.model.num_layers
        _, ends = _cell_order(num_layers)
        if flight is None:
            held = np.where(ends < num_layers, min(self.m, 2), 1)
        else:
            held = np.full(len(ends), min(self.m, flight))
        by_kind: dict[tuple[int, int, int], list[int]] = {}
        for option in self._single_rows.tolist():
            by_kind.setdefault(self._top_share(option), []).append(option)
        found = [
            (rows, self._fitting_floors(k, t, x, rows, slice(0, len(ends)), held))
            for (k, t, x), rows in by_kind.items()
        ]
        self._fitting_kept[flight] = found
        return found

    def _top_share(self, option: int) -> tuple[int, int, int]:
        """A one-kind option's (class, tp, largest share)."""
        ((k, t, n),) = self.allocations[option]
        if self.pinned.micro_batch_size is not None:
            return k, t, self.pinned.micro_batch_size
        return k, t, -(-self.b // n)

    def _fitting_floors(
        self,
        k: int,
        t: int,
        x: int,
        rows: list[int],
        cells: slice,
        flight: np.ndarray,
    ) -> np.ndarray:
        """``out[r, c]``: a lower bound on the time of one-kind option ``rows[r]`` (each of
        class k at tp t, largest share x) on the c-th of ``cells`` with ``flight[c]``
        micro-batches in flight or more: its time (``_work`` without the fixed per-pass
        times, which the caller adds, the sequence-parallel all-gathers and ZeRO-2/3's
        collectives) in the fastest mode in which its
        largest share fits at some allowed ZeRO level (``_mode``'s test: memory grows with
        the micro-batches in flight, so a stage's mode at any flight at or above ``flight``
        is one of these); inf where none fits. The test allows a margin for rounding: only a
        clear excess rules a mode out.

        Per mode, the share fits at level z where P·s_z + Q <= U_z (P its parameters, s_z
        the bytes per parameter held, U_z its usable memory, Q its transfer buffers, saved
        activations times the flight and largest transient), so at some level exactly where
        min_z (P·s_z − U_z) + Q <= 0: one minimum per option, one test per mode."""
        params, buffers, per_mode = self._fit_cells(k, t, x, cells)
        out = np.full((len(rows), len(flight)), math.inf)
        needs = [
            (
                work,
                buffers + flight * saved + transient,
                None if parked is None else flight * parked,
            )
            for work, saved, transient, parked in per_mode
        ]
        for r, option in enumerate(rows):
            ((_, _, n),) = self.allocations[option]
            slack = np.full(len(flight), math.inf)
            host = 0.0
            for level in zero_levels(n, True, self.pinned):
                usable, host = self._limits(k, t, n, level)
                np.minimum(
                    slack,
                    params * self.model.static_bytes_per_param(n, level)
                    - (usable * (1 + 1e-9) + 1.0),
                    out=slack,
                )
            for work, need, parked in needs:
                fits = slack + need <= 0
                if parked is not None:
                    fits &= parked <= host * (1 + 1e-9) + 1.0
                np.minimum(out[r], np.where(fits, work, math.inf), out=out[r])
        return out

    def _fit_cells(
        self, k: int, t: int, x: int, cells: slice
    ) -> tuple[np.ndarray, np.ndarray, list[tuple[np.ndarray, np.ndarray, np.ndarray, object]]]:
        """What ``_fitting_floors`` reads of a replica of (k, t) taking ``x`` samples on the
        ``cells`` of ``_cell_order``: its parameters, its transfer buffers and, per mode, its
        time, saved bytes, largest transient and parked bytes (None without offload)."""
        params, per_mode = self._fit_layers(k, t, x)
        return (
            params[cells],
            self._buffer_cells(x)[cells],
            [
                (
                    work[cells],
                    saved[cells],
                    transient[cells],
                    None if parked is None else parked[cells],
                )
                for work, saved, transient, parked in per_mode
            ],
        )

    def _fit_layers(self, k: int, t: int, x: int):
        """``_fit_cells``' figures on every cell of ``_cell_order``: what ``_mode_rows``,
        ``_transient`` and ``_work`` read, as arrays. Kept with the tables
        (``CostTables.derived``): the runs of other micro-batch counts read the same shares
        (the transfer buffers, which scale with m, apart: ``_buffer_cells``)."""
        model, num_layers = self.model, self.model.num_layers
        tables = model.tables(k, t, x)
        key = ("fit", self.modes)
        kept = tables.derived.get(key)
        if kept is not None:
            return kept
        starts, ends = _cell_order(num_layers)
        per_mode = []
        for mode in self.modes:
            work = np.array(tables.work[mode])
            cell_work = work[ends] - work[starts]
            if tables.start_work:
                cell_work += np.array(tables.start_work[mode])[starts]
            saved = np.array(tables.saved[mode])
            # ``_transient`` of every cell at once, from the same sparse table of range maxima.
            sparse = self._transient_table(k, t, x, mode)
            rows = np.full((len(sparse), num_layers), -math.inf)
            for level, row in enumerate(sparse):
                rows[level, : len(row)] = row
            level = np.log2(ends - starts).astype(np.int64)
            transient = np.maximum(rows[level, starts], rows[level, ends - (1 << level)])
            parked = tables.parked.get(mode)
            per_mode.append(
                (
                    cell_work,
                    saved[ends] - saved[starts],
                    transient,
                    None if parked is None else (np.array(parked)[ends] - np.array(parked)[starts]),
                )
            )
        params = np.array(tables.params)
        kept = (params[ends] - params[starts], per_mode)
        tables.derived[key] = kept
        return kept

    @functools.cache  # noqa: B019 (one source per search)
    def _buffer_cells(self, x: int) -> np.ndarray:
        """``transfer_buffer_bytes(x, i, j, m)`` on every cell of ``_cell_order`` (a start's
        term plus an end's)."""
        model, num_layers = self.model, self.model.num_layers
        first = [model.transfer_buffer_bytes(x, i, num_layers, self.m) for i in range(num_layers)]
        last = [model.transfer_buffer_bytes(x, 0, j, self.m) for j in range(num_layers + 1)]
        starts, ends = _cell_order(num_layers)
        return np.array(first)[starts] + np.array(last)[ends]

    def prefix_table(self, free: np.ndarray) -> np.ndarray:
        """``out[o, i]`` = b Σ_{l<i} min_{k: free_k > 0} ω_k(l)/Ω_k / Σ_k free_k/Ω_k
        (module docstring), inf where no GPUs are left."""
        classes = self._omega_classes
        if not classes:
            return np.full((len(free), self.model.num_layers + 1), math.inf)
        totals = np.array([self._omega_total[k] for k in classes])
        present = free[:, classes] > 0
        norm = (np.where(present, free[:, classes], 0) / totals).sum(axis=1)
        ids = (present * (1 << np.arange(len(classes)))).sum(axis=1)
        scale = np.where(norm > 0, self.b / np.where(norm > 0, norm, 1.0), math.inf)
        with np.errstate(invalid="ignore"):  # 0 × inf at i = 0, set to 0 just below
            out = self._prefix_matrix[ids] * scale[:, None]
        out[:, 0] = 0.0
        return np.nan_to_num(out, nan=math.inf, posinf=math.inf)

    def fill_ratio(
        self, free: np.ndarray, usable: np.ndarray, uses: np.ndarray | None = None
    ) -> np.ndarray:
        """``out[o]`` >= 1: ``prefix_table(free)[o] × out[o]`` is a lower bound on the sum of
        the a of the stages covering [0, i) with ``free[o]`` GPUs left, when each of them is
        one of the options ``usable`` (rows of ``uses``, default this source's options).

        With λ_k = 1/Ω_k (the prefix bound's weights) a stage s of g_{s,k} GPUs of class k
        has a_s >= b w_s / c_s, w_s = Σ_{l ∈ s} min_k λ_k ω_k(l) and c_s = Σ_k λ_k g_{s,k}
        (module docstring); with c_s <= c_max, the largest c of the usable options,
        Σ_s a_s >= b Σ_s w_s / c_max. Against the prefix bound's b Σ w / Σ_k λ_k free_k that
        is the ratio Σ_k λ_k free_k / c_max when above 1: a stage holds at most b replicas,
        so at a small share the layers need several stages, each with its own a in the sum."""
        classes = self._omega_classes
        if not classes or not usable.any():
            return np.ones(len(free))
        weights = np.zeros(free.shape[1])
        weights[classes] = [1.0 / self._omega_total[k] for k in classes]
        uses = np.array(self._uses, dtype=np.float64) if uses is None else uses
        most = float((uses[usable] @ weights).max())
        if most <= 0:
            return np.ones(len(free))
        present = free[:, classes] > 0
        norm = (np.where(present, free[:, classes], 0) * weights[classes]).sum(axis=1)
        return np.maximum(1.0, norm / most)

    def _least_side(self, allocation: Allocation) -> LinkSide:
        """The option's side of a boundary, or one below it: a one-kind stage's shares are
        fixed (b over its replicas as ``_split`` deals them: its side exactly); a two-kind
        stage's split is not known before it is costed: its classes, at least
        ⌈b / replicas⌉ samples in its largest share, and in its busiest node at least the
        replicas of one group of a kind on one node (a kind's replicas form at most two groups,
        one of at least half of them, each replica taking a sample or more).
        ``CostModel.boundary_ms`` grows with the samples of either side, so a transfer
        costed with this side is never above the real one."""
        if len(allocation) == 1:
            ((k, t, n),) = allocation
            low, extra = divmod(self.b, n)
            if self.pinned.micro_batch_size is not None:
                low, extra = self.pinned.micro_batch_size, 0
            groups = tuple(
                group_of(k, t, count, x, "none")
                for x, count in ((low + 1, extra), (low, n - extra))
                if count and x
            )
            return self.model.link_side(groups)
        classes = tuple(sorted({k for k, _, _ in allocation}))
        replicas = sum(n for _, _, n in allocation)
        busiest = max(
            min(-(-n // 2), max(1, self.model.classes[k].gpus_per_node // t))
            for k, t, n in allocation
        )
        return LinkSide(classes, busiest, -(-self.b // replicas), None)

    def resource_weights(self) -> np.ndarray:
        """Per class, 1/Ω_k (the prefix bound's weights; 0 for a class with no bound)."""
        weights = np.zeros(len(self.model.classes))
        for k in self._omega_classes:
            if self._omega_total[k] > 0:
                weights[k] = 1.0 / self._omega_total[k]
        return weights

    def edge_floors(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """(``out[o]``, ``into[o]``): the least one-way boundary transfer at layer j out of a
        stage of option o (to a stage of any option) and into one (from any), each side at
        ``_least_side``: 0 < j < L (the same at every block boundary: cached by size).

        The other side is taken per (classes, single-node class) with the least samples of
        any side of that group (``boundary_ms`` grows with either side's samples and reads
        nothing else of them), so each side meets a few groups rather than every side."""
        size = self._out_bytes[j - 1]
        found = self._edge_floors.get(size)
        if found is None:
            sides = sorted(set(self._least_sides), key=repr)
            least: dict[tuple, LinkSide] = {}
            for side in sides:
                key = (side.classes, side.single_node_class)
                low = least.get(key, side)
                least[key] = LinkSide(
                    side.classes,
                    min(low.node_samples, side.node_samples),
                    min(low.largest_share, side.largest_share),
                    side.single_node_class,
                )
            groups = list(least.values())
            out = {s: min(self.model.boundary_ms(s, g, size) for g in groups) for s in sides}
            into = {r: min(self.model.boundary_ms(g, r, size) for g in groups) for r in sides}
            found = (
                np.array([out[side] for side in self._least_sides]),
                np.array([into[side] for side in self._least_sides]),
            )
            self._edge_floors[size] = found
        return found

    def send_floor(self, j: int, next_key: Hashable | None) -> np.ndarray:
        """``out[o]``: a lower bound on the time of option o's boundary transfer at layer j
        to a stage of side ``next_key`` (one way; 0 for the last stage). The sender's side is
        ``_least_side``: exact for a one-kind option, a two-kind one's classes with no samples
        (``CostModel.boundary_ms`` reads the sender's classes and the larger of the two
        sides' samples, and grows with those)."""
        if next_key is None:
            return np.zeros(len(self.allocations))
        assert isinstance(next_key, LinkSide)
        size = self._out_bytes[j - 1]  # the same at every block boundary: cached by it
        found = self._send_floors.get((size, next_key))
        if found is None:
            by_side: dict[LinkSide, float] = {}
            values = []
            for side in self._least_sides:
                if side not in by_side:
                    by_side[side] = self.model.boundary_ms(side, next_key, size)
                values.append(by_side[side])
            found = np.array(values)
            self._send_floors[(size, next_key)] = found
        return found

    # ---- costs ---------------------------------------------------------------------------
    @functools.cache  # noqa: B019 (one source per search)
    def _transient_table(self, k: int, t: int, x: int, mode: str) -> list[list[float]]:
        # Repeated blocks share one LayerCost: each costed once (by identity, in this call).
        seen: dict[int, float] = {}
        values = []
        for c in self.model.tables(k, t, x).layers:
            if id(c) not in seen:
                seen[id(c)] = self.model.transient_bytes(c, mode)
            values.append(seen[id(c)])
        # A sparse table of range maxima: level l holds the max of each 2^l layers from y.
        # Built in numpy (a search builds thousands, one per (class, tp, share, mode): the
        # Python pairs were most of their time), read back as lists (a lookup per stage).
        table = [values]
        prev = np.array(values)
        width = 1
        while 2 * width <= len(values):
            prev = np.maximum(prev[:-width], prev[width:])
            table.append(prev.tolist())
            width *= 2
        return table

    def _transient(self, k: int, t: int, x: int, mode: str, i: int, j: int) -> float:
        table = self._transient_table(k, t, x, mode)
        level = (j - i).bit_length() - 1
        row = table[level]
        return max(row[i], row[j - (1 << level)])

    @functools.cache  # noqa: B019 (one source per search)
    def _mode_rows(
        self, k: int, t: int, x: int, i: int, j: int
    ) -> tuple[float, float, tuple[tuple[str, float, float | None], ...]]:
        """What ``_mode`` reads of a replica of (k, t) taking ``x`` samples on [i, j), the
        same at every flight, ZeRO level and replica count (a search asks ~6 of those per
        (k, t, x, i, j)): (its parameters, its transfer buffers, per mode in time order its
        saved and its parked bytes (None without offload)). The modes by their time, ties in
        the space's order (a stable sort)."""
        tables = self.model.tables(k, t, x)
        timed = sorted(self.modes, key=lambda mode: tables.span_work(mode, i, j))
        rows = []
        for mode in timed:
            saved = tables.saved[mode]
            parked = tables.parked.get(mode)
            rows.append(
                (mode, saved[j] - saved[i], None if parked is None else parked[j] - parked[i])
            )
        buffers = self.model.transfer_buffer_bytes(x, i, j, self.m)
        return tables.params[j] - tables.params[i], buffers, tuple(rows)

    @functools.cache  # noqa: B019 (one source per search)
    def _mode(
        self,
        kind: Kind,
        x: int,
        i: int,
        j: int,
        flight: int,
        per_param: float,
        replicas: int = 1,
        level: int = 0,
    ) -> str | None:
        """The fastest recompute mode with which a replica of ``kind`` taking ``x`` samples
        fits on [i, j) at ZeRO ``level`` over ``replicas``, or None."""
        k, t = kind
        params, buffers, rows = self._mode_rows(k, t, x, i, j)
        static = params * per_param
        usable, host = self._limits(k, t, replicas, level)
        if static > usable:
            return None  # no mode fits: every one holds the same parameters
        # The fastest mode that fits (with offload the order is the hardware's): the first
        # in time order that fits; the memory of the slower ones is never looked at.
        for mode, saved, parked in rows:
            used = static + buffers + flight * saved
            if used > usable:
                continue
            if parked is not None and flight * parked > host:
                continue  # offload parks more than the GPU's share of host memory
            if used + self._transient(k, t, x, mode, i, j) <= usable:
                return mode
        return None

    @functools.cache  # noqa: B019 (one source per search)
    def _limits(self, k: int, t: int, replicas: int, level: int) -> tuple[float, float]:
        """(device bytes a replica's stage may fill, host bytes it may park) on class k."""
        model = self.model
        usable = model.usable_bytes(k) - model.zero_transient_bytes(t, replicas, level)
        return usable, model.host_budget_bytes(k)

    @functools.cache  # noqa: B019 (one source per search)
    def _edges(self, k: int, t: int, x: int, i: int, j: int) -> float:
        """One pass's sequence-parallel all-gathers at the ends of [i, j)'s runs of blocks
        (``CostModel.sequence_edges_ms``; zero without SP or tp): evaluate adds them to the
        forward and to the backward, so the DP's stage time must too (else its objective is
        below the plan's time and a search run to its end proves nothing)."""
        if not self.model.sequence_parallel or t <= 1:
            return 0.0
        group = ReplicaGroup(k, t, 1, x, "none")
        return self.model.sequence_edges_ms(StageChoice(i, j, (group,)), group, None)

    def _work(self, kind: Kind, x: int, mode: str, i: int, j: int) -> float:
        k, t = kind
        work = self.model.tables(k, t, x).span_work(mode, i, j)
        return work + 2 * self.model.pass_overhead_ms(k) + 2 * self._edges(k, t, x, i, j)

    @functools.cache  # noqa: B019 (one source per search)
    def _split(self, kind: Kind, replicas: int, samples: int, i, j, flight, per_param, zero):
        """``samples`` spread evenly over ``replicas`` of ``kind``: its groups (largest share
        first) and time, or None if the largest share does not fit."""
        k, t = kind
        low, extra = divmod(samples, replicas)
        shares = [(low + 1, extra), (low, replicas - extra)]
        groups = []
        for x, count in shares:
            if count == 0 or x == 0:
                continue
            mode = self._mode(kind, x, i, j, flight, per_param, *zero)
            if mode is None:
                return None
            groups.append(group_of(k, t, count, x, mode))
        top = groups[0]
        top_mode = mode_key(top.recompute, top.offload)
        return groups, self._work(kind, top.micro_batch_size, top_mode, i, j)

    def _shares(
        self,
        allocation: Allocation,
        i: int,
        j: int,
        flight: int,
        per_param: float,
        zero: tuple[int, int] = (1, 0),
    ):
        """Balanced shares (space.py): the groups of the least stage time, or None;
        ``zero`` = (the stage's replicas, its ZeRO level)."""
        if self.pinned.micro_batch_size is not None:
            x = self.pinned.micro_batch_size
            groups, worst = [], 0.0
            for k, t, n in allocation:
                mode = self._mode((k, t), x, i, j, flight, per_param, *zero)
                if mode is None:
                    return None
                groups.append(group_of(k, t, n, x, mode))
                worst = max(worst, self._work((k, t), x, mode, i, j))
            return groups, worst
        if len(allocation) == 1:
            ((k, t, n),) = allocation
            return self._split((k, t), n, self.b, i, j, flight, per_param, zero)
        (k1, t1, n1), (k2, t2, n2) = allocation
        # Kind 1 takes S samples: n1 × x samples, or the most it may (b − n2); larger S at the
        # same largest share never hurts, so these S cover every balanced split. Kind 1's time
        # grows with S and kind 2's shrinks (a split that does not fit counts as infinitely
        # slow), so the slowest of the two is least where they cross: bisection.
        # (The multiples of n1 up to b − n2 and b − n2 itself, ascending, from n1 on.)
        most = self.b - n2
        candidates = list(range(n1, most + 1, n1))
        if most >= n1 and most % n1:
            candidates.append(most)

        def splits(index: int):
            total = candidates[index]
            first = self._split((k1, t1), n1, total, i, j, flight, per_param, zero)
            second = self._split((k2, t2), n2, self.b - total, i, j, flight, per_param, zero)
            return first, second

        def kind1_slower(index: int) -> bool:
            total = candidates[index]
            first = self._split((k1, t1), n1, total, i, j, flight, per_param, zero)
            if first is None:
                return True  # (kind 2's split is not needed to say so)
            second = self._split((k2, t2), n2, self.b - total, i, j, flight, per_param, zero)
            return second is not None and first[1] >= second[1]

        low, high = 0, len(candidates)  # the first index where kind 1 is the slower
        while low < high:
            middle = (low + high) // 2
            if kind1_slower(middle):
                high = middle
            else:
                low = middle + 1
        best = None
        for index in (low - 1, low):
            if not 0 <= index < len(candidates):
                continue
            first, second = splits(index)
            if first is None or second is None:
                continue
            worst = max(first[1], second[1])
            if best is None or worst < best[1]:
                best = (first[0] + second[0], worst)
        return best

    def stage_groups(
        self, allocation: Allocation, i: int, j: int, flight: int
    ) -> tuple[tuple[ReplicaGroup, ...], int, float] | None:
        """The space's stage on [i, j) with ``allocation`` and ``flight`` micro-batches in
        flight: (groups with balanced shares and recompute, ZeRO level, slowest group's time),
        or None when it does not fit (space.py). Of the allowed levels (``zero_levels``), the
        one of least time, then of least tail (``_tail``), the lower on ties.

        The tail breaks ties: where a level's collectives hide entirely behind the passes
        (its time equal to the lowest level's), it costs the same a and f and its tail has no
        gradient all-reduce, so the stage is no worse in every pipeline around it (GPT-3 175B
        on 16,384 GPUs: a third of the (allocation, layers) tried tie so, their tails ~0.9 s
        shorter; kept at the lower level, those plans paid an all-reduce they need not).

        Not exact beyond ties: where a level costs a little more per micro-batch and saves
        more in its tail than m × the extra, the stage is faster there and this search does
        not see it; "proven" is then relative to this choice. Keeping every level as its own
        stage option would make it exact at up to three times the options."""
        found = self._stage(allocation, i, j, flight)
        return None if found is None else found[:3]

    def _stage(
        self, allocation: Allocation, i: int, j: int, flight: int
    ) -> tuple[tuple[ReplicaGroup, ...], int, float, float] | None:
        """``stage_groups`` with the stage's tail (``_tail``)."""
        replicas = sum(n for _, _, n in allocation)
        uniform_tp = len({t for _, t, _ in allocation}) == 1
        best = None
        tail = math.nan  # the best's, computed where a tie or the caller asks for it
        for level in zero_levels(replicas, uniform_tp, self.pinned):
            per_param = self.model.static_bytes_per_param(replicas, level)
            found = self._shares(allocation, i, j, flight, per_param, (replicas, level))
            if found is None:
                continue
            groups = tuple(sorted(found[0]))
            work = self._zero_work(groups, i, j, level, found[1])
            if best is None or work < best[2]:
                best, tail = (groups, level, work), math.nan
            elif work == best[2]:
                if math.isnan(tail):
                    tail = self._tail(best[0], i, j, best[1])
                other = self._tail(groups, i, j, level)
                if other < tail:
                    best, tail = (groups, level, work), other
        if best is None:
            return None
        if math.isnan(tail):
            tail = self._tail(best[0], i, j, best[1])
        return (*best, tail)

    def _tail(self, groups: tuple[ReplicaGroup, ...], i: int, j: int, level: int) -> float:
        """What the stage's groups do after their last backward on [i, j) at ZeRO ``level``:
        the gradient all-reduce (levels 0 and 1; its plans run on the groups executor, where
        the sums come after the last backward) and the slowest optimizer step."""
        model = self.model
        replicas = sum(g.replicas for g in groups)
        params, backward, steps = [], [], []
        for g in groups:
            tables = model.tables(g.device_class, g.tp, g.micro_batch_size)
            params.append(tables.params[j] - tables.params[i])
            backward.append(
                tables.span_backward(mode_key(g.recompute, g.offload), i, j)
                + model.pass_overhead_ms(g.device_class)
                + self._edges(g.device_class, g.tp, g.micro_batch_size, i, j)
            )
            steps.append(
                model.optimizer_ms(params[-1], g.device_class, replicas, level)
                + model.step_overhead_ms(g.device_class)
            )
        allreduce = model.allreduce_ms(groups, tuple(params)) if level <= 1 else 0.0
        exposed = model.exposed_allreduce_ms(allreduce, min(backward), "groups", groups)
        return exposed + max(steps)

    def _zero_work(
        self, groups: tuple[ReplicaGroup, ...], i: int, j: int, level: int, work: float
    ) -> float:
        """The slowest group's time with ZeRO-2/3's exposed collectives (``sharding``)."""
        if level <= 1:
            return work
        model = self.model
        passes, params = [], []
        for g in groups:
            tables = model.tables(g.device_class, g.tp, g.micro_batch_size)
            overhead = model.pass_overhead_ms(g.device_class)
            mode = mode_key(g.recompute, g.offload)
            edges = self._edges(g.device_class, g.tp, g.micro_batch_size, i, j)
            total = tables.span_work(mode, i, j) + 2 * overhead + 2 * edges
            backward = tables.span_backward(mode, i, j) + edges
            passes.append((total - backward - overhead, backward + overhead))
            params.append(tables.params[j] - tables.params[i])
        collective = model.zero_collective_ms(groups, tuple(params))
        exposed = [sum(exposed_ms(level, collective, f, b)) for f, b in passes]
        if not any(exposed):
            # Hidden entirely: the groups' own time, so that a tie with a lower level is
            # exact (f + b rounds apart from the sum it was split from).
            return work
        return max(f + b + e for (f, b), e in zip(passes, exposed, strict=True))

    def _core(self, option: int, i: int, j: int, flight: int) -> _Core | None:
        key = (option, i, j, flight)
        if key in self._cores:
            return self._cores[key]
        model = self.model
        core = None
        found = self._stage(self.allocations[option], i, j, flight)
        if found is not None:
            groups, zero1, work, tail = found
            payload: tuple = (groups, zero1)
            if self._degrees is not None:
                cp, ep, sp = self._degrees
                at_cp = tuple(dataclasses.replace(g, cp=cp) for g in groups) if cp > 1 else groups
                payload = (at_cp, zero1, ep, (), True) if sp else (at_cp, zero1, ep)
            core = _Core(payload, work, tail, model.link_side(groups))
        self._cores[key] = core
        return core

    def key_covers(self, low: Hashable, high: Hashable) -> bool:
        """Whether a stage sending to side ``low`` never pays more than to side ``high``:
        the same classes and single-node class, and no more samples leaving the busiest node
        nor in the largest share (``CostModel.boundary_ms`` grows with both, through the max
        with the sender's: so for every sender)."""
        if not isinstance(low, LinkSide) or not isinstance(high, LinkSide):
            return False
        return (
            low.classes == high.classes
            and low.single_node_class == high.single_node_class
            and low.node_samples <= high.node_samples
            and low.largest_share <= high.largest_share
        )

    def cost(
        self, option: int, i: int, j: int, position: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        flight = self.m if self.schedule == "gpipe" else min(self.m, position)
        core = self._core(option, i, j, flight)
        if core is None:
            return None
        send = 0.0
        if next_key is not None:
            assert isinstance(next_key, LinkSide)
            link = (core.side, next_key, j)
            send = self._sends.get(link, -1.0)
            if send < 0:
                send = self.model.boundary_ms(core.side, next_key, self._out_bytes[j - 1])
                self._sends[link] = send
        # Blocking transfers (``autoplan.cost.schedule``): this stage sends its activation
        # and receives the gradient back; the next stage pays the same two transfers.
        return StageCostResult(
            steady_ms=core.work_ms + 2 * send,
            fill_ms=core.work_ms + 2 * send,
            tail_ms=core.tail_ms,
            key=core.side,
            payload=core.payload,
            next_added_ms=2 * send,
        )


@dataclass(frozen=True)
class HeteroResult:
    """The configurations found, best first, and how the search went."""

    configs: list[PlanConfig]
    stages_costed: int
    labels: int
    timed_out: bool
    floor_ms: float = 0.0  # no plan of the family not in ``configs`` is faster (certificate)


def _config(labels, m: int, schedule: str) -> PlanConfig:
    # A payload is (groups, ZeRO level), then where the source chose them the stage's ep,
    # its experts' split and its sequence parallelism (``StageChoice``'s fields in order:
    # ``autoplan.solve.stage_degrees``, ``autoplan.solve.expert_span``).
    stages = tuple(
        StageChoice(label.start, label.previous.start, groups, int(zero1), *ep)
        for label in labels
        for groups, zero1, *ep in [label.payload]
    )
    return PlanConfig(m, schedule, 1, stages, executor="groups")


def _run_source(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    run: tuple[int, str, int, int],
    sources: dict[int, StageSource],
    index: int,
    source_type: SourceType,
) -> StageSource:
    """The stage source of run ``index`` (kept in ``sources``): the source of the same m
    under the other schedule shared where there is one (``with_schedule``: a
    ``HeteroSource``, or a ``stage_degrees.StageDegreeSource`` joining several), else a new
    one. (Every source in ``sources`` was made by ``source_type``: one pass's.)"""
    if index not in sources:
        m, schedule = run[0], run[1]
        twin = next(
            (
                s
                for s in sources.values()
                if getattr(s, "m", None) == m and hasattr(s, "with_schedule")
            ),
            None,
        )
        if twin is not None:
            sources[index] = twin.with_schedule(schedule)
        else:
            sources[index] = source_type(model, batch, m, schedule, options)
    return sources[index]


def _root_bound(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    run: tuple[int, str, int, int],
    sources: dict[int, StageSource],
    index: int,
    source_type: SourceType,
    relaxations: dict[int, RunRelaxation] | None = None,
    relaxed: bool = True,
    target: float = math.inf,
) -> float:
    """A lower bound on run ``run``'s pipelines, the larger of two:

    - F = (m − 1) max a + Σ f + max t, each stage's f is its a here, the DP's prefix bound
      over all layers with every GPU free bounds max a, and times its fill ratio Σ a
      (``HeteroSource.fill_ratio``);
    - the relaxation of ``solvers.relaxed_bound``: every stage at its floor
      (``floor_table``) plus its least boundary transfers (``edge_floors``: zero for a
      source without them), the GPUs priced by the prefix bound's weights
      (``resource_weights``) and each class alone (any prices >= 0 hold), the stage count
      of the run.

    It orders the exact pass, skips a run it puts at or above the incumbent, and bounds a
    run never started. The relaxation is kept in ``relaxations[index]``: the exact pass
    prunes its labels with it (``RunRelaxation.completion_floors``). ``relaxed`` False: the
    first alone (cheap: what a search past its deadline still adds). ``target``: the bound
    the run is pruned against, where a coarser relaxation that reaches it is enough
    (``RunRelaxation``), and none where the first does."""
    m = run[0]
    source = _run_source(model, batch, options, run, sources, index, source_type)
    if not source.options():
        return math.inf
    num_layers = model.num_layers
    free = np.array([[c.total_gpus for c in model.classes]], dtype=np.int64)
    spread = float(source.prefix_table(free)[0, num_layers])
    fill = float(source.fill_ratio(free, np.ones(len(source.options()), dtype=bool))[0])
    plain = (m - 1 + fill) * spread
    if not relaxed or plain >= target:
        # At or above ``target`` already: the caller skips the run on this bound as on any
        # higher one, so the relaxation (its floors and tables) is not computed.
        return plain
    _, _, floors = _run_floors(source, num_layers)
    relaxation = _relaxation(
        model,
        options,
        run,
        source,
        floors,
        spread,
        target=target,
        # The last run's tables, where its inputs are these (the other schedule of its m).
        like=next(reversed(relaxations.values()), None) if relaxations else None,
    )
    if relaxations is not None:
        relaxations[index] = relaxation
    return max(plain, relaxation.bound)


FRONT_EFFORT = 20_000
"""Stages costed and labels kept by a run's last exact search past which its next searches
prune with ``front_relaxations`` (their tables cost about what the run's root bound did:
worth it only for a run whose searches cost more)."""


def front_relaxations(
    model: CostModel, options: SolveOptions, run: tuple[int, str, int, int], source: StageSource
) -> list[RunRelaxation]:
    """The run's relaxation (``_root_bound``) again with each option's floor at 3, then 4
    micro-batches in flight (``front_floor_table``), as far as m allows: what stages in
    front of a partial pipeline of 1, then 2 or more stages can least add (a stage with q
    stages after it holds min(m, q + 1) under 1F1B, m under GPipe): ``best_pipelines``'
    ``deeper``. None where the source has no such floors or m < 3 (the same as the root's)."""
    m = run[0]
    front_table = getattr(source, "front_floor_table", None)
    if front_table is None or m < 3 or not source.options():
        return []
    num_layers = model.num_layers
    free = np.array([[c.total_gpus for c in model.classes]], dtype=np.int64)
    spread = float(source.prefix_table(free)[0, num_layers])
    _, edges, _ = _run_floors(source, num_layers)
    relaxations = []
    for flight in sorted({min(m, 3), min(m, 4)}):
        floors = stage_floors(
            num_layers, [front_table(j, flight) for j in range(1, num_layers + 1)], edges
        )
        relaxations.append(_relaxation(model, options, run, source, floors, spread))
    return relaxations


def _relaxation(
    model: CostModel,
    options: SolveOptions,
    run: tuple[int, str, int, int],
    source: StageSource,
    floors: np.ndarray,
    lowest_peak: float,
    *,
    target: float = math.inf,
    like: RunRelaxation | None = None,
) -> RunRelaxation:
    """``RunRelaxation`` of run ``run`` on ``floors`` (``stage_floors``' layout): every GPU of
    the model free, the source's options and prices (``resource_weights``), the run's stage
    counts within a pinned pp."""
    m, _schedule, most, least = run
    uses, _, _ = _run_floors(source, model.num_layers)
    weights_of = getattr(source, "resource_weights", None)
    weights = weights_of() if weights_of is not None else np.ones(uses.shape[1])
    pinned_pp = options.pp if options.layer_split is None else len(options.layer_split)
    return RunRelaxation(
        model.num_layers,
        m,
        tuple(c.total_gpus for c in model.classes),
        uses,
        floors,
        weights,
        lowest_peak,
        min_stages=least if pinned_pp is None else max(least, pinned_pp),
        max_stages=most if pinned_pp is None else min(most, pinned_pp),
        target=target,
        like=like,
    )


def _run_floors(source: StageSource, num_layers: int) -> RunFloors:
    """(each option's resources, the least transfers out of and into a stage at each layer,
    ``stage_floors``' floors of every option on every [i, j)) of a run's source; a
    ``HeteroSource`` keeps them (``kept_run_floors``: the 1F1B and GPipe runs of one m read
    the same, and the relaxation of the second then finds its inputs identical to the
    first's, ``RunRelaxation``'s ``like``)."""
    kept: dict[int, RunFloors] | None = getattr(source, "kept_run_floors", None)
    if kept is not None and num_layers in kept:
        return kept[num_layers]
    uses = np.array(source.options(), dtype=np.int64).reshape(len(source.options()), -1)
    edge_floors = getattr(source, "edge_floors", None)
    zeros = np.zeros(len(uses))
    edges = [
        edge_floors(j) if edge_floors is not None and 0 < j < num_layers else (zeros, zeros)
        for j in range(num_layers + 1)
    ]
    floors = stage_floors(
        num_layers, [source.floor_table(j) for j in range(1, num_layers + 1)], edges
    )
    if kept is not None:
        kept[num_layers] = (uses, edges, floors)
    return uses, edges, floors


@dataclass
class HeteroState:
    """A heterogeneous exact pass in progress, kept between calls of ``hetero_candidates``
    on the same model view, batch and options, so that a call can go on where the last one
    stopped (at its deadline or at its ``ceiling``) instead of starting over: the runs' stage
    sources, root bounds and relaxations, what each run has proven (its floor) and found,
    and the level to search next. ``capped``: the last call stopped at its ceiling with every
    run proven there; ``done``: every run searched below the bound itself (nothing left)."""

    runs: list[tuple[int, str, int, int]] = field(default_factory=list)
    started: bool = False
    level: float = math.inf
    bound: float = math.inf
    found: list[tuple[float, int, PlanConfig]] = field(default_factory=list)
    seen: set[PlanConfig] = field(default_factory=set)
    effort: dict[int, int] = field(default_factory=dict)
    costed: int = 0
    labels: int = 0
    sources: dict[int, StageSource] = field(default_factory=dict)
    promise: dict[int, float] = field(default_factory=dict)
    floors: dict[int, float] = field(default_factory=dict)
    costs: LevelCosts = field(default_factory=LevelCosts)
    roots: dict[int, float] = field(default_factory=dict)
    relaxations: dict[int, RunRelaxation] = field(default_factory=dict)
    fronts: dict[int, list[RunRelaxation]] = field(default_factory=dict)
    capped: bool = False
    done: bool = False
    timed_out: bool = False
    # A jump to the bound (``levels.next_level``) has been cut by its share of the time: the
    # levels go by steps from then on (``hetero_candidates``).
    jump_failed: bool = False
    proven_level: float = -math.inf  # the last level every run was searched below

    def floor_ms(self) -> float:
        """The least floor of the runs (-inf while one has none yet)."""
        return min((self.floors.get(i, -math.inf) for i in range(len(self.runs))), default=math.inf)


def _runs(num_layers: int, batch: int, options: SolveOptions) -> list[tuple[int, str, int, int]]:
    """The runs of the heterogeneous family: (m, schedule, most stages, least stages)."""
    runs: list[tuple[int, str, int, int]] = []
    pinned_pp = options.pp if options.layer_split is None else len(options.layer_split)
    for m in micro_batch_counts(batch, options):
        kinds = []
        if options.schedule in (None, "1f1b"):
            kinds.append(("1f1b", min(m, num_layers), 1))
        if options.schedule == "gpipe" or (options.schedule is None and m < num_layers):
            kinds.append(("gpipe", num_layers, 1 if options.schedule == "gpipe" else m + 1))
        for schedule, most, least in kinds:
            if pinned_pp is None or least <= pinned_pp <= most:
                runs.append((m, schedule, most, least))
    return runs


def hetero_candidates(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    upper_bound: float,
    *,
    keep: int,
    deadline: float,
    progress: Callable[[int, int], None] | None = None,
    source_type: SourceType | None = None,
    state: HeteroState | None = None,
    ceiling: float = math.inf,
) -> HeteroResult:
    """The best heterogeneous pipelines below ``upper_bound`` (space.py), best first.

    Two passes over the runs (one per micro-batch count and schedule): with no incumbent
    (``upper_bound`` inf), a quick heuristic one (``best_pipelines`` with a beam of
    ``HEURISTIC_BEAM`` labels per position) whose best is the incumbent, then the exact one,
    most promising run first (by the heuristic's value, or with an incumbent by the run's
    root bound): the tighter the incumbent, the more the exact pass prunes, and a run whose
    root bound (``_root_bound``) is at or above the bound pruned against is skipped, with that
    root bound as its floor. ``source_type`` builds each run's stage source (default
    ``HeteroSource``).

    With an incumbent, the exact pass goes by levels: every run is searched for pipelines
    below a level (the least root bound, then ``LEVEL_STEP`` higher each time; within two
    steps of the bound, the bound itself; a smaller step where that is predicted not to
    finish before the deadline: ``autoplan.solve.levels``) and, where it finds none, is
    proven at or above that level (its floor); a run that finds one lowers the bound. It
    stops once the level reaches the bound pruned against, where every run has been searched
    below the bound itself, as one pass would. A run's search prunes far more below a level
    near the optimum than below a poor incumbent (GPT-3 175B on mixed-1024: the uniform
    incumbent is 6.7% above the optimum, which a two-stage plan at m = 8 holds), and the
    certificate holds the level reached when the time limit stops it. A jump to the bound
    gets half the time left; cut there, the levels go on by steps from the last one every
    run was proven at (``autoplan.solve.levels``).

    ``state`` (``HeteroState``): where the pass is kept, and from where a later call with
    the same state goes on (``autoplan.solve.portfolio`` shares the time among its runs by
    it). ``ceiling``: no level above it is searched; once every run is proven there the call
    returns (``state.capped``) with its floor, the least of the runs', at or above it."""
    if source_type is None:
        source_type = HeteroSource
    num_layers = model.num_layers
    if state is None:
        state = HeteroState()
    if not state.started:
        state.runs = _runs(num_layers, batch, options)
        state.bound = upper_bound
    runs = state.runs
    pinned_pp = options.pp if options.layer_split is None else len(options.layer_split)
    splits = None
    if options.layer_split is not None:
        splits = list(itertools.accumulate(options.layer_split))[:-1]
    resources = tuple(c.total_gpus for c in model.classes)
    state.bound = min(state.bound, upper_bound)
    state.capped = state.timed_out = False
    sources, promise, floors = state.sources, state.promise, state.floors
    roots, relaxations, costs = state.roots, state.relaxations, state.costs

    def cheap_root(index: int) -> float:
        """The run's root bound as far as computed: the relaxation's where it was."""
        if index in roots:
            return roots[index]
        return _root_bound(
            model, batch, options, runs[index], sources, index, source_type, None, False
        )

    def root(index: int) -> float:
        if index not in roots:
            # The best plan held now, or a better one later, prunes a run whose bound
            # reaches it (a coarser one will do). With --gap a skipped run's root bound is
            # its floor, and may be the certificate's: computed in full.
            roots[index] = _root_bound(
                model,
                batch,
                options,
                runs[index],
                sources,
                index,
                source_type,
                relaxations,
                target=state.bound if options.gap == 0 else math.inf,
            )
        return roots[index]

    def run(
        index: int, beam: int | None, level: float = math.inf, until: float | None = None
    ) -> bool:
        """One run, pruned at ``level`` where that is below the bound; False when the
        deadline (or ``until``, where earlier) stopped it."""
        stop = deadline if until is None else min(until, deadline)
        m, schedule, most, least = runs[index]
        source = _run_source(model, batch, options, runs[index], sources, index, source_type)
        if not source.options():
            promise[index] = math.inf
            floors[index] = math.inf
            return True
        # With --gap, what cannot beat the best by more than the gap is pruned: the run's
        # floor is then the lowered bound.
        pruning = min(state.bound * (1.0 - options.gap), level)
        now = time.monotonic()
        started = now <= stop
        if beam is None and math.isfinite(pruning) and started and root(index) >= pruning:
            # No pipeline of the run reaches the bound pruned against: its floor is its own.
            floors[index] = root(index)
            return True
        front = state.fronts.get(index, [])
        if (
            beam is None
            and index in relaxations
            and index not in state.fronts
            and state.effort.get(index, 0) >= FRONT_EFFORT
        ):
            front = state.fronts[index] = front_relaxations(model, options, runs[index], source)
        finals, stats = best_pipelines(
            num_layers,
            m,
            resources,
            source,
            max_stages=most,
            min_stages=least,
            exact_stages=pinned_pp,
            upper_bound=pruning,
            keep=1 if beam is not None else keep,
            splits=splits,
            deadline=stop,
            beam=beam,
            completion=relaxations.get(index),
            deeper=front if beam is None else (),
        )
        state.costed += stats.costed
        state.labels += stats.labels
        if beam is None:
            state.effort[index] = stats.costed + stats.labels
            if not stats.timed_out:
                costs.record(index, pruning, time.monotonic() - now, stats.costed + stats.labels)
        for label in finals:
            config = _config(label.chain(), m, schedule)
            if config not in state.seen:  # a run searched again at a higher level finds it again
                state.seen.add(config)
                state.found.append((label.objective(m), len(state.found), config))
        if finals:
            state.bound = min(state.bound, finals[0].objective(m))
            report_found(state.bound)
        if beam is not None:
            promise[index] = finals[0].objective(m) if finals else math.inf
        else:
            # Run to its end: the bound it pruned against; cut off: the least any label it
            # left open can reach (``best_pipelines``), or its root bound or its count's work
            # bound where higher (they hold for every pipeline of the run).
            # A level below proved the run's floor already: the larger of the two holds.
            earlier = floors.get(index, -math.inf)
            floors[index] = max(earlier, stats.floor_ms)
            if stats.timed_out:
                floors[index] = max(
                    earlier,
                    stats.floor_ms,
                    cheap_root(index),
                    work_bound_ms(model, batch, options, [m]),
                )
        if stats.timed_out and stop >= deadline:
            logger.warning(
                "time limit reached in micro-batch count %d (%s): the plan is the best found, "
                "not proven optimal",
                m,
                schedule,
            )
        return not stats.timed_out

    timed_out = False
    if not state.started:
        state.started = True
        if math.isinf(state.bound):
            for index in range(len(runs)):
                if not run(index, HEURISTIC_BEAM):
                    timed_out = True
                    break
        else:
            # An incumbent is held (the uniform and shared families ran first): the beam
            # pass would mostly re-find it and cost more than the exact pass it serves
            # (GPT-Neo-2.7B 16+16: 9.4 s of beam against 5.1 s exact); the runs go by their
            # root bound instead.
            for index in range(len(runs)):
                if time.monotonic() > deadline:  # only the cheap bound: nothing more will run
                    promise[index] = cheap_root(index)
                else:
                    promise[index] = root(index)
        # Levels (module docstring): from the least root bound up, each run searched below
        # the level until one finds a plan under it; by the beam's plans, at once to the bound.
        lowest = min(promise.values(), default=math.inf)
        if roots and 0 < lowest < math.inf:
            state.level = lowest * (1 + LEVEL_STEP)
    order = sorted(range(len(runs)), key=lambda x: (promise.get(x, math.inf), x))
    level = state.level
    while not timed_out and not state.done:
        target = state.bound * (1.0 - options.gap)
        if ceiling < target:
            if state.floor_ms() >= ceiling:
                state.capped = True  # proven at the ceiling: the caller goes on later
                break
            level = min(level, ceiling)
        # A jump to the bound from a level below it gets TIME_SHARE of the time left: near
        # the optimum a search's cost grows faster than any level's before it foretells
        # (Llama-2-70B on h100-a100-l4 with --gap 0.005: the m = 64 run costed 152 stages
        # and labels below 46.6k ms and more than 850,000 below the bound 48.8k, 4.8% higher,
        # where the jump rule predicted 640,000 for all runs), and a level the clock cuts
        # proves nothing beyond the one before: cut at its share, the levels go on by steps.
        jump = (
            math.isinf(level)
            and not state.jump_failed
            and math.isfinite(state.proven_level)
            and state.proven_level < target
        )
        now = time.monotonic()
        until = now + TIME_SHARE * (deadline - now) if jump else None
        # The runs their last search found cheap first: one holding a plan under the level
        # lowers the bound the costly ones are then searched below (GPT-3 175B on mixed-1024:
        # the two-stage m = 8 run before m = 32, 48 and 64; 16 -> 13 CPU-s).
        order.sort(key=lambda x: (state.effort.get(x, 0), promise.get(x, math.inf), x))
        fell_back = False
        for done, index in enumerate(order):
            if progress is not None:
                progress(done, len(runs))
            if floors.get(index, -math.inf) >= min(level, state.bound * (1.0 - options.gap)):
                continue  # proven at this level already
            if not run(index, None, level, until):
                if jump and time.monotonic() < deadline:
                    fell_back = True
                else:
                    timed_out = True
                break
        if fell_back:
            state.jump_failed = True  # the next level: a step from the last one proven
        elif timed_out:
            break  # the level cut: the next call searches it again
        else:
            state.proven_level = level
            if level >= state.bound * (1.0 - options.gap):
                state.done = True  # every run searched below the bound itself: the pass is done
                break
        # LEVEL_STEP higher, or the bound itself within two steps of it (a level that close
        # costs about what the bound's own pass does: Llama-2-13B on h100-a100-l4, 0.5 s each
        # of the last two under its optimal incumbent, and what it would find, that pass
        # finds too); a smaller step where that is predicted not to finish in the time left
        # (``autoplan.solve.levels``).
        level = next_level(
            state.proven_level,
            state.bound * (1.0 - options.gap),
            deadline - time.monotonic(),
            costs,
            range(len(runs)),
            floors,
            jump=not state.jump_failed,
        )
    state.level = level
    state.timed_out = timed_out
    found = sorted(state.found, key=lambda item: (item[0], item[1]))
    # A run never started has its root bound and the work bound of its micro-batch count
    # (past the deadline, without the relaxation where it was not computed: it costs).
    floor = min(
        (
            floors[index]
            if index in floors
            else max(work_bound_ms(model, batch, options, [m]), cheap_root(index))
            for index, (m, _schedule, _most, _least) in enumerate(runs)
        ),
        default=math.inf,
    )
    return HeteroResult(
        [config for _, _, config in found[:keep]], state.costed, state.labels, timed_out, floor
    )
