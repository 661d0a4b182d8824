"""Context and expert parallelism and sequence parallelism per stage in the heterogeneous
search: each stage its own degrees and SP setting.

The heterogeneous DP (``solvers.pipeline_dp``) draws its stage options, their costs and its
bounds from a source (``HeteroSource``: one option per replica allocation of one cost-model
view). ``StageDegreeSource`` joins the sources of several views, one per (cp, ep, SP) triple
searched, every option of each an option of its own:

- the view at cp c (``CostModel.with_context_parallel``) counts cp groups of c GPUs of one
  node as its GPUs: an option's GPUs are c × the view's, and its stage's groups come back at
  cp c (a stage's replicas share one cp; ring attention within a node);
- the view at ep e (``CostModel.with_expert_parallel``) admits replica counts that e divides
  (expert groups of e replicas of one kind), with ZeRO 0 or 1 (the levels
  ``autoplan.cost.expert_parallel`` composes with ep); its stage carries ep e;
- with SP searched per stage (``stage_source``'s ``sequence_parallel``: the SP-off run of
  ``autoplan.solve.sequence_parallel``), each (cp, ep) view's allocations with a kind at
  tp > 1 on the same view with SP on (``CostModel.with_sequence_parallel``); its stage
  carries ``StageChoice.sequence_parallel``.

``CostModel.evaluate`` costs each stage at its own degrees and SP setting (SP is local to a
stage: the boundary transfer is the whole activation either way). Since every (allocation,
cp, ep, SP) is its own option, the DP's exactness covers the per-stage choice: an H100 stage
at cp 2 beside an L4 stage at cp 1, an ep 4 stage beside an ep 1 stage, a memory-tight stage
with SP beside one where SP's all-gathers cost; where the best plan has one setting
everywhere the search still finds it. Bounds: each option's floor (``floor_table``,
``send_floor``, the relaxation's floors) is its own view's; what the DP takes from the base
(the plain view's source: the prefix bound, its fill ratio, ``key_covers``, the relaxation's
prices and, where every variant is the plain view with SP off or on, the edge floors) holds
for every option: the prefix bound's ω_k(l), the least GPU-time of a sample of layer l on
class k, is there the least over SP off and on (``HeteroSource``'s
``bound_sequence_parallel``: a layer's time can be lower with SP, its replicated part split
t ways); ep only adds to a layer's time (its all-to-alls), and a cp rank's time for 1/c of
the tokens is at least 1/c of the whole's (the cost model scales a layer's work by 1/c, its
fixed costs do not shrink, the ring only adds), with SP on or off alike, so its c GPUs spend
at least as much; an SP option's boundary side is its allocation's (``CostModel.link_side``
reads no SP), one of the base's.

Experts placed by speed (``autoplan.solve.expert_span``, on unless ``--even-experts``): where ep
is searched, the mixed allocations of the plain view with their expert groups spanning the two
GPU types, every expert-group count and integer split of the experts its own option, joined as
one more source (its payload says its ep and split). Its floors are its own; the prefix bound
holds for it too: a sample's expert work moves to the other type but is done once, each part at
least its own type's per-sample time.

Degrees (module functions): cp 1 and the powers of two up to ``MAX_CONTEXT_PARALLEL`` that
divide some class's GPUs per node and whose 2·c load-balanced chunks divide the sequence, for a
model with an attention core, searched from ``SolveOptions.cp_min_seq_len`` tokens
(``cp_choices``); ep 1 and the divisors of the gcd of the MoE layers' expert counts up to the
cluster's GPUs (``expert_degrees``). A pinned ``--cp`` or ``--ep`` holds for every stage (the
per-plan views of ``autoplan.solve.context_parallel`` and ``autoplan.solve.expert_parallel``).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Hashable

import numpy as np

from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.solve.expert_span import ExpertSpanSource
from autoplan.solve.hetero import HeteroSource, RunFloors, SourceType
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors
from solvers.pipeline_dp import StageCostResult

__all__ = [
    "MAX_CONTEXT_PARALLEL",
    "StageDegreeSource",
    "cp_choices",
    "degree_options",
    "expert_degrees",
    "stage_source",
]

MAX_CONTEXT_PARALLEL = 8


def cp_choices(model: CostModel, options: SolveOptions) -> list[int]:
    """The cp degrees to search (module docstring), ascending."""
    profile = model.profile
    if options.cp is not None:
        if options.cp > 1 and profile.seq_len % (2 * options.cp):
            raise InputError(
                f"--cp {options.cp}: 2 × {options.cp} load-balanced chunks do not divide the "
                f"sequence length {profile.seq_len}"
            )
        return [options.cp]
    if options.strategy != "optimal":
        return [1]  # the baselines are what they are: no cp
    attention = any(layer.selective_recompute_flops > 0 for layer in profile.layers)
    if not attention or profile.seq_len < options.cp_min_seq_len:
        return [1]
    out = [1]
    cp = 2
    while cp <= MAX_CONTEXT_PARALLEL and profile.seq_len % (2 * cp) == 0:
        if any(c.gpus_per_node % cp == 0 for c in model.classes):
            out.append(cp)
        cp *= 2
    return out


def expert_degrees(model: CostModel, options: SolveOptions) -> list[int]:
    """The ep degrees to search (module docstring); raises InputError for a pinned degree the
    model cannot take."""
    counts = expert_counts(model.profile)
    pinned = options.expert_parallel
    if not counts:
        if pinned not in (None, 1):
            raise InputError(f"--ep {pinned}: {model.profile.model.name} has no experts")
        return [1]
    common = math.gcd(*counts)
    if pinned is not None:
        if common % pinned:
            raise InputError(f"--ep {pinned} must divide the experts of every MoE layer ({common})")
        return [pinned]
    gpus = sum(c.total_gpus for c in model.classes)
    return [e for e in divisors(common) if e <= gpus]


def degree_options(options: SolveOptions, ep: int) -> SolveOptions | None:
    """The options of a search at ep ``ep``: ZeRO 1 (or 0 where pinned off) for ep > 1, none
    where ZeRO-2/3 is pinned (not composed with ep)."""
    if ep == 1:
        return options
    if (options.zero_stage or 0) > 1:
        return None
    pinned_off = options.zero_stage == 0 or options.zero1 is False
    return options.model_copy(update={"zero_stage": 0 if pinned_off else 1})


@dataclasses.dataclass(frozen=True)
class _Variant:
    """One (cp, ep, SP) triple: its view of the cost model and the options of a search on
    it; with ``sp``, its options are the allocations with tp > 1 of a view with sequence
    parallelism on, each stage of them running it (``StageChoice.sequence_parallel``)."""

    cp: int
    ep: int
    view: CostModel
    options: SolveOptions
    sp: bool = False


class StageDegreeSource:
    """The options of several views' ``HeteroSource``s, each at its (cp, ep) (module
    docstring); the first variant is the plain one (cp 1, ep 1 of the model searched)."""

    def __init__(
        self,
        batch: int,
        num_micro_batches: int,
        schedule: str,
        variants: list[_Variant],
        spans: SolveOptions | None = None,
    ) -> None:
        searched_sp = any(v.sp for v in variants)
        self._sources: list[HeteroSource | ExpertSpanSource] = [
            HeteroSource(
                v.view,
                batch,
                num_micro_batches,
                schedule,
                v.options,
                tensor_parallel_only=v.sp,
                # The base's bounds hold for every option (module docstring): with SP
                # options among them, its ω is the least over SP off and on.
                bound_sequence_parallel=index == 0 and searched_sp,
                # The plain view's payloads as they are; the others' say their degrees.
                degrees=None if index == 0 else (v.cp, v.ep, v.sp),
            )
            for index, v in enumerate(variants)
        ]
        self._setup(num_micro_batches, variants, spans)

    def _setup(
        self, num_micro_batches: int, variants: list[_Variant], spans: SolveOptions | None
    ) -> None:
        """What ``__init__`` derives from the variants' sources (``with_schedule`` too)."""
        self.m = num_micro_batches
        self._spans = spans
        base = self._sources[0]
        assert isinstance(base, HeteroSource)
        self.base: HeteroSource = base
        if spans is not None:
            # Experts placed by speed: the mixed allocations of the plain view, each split
            # its own option (``autoplan.solve.expert_span``); counted as a variant at cp 1.
            self._sources.append(ExpertSpanSource(base, spans))
            variants = [*variants, dataclasses.replace(variants[0], ep=0)]
        self._given = variants if spans is None else variants[:-1]
        self._variants = variants
        # (variant, its source's option) of each of this source's options, and its GPUs.
        self._options: list[tuple[int, int]] = []
        self._uses: list[tuple[int, ...]] = []
        for index, (variant, source) in enumerate(zip(variants, self._sources, strict=True)):
            for option, use in enumerate(source.options()):
                self._options.append((index, option))
                self._uses.append(tuple(variant.cp * u for u in use))
        self._rows = [
            np.array([o for v, o in self._options if v == index], dtype=np.int64)
            for index in range(len(variants))
        ]
        self._use_array = np.array(self._uses, dtype=np.float64)
        # ``send_floor`` of the position being extended, per next key: the DP asks once per
        # label, the same array for every label of one key (4-5 s of a mixtral-8x7b solve).
        self._sends_at = -1
        self._sends: dict[Hashable | None, np.ndarray] = {}
        # Where every variant is the plain view with SP off or on, each option's base option
        # (the same allocation: the same side of a boundary), for ``edge_floors``.
        self._base_option: np.ndarray | None = None
        if all((v.cp, v.ep) == (1, 1) for v in variants):
            where = {a: o for o, a in enumerate(base.allocations)}
            self._base_option = np.array(
                [
                    where[source.allocations[own]]
                    for index, own in self._options
                    for source in [self._sources[index]]
                    if isinstance(source, HeteroSource)
                ],
                dtype=np.int64,
            )
        # ``_run_floors``' answer, shared with the twin of the other schedule as
        # ``HeteroSource.kept_run_floors`` is.
        self.kept_run_floors: dict[int, RunFloors] = {}

    def with_schedule(self, schedule: str) -> StageDegreeSource:
        """This source for ``schedule`` at the same m (``HeteroSource.with_schedule``: each
        variant's source shares its tables and stage costs with its twin; the experts placed
        by speed, whose costs are kept per schedule, are made again on the twin's base)."""
        twin = copy.copy(self)
        twin._sources = [
            source.with_schedule(schedule)
            for source in self._sources[: len(self._given)]
            if isinstance(source, HeteroSource)
        ]
        kept = self.kept_run_floors
        twin._setup(self.m, list(self._given), self._spans)
        twin.kept_run_floors = kept
        return twin

    def options(self) -> list[tuple[int, ...]]:
        return self._uses

    def floor_table(self, j: int) -> np.ndarray:
        return np.concatenate(
            [
                source.floor_table(j)[rows]
                for source, rows in zip(self._sources, self._rows, strict=True)
            ]
        )

    def front_floor_table(self, j: int, flight: int) -> np.ndarray:
        """``HeteroSource.front_floor_table`` over every option (a source without one: its
        ``floor_table``, which holds at any flight)."""
        return np.concatenate(
            [
                (
                    source.front_floor_table(j, flight)
                    if isinstance(source, HeteroSource)
                    else source.floor_table(j)
                )[rows]
                for source, rows in zip(self._sources, self._rows, strict=True)
            ]
        )

    def send_floor(self, j: int, next_key: Hashable | None) -> np.ndarray:
        if j != self._sends_at:
            self._sends_at, self._sends = j, {}
        found = self._sends.get(next_key)
        if found is None:
            # Each variant's own (its view's boundary times, as its costs take them).
            found = np.concatenate(
                [
                    source.send_floor(j, next_key)[rows]
                    for source, rows in zip(self._sources, self._rows, strict=True)
                ]
            )
            found.flags.writeable = False  # shared by every label of the key
            self._sends[next_key] = found
        return found

    def prefix_table(self, free: np.ndarray) -> np.ndarray:
        return self.base.prefix_table(free)

    def fill_ratio(self, free: np.ndarray, usable: np.ndarray) -> np.ndarray:
        # The base's weights over every variant's options (a cp stage's GPUs counted cp times,
        # as the prefix bound counts them).
        return self.base.fill_ratio(free, usable, self._use_array)

    def key_covers(self, low: Hashable, high: Hashable) -> bool:
        return self.base.key_covers(low, high)

    def resource_weights(self) -> np.ndarray:
        """The base's (the relaxation's prices: any prices >= 0 hold)."""
        return self.base.resource_weights()

    def edge_floors(self, j: int) -> tuple[np.ndarray, np.ndarray]:
        """``HeteroSource.edge_floors`` over every option: where the variants are the plain
        view with SP off or on, each option's is its base option's (an SP option's sides
        are its allocation's, and the base's options hold every allocation); else none
        (zeros: the sides of a cp or ep view's options are not the base's)."""
        if self._base_option is None:
            zeros = np.zeros(len(self._uses))
            return zeros, zeros
        out, into = self.base.edge_floors(j)
        return out[self._base_option], into[self._base_option]

    def cost(
        self, option: int, i: int, j: int, position: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        index, own = self._options[option]
        return self._sources[index].cost(own, i, j, position, next_key)


def stage_source(
    model: CostModel, options: SolveOptions, sequence_parallel: bool = False
) -> SourceType:
    """The heterogeneous search's source on ``model``: ``StageDegreeSource`` over the (cp, ep)
    pairs not pinned nor fixed by ``model``'s view (a view of one cp or ep keeps it for every
    stage), and with ``sequence_parallel`` each pair's tp > 1 allocations with SP on beside
    them (``autoplan.solve.sequence_parallel``); else ``HeteroSource``."""
    cps = [1]
    if model.context_parallel == 1 and options.cp is None:
        cps = cp_choices(model, options)
    eps = [1]
    if model.expert_parallel == 1 and options.expert_parallel is None:
        eps = expert_degrees(model, options)
    # Experts placed by speed (``autoplan.solve.expert_span``) where ep is searched freely
    # and composes with the ZeRO level asked for.
    spans = None
    if len(eps) > 1 and options.strategy == "optimal" and options.experts_by_speed:
        spans = degree_options(options, 2)
    if len(cps) * len(eps) == 1 and not sequence_parallel:
        return HeteroSource
    variants = []
    for cp in cps:
        for ep in eps:
            ep_options = degree_options(options, ep)
            if ep_options is None:
                continue
            view = model if cp == 1 else model.with_context_parallel(cp)
            view = view if ep == 1 else view.with_expert_parallel(ep)
            variants.append(_Variant(cp, ep, view, ep_options))
    if sequence_parallel:
        # After the SP-off ones: the first variant stays the plain view (the base).
        variants += [
            dataclasses.replace(v, view=v.view.with_sequence_parallel(True), sp=True)
            for v in list(variants)
        ]

    def make(
        model: CostModel, batch: int, m: int, schedule: str, options: SolveOptions
    ) -> StageDegreeSource:
        # ``model`` and ``options`` are the variants' first (the views are made once, so
        # their cost tables are computed once for every micro-batch count).
        return StageDegreeSource(batch, m, schedule, variants, spans)

    return make
