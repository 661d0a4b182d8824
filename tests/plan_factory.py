"""Hand-built plans for tests of the parts that read plans (runtime, simulator, validator).

These plans are not solved: their prediction is made up from the given stage timings so that
readers of plans can be tested without the solver. Tests of the solver use the solver.

``make_plan`` builds the uniform shape (every stage dp replicas of tp GPUs, one DeviceMesh);
``make_stages_plan`` builds any heterogeneous shape from per-stage replica lists.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.catalog import gpu_specs
from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup
from autoplan.plan.schema import (
    MemoryEstimate,
    Parallelism,
    Plan,
    PlanInputs,
    PlanNode,
    Prediction,
    RankEntry,
    Recompute,
    Replica,
    Stage,
    StageTiming,
    TimeBreakdown,
)
from autoplan.profile.schema import ModelRef
from autoplan.schedule.names import ScheduleName

__all__ = ["CPU_GPU", "ReplicaSpec", "local_cluster", "make_plan", "make_stages_plan"]

CPU_GPU = GpuSpec(
    name="cpu",
    memory_gib=8,
    memory_bandwidth_gb_per_s=20,
    peak_tflops={"fp32": 0.1, "fp64": 0.05, "bf16": 0.1},
    efficiency=0.5,
    datasheet_url="test fixture",
)


def local_cluster(gpus: int = 4) -> Cluster:
    """One node of ``gpus`` CPU 'devices': what ``autoplan run --local`` runs on."""
    return Cluster(
        name="test-local",
        gpu_types=[CPU_GPU],
        node_groups=[
            NodeGroup(name="local", gpu="cpu", gpus_per_node=gpus, intra_node_bandwidth_gb_per_s=5)
        ],
        inter_node_bandwidth_gb_per_s=1,
    )


@dataclass(frozen=True)
class ReplicaSpec:
    """One replica of a hand-built stage: ``tp`` GPUs on node ``node`` (index into the
    cluster's nodes), ``share`` samples per micro-batch, ``recompute``, ``offload``."""

    tp: int = 1
    share: int = 1
    recompute: Recompute = "none"
    node: int = 0
    offload: bool = False


def _parameter_count(model: str) -> int:
    """0 (unchecked) except for a Hugging Face config, whose count the runtime checks (the
    config file is read again at run time); the zoo is imported only then (it needs torch)."""
    if not model.startswith("hf:"):
        return 0
    from autoplan.zoo import get_model_spec

    return get_model_spec(model).parameter_count()


def make_stages_plan(
    stage_layers: list[int],
    stage_replicas: list[list[ReplicaSpec]],
    *,
    model: str = "gpt-tiny",
    num_model_layers: int | None = None,
    layer_modules: list[str] | None = None,
    virtual_stages_per_rank: int = 1,
    schedule: ScheduleName = "1f1b",
    num_micro_batches: int = 4,
    zero1: bool = False,
    zero_stage: int | None = None,
    sequence_parallel: bool = False,
    dtype: str = "fp64",
    seq_len: int = 16,
    stage_timings: list[StageTiming] | None = None,
    dp_allreduce_ms: float = 0.0,
    cluster: Cluster | None = None,
) -> Plan:
    """A plan whose stage i holds ``stage_layers[i]`` layers on the replicas of the pipeline
    rank that runs it (``stage_replicas[rank]``; rank ``i % pp``, or the V of the zbv and
    dualpipev schedules). ``zero_stage`` (default 1 if ``zero1`` else 0) applies to every
    stage with more than one replica.

    GPUs are handed out node by node in order of first use (pipeline rank, then replica, then
    tp index); a node's ranks follow those of the nodes used before it, as torchrun numbers
    them."""
    num_stages = len(stage_layers)
    pipeline = num_stages // virtual_stages_per_rank
    if len(stage_replicas) != pipeline:
        raise ValueError(f"{len(stage_replicas)} replica lists for {pipeline} pipeline ranks")
    world = sum(spec.tp for replicas in stage_replicas for spec in replicas)
    cluster = cluster or local_cluster(max(world, 1))
    cluster_nodes = cluster.nodes()

    # Local ranks per node in order of use, then global ranks node by node.
    order: list[int] = []
    slots: list[list[tuple[int, int, int, int]]] = []  # per (p, d): (node, local) per tp
    used: dict[int, int] = {}
    for p, replicas in enumerate(stage_replicas):
        for d, spec in enumerate(replicas):
            if spec.node not in used:
                used[spec.node] = 0
                order.append(spec.node)
            first = used[spec.node]
            used[spec.node] = first + spec.tp
            slots.append([(spec.node, first + t, p, d) for t in range(spec.tp)])
    offset, start = 0, {}
    for node in order:
        start[node] = offset
        offset += used[node]
    entries: list[RankEntry] = []
    ranks_of: dict[tuple[int, int], list[int]] = {}
    node_rank = {node: index for index, node in enumerate(order)}
    for slot in slots:
        for tp_index, (node, local, p, d) in enumerate(slot):
            rank = start[node] + local
            ranks_of.setdefault((p, d), []).append(rank)
            entries.append(
                RankEntry(
                    rank=rank,
                    node=cluster_nodes[node].name,
                    node_rank=node_rank[node],
                    local_rank=local,
                    gpu_type=cluster_nodes[node].gpu,
                    pipeline_rank=p,
                    dp_index=d,
                    tp_index=tp_index,
                )
            )
    entries.sort(key=lambda entry: entry.rank)
    nodes = [
        PlanNode(
            node_rank=node_rank[node],
            name=cluster_nodes[node].name,
            gpu_type=cluster_nodes[node].gpu,
            nproc_per_node=used[node],
        )
        for node in order
    ]
    micro_batch = sum(spec.share for spec in stage_replicas[0])
    bounds = [sum(stage_layers[:i]) for i in range(num_stages + 1)]
    stages = []
    parallelism = Parallelism(
        pipeline_degree=pipeline,
        virtual_stages_per_rank=virtual_stages_per_rank,
        schedule=schedule,
        num_micro_batches=num_micro_batches,
        micro_batch_size=micro_batch,
        sequence_parallel=sequence_parallel,
    )
    level = zero_stage if zero_stage is not None else int(zero1)
    for i in range(num_stages):
        p = parallelism.rank_of_stage(i)
        stages.append(
            Stage(
                index=i,
                pipeline_rank=p,
                layer_start=bounds[i],
                layer_end=bounds[i + 1],
                replicas=[
                    Replica(
                        gpu_type=cluster_nodes[spec.node].gpu,
                        node=cluster_nodes[spec.node].name,
                        tensor_parallel_degree=spec.tp,
                        ranks=ranks_of[(p, d)],
                        micro_batch_size=spec.share,
                        recompute=spec.recompute,
                        offload=spec.offload,
                    )
                    for d, spec in enumerate(stage_replicas[p])
                ],
                zero_stage=level if len(stage_replicas[p]) > 1 else 0,  # type: ignore[arg-type]
            )
        )
    timings = stage_timings or [
        StageTiming(stage=i, forward_ms=1.0, backward_ms=2.0, send_ms=0.0)
        for i in range(num_stages)
    ]
    compute_ms = sum(t.forward_ms + t.backward_ms for t in timings) * num_micro_batches
    iteration_ms = compute_ms + dp_allreduce_ms
    global_batch = micro_batch * num_micro_batches
    specs = gpu_specs(cluster)
    kinds = sorted(
        {
            (p, cluster_nodes[spec.node].gpu, spec.tp, spec.share)
            for p, replicas in enumerate(stage_replicas)
            for spec in replicas
        }
    )
    prediction = Prediction(
        iteration_time_ms=iteration_ms,
        breakdown=TimeBreakdown(
            compute_ms=compute_ms,
            bubble_ms=0,
            tp_comm_ms=0,
            pp_comm_ms=0,
            dp_comm_ms=dp_allreduce_ms,
            optimizer_ms=0,
        ),
        samples_per_s=global_batch / iteration_ms * 1000,
        tokens_per_s=global_batch * seq_len / iteration_ms * 1000,
        model_flops_per_iteration=0,
        tflops_per_gpu=0,
        mfu=0,
        stage_timings=timings,
        dp_allreduce_ms=dp_allreduce_ms,
        memory=[
            MemoryEstimate(
                pipeline_rank=p,
                gpu_type=gpu_type,
                tensor_parallel_degree=tp,
                micro_batch_size=share,
                weights_bytes=0,
                gradients_bytes=0,
                optimizer_bytes=0,
                activations_bytes=0,
                transient_bytes=0,
                total_bytes=0,
                capacity_bytes=specs[gpu_type].memory_bytes,
            )
            for p, gpu_type, tp, share in kinds
        ],
    )
    total_layers = num_model_layers if num_model_layers is not None else bounds[-1]
    return Plan(
        inputs=PlanInputs(
            model=ModelRef(
                name=model,
                parameter_count=_parameter_count(model),
                num_layers=total_layers,
                layer_modules=layer_modules,
            ),
            profile_sha256="hand-made",
            seq_len=seq_len,
            dtype=dtype,
            cluster=cluster,
            global_batch_size=global_batch,
            strategy="hand-made",
        ),
        parallelism=parallelism,
        stages=stages,
        nodes=nodes,
        rank_map=entries,
        prediction=prediction,
    )


def make_plan(
    layer_split: list[int],
    *,
    model: str = "gpt-tiny",
    num_model_layers: int | None = None,
    layer_modules: list[str] | None = None,
    data_parallel: int = 1,
    tensor_parallel: int = 1,
    virtual_stages_per_rank: int = 1,
    schedule: ScheduleName = "1f1b",
    num_micro_batches: int = 4,
    micro_batch_size: int = 2,
    replica_micro_batch_sizes: list[int] | None = None,
    recompute: Recompute = "none",
    offload: bool = False,
    zero1: bool = False,
    zero_stage: int | None = None,
    sequence_parallel: bool = False,
    dtype: str = "fp64",
    seq_len: int = 16,
    stage_timings: list[StageTiming] | None = None,
    dp_allreduce_ms: float = 0.0,
    cluster: Cluster | None = None,
) -> Plan:
    """A uniform plan whose stage i holds ``layer_split[i]`` layers, on one local node:
    every pipeline rank has ``data_parallel`` replicas of ``tensor_parallel`` GPUs, replica d
    taking ``replica_micro_batch_sizes[d]`` (default ``micro_batch_size``) samples."""
    pipeline = len(layer_split) // virtual_stages_per_rank
    shares = replica_micro_batch_sizes or [micro_batch_size] * data_parallel
    replicas = [
        [
            ReplicaSpec(tp=tensor_parallel, share=share, recompute=recompute, offload=offload)
            for share in shares
        ]
        for _ in range(pipeline)
    ]
    return make_stages_plan(
        layer_split,
        replicas,
        model=model,
        num_model_layers=num_model_layers,
        layer_modules=layer_modules,
        virtual_stages_per_rank=virtual_stages_per_rank,
        schedule=schedule,
        num_micro_batches=num_micro_batches,
        zero1=zero1,
        zero_stage=zero_stage,
        sequence_parallel=sequence_parallel,
        dtype=dtype,
        seq_len=seq_len,
        stage_timings=stage_timings,
        dp_allreduce_ms=dp_allreduce_ms,
        cluster=cluster,
    )
