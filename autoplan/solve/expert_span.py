"""Experts placed by speed as stage options of the heterogeneous search.

A mixed stage of the space (two kinds (class, tp, n) of ``HeteroSource``'s allocations) may
run its expert parallelism across its two GPU types (``autoplan.cost.expert_parallel``,
experts placed by speed): k expert groups, each of a1 = n1 / k replicas of kind 1 and
a2 = n2 / k of kind 2 (k divides both; ep = a1 + a2 >= 2), a rank of kind g holding x_g
experts of each MoE layer, a1·x1 + a2·x2 = E, x_g >= 1. Every (allocation, k, x1) is an
option of its own (``SpanOption``): the search's exactness covers the split, which is found
by enumerating every integer one rather than rounding the speed ratio.

The stage of an option on [i, j) (``ExpertSpanSource.stage``: the space's rule, which the
oracle applies too): each kind's replicas take one share, s1 and s2 with n1·s1 + n2·s2 = b
(every expert group alike: ``Replica.routed_experts`` is the same at one place of every
group), each group at the fastest recompute mode that fits, ZeRO at the ep views' level
(``degree_options``: 1, or 0 pinned); the shares where the two groups' times cross, found by
bisection as ``HeteroSource`` finds its shares (the two neighbours of the crossing, the faster,
the smaller s1 on ties). Not every share is tried: the all-to-all's volumes also change with
the shares, and where they move the least stage time off the crossing the search does not see
it (the oracle applies the same rule). Needs one tp for the two kinds (an expert group
exchanges tp rank by tp rank), cp 1, and one expert count for every MoE layer.

Floor (``floor_table``): the expert work of a sample moves between types but is done once:
with ω_g(l) (forward) and β_g(l) (backward) the least per-sample times of layer l on kind g
(at the largest share), the n1 + n2 replicas spend together at least
b Σ_l (min_g ω_g(l) + min_g β_g(l)) (each replica's expert part is at least its slots times
the per-sample time of its own kind, and the slots of all replicas are the b samples'), so
the slowest at least that over n1 + n2, plus the fixed per-pass times.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from autoplan.cost.config import ReplicaGroup
from autoplan.cost.expert_parallel import ExpertMember, ExpertSpan, expert_counts
from autoplan.cost.model import CostModel, LinkSide
from autoplan.cost.offload import group_of
from autoplan.solve.hetero import Allocation, HeteroSource
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors, zero_levels
from solvers.pipeline_dp import StageCostResult

__all__ = ["ExpertSpanSource", "SpanOption", "SpanStage", "span_options"]

# One group of an option's stage: (group, forward + backward ms, parameters per GPU, backward ms)
_Picked = tuple[ReplicaGroup, float, float, float]


@dataclass(frozen=True, order=True)
class SpanOption:
    """One stage option (module docstring): ``allocation`` (two kinds of one tp), ``groups``
    expert groups, ``experts`` held by a rank of each kind."""

    allocation: Allocation
    groups: int
    experts: tuple[int, int]

    @property
    def ep(self) -> int:
        return sum(n for _, _, n in self.allocation) // self.groups


@dataclass(frozen=True)
class SpanStage:
    """The stage of an option on some layers: its groups (in the allocation's order), ZeRO
    level, slowest group's time per micro-batch and tail (exposed all-reduce + step)."""

    groups: tuple[ReplicaGroup, ReplicaGroup]
    zero: int
    work_ms: float
    tail_ms: float


def span_options(model: CostModel, allocations: list[Allocation]) -> list[SpanOption]:
    """Every option of the space (module docstring) over ``allocations``; none for a dense
    model or one whose MoE layers differ in expert count."""
    counts = expert_counts(model.profile)
    if len(counts) != 1 or model.context_parallel != 1 or model.expert_parallel != 1:
        return []
    (experts,) = counts
    out = []
    for allocation in allocations:
        if len(allocation) != 2:
            continue
        (_, t1, n1), (_, t2, n2) = allocation
        if t1 != t2:
            continue
        for k in divisors(math.gcd(n1, n2)):
            a1, a2 = n1 // k, n2 // k
            for x1 in range(1, experts):
                rest = experts - a1 * x1
                if rest >= a2 and rest % a2 == 0:
                    out.append(SpanOption(allocation, k, (x1, rest // a2)))
    return out


class ExpertSpanSource:
    """The options of ``span_options`` with their costs and floors, on ``base`` (the plain
    view's ``HeteroSource``) with the options of a search at ep > 1 (``degree_options``)."""

    def __init__(self, base: HeteroSource, options: SolveOptions) -> None:
        self.base = base
        self.model = base.model
        self.pinned = options
        self.spans = span_options(self.model, base.allocations)
        self._uses = [base._use(o.allocation) for o in self.spans]
        model = self.model
        # Least per-sample forward and backward time of each layer on each kind (largest
        # share, no recompute): the floor's ω and β.
        self._least: dict[tuple[int, int, int, int], np.ndarray] = {}
        self._overhead = np.array(
            [2 * min(model.pass_overhead_ms(k) for k, _, _ in o.allocation) for o in self.spans]
        )
        self._replicas = np.array([sum(n for _, _, n in o.allocation) for o in self.spans])
        self._prefix = (
            np.array([self._least_prefix(o.allocation) for o in self.spans])
            if self.spans
            else np.zeros((0, model.num_layers + 1))
        )
        sides = [LinkSide(tuple(sorted({k for k, _, _ in o.allocation})), 0, 0, None)
                 for o in self.spans]  # fmt: skip
        # A floor side is its classes only: a few distinct sides among hundreds of options,
        # each send priced once per call (``send_floor``: 11 of 39 s of a mixtral-8x7b solve).
        self._distinct_sides = list(dict.fromkeys(sides))
        where = {side: i for i, side in enumerate(self._distinct_sides)}
        self._side_of = np.array([where[side] for side in sides], dtype=np.intp)
        self._out_bytes = base._out_bytes

    def _least_prefix(self, allocation: Allocation) -> np.ndarray:
        (k1, t, _), (k2, _, _) = allocation
        key = (k1, k2, t, self.base.b)
        if key not in self._least:
            b = self.base.b
            per = []
            for k in (k1, k2):
                layers = self.model.tables(k, t, b).layers
                per.append(
                    (
                        np.array([c.forward_ms() for c in layers]) / b,
                        np.array([c.backward_ms("none") for c in layers]) / b,
                    )
                )
            least = np.minimum(per[0][0], per[1][0]) + np.minimum(per[0][1], per[1][1])
            self._least[key] = np.concatenate([[0.0], np.cumsum(least)])
        return self._least[key]

    # ---- the source's interface (``StageDegreeSource`` joins it to its variants') --------
    def options(self) -> list[tuple[int, ...]]:
        return self._uses

    def floor_table(self, j: int) -> np.ndarray:
        work = self._prefix[:, j : j + 1] - self._prefix[:, :j]
        return self.base.b * work / self._replicas[:, None] + self._overhead[:, None]

    def send_floor(self, j: int, next_key: Hashable | None) -> np.ndarray:
        if next_key is None:
            return np.zeros(len(self.spans))
        assert isinstance(next_key, LinkSide)
        size = self._out_bytes[j - 1]
        sends = [self.model.boundary_ms(side, next_key, size) for side in self._distinct_sides]
        return np.array(sends, dtype=float)[self._side_of]

    def cost(
        self, option: int, i: int, j: int, position: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        base = self.base
        flight = base.m if base.schedule == "gpipe" else min(base.m, position)
        span = self.spans[option]
        found = self.stage(span, i, j, flight)
        if found is None:
            return None
        side = self.model.link_side(found.groups)
        send = 0.0
        if next_key is not None:
            assert isinstance(next_key, LinkSide)
            send = self.model.boundary_ms(side, next_key, self._out_bytes[j - 1])
        return StageCostResult(
            steady_ms=found.work_ms + 2 * send,
            fill_ms=found.work_ms + 2 * send,
            tail_ms=found.tail_ms,
            key=side,
            payload=(found.groups, found.zero, span.ep, span.experts),
            next_added_ms=2 * send,
        )

    # ---- the space's rule ------------------------------------------------------------------
    @functools.cache  # noqa: B019 (one source per search)
    def stage(self, option: SpanOption, i: int, j: int, flight: int) -> SpanStage | None:
        """The option's stage on [i, j) with ``flight`` micro-batches in flight (module
        docstring), or None where no shares fit."""
        (k1, t, n1), (k2, _, n2) = option.allocation
        b = self.base.b
        replicas = n1 + n2
        levels = zero_levels(replicas, True, self._level_options())
        if not levels:
            return None
        level = levels[0]
        ranks = option.groups  # the replicas holding one expert set: one per expert group
        shares = [(s, (b - n1 * s) // n2) for s in range(1, b) if (b - n1 * s) % n2 == 0]
        if self.pinned.micro_batch_size is not None:
            x = self.pinned.micro_batch_size
            shares = [(x, x)] if n1 * x + n2 * x == b else []
        shares = [(s1, s2) for s1, s2 in shares if s2 >= 1]

        def picked_at(index: int) -> list[_Picked | None]:
            """Each group's (group, time, parameters, backward) at shares[index]; None for a
            group that does not fit."""
            s1, s2 = shares[index]
            span = ExpertSpan(
                (
                    ExpertMember(k1, s1, option.experts[0], n1 // option.groups),
                    ExpertMember(k2, s2, option.experts[1], n2 // option.groups),
                )
            )
            return [
                self._group(k, t, n, s, span, g, i, j, flight, ranks, level)
                for g, (k, n, s) in enumerate(((k1, n1, s1), (k2, n2, s2)))
            ]

        def first_slower(index: int) -> bool:
            first, second = picked_at(index)
            if first is None:
                return True
            return second is not None and first[1] >= second[1]

        # Kind 1's time grows with its share and kind 2's shrinks (the expert part is the
        # expert group's S samples whatever the split; a group that does not fit counts as
        # infinitely slow): the slower of the two is least where they cross, as for
        # ``HeteroSource``'s shares. The all-to-all, the same for both, is left to move it.
        low, high = 0, len(shares)
        while low < high:
            middle = (low + high) // 2
            if first_slower(middle):
                high = middle
            else:
                low = middle + 1
        best: SpanStage | None = None
        for index in (low - 1, low):
            if not 0 <= index < len(shares):
                continue
            first, second = picked_at(index)
            if first is None or second is None:
                continue
            work = max(first[1], second[1])
            if best is not None and work >= best.work_ms:
                continue
            groups = (first[0], second[0])
            params = (first[2], second[2])
            allreduce = self.model.allreduce_ms(groups, params) if level <= 1 else 0.0
            shortest = min(first[3], second[3])
            tail = self.model.exposed_allreduce_ms(allreduce, shortest, "groups", groups) + max(
                self.model.optimizer_ms(p[2], g.device_class, ranks, level)
                + self.model.step_overhead_ms(g.device_class)
                for p, g in zip((first, second), groups, strict=True)
            )
            best = SpanStage(groups, level, work, tail)
        return best

    def _level_options(self) -> SolveOptions:
        pinned_off = self.pinned.zero_stage == 0 or self.pinned.zero1 is False
        return self.pinned.model_copy(update={"zero_stage": 0 if pinned_off else 1})

    def _group(
        self,
        k: int,
        t: int,
        n: int,
        share: int,
        span: ExpertSpan,
        member: int,
        i: int,
        j: int,
        flight: int,
        ranks: int,
        level: int,
    ) -> _Picked | None:
        """(group, forward + backward, parameters per GPU, backward) of n replicas of kind
        (k, t) taking ``share`` samples at the fastest recompute mode that fits, or None."""
        model = self.model
        tables = model.tables(k, t, share, False, 1, span.ep, (span, member))
        params = tables.params[j] - tables.params[i]
        static = sum(model.static_bytes(params, ranks, level))
        usable = model.usable_bytes(k) - model.zero_transient_bytes(t, ranks, level)
        host = model.host_budget_bytes(k)
        buffers = model.transfer_buffer_bytes(share, i, j, self.base.m)
        overhead = model.pass_overhead_ms(k)
        if static > usable:
            return None
        for mode in sorted(self.base.modes, key=lambda mode: tables.span_work(mode, i, j)):
            used = static + buffers + flight * (tables.saved[mode][j] - tables.saved[mode][i])
            if used > usable:
                continue
            parked = tables.parked.get(mode)
            if parked is not None and flight * (parked[j] - parked[i]) > host:
                continue
            transient = max(model.transient_bytes(c, mode) for c in tables.layers[i:j])
            if used + transient > usable:
                continue
            group = group_of(k, t, n, share, mode)
            backward = tables.span_backward(mode, i, j) + overhead
            return group, tables.span_work(mode, i, j) + 2 * overhead, params, backward
        return None
