"""The cost model of whole plans: per-stage times and memory, pipeline time, dp tail.

A stage's replica groups run their shares of every micro-batch in parallel; the stage takes,
per micro-batch, as long as its slowest group (forward + backward, with recompute and tp
all-reduces, plus the GPU type's fixed ``pass_overhead_ms`` per pass). Iteration time =
pipeline time (``autoplan.cost.schedule``, with a pipeline rank's work = its stages') + the
largest per-rank tail. Costs are those of autoplan's own runtime unless a ``with_engine``
view says Megatron-DeepSpeed (``autoplan.cost.engines``: where the two differ).

Stage-to-stage transfers (``boundary_ms``): each replica's tp rank 0 sends the rows of its
samples to the replicas of the next stage that own them (samples are regrouped by index). The
time is one latency plus the busiest node's bytes over the link: inside one node (both stages
on one class that has a single node) each GPU sends over its own NVLink, so the busiest GPU's
share counts; otherwise the replicas of a stage on one node share that node's inter-node
bandwidth (the cluster's bandwidth between the two stages' node groups), sending and receiving
sides alike. Transfers overlap computation in the steady state and lengthen fill and drain.

The tail of a pipeline rank: its gradient all-reduce over the stage's replicas
(``stage_allreduce_ms``: ring; a stage of one class in one buddy block of a node uses the
intra-node link and the busiest GPU's gradient bytes; otherwise each node's inter-node
bandwidth carries the whole gradient once per direction, whatever the tp degrees) less what the
shortest last backward hides, plus the slowest group's optimizer step (memory-bound: states
read and written, gradient read, weight written; divided by the replicas under ZeRO-1) and the
type's ``step_overhead_ms``.

Memory of one GPU of a group = weights + gradients (training dtype; twice where the engine
keeps gradient buckets: DDP's, with replicas at ZeRO 0/1) + Adam states (divided by the
stage's replicas under ZeRO-1; ZeRO-2/3 shard more and cost per-micro-batch collectives:
``autoplan.cost.sharding``) + saved activations of the micro-batches in flight + the largest
transient (a head's: its loss's logits-sized temporaries, by engine: ``transient_bytes``); it
must stay within the device memory less the type's reserve. ``autoplan.cost.engines`` says
where autoplan's runtime and Megatron-DeepSpeed differ in these terms.

Context parallelism (``ReplicaGroup.cp`` = c, ``autoplan.cost.context_parallel``): each replica
is tp × c GPUs, each cp rank runs 1/c of every sample's tokens, and the gradient reduction,
ZeRO's sharding and the optimizer step run over the stage's replicas × c ranks. A
``with_context_parallel(c)`` view costs every group at cp c where the group says 1: its device
classes count cp groups (c GPUs of a node) as their GPUs, so the search, unchanged, places cp
groups inside nodes; ``evaluate`` of the same plan with ``cp = c`` on the groups gives the same
figures.

``CostModel.tables`` precomputes prefix sums per (device class, tp, micro-batch size) so that
the search costs a stage [i, j) in O(1); ``CostModel.evaluate`` sums layer by layer, an
independent path the oracle tests compare the search against.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TypedDict

from autoplan.cluster.catalog import peak_tflops, spec_for_dtype
from autoplan.cluster.schema import Cluster, GpuSpec
from autoplan.cost import sharding
from autoplan.cost.block_parts import (
    block_cost,
    block_pairs,
    merge_parts,
    stage_pieces,
    whole_block_passes,
)
from autoplan.cost.comm import allreduce_ms as nccl_allreduce_ms
from autoplan.cost.comm import p2p_ms, ring_allreduce_ms
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.devices import DeviceClass, block_sizes, device_classes
from autoplan.cost.engines import ENGINES, Engine
from autoplan.cost.expert_parallel import (
    ExpertMember,
    ExpertSpan,
    expert_layer_cost,
    span_layer_cost,
)
from autoplan.cost.layers import (
    LayerCost,
    layer_cost,
    optimizer_bytes_per_param,
)
from autoplan.cost.offload import (
    ALL_MODES,
    HOST_MEMORY_HEADROOM,
    host_budget_bytes,
    mode_backward_ms,
    mode_forward_ms,
    mode_key,
    parked_bytes,
    resident_saved_bytes,
    split_mode,
    transit_bytes,
)
from autoplan.cost.schedule import blocking_stage_times, in_flight_chunks, pipeline_time_ms
from autoplan.cost.sequence_parallel import ring_collective_ms, sequence_runs
from autoplan.cost.totals import ModelTotals
from autoplan.cost.zero_bubble import zero_bubble_pipeline
from autoplan.plan.schema import Executor
from autoplan.profile.schema import LayerProfile, Profile
from autoplan.schedule.names import V_SCHEDULES, ZERO_BUBBLE_SCHEDULES, stage_rank

__all__ = [
    "CostModel",
    "CostTables",
    "GroupCost",
    "LinkSide",
    "PlanCost",
    "RankMemory",
    "StageCost",
]


class _RingLink(TypedDict):
    """``layer_cost``'s context-parallel arguments (``CostModel._ring_link``)."""

    context_parallel: int
    cp_bandwidth_gb_per_s: float
    cp_latency_us: float


@dataclass(frozen=True)
class RankMemory:
    """Peak memory of one GPU of one replica group of a pipeline rank, by category (bytes)."""

    pipeline_rank: int
    gpu_type: str
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    capacity_bytes: int
    reserved_bytes: int = 0
    tensor_parallel_degree: int = 1
    micro_batch_size: int = 1
    # Offloaded activations parked in host memory, and what this GPU may park there
    # (``autoplan.cost.offload``).
    host_bytes: float = 0.0
    host_budget_bytes: float = math.inf

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.transient_bytes
        )

    @property
    def device_fits(self) -> bool:
        return self.total_bytes + self.reserved_bytes <= self.capacity_bytes

    @property
    def host_fits(self) -> bool:
        return self.host_bytes <= self.host_budget_bytes

    @property
    def fits(self) -> bool:
        """Device memory and the GPU's share of host memory both hold what the plan puts there."""
        return self.device_fits and self.host_fits


@dataclass(frozen=True)
class GroupCost:
    """One replica group of one stage, per micro-batch (its share) and per GPU."""

    forward_ms: float
    backward_ms: float
    compute_ms: float  # forward + backward without tp communication
    tp_comm_ms: float
    params_per_gpu: float
    saved_bytes: float
    transient_bytes: float
    host_bytes: float = 0.0  # offloaded saved bytes parked in host memory

    @property
    def work_ms(self) -> float:
        return self.forward_ms + self.backward_ms


@dataclass(frozen=True)
class StageCost:
    """One stage: its groups' costs and its boundary transfer to the next stage."""

    groups: tuple[GroupCost, ...]
    send_ms: float

    @property
    def forward_ms(self) -> float:
        return max(g.forward_ms for g in self.groups)

    @property
    def backward_ms(self) -> float:
        return max(g.backward_ms for g in self.groups)

    @property
    def work_ms(self) -> float:
        """Per micro-batch: the slowest group's forward + backward."""
        return max(g.work_ms for g in self.groups)

    @property
    def saved_bytes(self) -> float:
        return max(g.saved_bytes for g in self.groups)

    def slowest(self) -> GroupCost:
        return max(self.groups, key=lambda g: g.work_ms)


@dataclass(frozen=True)
class PlanCost:
    """Everything the cost model says about one configuration."""

    iteration_ms: float
    pipeline_ms: float
    tail_ms: float
    compute_ms: float
    bubble_ms: float
    tp_comm_ms: float
    pp_comm_ms: float
    dp_comm_ms: float
    optimizer_ms: float
    dp_allreduce_ms: float
    rank_allreduce_ms: list[float]
    stages: list[StageCost]
    memory: list[RankMemory]
    violations: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass
class CostTables:
    """Prefix sums of per-layer figures for one (device class, tp, micro-batch size)."""

    layers: list[LayerCost]
    # by mode (recompute, with or without offload: autoplan.cost.offload.ALL_MODES): prefix of
    # forward + backward ms, of backward ms, of device-resident saved bytes
    work: dict[str, list[float]]
    backward: dict[str, list[float]]
    saved: dict[str, list[float]]
    params: list[float]
    # by mode: prefix of saved bytes parked in host memory (offload modes only)
    parked: dict[str, list[float]] = field(default_factory=dict)
    # At sub-block grain (autoplan.cost.block_parts): what a stage starting at unit i adds to
    # the prefix differences of work and backward, by mode (nonzero at a block's MLP part);
    # each unit alone; each block, keyed by its attention part's position.
    start_work: dict[str, list[float]] = field(default_factory=dict)
    start_backward: dict[str, list[float]] = field(default_factory=dict)
    alone: list[LayerCost] = field(default_factory=list)
    blocks: dict[int, LayerCost] = field(default_factory=dict)
    # What a reader derives from these tables and keeps with them, by the reader's key (the
    # heterogeneous search's memory floors: ``autoplan.solve.hetero``); tables are shared by
    # every view that reads the same figures, and so is this.
    derived: dict[object, object] = field(default_factory=dict, repr=False, compare=False)

    def span_work(self, mode: str, i: int, j: int) -> float:
        """Forward + backward ms of units [i, j) in ``mode`` (whole blocks as blocks)."""
        extra = self.start_work[mode][i] if self.start_work else 0.0
        return self.work[mode][j] - self.work[mode][i] + extra

    def span_backward(self, mode: str, i: int, j: int) -> float:
        """Backward ms of units [i, j) in ``mode`` (whole blocks as blocks)."""
        extra = self.start_backward[mode][i] if self.start_backward else 0.0
        return self.backward[mode][j] - self.backward[mode][i] + extra


@dataclass(frozen=True, order=True)
class LinkSide:
    """What one side of a stage boundary needs for ``boundary_ms``: the stage's node groups
    (by class), the samples of a micro-batch leaving its busiest node, the largest share of
    one replica, and whether it is one class with a single node."""

    classes: tuple[int, ...]
    node_samples: int
    largest_share: int
    single_node_class: int | None


_PLAIN_TABLES_KEPT = 8192
"""Table sets a model and its views keep (``CostModel.tables``), the oldest dropped first."""


def _prefix(values: list[float]) -> list[float]:
    return [0.0, *accumulate(values)]


class CostModel:
    """Costs plans of ``profile`` on ``cluster``.

    ``efficiency`` overrides the catalog's efficiency per GPU type name. Each GPU type's
    efficiency is resolved once, here, for the profile's dtype (``spec_for_dtype``: measured
    fp32/tf32 fractions where the catalog has them), so every cost below reads one figure.
    """

    def __init__(
        self,
        profile: Profile,
        cluster: Cluster,
        specs: dict[str, GpuSpec],
        efficiency: dict[str, float] | None = None,
    ) -> None:
        efficiency = efficiency or {}
        specs = {
            name: spec_for_dtype(spec, profile.dtype, efficiency.get(name))
            for name, spec in specs.items()
        }
        self.profile = profile
        self.cluster = cluster
        self.classes: list[DeviceClass] = device_classes(cluster, specs)
        self.num_layers = len(profile.layers)
        self.dtype_bytes = profile.dtype_bytes
        self.optimizer_bytes_per_param = optimizer_bytes_per_param(profile.dtype)
        self._peaks = [peak_tflops(c.gpu, profile.dtype) for c in self.classes]
        # Identical layers (a model's repeated blocks) cost the same: each is costed once.
        first: dict[str, int] = {}
        self._same_as = [
            first.setdefault(
                layer.model_dump_json(exclude={"index", "name", "replica_of", "block_index"}),
                position,
            )
            for position, layer in enumerate(profile.layers)
        ]
        # At sub-block grain: each block (its two parts merged), by its attention part.
        self._blocks = {
            p: merge_parts(profile.layers[p], profile.layers[p + 1], p)
            for p in block_pairs(profile)
        }
        # What ``tables`` costs when not told: the search runs on a view of each setting.
        self.sequence_parallel = False
        self.host_limit = True  # offload's host-memory bound (``without_host_limit``)
        self.context_parallel = 1  # cp of groups that say 1 (``with_context_parallel``)
        self.expert_parallel = 1  # ep of stages that say 1 (``with_expert_parallel``)
        self.engine: Engine = "autoplan"  # whose runtime runs the plan (``with_engine``)
        self._plain_tables: dict[tuple[int, int, int, int, bool, int, int], CostTables] = {}
        # The whole-model sums of single-stage plans (``totals``), shared with views alike.
        self._plain_totals: dict[tuple[int, int, int, int, bool, int, int], ModelTotals] = {}
        # ``work_prefix``'s lists where no table set is built, shared with views alike.
        self._work_prefixes: dict[tuple[int, int, int, int, bool, int, int, str], list[float]] = {}
        # ``_layer_cost`` by (view's cp, layer, class, tp, micro-batch size, sp, cp), shared
        # with views alike: ``tables``, ``totals`` and ``work_prefix`` of one (class, tp,
        # micro-batch size) ask the same layers (GPT-Neo-2.7B 16+16: 2,568 asks, 2,000 distinct).
        self._layer_costs: dict[tuple[int, int, int, int, int, bool, int], LayerCost] = {}
        # ``boundary_ms``' inter-node (bandwidth GB/s, latency us) by the two sides' classes,
        # shared with views alike (none changes a class's node groups or GPU): the search's
        # bounds ask it thousands of times over a few class sets.
        self._inter_node_links: dict[tuple[int, ...], tuple[float, float]] = {}

    def with_engine(self, engine: Engine) -> CostModel:
        """This model costing plans as ``engine`` runs them (``ENGINES``): the search reads
        ``SolveOptions.engine`` ("autoplan", what ``autoplan run`` runs, by default); ``autoplan
        fidelity`` prices the published Megatron-DeepSpeed runs as that engine runs them."""
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; one of {', '.join(ENGINES)}")
        view = copy.copy(self)
        view.engine = engine
        return view

    @property
    def hides_allreduce(self) -> bool:
        """Whether the engine overlaps the gradient all-reduce with the last backward."""
        return ENGINES[self.engine].overlaps_grad_reduce

    def uniform_executor(self) -> Executor:
        """The executor a uniform plan of this view runs on (``Plan.runs_on_mesh``): the mesh,
        unless the view splits experts, which run on per-stage groups only."""
        return "groups" if self.expert_parallel > 1 else "mesh"

    def stage_executor(self, executor: Executor, groups: tuple[ReplicaGroup, ...]) -> Executor:
        """The executor a stage of ``groups`` in a plan priced for ``executor`` runs on:
        context parallelism runs on the mesh executor only, so a stage with cp > 1 is priced
        as the mesh runs it."""
        return "mesh" if any(self.cp_of(g) > 1 for g in groups) else executor

    def exposed_allreduce_ms(
        self,
        allreduce_ms: float,
        shortest_backward_ms: float,
        executor: Executor = "mesh",
        groups: tuple[ReplicaGroup, ...] = (),
    ) -> float:
        """What of a stage's gradient all-reduce the iteration waits for after the schedule's
        last backward: the excess over the shortest replica's last backward where the engine
        overlaps the two, all of it where it does not (``autoplan.cost.engines``). autoplan's
        runtime overlaps them on its mesh executor only (DDP reduces buckets as the last
        backward fills them); its groups executor sums the gradients after the stage's last
        backward (``autoplan.runtime.grad_sync``). The search's tails (uniform,
        heterogeneous and shared-stage families) and ``evaluate`` all read this one rule,
        each with the executor its plans record and the stage's ``groups``
        (``stage_executor``), so the search's objective is the figure the plan reports."""
        if self.hides_allreduce and self.stage_executor(executor, groups) == "mesh":
            return max(0.0, allreduce_ms - shortest_backward_ms)
        return allreduce_ms

    def with_sequence_parallel(self, sequence_parallel: bool) -> CostModel:
        """This model costing sequence parallelism on or off where a caller does not say
        (the search's view of one setting; ``PlanConfig.sequence_parallel`` rules evaluate)."""
        view = copy.copy(self)
        view.sequence_parallel = sequence_parallel
        return view

    def with_context_parallel(self, cp: int) -> CostModel:
        """This model costing every group at cp ``cp`` (module docstring): a class's "GPU" is
        a cp group of ``cp`` GPUs of one node; classes whose nodes ``cp`` does not divide
        have none. The search runs on this view; configs it returns get ``cp`` on their groups
        (``with_cp``) and are costed by this model itself."""
        view = copy.copy(self)
        view.context_parallel = self.context_parallel * cp
        view.classes = [
            dataclasses.replace(
                c,
                gpus_per_node=max(1, c.gpus_per_node // cp),
                num_nodes=c.num_nodes if c.gpus_per_node % cp == 0 else 0,
            )
            for c in self.classes
        ]
        return view

    def cp_of(self, group: ReplicaGroup) -> int:
        """The cp degree ``group`` runs at in this model (its own, times a view's)."""
        return group.cp * self.context_parallel

    def with_expert_parallel(self, expert_parallel: int) -> CostModel:
        """This model costing every stage at expert-parallel degree ``expert_parallel`` where
        a stage does not say otherwise (the search's view of one ep: ``solve.expert_parallel``)."""
        view = copy.copy(self)
        view.expert_parallel = expert_parallel
        return view

    def stage_expert_parallel(self, stage: StageChoice) -> int:
        """The ep a stage runs at: its own, or the view's where it says 1."""
        return stage.ep if stage.ep > 1 else self.expert_parallel

    def expert_span(self, stage: StageChoice) -> ExpertSpan | None:
        """The expert group of a stage whose experts are placed by speed
        (``StageChoice.experts``), None for even placement; raises ValueError where its
        groups do not cut into ``ep``-replica expert groups."""
        if not stage.experts:
            return None
        groups = stage.replicas // stage.ep  # expert groups
        if (
            len(stage.experts) != len(stage.groups)
            or stage.ep < 2
            or stage.replicas % stage.ep
            or any(g.replicas % groups for g in stage.groups)
        ):
            raise ValueError(
                f"experts {stage.experts} of a stage of {stage.replicas} replicas at ep "
                f"{stage.ep}: each of its {len(stage.groups)} groups must give every one of "
                "replicas / ep expert groups the same number of replicas"
            )
        return ExpertSpan(
            tuple(
                ExpertMember(g.device_class, g.micro_batch_size, x, g.replicas // groups)
                for g, x in zip(stage.groups, stage.experts, strict=True)
            )
        )

    def span_links(self, span: ExpertSpan) -> tuple[tuple[float, float], ...]:
        """(bandwidth GB/s, latency us) one GPU of each member of ``span`` gets in its
        all-to-alls: the inter-node link joining the members' nodes, shared by every GPU of
        the node (all exchange at once; ``autoplan.cost.expert_parallel``)."""
        names = {n for m in span.members for n in self.classes[m.device_class].groups}
        bandwidth = self.cluster.inter_node_bandwidth(names)
        latency = self.cluster.inter_node_latency(names)
        return tuple(
            (bandwidth / self.classes[m.device_class].gpus_per_node, latency) for m in span.members
        )

    # ---- per-layer tables -------------------------------------------------------------
    def tables(
        self,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sequence_parallel: bool | None = None,
        cp: int = 1,
        expert_parallel: int | None = None,
        span: tuple[ExpertSpan, int] | None = None,
    ) -> CostTables:
        """Per-layer costs and their prefix sums for one (class, tp, micro-batch size), with
        sequence parallelism on or off (None: the model's ``sequence_parallel``), at
        context-parallel degree ``cp`` (times the model's) and expert-parallel degree
        ``expert_parallel`` (None: the model's ``expert_parallel``); with ``span`` (an
        expert group spanning a mixed stage and this group's member in it), the experts
        placed by it instead (``autoplan.cost.expert_parallel``)."""
        if sequence_parallel is None:
            sequence_parallel = self.sequence_parallel
        if span is not None:
            return self._span_tables(
                device_class, tp, micro_batch_size, sequence_parallel, cp, span
            )
        ep = self.expert_parallel if expert_parallel is None else expert_parallel
        # Sequence parallelism changes nothing without tp (``layer_cost``): one table set.
        sp = sequence_parallel and tp > 1
        # Shared with every view of this model (``with_sequence_parallel`` and the others
        # copy the reference): the key holds what a view changes that the tables read (the
        # cp view's classes go with its ``context_parallel``).
        key = (self.context_parallel, device_class, tp, micro_batch_size, sp, cp, ep)
        cache = self._plain_tables
        found = cache.get(key)
        if found is None:
            found = self._build_tables(device_class, tp, micro_batch_size, sp, cp, ep, None)
            cache[key] = found
            if len(cache) > _PLAIN_TABLES_KEPT:
                del cache[next(iter(cache))]  # the oldest
        return found

    # Experts placed by speed: a table set per (shares, split) of a spanning stage, many more
    # than the plain sets; a cache of their own keeps them from evicting those (the search's
    # and the oracles' costs of every other stage).
    @functools.lru_cache(maxsize=4096)  # noqa: B019 (the model lives as long as one solve)
    def _span_tables(
        self,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sp: bool,
        cp: int,
        span: tuple[ExpertSpan, int],
    ) -> CostTables:
        return self._build_tables(device_class, tp, micro_batch_size, sp, cp, 1, span)

    def _build_tables(
        self,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sequence_parallel: bool,
        cp: int,
        ep: int,
        span: tuple[ExpertSpan, int] | None,
    ) -> CostTables:
        """``tables`` of resolved arguments, uncached."""
        cp *= self.context_parallel
        dc = self.classes[device_class]

        links = None if span is None else self.span_links(span[0])

        def with_experts(layer: LayerProfile, cost: LayerCost) -> LayerCost:
            if span is not None and links is not None:
                return span_layer_cost(
                    cost, layer, span[0], span[1], tp, links, self.profile.micro_batch_size
                )
            return expert_layer_cost(
                cost, layer, dc, tp, ep, micro_batch_size, self.profile.micro_batch_size
            )

        costed = self._distinct_costs(
            device_class, tp, micro_batch_size, sequence_parallel, cp, with_experts
        )
        layers = [costed[position] for position in self._same_as]
        host = dc.host_link_bandwidth_gb_per_s
        # Per distinct layer, then spread: a model's repeated blocks cost the same.
        distinct_forward = {
            m: {x: mode_forward_ms(c, m, host) for x, c in costed.items()} for m in ALL_MODES
        }
        distinct_backward = {
            m: {x: mode_backward_ms(c, m, host) for x, c in costed.items()} for m in ALL_MODES
        }
        forward = {m: [values[x] for x in self._same_as] for m, values in distinct_forward.items()}
        backward = {
            m: [values[x] for x in self._same_as] for m, values in distinct_backward.items()
        }
        alone, blocks, whole = layers, {}, {}
        if self._blocks:
            # A stage holding both parts of a block runs the block (block_parts).
            merged: dict[tuple[int, int], LayerCost] = {}
            for p, block in self._blocks.items():
                key = (self._same_as[p], self._same_as[p + 1])
                if key not in merged:
                    cost = self._layer_cost(
                        block, device_class, tp, micro_batch_size, sequence_parallel, cp
                    )
                    cost = with_experts(block, cost)
                    merged[key] = block_cost(cost, layers[p], layers[p + 1])
                blocks[p] = merged[key]
            layers, *starts = whole_block_passes(
                alone,
                blocks,
                forward,
                backward,
                lambda c, m: (mode_forward_ms(c, m, host), mode_backward_ms(c, m, host)),
            )
            whole = dict(zip(("start_work", "start_backward"), starts, strict=True))
        # Each per-layer figure once per distinct cost object (a model's repeated blocks
        # share one), then spread over the layers.
        distinct: dict[int, int] = {}
        slots = [distinct.setdefault(id(c), len(distinct)) for c in layers]
        unique = list({id(c): c for c in layers}.values())

        def spread(values: list[float]) -> list[float]:
            """Prefix sums of per-distinct-layer ``values`` over the layers."""
            return _prefix([values[slot] for slot in slots])

        return CostTables(
            alone=alone,
            blocks=blocks,
            start_work=whole.get("start_work", {}),
            start_backward=whole.get("start_backward", {}),
            layers=layers,
            work={
                m: _prefix([f + b for f, b in zip(forward[m], backward[m], strict=True)])
                for m in ALL_MODES
            },
            backward={m: _prefix(backward[m]) for m in ALL_MODES},
            saved={m: spread([resident_saved_bytes(c, m) for c in unique]) for m in ALL_MODES},
            params=spread([c.params_per_gpu for c in unique]),
            parked={m: spread([parked_bytes(c, m) for c in unique]) for m in ALL_MODES},
        )

    def _distinct_costs(
        self,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sequence_parallel: bool,
        cp: int,
        with_experts: Callable[[LayerProfile, LayerCost], LayerCost],
    ) -> dict[int, LayerCost]:
        """Each distinct layer's cost (by its first position, ``_same_as``) for
        ``_build_tables`` (``cp`` resolved: times the view's) and ``totals``."""
        costed = {
            position: self._layer_cost(
                self.profile.layers[position],
                device_class,
                tp,
                micro_batch_size,
                sequence_parallel,
                cp,
            )
            for position in sorted(set(self._same_as))
        }
        return {x: with_experts(self.profile.layers[x], c) for x, c in costed.items()}

    def _layer_cost(
        self,
        layer: LayerProfile,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sequence_parallel: bool,
        cp: int,
    ) -> LayerCost:
        """``layer_cost`` of one layer on a GPU of ``device_class`` (its peaks, its tp and cp
        links; ``cp`` resolved), experts aside; kept (``layer_cost`` is a pure function of
        these: the view's cp picks its classes, the layer is the profile's or a merged block
        this model holds, so its id is its own while the model lives)."""
        key = (
            self.context_parallel,
            id(layer),
            device_class,
            tp,
            micro_batch_size,
            sequence_parallel,
            cp,
        )
        found = self._layer_costs.get(key)
        if found is None:
            found = self._layer_costs[key] = self._new_layer_cost(
                layer, device_class, tp, micro_batch_size, sequence_parallel, cp
            )
        return found

    def _new_layer_cost(
        self,
        layer: LayerProfile,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        sequence_parallel: bool,
        cp: int,
    ) -> LayerCost:
        """``_layer_cost``, uncached."""
        dc = self.classes[device_class]
        return layer_cost(
            layer,
            dc.gpu,
            self._peaks[device_class],
            tp=tp,
            micro_batch_size=micro_batch_size,
            profile_micro_batch_size=self.profile.micro_batch_size,
            intra_node_bandwidth_gb_per_s=dc.collective_bandwidth_gb_per_s(tp),
            intra_node_latency_us=dc.intra_node_latency_us,
            sequence_parallel=sequence_parallel,
            **self._ring_link(dc, tp, cp),
        )

    def totals(self, device_class: int, tp: int, micro_batch_size: int) -> ModelTotals:
        """The whole model's sums on one (class, tp, micro-batch size) as ``tables`` (with
        the view's settings) would give them in their last entries, to the bit, without
        building the per-layer tables (``autoplan.cost.totals``): a single-stage plan needs
        no more. Read from the tables where they are built already, or where the model is
        at sub-block grain (a stage holding both parts of a block runs the block)."""
        sp = self.sequence_parallel and tp > 1
        ep = self.expert_parallel
        key = (self.context_parallel, device_class, tp, micro_batch_size, sp, 1, ep)
        found = self._plain_totals.get(key)
        if found is not None:
            return found
        tables = self._plain_tables.get(key)
        if tables is not None or self._blocks:
            t = tables if tables is not None else self.tables(device_class, tp, micro_batch_size)
            found = ModelTotals(
                list({id(c): c for c in t.layers}.values()),
                t.params[-1],
                lambda name, mode: getattr(t, name)[mode][-1],
            )
        else:
            costed = self._plain_distinct_costs(device_class, tp, micro_batch_size)
            index = {position: n for n, position in enumerate(costed)}
            found = ModelTotals.of_layers(
                list(costed.values()),
                [index[position] for position in self._same_as],
                self.classes[device_class].host_link_bandwidth_gb_per_s,
            )
        self._plain_totals[key] = found
        if len(self._plain_totals) > _PLAIN_TABLES_KEPT:
            del self._plain_totals[next(iter(self._plain_totals))]  # the oldest
        return found

    def work_prefix(
        self, device_class: int, tp: int, micro_batch_size: int, mode: str
    ) -> list[float]:
        """``tables(device_class, tp, micro_batch_size).work[mode]`` (with the view's
        settings), to the bit, without building the other tables where they are not built
        yet: the same per-layer figures (forward + backward of each distinct layer, spread)
        summed in the same order. The heterogeneous search's stage floors read this alone
        of hundreds of shares (GPT-3 175B on mixed-1024: 313 of the solve's 846 table sets).
        Read from the tables where they are built, or where the model is at sub-block grain
        (whole blocks change the per-layer figures)."""
        sp = self.sequence_parallel and tp > 1
        key = (self.context_parallel, device_class, tp, micro_batch_size, sp, 1)
        tables = self._plain_tables.get((*key, self.expert_parallel))
        if tables is not None or self._blocks:
            return self.tables(device_class, tp, micro_batch_size).work[mode]
        found = self._work_prefixes.get((*key, self.expert_parallel, mode))
        if found is None:
            costed = self._plain_distinct_costs(device_class, tp, micro_batch_size)
            host = self.classes[device_class].host_link_bandwidth_gb_per_s
            work = {
                x: mode_forward_ms(c, mode, host) + mode_backward_ms(c, mode, host)
                for x, c in costed.items()
            }
            found = _prefix([work[x] for x in self._same_as])
            self._work_prefixes[(*key, self.expert_parallel, mode)] = found
            if len(self._work_prefixes) > _PLAIN_TABLES_KEPT:
                del self._work_prefixes[next(iter(self._work_prefixes))]  # the oldest
        return found

    def _plain_distinct_costs(
        self, device_class: int, tp: int, micro_batch_size: int
    ) -> dict[int, LayerCost]:
        """``_distinct_costs`` as ``tables`` with the view's settings and no span computes
        them (``totals``, ``work_prefix``)."""
        dc = self.classes[device_class]
        ep = self.expert_parallel

        def with_experts(layer: LayerProfile, cost: LayerCost) -> LayerCost:
            return expert_layer_cost(
                cost, layer, dc, tp, ep, micro_batch_size, self.profile.micro_batch_size
            )

        sp = self.sequence_parallel and tp > 1
        return self._distinct_costs(
            device_class, tp, micro_batch_size, sp, self.context_parallel, with_experts
        )

    def _ring_link(self, dc: DeviceClass, tp: int, cp: int) -> _RingLink:
        """``layer_cost``'s cp arguments: the ring inside a node when a replica's tp × cp GPUs
        fit in one (the search places them so), else between nodes, each node's bandwidth
        shared by the tp rings that leave it together."""
        # In a view, a class's "GPU" is a cp group: its real GPUs per node are cp times more.
        real_per_node = dc.gpus_per_node * self.context_parallel
        bandwidth, latency = dc.intra_node_bandwidth_gb_per_s, dc.intra_node_latency_us
        if tp * cp > real_per_node:
            bandwidth = dc.inter_node_bandwidth_gb_per_s / min(tp, real_per_node)
            latency = dc.inter_node_latency_us
        return _RingLink(
            context_parallel=cp, cp_bandwidth_gb_per_s=bandwidth, cp_latency_us=latency
        )

    # ---- pieces shared by the search and the evaluation --------------------------------
    def static_bytes(
        self, params_per_gpu: float, replicas: int, zero: int
    ) -> tuple[float, float, float]:
        """(weights, gradients, optimizer states) bytes of ``params_per_gpu`` parameters at
        ZeRO level ``zero`` (``sharding``; a bool reads as level 0 or 1)."""
        return sharding.static_bytes(
            params_per_gpu,
            self._sharding_ranks(replicas),
            int(zero),
            self.dtype_bytes,
            self.optimizer_bytes_per_param,
        )

    def _sharding_ranks(self, replicas: int) -> int:
        """The ranks that shard one parameter's states: replicas × cp, over ep in a view of
        one ep (ZeRO-1 shards over an expert group's r / ep replicas of one expert index:
        ``autoplan.cost.expert_parallel``)."""
        return max(1, replicas * self.context_parallel // self.expert_parallel)

    def static_bytes_per_param(self, replicas: int, zero: int) -> float:
        """Weights + gradients + optimizer bytes per parameter held."""
        return sharding.static_bytes_per_param(
            self._sharding_ranks(replicas),
            int(zero),
            self.dtype_bytes,
            self.optimizer_bytes_per_param,
        )

    @functools.lru_cache(maxsize=64)  # noqa: B019 (the model lives as long as one solve)
    def largest_layer_params(self, tp: int) -> float:
        """Parameters per GPU of the model's largest layer at ``tp``."""
        return max(c.params_per_gpu for c in self.tables(0, tp, 1).layers)

    def zero_transient_bytes(self, tp: int, replicas: int, zero: int) -> float:
        """What ZeRO-2/3 add to a GPU's largest transient (``sharding.transient_bytes``)."""
        if int(zero) <= 1:
            return 0.0
        return sharding.transient_bytes(
            self.largest_layer_params(tp),
            replicas * self.context_parallel,
            int(zero),
            self.dtype_bytes,
        )

    def zero_collective_ms(
        self, groups: tuple[ReplicaGroup, ...], params_per_gpu: tuple[float, ...]
    ) -> float:
        """One all-gather (or reduce-scatter) of a stage's parameters over its replicas: half
        its all-reduce (``sharding``)."""
        return self.allreduce_ms(groups, params_per_gpu) / 2

    def transient_bytes(self, layer: LayerCost, recompute: str) -> float:
        """Largest temporary while one layer runs its backward; ``recompute`` is a mode
        (``autoplan.cost.offload``): an offloading one adds the layers in transit. A head's
        is at least its loss's temporaries: ``EngineTraits.loss_copies`` copies of its
        logits (``LayerCost.logits_bytes``), which the backward's two output-sized gradients
        do not cover where the profiled head ends in the per-token loss."""
        base, _ = split_mode(recompute)
        extra = transit_bytes(layer, recompute)
        extra += layer.ring_buffer_bytes  # cp: the K, V chunk in flight
        # A head's loss: the engine's logits-sized fp32 temporaries (``cost.engines``).
        copies = ENGINES[self.engine].loss_copies(layer.logits_one_sample)
        loss = copies * layer.logits_bytes
        if base == "none":
            return max(2 * layer.output_bytes, loss) + extra
        return max(layer.full_activation_bytes, loss) + extra

    def pass_overhead_ms(self, device_class: int) -> float:
        """Fixed time of one forward or backward pass of a stage on this class."""
        return self.classes[device_class].gpu.pass_overhead_ms

    def step_overhead_ms(self, device_class: int) -> float:
        return self.classes[device_class].gpu.step_overhead_ms

    def reserved_bytes(self, device_class: int) -> int:
        """Memory no plan may use on this class (CUDA context, NCCL, fragmentation)."""
        return int(self.classes[device_class].gpu.memory_reserve_gib * 1024**3)

    def capacity_bytes(self, device_class: int) -> int:
        """Device memory of the class."""
        return self.classes[device_class].gpu.memory_bytes

    def host_budget_bytes(self, device_class: int) -> float:
        """What one GPU of the class may park in host memory (``autoplan.cost.offload``);
        unbounded in a ``without_host_limit`` view."""
        if not self.host_limit:
            return math.inf
        return host_budget_bytes(self.classes[device_class].host_memory_bytes_per_gpu)

    def without_host_limit(self) -> CostModel:
        """This model with host memory unbounded (what the infeasibility diagnosis compares
        with, to say whether host memory is what binds)."""
        view = copy.copy(self)
        view.host_limit = False
        return view

    def transfer_buffer_bytes(
        self, samples: int, start: int, end: int, micro_batches: int
    ) -> float:
        """Device bytes the engine holds for a stage's pipeline transfers beyond its saved
        activations: the stage on layers [start, end) of a replica taking ``samples`` samples
        per micro-batch, ``micro_batches`` per iteration.

        autoplan's runtime runs uniform plans on ``torch.distributed.pipelining``, whose
        ``PipelineStage`` allocates, once and for the stage's life, a receive buffer for every
        micro-batch's input (stages after the first) and for every micro-batch's output
        gradient (stages before the last), each the full boundary activation on every tp rank
        (``_setup_forward_recv_info`` and ``_create_grad_recv_info`` in torch 2.13; PyTorch's
        issue #136380, with just-in-time allocation proposed in #196463). Counted whole, for
        every plan of this engine: the groups executor (``autoplan.runtime.transfers``) holds
        fewer (its receives live until taken, its sends until done), so there the count is
        conservative; and a received input that the stage's first layer saves is counted
        again in its saved activations, conservative by one boundary per micro-batch in
        flight. Megatron-DeepSpeed's pipeline engine keeps only its in-flight pipe buffers,
        whose inputs the saved activations count and whose outputs it frees after sending
        (partitioned over tp): nothing more."""
        if not ENGINES[self.engine].keeps_receive_buffers or micro_batches <= 0:
            return 0.0
        layers = self.profile.layers
        per_sample = 0.0
        if start > 0:
            per_sample += layers[start - 1].output_activation_bytes
        if end < len(layers):
            per_sample += layers[end - 1].output_activation_bytes
        return micro_batches * samples * per_sample / self.profile.micro_batch_size

    def usable_bytes(self, device_class: int) -> int:
        """Device memory a plan may fill: capacity less the reserve."""
        return self.capacity_bytes(device_class) - self.reserved_bytes(device_class)

    def optimizer_ms(
        self, params_per_gpu: float, device_class: int, replicas: int, zero1: int
    ) -> float:
        """Adam step, memory-bound: states read and written, gradient read, weight written
        (of the shard under any ZeRO level)."""
        # cp ranks shard the states as replicas do; ep's replicas of one expert index only.
        replicas = self._sharding_ranks(replicas)
        params = params_per_gpu / replicas if (zero1 and replicas > 1) else params_per_gpu
        moved = params * (2 * self.optimizer_bytes_per_param + 2 * self.dtype_bytes)
        return moved / (self.classes[device_class].gpu.memory_bandwidth_gb_per_s * 1e9) * 1e3

    def peak_tflops_of(self, gpu_type: str) -> float:
        """Dense peak TFLOP/s of a GPU type of this cluster in the profile's dtype."""
        for c in self.classes:
            if c.gpu.name == gpu_type:
                return self._peaks[c.index]
        raise KeyError(gpu_type)

    # ---- placement-dependent communication ---------------------------------------------
    def in_one_node(self, groups: tuple[ReplicaGroup, ...]) -> bool:
        """Whether the emitter places these groups (one stage) in one node: one class, and
        their GPUs make one block size of its nodes (``devices.block_sizes``)."""
        classes = {g.device_class for g in groups}
        if len(classes) != 1:
            return False
        dc = self.classes[next(iter(classes))]
        return sum(g.gpus for g in groups) in block_sizes(dc.gpus_per_node)

    def link_side(self, groups: tuple[ReplicaGroup, ...]) -> LinkSide:
        """One stage's side of a boundary (see ``LinkSide``)."""
        classes = tuple(sorted({g.device_class for g in groups}))
        node_samples = 0
        for g in groups:
            per_node = max(1, self.classes[g.device_class].gpus_per_node // (g.tp * g.cp))
            node_samples = max(node_samples, min(g.replicas, per_node) * g.micro_batch_size)
        single = None
        if len(classes) == 1 and self.classes[classes[0]].num_nodes == 1:
            single = classes[0]
        largest = max(g.micro_batch_size for g in groups)
        return LinkSide(classes, node_samples, largest, single)

    def boundary_ms(self, sender: LinkSide, receiver: LinkSide, bytes_per_sample: float) -> float:
        """One-way time of a micro-batch's boundary activation between two stages (module
        docstring); the gradient back takes the same. One copy of the activation crosses the
        link, as Megatron-DeepSpeed (partitioned over tp) and autoplan's groups executor (tp
        rank 0 sends) move it. Not modelled: autoplan's mesh executor without sequence
        parallelism sends it from every tp rank (a ``PipelineStage`` per tp index), tp copies
        through a node's inter-node link."""
        if bytes_per_sample <= 0:
            return 0.0
        if sender.single_node_class is not None and (
            sender.single_node_class == receiver.single_node_class
        ):
            dc = self.classes[sender.single_node_class]
            largest = max(sender.largest_share, receiver.largest_share)
            return p2p_ms(
                largest * bytes_per_sample,
                dc.intra_node_bandwidth_gb_per_s,
                dc.intra_node_latency_us,
            )
        classes = sender.classes + receiver.classes
        link = self._inter_node_links.get(classes)
        if link is None:
            names = {name for k in classes for name in self.classes[k].groups}
            link = self._inter_node_links[classes] = (
                self.cluster.inter_node_bandwidth(names),
                self.cluster.inter_node_latency(names) + self._step_overhead_us(classes),
            )
        bandwidth, latency = link
        busiest = max(sender.node_samples, receiver.node_samples)
        return p2p_ms(busiest * bytes_per_sample, bandwidth, latency)

    def _step_overhead_us(self, classes: tuple[int, ...]) -> float:
        """The stack's overhead per collective step, of the slowest of ``classes``
        (GpuSpec.collective_step_overhead_us; the intra-node latencies of the device classes
        already hold it)."""
        return max(self.classes[k].gpu.collective_step_overhead_us for k in classes)

    def allreduce_ms(
        self, groups: tuple[ReplicaGroup, ...], params_per_gpu: tuple[float, ...]
    ) -> float:
        """Gradient all-reduce over a stage's replicas; ``params_per_gpu[g]`` is what one GPU
        of group g holds (module docstring)."""
        # cp ranks reduce gradients of different tokens: they join the ring as replicas do.
        replicas = sum(g.replicas * self.cp_of(g) for g in groups)
        if replicas <= 1:
            return 0.0
        if self.in_one_node(groups):
            dc = self.classes[groups[0].device_class]
            return ring_allreduce_ms(
                max(params_per_gpu) * self.dtype_bytes,
                replicas,
                dc.collective_bandwidth_gb_per_s(sum(g.gpus for g in groups)),
                dc.intra_node_latency_us,
            )
        names = {name for g in groups for name in self.classes[g.device_class].groups}
        # Each node's link carries the whole gradient once per ring direction: a replica of tp
        # t sends its t shards in t rings that cross the node's link together.
        whole = max(
            p * min(g.tp, self.classes[g.device_class].gpus_per_node)
            for g, p in zip(groups, params_per_gpu, strict=True)
        )
        return nccl_allreduce_ms(
            whole * self.dtype_bytes,
            replicas,
            self.cluster.inter_node_bandwidth(names),
            self.cluster.inter_node_latency(names)
            + self._step_overhead_us(tuple(g.device_class for g in groups)),
            across_nodes=True,
        )

    def sequence_edges_ms(
        self, stage: StageChoice, group: ReplicaGroup, sequence_parallel: bool | None
    ) -> float:
        """One pass's all-gathers at the ends of the stage's runs of sequence-sharded blocks
        (``autoplan.cost.sequence_parallel.sequence_runs``); zero without SP or tp."""
        sp = self.sequence_parallel if sequence_parallel is None else sequence_parallel
        if not sp or group.tp <= 1:
            return 0.0
        layers = self.profile.layers[stage.layer_start : stage.layer_end]
        runs = sequence_runs([layer.kind if layer.tensor_parallel else "other" for layer in layers])
        if not runs:
            return 0.0
        dc = self.classes[group.device_class]
        whole = max(layer.output_activation_bytes for layer in layers if layer.kind == "block")
        payload = (
            whole * group.micro_batch_size / (self.profile.micro_batch_size * self.cp_of(group))
        )
        one = ring_collective_ms(
            payload,
            group.tp,
            dc.collective_bandwidth_gb_per_s(group.tp),
            dc.intra_node_latency_us,
        )
        return runs * one

    # ---- whole plans ---------------------------------------------------------------------
    def group_cost(
        self, stage: StageChoice, group: ReplicaGroup, sequence_parallel: bool | None = None
    ) -> GroupCost:
        """One group's per-micro-batch figures on the stage's layers, layer by layer."""
        sp = self.sequence_parallel if sequence_parallel is None else sequence_parallel
        span = self.expert_span(stage)
        return self._group_cost(
            stage.layer_start,
            stage.layer_end,
            group.device_class,
            group.tp,
            group.micro_batch_size,
            group.recompute,
            group.offload,
            sp,
            group.cp,
            self.stage_expert_parallel(stage),
            None if span is None else (span, stage.groups.index(group)),
        )

    # The figures depend on none of the group's replicas, the stage's ZeRO level or the rest of
    # the plan, and the searches and the oracles cost the same (layers, group) in many plans.
    @functools.lru_cache(maxsize=1 << 16)  # noqa: B019 (the model lives as long as one solve)
    def _group_cost(
        self,
        layer_start: int,
        layer_end: int,
        device_class: int,
        tp: int,
        micro_batch_size: int,
        r: str,
        offload: bool,
        sequence_parallel: bool,
        cp: int = 1,
        expert_parallel: int = 1,
        span: tuple[ExpertSpan, int] | None = None,
    ) -> GroupCost:
        group = ReplicaGroup(device_class, tp, 1, micro_batch_size, r, offload, cp)
        stage = StageChoice(layer_start, layer_end, (group,))
        tables = self.tables(
            device_class, tp, micro_batch_size, sequence_parallel, cp, expert_parallel, span
        )
        units = layers = tables.layers[layer_start:layer_end]
        if tables.blocks:  # the times of whole blocks as blocks (block_parts)
            layers = stage_pieces(tables.alone, tables.blocks, layer_start, layer_end)
        mode = mode_key(r, offload)
        host = self.classes[device_class].host_link_bandwidth_gb_per_s
        overhead = self.pass_overhead_ms(device_class)
        forward_compute = sum(c.forward_compute_ms for c in layers)
        forward_tp = sum(c.forward_tp_comm_ms for c in layers)
        backward_tp = sum(c.backward_tp_comm_ms for c in layers)
        backward = sum(mode_backward_ms(c, mode, host) for c in layers)
        # Offload's exposed copies count as compute time: they hold the GPU's stream.
        swap_forward = sum(mode_forward_ms(c, mode, host) for c in layers) - (
            forward_compute + forward_tp
        )
        forward_compute += swap_forward
        edges = self.sequence_edges_ms(stage, group, sequence_parallel)
        forward_tp += edges
        backward_tp += edges
        backward += edges
        regather = sum(c.regather_ms for c in layers)
        recompute_tp = forward_tp - regather if r == "full" else 0.0
        return GroupCost(
            forward_ms=forward_compute + forward_tp + overhead,
            backward_ms=backward + overhead,
            compute_ms=forward_compute + backward - backward_tp - recompute_tp + 2 * overhead,
            tp_comm_ms=forward_tp + backward_tp + recompute_tp,
            params_per_gpu=sum(c.params_per_gpu for c in layers),
            saved_bytes=sum(resident_saved_bytes(c, mode) for c in layers),
            transient_bytes=max(self.transient_bytes(c, mode) for c in units),
            host_bytes=sum(parked_bytes(c, mode) for c in layers),
        )

    def _with_zero(self, stage: StageChoice, costs: tuple[GroupCost, ...]) -> tuple[GroupCost, ...]:
        """The groups' costs with what ZeRO-2/3's per-micro-batch collectives expose."""
        if stage.zero_stage <= 1 or stage.replicas * stage.cp * self.context_parallel <= 1:
            return costs
        collective = self.zero_collective_ms(stage.groups, tuple(c.params_per_gpu for c in costs))
        out = []
        for c in costs:
            forward, backward = sharding.exposed_ms(
                stage.zero_stage, collective, c.forward_ms, c.backward_ms
            )
            out.append(
                dataclasses.replace(
                    c, forward_ms=c.forward_ms + forward, backward_ms=c.backward_ms + backward
                )
            )
        return tuple(out)

    def evaluate(self, config: PlanConfig) -> PlanCost:
        """Cost ``config`` layer by layer (module docstring). Infeasible configurations come
        back with ``violations`` naming what does not fit."""
        pp, v, m = config.pipeline_degree, config.chunks, config.num_micro_batches
        stages = config.stages
        v_shape = config.schedule in V_SCHEDULES

        # Each stage's pipeline rank, and each rank's stages (its chunks), computed once.
        rank_of = [stage_rank(index, pp, v_shape=v_shape) for index in range(len(stages))]
        chunks_of: list[list[int]] = [[] for _ in range(pp)]
        for index, stage in enumerate(stages):
            chunks_of[rank_of[index]].append(index)
            if stage.groups != stages[rank_of[index]].groups:
                raise ValueError("all stages of one pipeline rank must have the same groups")
        # A view with sequence parallelism on (``with_sequence_parallel``) costs every config
        # with it: the solvers build their configs without the flag. A stage may run it alone.
        sp = config.sequence_parallel or self.sequence_parallel
        groups_cost = [
            self._with_zero(
                s, tuple(self.group_cost(s, g, sp or s.sequence_parallel) for g in s.groups)
            )
            for s in stages
        ]
        sides = [self.link_side(s.groups) for s in stages]
        costs = []
        for index, stage in enumerate(stages):
            send = 0.0
            if index + 1 < len(stages):
                per_sample = (
                    self.profile.layers[stage.layer_end - 1].output_activation_bytes
                    / self.profile.micro_batch_size
                )
                send = self.boundary_ms(sides[index], sides[index + 1], per_sample)
            costs.append(StageCost(groups_cost[index], send))

        rank_work = [0.0] * pp
        rank_sends = [0.0] * pp
        rank_receives = [0.0] * pp
        for index, cost in enumerate(costs):
            rank_work[rank_of[index]] += cost.work_ms
            rank_sends[rank_of[index]] += cost.send_ms
            if index + 1 < len(costs):
                rank_receives[rank_of[index + 1]] += cost.send_ms
        steady = blocking_stage_times(rank_work, rank_sends, rank_receives)
        fill = steady
        zero_bubble = config.schedule in ZERO_BUBBLE_SCHEDULES
        if zero_bubble:  # no closed form: the action lists played (cost.zero_bubble)
            pipeline, zero_bubble_flight = zero_bubble_pipeline(self, config, costs)
        else:
            pipeline = pipeline_time_ms(steady, m, v, fill)

        memory: list[RankMemory] = []
        violations: list[str] = []
        tails, allreduces, exposed, optimizer = [], [], [], []
        for r in range(pp):
            chunks = chunks_of[r]
            stage = stages[r]
            if zero_bubble:
                flight = zero_bubble_flight[r]
            else:
                flight = in_flight_chunks(config.schedule, pp, r, m, v)  # type: ignore[arg-type]
            params = [
                sum(groups_cost[c][g].params_per_gpu for c in chunks)
                for g in range(len(stage.groups))
            ]
            steps = []
            # The ranks that shard gradients and states: replicas × cp (cp ranks as replicas).
            # With ep, those of one expert index (expert_parallel; a view's ep: _sharding_ranks).
            ranks = stage.replicas * stage.cp // stage.ep
            for g, group in enumerate(stage.groups):
                k = group.device_class
                weights, grads, opt = self.static_bytes(params[g], ranks, stage.zero_stage)
                mem = RankMemory(
                    pipeline_rank=r,
                    gpu_type=self.classes[k].gpu.name,
                    weights_bytes=weights,
                    gradients_bytes=grads,
                    optimizer_bytes=opt,
                    activations_bytes=flight * max(groups_cost[c][g].saved_bytes for c in chunks)
                    + sum(
                        self.transfer_buffer_bytes(
                            group.micro_batch_size,
                            stages[c].layer_start,
                            stages[c].layer_end,
                            m,
                        )
                        for c in chunks
                    ),
                    transient_bytes=max(groups_cost[c][g].transient_bytes for c in chunks)
                    + self.zero_transient_bytes(group.tp, ranks, stage.zero_stage)
                    + sharding.gathered_bytes(
                        params[g],
                        ranks * self.context_parallel,
                        stage.zero_stage,
                        self.dtype_bytes,
                    ),
                    capacity_bytes=self.capacity_bytes(k),
                    reserved_bytes=self.reserved_bytes(k),
                    tensor_parallel_degree=group.tp,
                    micro_batch_size=group.micro_batch_size,
                    host_bytes=flight * max(groups_cost[c][g].host_bytes for c in chunks),
                    host_budget_bytes=self.host_budget_bytes(k),
                )
                memory.append(mem)
                if not mem.host_fits:
                    share = self.classes[k].host_memory_bytes_per_gpu
                    violations.append(
                        f"pipeline rank {r} on {mem.gpu_type} (tp {group.tp}, "
                        f"{group.micro_batch_size} samples per micro-batch) parks "
                        f"{mem.host_bytes / 1e9:.2f} GB of offloaded activations in host "
                        f"memory; its GPU's share of the node's host memory is "
                        f"{share / 1e9:.2f} GB, of which {HOST_MEMORY_HEADROOM:.0%} is kept free"
                    )
                if not mem.device_fits:
                    reserve = (
                        f" (of which {mem.reserved_bytes / 1e9:.2f} GB is reserved)"
                        if mem.reserved_bytes
                        else ""
                    )
                    violations.append(
                        f"pipeline rank {r} on {mem.gpu_type} (tp {group.tp}, "
                        f"{group.micro_batch_size} samples per micro-batch) needs "
                        f"{(mem.total_bytes + mem.reserved_bytes) / 1e9:.2f} GB{reserve}; it "
                        f"has {mem.capacity_bytes / 1e9:.2f} GB"
                    )
                steps.append(
                    self.optimizer_ms(params[g], k, ranks, stage.zero1) + self.step_overhead_ms(k)
                )
            # ZeRO-2/3 reduce-scatter every micro-batch's gradients in its backward
            # (``sharding``): nothing is left to all-reduce after the last one.
            ar = self.allreduce_ms(stage.groups, tuple(params)) if stage.zero_stage <= 1 else 0.0
            shortest_backward = min(
                sum(groups_cost[c][g].backward_ms for c in chunks) for g in range(len(stage.groups))
            )
            hidden = self.exposed_allreduce_ms(ar, shortest_backward, config.executor, stage.groups)
            allreduces.append(ar)
            exposed.append(hidden)
            optimizer.append(max(steps))
            tails.append(hidden + max(steps))
        tail_rank = max(range(pp), key=lambda r: (tails[r], -r))
        slow = max(range(pp), key=lambda r: (steady[r], -r))
        slow_parts = [costs[c].slowest() for c in chunks_of[slow]]
        # ZeRO-2/3's exposed per-micro-batch collectives (``_with_zero``) are in the passes'
        # times but neither compute nor tp: they are data-parallel communication.
        # (Clamped: without them the difference is 0 up to rounding.)
        zero_ms = m * sum(max(0.0, g.work_ms - g.compute_ms - g.tp_comm_ms) for g in slow_parts)
        return PlanCost(
            iteration_ms=pipeline + tails[tail_rank],
            pipeline_ms=pipeline,
            tail_ms=tails[tail_rank],
            compute_ms=m * sum(g.compute_ms for g in slow_parts),
            tp_comm_ms=m * sum(g.tp_comm_ms for g in slow_parts),
            pp_comm_ms=m * (steady[slow] - rank_work[slow]),
            bubble_ms=pipeline - m * steady[slow],
            dp_comm_ms=exposed[tail_rank] + zero_ms,
            optimizer_ms=optimizer[tail_rank],
            dp_allreduce_ms=max(allreduces),
            rank_allreduce_ms=allreduces,
            stages=costs,
            memory=memory,
            violations=violations,
        )
