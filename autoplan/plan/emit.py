"""From a costed configuration to the Plan file: placement on nodes, rank map, prediction."""

from __future__ import annotations

from typing import Literal

from autoplan.cluster.schema import Node
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel, PlanCost, RankMemory
from autoplan.plan.ranks import NodeSlice, build_rank_map
from autoplan.plan.schema import (
    Alternative,
    MemoryEstimate,
    Parallelism,
    Plan,
    PlanInputs,
    Prediction,
    Stage,
    StageTiming,
    TimeBreakdown,
)

__all__ = ["Placement", "emit_plan", "model_flops_per_iteration", "place"]

Placement = Literal["by_class", "file_order"]


def _round(value: float) -> float:
    # Rounded so that plan files stay readable; the rounding is deterministic.
    return round(value, 6)


def model_flops_per_iteration(model: CostModel, global_batch_size: int) -> float:
    """Forward + backward FLOPs of the profile (no recompute), scaled to the global batch."""
    profile = model.profile
    per_micro = sum(layer.forward_flops + layer.backward_flops for layer in profile.layers)
    return per_micro / profile.micro_batch_size * global_batch_size


def _memory_estimate(mem: RankMemory) -> MemoryEstimate:
    """Whole bytes per category; the total is the sum of the rounded parts, so that it adds up
    exactly (rounding the float total separately can differ by a byte)."""
    parts = {
        "weights_bytes": round(mem.weights_bytes),
        "gradients_bytes": round(mem.gradients_bytes),
        "optimizer_bytes": round(mem.optimizer_bytes),
        "activations_bytes": round(mem.activations_bytes),
        "transient_bytes": round(mem.transient_bytes),
    }
    return MemoryEstimate(
        pipeline_rank=mem.pipeline_rank,
        gpu_type=mem.gpu_type,
        total_bytes=sum(parts.values()),
        capacity_bytes=mem.capacity_bytes,
        **parts,
    )


def _take(cursor: dict[str, int], nodes: list[Node], gpus: int, tp: int) -> list[NodeSlice]:
    """``gpus`` GPUs from ``nodes`` in order, whole tp groups per node."""
    slices = []
    for node in nodes:
        if gpus == 0:
            break
        free = node.gpus - cursor.get(node.name, 0)
        free -= free % tp
        if free <= 0:
            continue
        used = min(free, gpus)
        slices.append(NodeSlice(node=node, gpus=used))
        cursor[node.name] = cursor.get(node.name, 0) + used
        gpus -= used
    if gpus:
        raise ValueError(f"not enough GPUs left for a group of {gpus} more")
    return slices


def place(model: CostModel, config: PlanConfig, mode: Placement = "by_class"):
    """The node slices of each pipeline rank: ``by_class`` takes each rank's GPUs from the
    nodes of its device class (file order within the class); ``file_order`` hands out the
    cluster's nodes in file order regardless of class (how a heterogeneity-blind planner
    places ranks)."""
    nodes = model.cluster.nodes()
    cursor: dict[str, int] = {}
    group = config.dp * config.tp
    if mode == "file_order":
        return [_take(cursor, nodes, group, config.tp) for _ in range(config.pipeline_degree)]
    of_class = {c.index: [n for n in nodes if n.group in c.groups] for c in model.classes}
    if config.replica_groups:
        slices = []
        for g in config.replica_groups:
            slices += _take(cursor, of_class[g.device_class], g.replicas * config.tp, config.tp)
        return [slices]
    return [
        _take(cursor, of_class[config.stages[r].device_class], group, config.tp)
        for r in range(config.pipeline_degree)
    ]


def _types(slices: list[NodeSlice]) -> list[str]:
    seen: list[str] = []
    for piece in slices:
        if piece.node.gpu not in seen:
            seen.append(piece.node.gpu)
    return seen


def emit_plan(
    model: CostModel,
    config: PlanConfig,
    cost: PlanCost,
    inputs: PlanInputs,
    alternatives: list[tuple[PlanConfig, PlanCost]],
    placement: Placement = "by_class",
) -> Plan:
    """The Plan of ``config`` (costed as ``cost``), with runner-ups as alternatives."""
    slices = place(model, config, placement)
    nodes, ranks = build_rank_map(slices, config.dp, config.tp)
    pp = config.pipeline_degree
    if config.replica_groups:
        shares = [g.micro_batch_size for g in config.replica_groups for _ in range(g.replicas)]
    else:
        shares = [config.micro_batch_size] * config.dp
    parallelism = Parallelism(
        pipeline_degree=pp,
        data_parallel_degree=config.dp,
        tensor_parallel_degree=config.tp,
        virtual_stages_per_rank=config.chunks,
        schedule=config.schedule,  # type: ignore[arg-type]
        num_micro_batches=config.num_micro_batches,
        replica_micro_batch_sizes=shares,
        zero1=config.zero1,
    )
    stages = [
        Stage(
            index=s,
            pipeline_rank=s % pp,
            layer_start=stage.layer_start,
            layer_end=stage.layer_end,
            gpu_types=_types(slices[s % pp]),
            recompute=stage.recompute,  # type: ignore[arg-type]
        )
        for s, stage in enumerate(config.stages)
    ]
    if config.replica_groups:
        modes = {g.recompute for g in config.replica_groups}
        if len(modes) > 1:
            # One Stage carries one recompute mode: the runtime applies the strongest.
            order = ["none", "selective", "full"]
            strongest = max(modes, key=order.index)
            stages = [stages[0].model_copy(update={"recompute": strongest})]
    batch = inputs.global_batch_size
    seconds = cost.iteration_ms / 1e3
    flops = model_flops_per_iteration(model, batch)
    peak = sum(model.peak_tflops_of(entry.gpu_type) for entry in ranks)
    prediction = Prediction(
        iteration_time_ms=_round(cost.iteration_ms),
        breakdown=TimeBreakdown(
            compute_ms=_round(cost.compute_ms),
            bubble_ms=_round(max(0.0, cost.bubble_ms)),
            tp_comm_ms=_round(cost.tp_comm_ms),
            pp_comm_ms=_round(cost.pp_comm_ms),
            dp_comm_ms=_round(cost.dp_comm_ms),
            optimizer_ms=_round(cost.optimizer_ms),
        ),
        samples_per_s=_round(batch / seconds),
        tokens_per_s=_round(batch * model.profile.seq_len / seconds),
        model_flops_per_iteration=flops,
        tflops_per_gpu=_round(flops / seconds / len(ranks) / 1e12),
        mfu=_round(flops / seconds / (peak * 1e12)) if peak else 0.0,
        stage_timings=[
            StageTiming(
                stage=s,
                forward_ms=_round(cost.stage_forward_ms[s]),
                backward_ms=_round(cost.stage_backward_ms[s]),
                send_ms=_round(cost.stage_send_ms[s]),
                saved_activation_bytes=round(cost.stage_saved_bytes[s]),
            )
            for s in range(len(cost.stage_forward_ms))
        ]
        if not config.replica_groups
        else [
            StageTiming(
                stage=0,
                forward_ms=_round(cost.stage_forward_ms[0]),
                backward_ms=_round(cost.stage_backward_ms[0]),
                send_ms=0.0,
                saved_activation_bytes=round(cost.stage_saved_bytes[0]),
            )
        ],
        dp_allreduce_ms=_round(cost.dp_allreduce_ms),
        rank_dp_allreduce_ms=[_round(value) for value in cost.rank_allreduce_ms],
        memory=[_memory_estimate(mem) for mem in cost.memory],
    )
    return Plan(
        inputs=inputs,
        parallelism=parallelism,
        stages=stages,
        nodes=nodes,
        rank_map=ranks,
        prediction=prediction,
        alternatives=[
            Alternative(
                rank=i + 1,
                summary=alt.summary(),
                layer_split=[s.layer_end - s.layer_start for s in alt.stages],
                gpu_types=[model.classes[s.device_class].gpu.name for s in alt.stages],
                iteration_time_ms=_round(alt_cost.iteration_ms),
                samples_per_s=_round(batch / (alt_cost.iteration_ms / 1e3)),
            )
            for i, (alt, alt_cost) in enumerate(alternatives)
        ],
    )
