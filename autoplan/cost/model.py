"""The cost model of whole plans: per-stage times and memory, pipeline time, dp tail.

Iteration time = pipeline time (``autoplan.cost.schedule``) + the largest per-rank tail.
A rank's work per micro-batch is its stages' forward + backward (with recompute and tp
all-reduces); the point-to-point sends of each boundary activation to the next stage and of
its gradient back overlap computation in the steady state and lengthen the fill and drain
(``autoplan.cost.schedule``). A rank's tail is the part of its gradient all-reduce over
dp (ring, on the slowest link its dp × tp GPUs span, whose node bandwidth the tp rings
share) that the backward of the last micro-batch does not hide, plus its optimizer step
(memory-bound: reads and writes the optimizer states, reads the gradients, writes the
weights).

Memory of one GPU of a rank = weights + gradients (training dtype) + Adam states (divided by
dp under ZeRO-1) + saved activations of the micro-batches in flight + the largest transient
(the full activations of one layer being recomputed, or two boundary tensors without
recompute).

``CostModel.tables`` precomputes prefix sums per (device class, tp, micro-batch size) so that
the search costs a stage [i, j) in O(1); ``CostModel.evaluate`` sums layer by layer, an
independent path the oracle tests compare the search against.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from itertools import accumulate

from autoplan.cluster.catalog import efficiency_for, peak_tflops
from autoplan.cluster.schema import Cluster, GpuSpec
from autoplan.cost.comm import p2p_ms, ring_allreduce_ms
from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.devices import DeviceClass, device_classes, link_between, node_flows
from autoplan.cost.layers import (
    RECOMPUTE_MODES,
    LayerCost,
    layer_cost,
    optimizer_bytes_per_param,
)
from autoplan.cost.schedule import in_flight_chunks, pipeline_time_ms
from autoplan.profile.schema import Profile

__all__ = ["CostModel", "CostTables", "PlanCost", "RankMemory"]


@dataclass(frozen=True)
class RankMemory:
    """Peak memory of one GPU of one pipeline rank, by category (bytes)."""

    pipeline_rank: int
    gpu_type: str
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    transient_bytes: float
    capacity_bytes: int

    @property
    def total_bytes(self) -> float:
        return (
            self.weights_bytes
            + self.gradients_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.transient_bytes
        )


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
    stage_forward_ms: list[float]
    stage_backward_ms: list[float]
    stage_send_ms: list[float]
    stage_saved_bytes: list[float]
    memory: list[RankMemory]
    violations: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.violations


@dataclass
class CostTables:
    """Prefix sums of per-layer figures for one (device class, tp, micro-batch size)."""

    layers: list[LayerCost]
    # by recompute mode: prefix of forward + backward ms, of backward ms, of saved bytes
    work: dict[str, list[float]]
    backward: dict[str, list[float]]
    saved: dict[str, list[float]]
    params: list[float]
    forward_compute: list[float]
    forward_tp: list[float]
    backward_compute: dict[str, list[float]]
    backward_tp: list[float]


def _prefix(values: list[float]) -> list[float]:
    return [0.0, *accumulate(values)]


class CostModel:
    """Costs plans of ``profile`` on ``cluster``.

    ``efficiency`` overrides the catalog's efficiency per GPU type name. Each GPU type's
    efficiency is resolved once, here, for the profile's dtype (``efficiency_for``: measured
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
            name: spec.model_copy(
                update={"efficiency": efficiency.get(name, efficiency_for(spec, profile.dtype))}
            )
            for name, spec in specs.items()
        }
        self.profile = profile
        self.cluster = cluster
        self.classes: list[DeviceClass] = device_classes(cluster, specs)
        self.num_layers = len(profile.layers)
        self.dtype_bytes = profile.dtype_bytes
        self.optimizer_bytes_per_param = optimizer_bytes_per_param(profile.dtype)
        self._peaks = [peak_tflops(c.gpu, profile.dtype) for c in self.classes]

    # ---- per-layer tables -------------------------------------------------------------
    @functools.lru_cache(maxsize=4096)  # noqa: B019 (the model lives as long as one solve)
    def tables(self, device_class: int, tp: int, micro_batch_size: int) -> CostTables:
        """Per-layer costs and their prefix sums for one (class, tp, micro-batch size)."""
        dc = self.classes[device_class]
        layers = [
            layer_cost(
                layer,
                dc.gpu,
                self._peaks[device_class],
                tp=tp,
                micro_batch_size=micro_batch_size,
                profile_micro_batch_size=self.profile.micro_batch_size,
                intra_node_bandwidth_gb_per_s=dc.intra_node_bandwidth_gb_per_s,
                intra_node_latency_us=dc.intra_node_latency_us,
            )
            for layer in self.profile.layers
        ]
        return CostTables(
            layers=layers,
            work={
                r: _prefix([c.forward_ms() + c.backward_ms(r) for c in layers])
                for r in RECOMPUTE_MODES
            },
            backward={r: _prefix([c.backward_ms(r) for c in layers]) for r in RECOMPUTE_MODES},
            saved={r: _prefix([c.saved_bytes[r] for c in layers]) for r in RECOMPUTE_MODES},
            params=_prefix([c.params_per_gpu for c in layers]),
            forward_compute=_prefix([c.forward_compute_ms for c in layers]),
            forward_tp=_prefix([c.forward_tp_comm_ms for c in layers]),
            backward_compute={
                r: _prefix(
                    [
                        c.backward_ms(r)
                        - c.backward_tp_comm_ms
                        - (c.forward_tp_comm_ms if r == "full" else 0.0)
                        for c in layers
                    ]
                )
                for r in RECOMPUTE_MODES
            },
            backward_tp=_prefix([c.backward_tp_comm_ms for c in layers]),
        )

    # ---- pieces shared by the search and the evaluation --------------------------------
    def static_bytes(
        self, params_per_gpu: float, dp: int, zero1: bool
    ) -> tuple[float, float, float]:
        """(weights, gradients, optimizer states) bytes of ``params_per_gpu`` parameters."""
        weights = params_per_gpu * self.dtype_bytes
        optimizer = params_per_gpu * self.optimizer_bytes_per_param
        if zero1 and dp > 1:
            optimizer /= dp
        return weights, weights, optimizer

    def transient_bytes(self, layer: LayerCost, recompute: str) -> float:
        """Largest temporary while one layer runs its backward."""
        if recompute == "none":
            return 2 * layer.output_bytes
        return layer.full_activation_bytes

    def send_ms(self, output_bytes: float, first: int, second: int, group_gpus: int) -> float:
        """One-way time of a boundary activation from a rank on class ``first`` to the next
        rank, on class ``second``."""
        bandwidth, latency = link_between(
            self.cluster, self.classes[first], self.classes[second], group_gpus
        )
        return p2p_ms(output_bytes, bandwidth, latency)

    def dp_allreduce_ms(self, params_per_gpu: float, device_class: int, dp: int, tp: int) -> float:
        """Gradient all-reduce of one rank's parameters over its dp group of one class."""
        # One ring per tp index: the tp rings leave each node together (devices.py).
        bandwidth, latency = self.classes[device_class].group_link(dp * tp, concurrent_flows=tp)
        return ring_allreduce_ms(params_per_gpu * self.dtype_bytes, dp, bandwidth, latency)

    def optimizer_ms(self, params_per_gpu: float, device_class: int, dp: int, zero1: bool) -> float:
        """Adam step, memory-bound: states read and written, gradient read, weight written."""
        params = params_per_gpu / dp if (zero1 and dp > 1) else params_per_gpu
        moved = params * (2 * self.optimizer_bytes_per_param + 2 * self.dtype_bytes)
        return moved / (self.classes[device_class].gpu.memory_bandwidth_gb_per_s * 1e9) * 1e3

    def peak_tflops_of(self, gpu_type: str) -> float:
        """Dense peak TFLOP/s of a GPU type of this cluster in the profile's dtype."""
        for c in self.classes:
            if c.gpu.name == gpu_type:
                return self._peaks[c.index]
        raise KeyError(gpu_type)

    def capacity_bytes(self, device_class: int) -> int:
        return self.classes[device_class].gpu.memory_bytes

    # ---- whole plans ---------------------------------------------------------------------
    def evaluate(self, config: PlanConfig) -> PlanCost:
        """Cost ``config`` layer by layer (module docstring). Infeasible configurations come
        back with ``violations`` naming what does not fit."""
        if config.replica_groups:
            return self._evaluate_shared(config)
        return self._evaluate_pipeline(config)

    def _stage_sums(self, stage: StageChoice, tp: int, mbs: int):
        tables = self.tables(stage.device_class, tp, mbs)
        layers = tables.layers[stage.layer_start : stage.layer_end]
        r = stage.recompute
        forward_compute = sum(c.forward_compute_ms for c in layers)
        forward_tp = sum(c.forward_tp_comm_ms for c in layers)
        backward_tp = sum(c.backward_tp_comm_ms for c in layers)
        backward = sum(c.backward_ms(r) for c in layers)
        params = sum(c.params_per_gpu for c in layers)
        saved = sum(c.saved_bytes[r] for c in layers)
        transient = max(self.transient_bytes(c, r) for c in layers)
        recompute_tp = forward_tp if r == "full" else 0.0
        return {
            "forward": forward_compute + forward_tp,
            "backward": backward,
            "compute": forward_compute + backward - backward_tp - recompute_tp,
            "tp": forward_tp + backward_tp + recompute_tp,
            "params": params,
            "saved": saved,
            "transient": transient,
            "output": layers[-1].output_bytes,
        }

    def _evaluate_pipeline(self, config: PlanConfig) -> PlanCost:
        pp, v, m = config.pipeline_degree, config.chunks, config.num_micro_batches
        group = config.dp * config.tp
        sums = [self._stage_sums(s, config.tp, config.micro_batch_size) for s in config.stages]
        sends = []
        for index, stage in enumerate(config.stages):
            if index + 1 < len(config.stages):
                nxt = config.stages[index + 1].device_class
                sends.append(self.send_ms(sums[index]["output"], stage.device_class, nxt, group))
            else:
                sends.append(0.0)
        rank_compute = [0.0] * pp  # forward + backward per micro-batch
        rank_sends = [0.0] * pp  # one-way sends per micro-batch
        rank_parts = [{"compute": 0.0, "tp": 0.0} for _ in range(pp)]
        rank_backward = [0.0] * pp
        rank_params = [0.0] * pp
        rank_saved_max = [0.0] * pp
        rank_transient = [0.0] * pp
        rank_class = [config.stages[r].device_class for r in range(pp)]
        for index, (stage, part) in enumerate(zip(config.stages, sums, strict=True)):
            r = index % pp
            rank_compute[r] += part["forward"] + part["backward"]
            rank_sends[r] += sends[index]
            rank_parts[r]["compute"] += part["compute"]
            rank_parts[r]["tp"] += part["tp"]
            rank_backward[r] += part["backward"]
            rank_params[r] += part["params"]
            rank_saved_max[r] = max(rank_saved_max[r], part["saved"])
            rank_transient[r] = max(rank_transient[r], part["transient"])
            if stage.device_class != rank_class[r]:
                raise ValueError("all stages of one pipeline rank must be on one device class")
        steady = [max(c, x) for c, x in zip(rank_compute, rank_sends, strict=True)]
        fill = [c + 2 * x for c, x in zip(rank_compute, rank_sends, strict=True)]
        pipeline = pipeline_time_ms(steady, m, v, fill)
        memory: list[RankMemory] = []
        tails, allreduces, exposed, optimizer = [], [], [], []
        violations = []
        for r in range(pp):
            k = rank_class[r]
            weights, grads, opt = self.static_bytes(rank_params[r], config.dp, config.zero1)
            flight = in_flight_chunks(config.schedule, pp, r, m, v)  # type: ignore[arg-type]
            mem = RankMemory(
                pipeline_rank=r,
                gpu_type=self.classes[k].gpu.name,
                weights_bytes=weights,
                gradients_bytes=grads,
                optimizer_bytes=opt,
                activations_bytes=flight * rank_saved_max[r],
                transient_bytes=rank_transient[r],
                capacity_bytes=self.capacity_bytes(k),
            )
            memory.append(mem)
            if mem.total_bytes > mem.capacity_bytes:
                violations.append(
                    f"pipeline rank {r} on {mem.gpu_type} needs {mem.total_bytes / 1e9:.2f} GB; "
                    f"it has {mem.capacity_bytes / 1e9:.2f} GB"
                )
            ar = self.dp_allreduce_ms(rank_params[r], k, config.dp, config.tp)
            step = self.optimizer_ms(rank_params[r], k, config.dp, config.zero1)
            hidden = max(0.0, ar - rank_backward[r])
            allreduces.append(ar)
            exposed.append(hidden)
            optimizer.append(step)
            tails.append(hidden + step)
        tail_rank = max(range(pp), key=lambda r: (tails[r], -r))
        slow = max(range(pp), key=lambda r: (steady[r], -r))
        return PlanCost(
            iteration_ms=pipeline + tails[tail_rank],
            pipeline_ms=pipeline,
            tail_ms=tails[tail_rank],
            compute_ms=m * rank_parts[slow]["compute"],
            tp_comm_ms=m * rank_parts[slow]["tp"],
            pp_comm_ms=m * (steady[slow] - rank_compute[slow]),
            bubble_ms=pipeline - m * steady[slow],
            dp_comm_ms=exposed[tail_rank],
            optimizer_ms=optimizer[tail_rank],
            dp_allreduce_ms=max(allreduces),
            rank_allreduce_ms=allreduces,
            stage_forward_ms=[p["forward"] for p in sums],
            stage_backward_ms=[p["backward"] for p in sums],
            stage_send_ms=sends,
            stage_saved_bytes=[p["saved"] for p in sums],
            memory=memory,
            violations=violations,
        )

    def _evaluate_shared(self, config: PlanConfig) -> PlanCost:
        """One stage, replicas on several classes with their own micro-batch sizes."""
        m = config.num_micro_batches
        stage = config.stages[0]
        groups_names: set[str] = set()
        works, backwards, parts, memory, violations, steps = [], [], [], [], [], []
        params = 0.0
        for g in config.replica_groups:
            groups_names |= set(self.classes[g.device_class].groups)
            choice = StageChoice(stage.layer_start, stage.layer_end, g.device_class, g.recompute)
            part = self._stage_sums(choice, config.tp, g.micro_batch_size)
            params = part["params"]
            works.append(part["forward"] + part["backward"])
            backwards.append(part["backward"])
            parts.append(part)
            weights, grads, opt = self.static_bytes(part["params"], config.dp, config.zero1)
            mem = RankMemory(
                pipeline_rank=0,
                gpu_type=self.classes[g.device_class].gpu.name,
                weights_bytes=weights,
                gradients_bytes=grads,
                optimizer_bytes=opt,
                activations_bytes=part["saved"],
                transient_bytes=part["transient"],
                capacity_bytes=self.capacity_bytes(g.device_class),
            )
            memory.append(mem)
            if mem.total_bytes > mem.capacity_bytes:
                violations.append(
                    f"replicas on {mem.gpu_type} need {mem.total_bytes / 1e9:.2f} GB; "
                    f"they have {mem.capacity_bytes / 1e9:.2f} GB"
                )
            steps.append(self.optimizer_ms(part["params"], g.device_class, config.dp, config.zero1))
        ar = self.shared_allreduce_ms(params, config)
        hidden = max(0.0, ar - min(backwards))
        step = max(steps)
        slow = max(range(len(works)), key=lambda i: (works[i], -i))
        pipeline = m * works[slow]
        return PlanCost(
            iteration_ms=pipeline + hidden + step,
            pipeline_ms=pipeline,
            tail_ms=hidden + step,
            compute_ms=m * parts[slow]["compute"],
            tp_comm_ms=m * parts[slow]["tp"],
            pp_comm_ms=0.0,
            bubble_ms=0.0,
            dp_comm_ms=hidden,
            optimizer_ms=step,
            dp_allreduce_ms=ar,
            rank_allreduce_ms=[ar],
            stage_forward_ms=[parts[slow]["forward"]],
            stage_backward_ms=[parts[slow]["backward"]],
            stage_send_ms=[0.0],
            stage_saved_bytes=[parts[slow]["saved"]],
            memory=memory,
            violations=violations,
        )

    def shared_allreduce_ms(self, params_per_gpu: float, config: PlanConfig) -> float:
        """Gradient all-reduce across replicas on several classes: between nodes, on the
        slowest link joining their groups, whose node bandwidth the tp rings share."""
        names: set[str] = set()
        flows = 1
        for g in config.replica_groups:
            dc = self.classes[g.device_class]
            names |= set(dc.groups)
            flows = max(flows, node_flows(config.tp, dc.gpus_per_node))
        bandwidth = self.cluster.inter_node_bandwidth(names) / flows
        return ring_allreduce_ms(
            params_per_gpu * self.dtype_bytes,
            config.dp,
            bandwidth,
            self.cluster.inter_node_latency_us,
        )
