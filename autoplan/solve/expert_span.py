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
the slowest at least that over n1 + n2, plus the fixed per-pass times. Every rank also waits
for the option's all-to-alls (``span_alltoall_ms``: the busiest rank's, the same on every rank
of a group, added to each MoE layer's forward and backward): at least their least over every
share pair (s1, s2) the option admits, per MoE layer, so that is added whole. A unit of a
block split in parts counts no all-to-all (its block's merged cost pays one for two units).
And where a member's weights, gradients and optimizer states alone exceed its usable memory
(they do not depend on the shares: a rank of kind g holds x_g / E of the routed experts),
no share fits and the floor is inf: most options of a large MoE model are ruled out so,
before any table set is built (none where a block is split in parts: there the units'
parameters are not the block's).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Hashable
from dataclasses import dataclass

import numpy as np

from autoplan.cost.block_parts import block_pairs
from autoplan.cost.config import ReplicaGroup
from autoplan.cost.expert_parallel import (
    ALLTOALLS_PER_PASS,
    ExpertMember,
    ExpertSpan,
    expert_counts,
)
from autoplan.cost.model import CostModel, LinkSide
from autoplan.cost.offload import group_of
from autoplan.solve.hetero import Allocation, HeteroSource
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors, zero_levels
from solvers.pipeline_dp import StageCostResult

__all__ = ["ExpertSpanSource", "SpanOption", "SpanStage", "span_options"]

# ``ExpertSpanSource.cost``'s answers kept at most (a few hundred bytes each).
_COSTS_KEPT = 50_000

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
        # The all-to-alls every rank waits for (module docstring), per option and layer.
        self._exchange = (
            np.array([self._exchange_prefix(o) for o in self.spans])
            if self.spans
            else np.zeros((0, model.num_layers + 1))
        )
        self._params, self._per_param, self._usable = self._static_parts()
        self._costs: dict[tuple[int, int, int, int, Hashable | None], StageCostResult | None] = {}
        # MoE layers before each unit, and each (allocation, expert-group count)'s first
        # option (``stage``: a stage without MoE layers is the same for every split).
        layers = model.profile.layers
        self._moe = np.concatenate([[0], np.cumsum([x.experts is not None for x in layers])])
        self._plain_ok = not block_pairs(model.profile)
        self._canonical: dict[tuple[Allocation, int], SpanOption] = {}
        for span in self.spans:
            self._canonical.setdefault((span.allocation, span.groups), span)
        # An option that is not its (allocation, count)'s first: on a stage without MoE layers
        # it is that first option's stage, with the same GPUs and key, found after it (the
        # DP keeps the first of equal labels), so its floor there is inf: never costed.
        self._repeat = np.array(
            [self._canonical[(s.allocation, s.groups)] != s for s in self.spans], dtype=bool
        )

    def _static_parts(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per option and member: the prefix sums over the layers of its parameters per GPU
        (options, 2, layers + 1), the bytes each parameter holds at the option's ZeRO level
        (options, 2) and the member's usable bytes (options, 2) (``_group``'s static check;
        module docstring). Usable bytes inf where the check cannot be made here."""
        model = self.model
        count = len(self.spans)
        params = np.zeros((count, 2, model.num_layers + 1))
        per_param = np.zeros((count, 2))
        usable = np.full((count, 2), math.inf)
        if block_pairs(model.profile):
            return params, per_param, usable
        b = self.base.b
        moe = np.array(
            [
                0.0 if x.experts is None else x.experts.expert_param_count
                for x in model.profile.layers
            ]
        )
        routed = np.concatenate([[0.0], np.cumsum(moe)])
        total = next(iter(expert_counts(model.profile)), 1)
        options = self._level_options()
        for o, span in enumerate(self.spans):
            replicas = sum(n for _, _, n in span.allocation)
            levels = zero_levels(replicas, True, options)
            if not levels:
                usable[o] = -math.inf  # ``stage``: no level, no stage
                continue
            for g, ((k, t, _), x) in enumerate(zip(span.allocation, span.experts, strict=True)):
                plain = np.asarray(model.tables(k, t, b).params, dtype=np.float64)
                # ``span_layer_cost``: the rank keeps x_g of the E routed experts.
                params[o, g] = plain - routed * (1 - x / total)
                per_param[o, g] = model.static_bytes_per_param(span.groups, levels[0])
                usable[o, g] = model.usable_bytes(k) - model.zero_transient_bytes(
                    t, span.groups, levels[0]
                )
        return params, per_param, usable

    def _shares(self, option: SpanOption) -> list[tuple[int, int]]:
        """Every (s1, s2) with n1·s1 + n2·s2 = b, both >= 1 (the shares ``stage`` tries are
        among them)."""
        (_, _, n1), (_, _, n2) = option.allocation
        b = self.base.b
        return [
            (s, (b - n1 * s) // n2)
            for s in range(1, b)
            if (b - n1 * s) % n2 == 0 and (b - n1 * s) // n2 >= 1
        ]

    def _exchange_prefix(self, option: SpanOption) -> np.ndarray:
        """Prefix sums over the layers of the least forward + backward all-to-all ms one rank
        of ``option`` waits for in each layer, over every share pair (module docstring); inf
        everywhere where no share pair exists (no stage of the option fits)."""
        model = self.model
        shares = np.array(self._shares(option), dtype=np.float64).reshape(-1, 2)
        if not len(shares):
            return np.full(model.num_layers + 1, math.inf)
        (k1, _, n1), (k2, _, n2) = option.allocation
        counts = np.array([n1 // option.groups, n2 // option.groups], dtype=np.float64)
        experts = np.array(option.experts, dtype=np.float64)
        probe = ExpertSpan(tuple(ExpertMember(k, 1, 1, 1) for k in (k1, k2)))
        links = np.array(model.span_links(probe))  # the members' classes only
        ranks = counts.sum()
        total = float(counts @ experts)  # E
        samples = shares @ counts  # S of each share pair
        in_parts = {q for p in block_pairs(model.profile) for q in (p, p + 1)}
        profile_batch = model.profile.micro_batch_size
        least: dict[float, float] = {}  # per dispatch_bytes: one for every Mixtral layer
        per_layer = []
        for position, layer in enumerate(model.profile.layers):
            moe = layer.experts
            if moe is None or position in in_parts:
                per_layer.append(0.0)
                continue
            if moe.dispatch_bytes not in least:
                # ``span_alltoall_ms`` at every share pair at once: each member's sent and
                # received bytes, its pairwise steps, the busiest member; the least pair.
                d = moe.dispatch_bytes / (moe.num_experts * profile_batch)
                sent = (total - experts)[None, :] * shares * d
                received = experts[None, :] * (samples[:, None] - shares) * d
                time_ms = (ranks - 1) * links[:, 1] / 1e3 + np.maximum(sent, received) / (
                    links[:, 0] * 1e6
                )
                least[moe.dispatch_bytes] = float(time_ms.max(axis=1).min())
            # Forward and backward each: ALLTOALLS_PER_PASS all-to-alls.
            per_layer.append(2 * ALLTOALLS_PER_PASS * least[moe.dispatch_bytes])
        return np.concatenate([[0.0], np.cumsum(per_layer)])

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
        with np.errstate(invalid="ignore"):  # inf - inf: an option with no share pair
            exchange = self._exchange[:, j : j + 1] - self._exchange[:, :j]
        exchange = np.where(np.isnan(exchange), math.inf, exchange)
        floor = self.base.b * work / self._replicas[:, None] + self._overhead[:, None] + exchange
        # No share fits where a member's static bytes exceed its usable memory (a margin for
        # the prefix sums' rounding: only a clear excess rules an option out).
        params = self._params[:, :, j : j + 1] - self._params[:, :, :j]
        static = params * self._per_param[:, :, None]
        over = static > self._usable[:, :, None] * (1 + 1e-9) + 1.0
        floor = np.where(over.any(axis=1), math.inf, floor)
        if self._plain_ok:
            free = self._moe[:j] == self._moe[j]  # starts whose stage has no MoE layer
            floor[np.ix_(self._repeat, free)] = math.inf
        return floor

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
        # The DP asks again for every label of one key at j: the answer once (a cap keeps a
        # long search's cache small; what it drops is recomputed the same).
        key = (option, i, j, flight, next_key)
        if key in self._costs:
            return self._costs[key]
        if len(self._costs) >= _COSTS_KEPT:
            self._costs.clear()
        found = self._cost(option, i, j, flight, next_key)
        self._costs[key] = found
        return found

    def _cost(
        self, option: int, i: int, j: int, flight: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        """``cost`` at ``flight`` micro-batches in flight, uncached."""
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
    def stage(self, option: SpanOption, i: int, j: int, flight: int) -> SpanStage | None:
        """The option's stage on [i, j) with ``flight`` micro-batches in flight (module
        docstring), or None where no shares fit."""
        if self._moe_free(i, j):
            # No MoE layer: the experts' split changes none of the stage's figures (each
            # layer's cost is the plain one), so every split of one (allocation, expert-group
            # count) has one stage, costed once on the plain table sets (a mixtral-8x7b solve
            # costs the head and embedding stages of hundreds of options).
            return self._stage(self._canonical[(option.allocation, option.groups)], i, j, flight)
        return self._stage(option, i, j, flight)

    def _moe_free(self, i: int, j: int) -> bool:
        """Whether units [i, j) hold no MoE layer (and no block is split in parts, whose
        merged costs are the block's)."""
        return self._plain_ok and self._moe[j] == self._moe[i]

    @functools.cache  # noqa: B019 (one source per search)
    def _stage(self, option: SpanOption, i: int, j: int, flight: int) -> SpanStage | None:
        """``stage`` of an option as the space's rule costs it."""
        plain = self._moe_free(i, j)
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
                self._group(k, t, n, s, span, g, i, j, flight, ranks, level, plain)
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
        plain: bool,
    ) -> _Picked | None:
        """(group, forward + backward, parameters per GPU, backward) of n replicas of kind
        (k, t) taking ``share`` samples at the fastest recompute mode that fits, or None;
        ``plain``: [i, j) holds no MoE layer, whose costs the plain table set has."""
        model = self.model
        if plain:
            tables = model.tables(k, t, share, False, 1, 1)
        else:
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
