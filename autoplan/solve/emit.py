"""From a costed configuration to the Plan file: placement on nodes, rank map, prediction."""

from __future__ import annotations

import dataclasses
import math

from autoplan.cost.config import PlanConfig, StageChoice, canonical_sequence_parallel
from autoplan.cost.model import CostModel, PlanCost, RankMemory
from autoplan.cost.zero_bubble import group_weight_gradient_ms
from autoplan.plan.fingerprint import costed_sha256
from autoplan.plan.ranks import build_rank_map
from autoplan.plan.schema import (
    Alternative,
    IdleGpus,
    MemoryEstimate,
    Parallelism,
    Plan,
    PlanInputs,
    Prediction,
    Replica,
    ReplicaTiming,
    Stage,
    StageTiming,
    TimeBreakdown,
)
from autoplan.plan.stage_spec import StageSpec, format_stage_specs, written_stage
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve.placement import place

__all__ = [
    "alternative_records",
    "config_stage_specs",
    "emit_plan",
    "model_flops_per_iteration",
    "stage_types",
    "with_fingerprint",
]


def _round(value: float) -> float:
    # Rounded so that plan files stay readable; the rounding is deterministic. Six decimals,
    # and six significant digits for a figure under 1: six decimals alone leave a tiny one
    # (the TFLOP/s per GPU of a slow CPU "GPU", ~1e-5) off by more than the 1% the validator
    # checks it to, and `autoplan run` would refuse the plan that `solve` just wrote.
    if value == 0 or not math.isfinite(value) or abs(value) >= 1:
        return round(value, 6)
    return round(value, max(6, 5 - math.floor(math.log10(abs(value)))))


def _replica_order(stage: StageChoice) -> list[tuple[int, int]]:
    """(group, replica) of each of the stage's replicas in plan order: group by group, or,
    where its expert groups span its groups (``StageChoice.experts``), expert group by expert
    group, each taking replicas / k of every group in turn (the plan's expert groups are ep
    consecutive replicas)."""
    if not stage.experts:
        return [(g, r) for g, group in enumerate(stage.groups) for r in range(group.replicas)]
    k = stage.replicas // stage.ep  # expert groups
    order: list[tuple[int, int]] = []
    for e in range(k):
        for g, group in enumerate(stage.groups):
            count = group.replicas // k
            order.extend((g, e * count + r) for r in range(count))
    return order


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
        tensor_parallel_degree=mem.tensor_parallel_degree,
        micro_batch_size=mem.micro_batch_size,
        total_bytes=sum(parts.values()),
        reserved_bytes=mem.reserved_bytes,
        capacity_bytes=mem.capacity_bytes,
        **parts,
    )


def stage_types(model: CostModel, config: PlanConfig) -> list[str]:
    """Each stage's GPU types, '+'-joined when it mixes several."""
    out = []
    for stage in config.stages:
        names: list[str] = []
        for group in stage.groups:
            name = model.classes[group.device_class].gpu.name
            if name not in names:
                names.append(name)
        out.append("+".join(names))
    return out


def _idle(model: CostModel, config: PlanConfig) -> list[IdleGpus]:
    """GPUs the plan leaves unused per type, and why using them would not pay."""
    by_type: dict[str, int] = {}
    smallest_layer: dict[str, bool] = {}
    most_replicas = max(stage.replicas for stage in config.stages)
    for c in model.classes:
        idle = c.total_gpus - config.gpus_of(c.index)
        if idle <= 0:
            continue
        by_type[c.gpu.name] = by_type.get(c.gpu.name, 0) + idle
        per_param = model.static_bytes_per_param(1, False)
        fits = any(
            layer.params_per_gpu * per_param <= model.usable_bytes(c.index)
            for layer in model.tables(c.index, 1, 1).layers
        )
        smallest_layer[c.gpu.name] = smallest_layer.get(c.gpu.name, False) or fits
    out = []
    for name, count in by_type.items():
        if not smallest_layer[name]:
            reason = "no memory to hold a stage: one GPU cannot hold any single layer's states"
        elif most_replicas >= config.micro_batch_size:
            reason = (
                "every sample of a micro-batch already has a replica: a stage cannot take "
                "more replicas at this micro-batch size, and a plan with larger micro-batches "
                "or more stages on them is slower"
            )
        else:
            reason = (
                "slower than the stages they would join: every plan the search costed with "
                "them (more replicas in a stage, or stages of their own) is slower"
            )
        out.append(IdleGpus(gpu_type=name, count=count, reason=reason))
    return out


def emit_plan(
    model: CostModel,
    config: PlanConfig,
    cost: PlanCost,
    inputs: PlanInputs,
    alternatives: list[tuple[PlanConfig, PlanCost]],
) -> Plan:
    """The Plan of ``config`` (costed as ``cost``), with runner-ups as alternatives.

    Raises ValueError when the configuration does not fit the cluster's nodes."""
    # Sequence parallelism said one way (plan-wide where every stage with tp runs it, else per
    # stage, never on a stage without tp): equal plans write equal files. The cost is the
    # same: a stage without tp runs the same with or without it.
    config = canonical_sequence_parallel(config)
    pp = config.pipeline_degree
    placement = place(model, config)
    nodes, rank_map, ranks = build_rank_map(placement)
    # A stage whose expert groups span its groups lists its replicas in another order than
    # group by group (``_replica_order``): its ranks' dp_index follow that order.
    dp_index: dict[int, int] = {}
    for p, stage in enumerate(config.stages[:pp]):
        if stage.experts:
            for index, (g, r) in enumerate(_replica_order(stage)):
                dp_index.update(dict.fromkeys(ranks[p][g][r], index))
    rank_map = [
        e.model_copy(update={"dp_index": dp_index[e.rank]}) if e.rank in dp_index else e
        for e in rank_map
    ]
    parallelism = Parallelism(
        pipeline_degree=pp,
        virtual_stages_per_rank=config.chunks,
        schedule=config.schedule,  # type: ignore[arg-type]
        num_micro_batches=config.num_micro_batches,
        micro_batch_size=config.micro_batch_size,
        sequence_parallel=config.sequence_parallel,
        executor=config.executor,
    )
    stages = []
    timings = []
    for s, (stage, stage_cost) in enumerate(zip(config.stages, cost.stages, strict=True)):
        p = parallelism.rank_of_stage(s)
        # Zero-bubble plans split each backward into I and W; the simulator plays the split.
        split = config.schedule in ZERO_BUBBLE_SCHEDULES
        weight_ms = [
            _round(group_weight_gradient_ms(model, stage, g, config.sequence_parallel))
            if split
            else None
            for g in range(len(stage.groups))
        ]
        replicas = []
        replica_timings = []
        for g, r in _replica_order(stage):
            group, group_cost, slots = stage.groups[g], stage_cost.groups[g], placement[p][g][r]
            replicas.append(
                Replica(
                    gpu_type=slots.node.gpu,
                    node=slots.node.name,
                    tensor_parallel_degree=group.tp,
                    context_parallel_degree=group.cp,
                    ranks=ranks[p][g][r],
                    micro_batch_size=group.micro_batch_size,
                    recompute=group.recompute,  # type: ignore[arg-type]
                    offload=group.offload,
                    routed_experts=stage.experts[g] if stage.experts else None,
                )
            )
            replica_timings.append(
                ReplicaTiming(
                    forward_ms=_round(group_cost.forward_ms),
                    backward_ms=_round(group_cost.backward_ms),
                    saved_activation_bytes=round(group_cost.saved_bytes),
                    measured_layers=sum(
                        layer.measured
                        for layer in model.tables(
                            group.device_class, group.tp, group.micro_batch_size
                        ).layers[stage.layer_start : stage.layer_end]
                    ),
                    weight_gradient_ms=weight_ms[g],
                )
            )
        stages.append(
            Stage(
                index=s,
                pipeline_rank=p,
                layer_start=stage.layer_start,
                layer_end=stage.layer_end,
                replicas=replicas,
                zero_stage=stage.zero_stage,  # type: ignore[arg-type]
                expert_parallel_degree=stage.ep,
                sequence_parallel=stage.sequence_parallel,
            )
        )
        timings.append(
            StageTiming(
                stage=s,
                forward_ms=_round(stage_cost.forward_ms),
                backward_ms=_round(stage_cost.backward_ms),
                send_ms=_round(stage_cost.send_ms),
                saved_activation_bytes=round(stage_cost.saved_bytes),
                weight_gradient_ms=weight_ms[
                    max(range(len(stage.groups)), key=lambda g: stage_cost.groups[g].backward_ms)
                ],
                replicas=replica_timings,
            )
        )
    batch = inputs.global_batch_size
    seconds = cost.iteration_ms / 1e3
    flops = model_flops_per_iteration(model, batch)
    peak = sum(model.peak_tflops_of(entry.gpu_type) for entry in rank_map)
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
        tflops_per_gpu=_round(flops / seconds / len(rank_map) / 1e12),
        mfu=_round(flops / seconds / (peak * 1e12)) if peak else 0.0,
        stage_timings=timings,
        dp_allreduce_ms=_round(cost.dp_allreduce_ms),
        rank_dp_allreduce_ms=[_round(value) for value in cost.rank_allreduce_ms],
        memory=[_memory_estimate(mem) for mem in cost.memory],
        idle_gpus=_idle(model, config),
    )
    plan = Plan(
        inputs=inputs,
        parallelism=parallelism,
        stages=stages,
        nodes=nodes,
        rank_map=rank_map,
        prediction=prediction,
        alternatives=alternative_records(model, alternatives, batch),
    )
    if config.executor == "mesh" and not plan.runs_on_mesh():
        # Priced for the mesh executor but placed where one mesh cannot hold it (or with
        # expert parallelism, which runs on per-stage groups only): priced again as the groups
        # executor runs it, so that the prediction is what the runtime will do.
        groups = dataclasses.replace(config, executor="groups")
        return emit_plan(model, groups, model.evaluate(groups), inputs, alternatives)
    return with_fingerprint(plan)


def alternative_records(
    model: CostModel, alternatives: list[tuple[PlanConfig, PlanCost]], batch: int
) -> list[Alternative]:
    """The plan's summaries of runner-ups (best first) at a global batch of ``batch``."""
    return [
        Alternative(
            rank=i + 1,
            summary=_summary(model, alt),
            layer_split=[s.num_layers for s in alt.stages],
            gpu_types=stage_types(model, alt),
            iteration_time_ms=_round(alt_cost.iteration_ms),
            samples_per_s=_round(batch / (alt_cost.iteration_ms / 1e3)),
        )
        for i, (alt, alt_cost) in enumerate(alternatives)
    ]


def with_fingerprint(plan: Plan) -> Plan:
    """``plan`` with its prediction marked as computed for its present stages and inputs."""
    prediction = plan.prediction.model_copy(update={"costed_sha256": costed_sha256(plan)})
    return plan.model_copy(update={"prediction": prediction})


def _class_name(model: CostModel, index: int) -> str:
    """A device class as a stage spec names it: its GPU type, or its first node group where
    the type has several classes."""
    gpu = model.classes[index].gpu.name
    if sum(c.gpu.name == gpu for c in model.classes) == 1:
        return gpu
    return model.classes[index].groups[0]


def config_stage_specs(model: CostModel, config: PlanConfig) -> list[StageSpec]:
    """``config``'s stages in ``autoplan cost --stages`` notation (``plan.stage_spec``)."""
    return [
        written_stage(
            stage.layer_start,
            stage.layer_end - 1,
            [
                (
                    _class_name(model, g.device_class),
                    g.replicas,
                    g.tp,
                    g.micro_batch_size,
                    g.recompute,
                    g.offload,
                    g.cp,
                )
                for g in stage.groups
            ],
            stage.zero_stage,
            stage.ep,
            stage.experts,
            stage.sequence_parallel,
        )
        for stage in config.stages
    ]


def _summary(model: CostModel, config: PlanConfig) -> str:
    """The pipeline's knobs, then its stages as ``autoplan cost --stages`` takes them
    (inclusive layer ranges): 'pp=2 m=8 1f1b | A100-80GB*4:L0-11:tp1:mb2 | ...'; sequence
    parallelism as ' sp' after the schedule where every stage with tp runs it, else as the
    stages' own ':sp'."""
    config = canonical_sequence_parallel(config)
    chunks = f" v={config.chunks}" if config.chunks > 1 else ""
    sp = " sp" if config.sequence_parallel else ""
    head = f"pp={config.pipeline_degree} m={config.num_micro_batches} {config.schedule}{chunks}{sp}"
    return f"{head} | {format_stage_specs(config_stage_specs(model, config))}"
