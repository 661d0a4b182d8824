"""Hand-built plans for tests of the parts that read plans (runtime, simulator, validator).

These plans are not solved: their prediction is made up from the given stage timings so that
readers of plans can be tested without the solver. Tests of the solver use the solver.
"""

from __future__ import annotations

from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup
from autoplan.plan.ranks import NodeSlice, build_rank_map
from autoplan.plan.schema import (
    MemoryEstimate,
    Parallelism,
    Plan,
    PlanInputs,
    Prediction,
    Recompute,
    ScheduleName,
    Stage,
    StageTiming,
    TimeBreakdown,
)
from autoplan.profile.schema import ModelRef

__all__ = ["CPU_GPU", "local_cluster", "make_plan"]

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


def make_plan(
    layer_split: list[int],
    *,
    model: str = "gpt-tiny",
    num_model_layers: int | None = None,
    data_parallel: int = 1,
    tensor_parallel: int = 1,
    virtual_stages_per_rank: int = 1,
    schedule: ScheduleName = "1f1b",
    num_micro_batches: int = 4,
    micro_batch_size: int = 2,
    replica_micro_batch_sizes: list[int] | None = None,
    recompute: Recompute = "none",
    dtype: str = "fp64",
    seq_len: int = 16,
    stage_timings: list[StageTiming] | None = None,
    dp_allreduce_ms: float = 0.0,
    cluster: Cluster | None = None,
) -> Plan:
    """A plan whose stage i holds ``layer_split[i]`` layers, on one local node."""
    num_stages = len(layer_split)
    pipeline = num_stages // virtual_stages_per_rank
    shares = replica_micro_batch_sizes or [micro_batch_size] * data_parallel
    world = pipeline * data_parallel * tensor_parallel
    cluster = cluster or local_cluster(max(world, 1))
    node = cluster.nodes()[0]
    group = data_parallel * tensor_parallel
    nodes, rank_map = build_rank_map(
        [[NodeSlice(node, group)] for _ in range(pipeline)], data_parallel, tensor_parallel
    )
    bounds = [sum(layer_split[:i]) for i in range(num_stages + 1)]
    stages = [
        Stage(
            index=i,
            pipeline_rank=i % pipeline,
            layer_start=bounds[i],
            layer_end=bounds[i + 1],
            gpu_types=[node.gpu],
            recompute=recompute,
        )
        for i in range(num_stages)
    ]
    timings = stage_timings or [
        StageTiming(stage=i, forward_ms=1.0, backward_ms=2.0, send_ms=0.0)
        for i in range(num_stages)
    ]
    iteration_ms = sum(t.forward_ms + t.backward_ms for t in timings) * num_micro_batches
    global_batch = sum(shares) * num_micro_batches
    prediction = Prediction(
        iteration_time_ms=iteration_ms,
        breakdown=TimeBreakdown(
            compute_ms=iteration_ms,
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
                gpu_type=node.gpu,
                weights_bytes=0,
                gradients_bytes=0,
                optimizer_bytes=0,
                activations_bytes=0,
                transient_bytes=0,
                total_bytes=0,
                capacity_bytes=CPU_GPU.memory_bytes,
            )
            for p in range(pipeline)
        ],
    )
    total_layers = num_model_layers if num_model_layers is not None else bounds[-1]
    return Plan(
        inputs=PlanInputs(
            model=ModelRef(name=model, parameter_count=0, num_layers=total_layers),
            profile_sha256="hand-made",
            seq_len=seq_len,
            dtype=dtype,
            cluster=cluster,
            global_batch_size=global_batch,
            strategy="hand-made",
        ),
        parallelism=Parallelism(
            pipeline_degree=pipeline,
            data_parallel_degree=data_parallel,
            tensor_parallel_degree=tensor_parallel,
            virtual_stages_per_rank=virtual_stages_per_rank,
            schedule=schedule,
            num_micro_batches=num_micro_batches,
            replica_micro_batch_sizes=shares,
            zero1=False,
        ),
        stages=stages,
        nodes=nodes,
        rank_map=rank_map,
        prediction=prediction,
    )
