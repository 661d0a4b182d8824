"""The independent plan validator: valid hand-built plans (uniform and heterogeneous) pass,
and each rule catches its violation (plans broken one thing at a time with
``model_copy(update=...)``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup
from autoplan.errors import PlanInvalidError
from autoplan.files import write_json_model
from autoplan.plan.schema import IdleGpus, MemoryEstimate, Plan, ReplicaTiming, Stage, StageTiming
from autoplan.plan.validate import plan_problems, validate_plan
from autoplan.profile.schema import LayerProfile, ModelRef, Profile, ProfileTotals
from autoplan.profile.schema import TensorParallelProfile as TP
from tests.plan_factory import CPU_GPU, ReplicaSpec, make_plan, make_stages_plan

PARAMS_PER_LAYER = 1000
# fp64 training: weights 8 + gradients 8 + two fp64 Adam moments 16 = 32 bytes per parameter.
STATE_BYTES_PER_PARAM = 32


def _profile(
    num_layers: int, *, params: int = PARAMS_PER_LAYER, divide: int = 4, name: str = "gpt-tiny"
) -> Profile:
    layers = [
        LayerProfile(
            index=i,
            name=f"layers.{i}",
            kind="block",
            forward_flops=10,
            backward_flops=20,
            forward_bytes_moved=1,
            backward_bytes_moved=1,
            param_count=params,
            param_bytes=8 * params,
            saved_activation_bytes=0,
            selective_recompute_saved_bytes=0,
            selective_recompute_flops=0,
            input_activation_bytes=0,
            output_activation_bytes=0,
            tensor_parallel=TP(
                sharded_param_count=params,
                sharded_saved_activation_bytes=0,
                allreduce_payload_bytes=0,
                forward_allreduce_count=1,
                backward_allreduce_count=1,
                degree_must_divide=divide,
            ),
        )
        for i in range(num_layers)
    ]
    return Profile(
        model=ModelRef(name=name, parameter_count=params * num_layers, num_layers=num_layers),
        seq_len=16,
        micro_batch_size=1,
        dtype="fp64",
        dtype_bytes=8,
        layers=layers,
        totals=ProfileTotals(
            forward_flops=10 * num_layers,
            backward_flops=20 * num_layers,
            param_count=params * num_layers,
            param_bytes=8 * params * num_layers,
            saved_activation_bytes=0,
        ),
        profiled_layer_indices=list(range(num_layers)),
        method="hand-made for tests",
    )


def _with_memory(plan: Plan, profile: Profile) -> Plan:
    """The plan with memory estimates that hold each replica kind's states exactly (fp64:
    8 + 8 bytes of weights and gradients, 16 of Adam moments, split over the stage's
    replicas under ZeRO-1)."""
    per_layer = profile.layers[0].param_count
    estimates = []
    for estimate in plan.prediction.memory:
        weights = optimizer = 0
        for stage in plan.stages:
            if stage.pipeline_rank != estimate.pipeline_rank:
                continue
            params = (stage.layer_end - stage.layer_start) * per_layer
            params //= estimate.tensor_parallel_degree
            weights += 8 * params
            divide = len(stage.replicas) if stage.zero1 else 1
            optimizer += 16 * params // divide
        estimates.append(
            estimate.model_copy(
                update={
                    "weights_bytes": weights,
                    "gradients_bytes": weights,
                    "optimizer_bytes": optimizer,
                    "total_bytes": 2 * weights + optimizer,
                }
            )
        )
    return _replace_prediction(plan, memory=estimates)


def _replace_prediction(plan: Plan, **update: object) -> Plan:
    return plan.model_copy(update={"prediction": plan.prediction.model_copy(update=update)})


def _replace_parallelism(plan: Plan, **update: object) -> Plan:
    return plan.model_copy(update={"parallelism": plan.parallelism.model_copy(update=update)})


def _replace_rank(plan: Plan, which: int, **update: object) -> Plan:
    rank_map = [e.model_copy(update=update) if e.rank == which else e for e in plan.rank_map]
    return plan.model_copy(update={"rank_map": rank_map})


def _replace_stage(plan: Plan, index: int, **update: object) -> Plan:
    stages = [s.model_copy(update=update) if s.index == index else s for s in plan.stages]
    return plan.model_copy(update={"stages": stages})


def _replace_replica(plan: Plan, stage: int, replica: int, **update: object) -> Plan:
    replicas = list(plan.stages[stage].replicas)
    replicas[replica] = replicas[replica].model_copy(update=update)
    return _replace_stage(plan, stage, replicas=replicas)


def _problems(plan: Plan, profile: Profile | None = None) -> str:
    with pytest.raises(PlanInvalidError) as caught:
        validate_plan(plan, profile)
    return str(caught.value)


CPU2 = CPU_GPU.model_copy(update={"name": "cpu2", "memory_gib": 4})


def _cluster(*groups: tuple[str, GpuSpec, int, int]) -> Cluster:
    """Node groups (name, GPU, GPUs per node, nodes)."""
    return Cluster(
        name="test",
        gpu_types=[CPU_GPU, CPU2],
        node_groups=[
            NodeGroup(
                name=name,
                gpu=gpu.name,
                gpus_per_node=per_node,
                count=count,
                intra_node_bandwidth_gb_per_s=5,
            )
            for name, gpu, per_node, count in groups
        ],
        inter_node_bandwidth_gb_per_s=1,
    )


def _two_node_plan(tensor_parallel: int) -> Plan:
    """pp=1, dp=4/tp, across two nodes of 2 GPUs: valid."""
    replicas = [
        [
            ReplicaSpec(tp=tensor_parallel, share=2, node=d * tensor_parallel // 2)
            for d in range(4 // tensor_parallel)
        ]
    ]
    return make_stages_plan([4], replicas, cluster=_cluster(("n", CPU_GPU, 2, 2)))


def _hetero_plan(**kw: object) -> Plan:
    """Three stages of types cpu, cpu2, cpu (non-consecutive), unequal dp and tp: stage 0 two
    replicas of tp 1 (shares 3 and 1), stage 1 one replica of tp 2, stage 2 one of tp 1."""
    cluster = _cluster(("a", CPU_GPU, 4, 1), ("b", CPU2, 2, 1))
    replicas = [
        [ReplicaSpec(tp=1, share=3, node=0), ReplicaSpec(tp=1, share=1, node=0)],
        [ReplicaSpec(tp=2, share=4, node=1, recompute="full")],
        [ReplicaSpec(tp=1, share=4, node=0)],
    ]
    plan = make_stages_plan([2, 1, 1], replicas, cluster=cluster, **kw)  # type: ignore[arg-type]
    # The factory gives every estimate the cpu's capacity.
    capacity = {"cpu": CPU_GPU.memory_bytes, "cpu2": CPU2.memory_bytes}
    memory = [
        m.model_copy(update={"capacity_bytes": capacity[m.gpu_type]})
        for m in plan.prediction.memory
    ]
    idle = [IdleGpus(gpu_type="cpu", count=1, reason="x")]
    return _replace_prediction(plan, memory=memory, idle_gpus=idle)


# ---- valid plans pass ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "plan",
    [
        make_plan([2, 2], data_parallel=2),
        make_plan([1, 2, 1], num_micro_batches=3),
        make_plan([2], data_parallel=2, tensor_parallel=2),
        make_plan([1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b"),
        make_plan([4], data_parallel=2, replica_micro_batch_sizes=[3, 1]),
        make_plan([2, 2], data_parallel=2, replica_micro_batch_sizes=[3, 1], zero1=True),
        _hetero_plan(),
        _two_node_plan(1),
        _two_node_plan(2),
    ],
    ids=[
        "pp2-dp2",
        "pp3-uneven-layers",
        "tp2-dp2",
        "interleaved",
        "uneven-shares-pp1",
        "uneven-shares-pp2-zero1",
        "heterogeneous",
        "two-nodes-tp1",
        "two-nodes-tp2",
    ],
)
def test_valid_plans_pass_with_and_without_profile(plan: Plan) -> None:
    profile = _profile(plan.inputs.model.num_layers)
    validate_plan(plan)
    assert plan_problems(_with_memory(plan, profile), profile) == []


# ---- layers and stages ---------------------------------------------------------------------


def test_gap_between_stages_is_caught() -> None:
    plan = _replace_stage(make_plan([2, 2]), 1, layer_start=3)
    assert "starts at layer 3; the previous stage ends at 2" in _problems(plan)


def test_overlapping_stages_are_caught() -> None:
    assert "starts at layer 1" in _problems(_replace_stage(make_plan([2, 2]), 1, layer_start=1))


def test_layers_not_covered_are_caught() -> None:
    plan = make_plan([2, 2], num_model_layers=5)
    assert "cover layers up to 4; the model has 5" in _problems(plan)


def test_profile_with_other_layer_count_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "the profile has 6" in _problems(plan, _profile(6))


def test_wrong_stage_pipeline_rank_is_caught() -> None:
    plan = make_plan([1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b")
    assert "stage 2 runs on pipeline rank 1; it must be 0 (2 % pp)" in _problems(
        _replace_stage(plan, 2, pipeline_rank=1)
    )


# ---- batch and shares ------------------------------------------------------------------------


def test_shares_must_add_up_to_the_micro_batch() -> None:
    plan = _replace_replica(_hetero_plan(), 0, 1, micro_batch_size=2)
    assert "stage 0's replica shares [3, 2] add up to 5; the micro-batch is 4 samples" in (
        _problems(plan)
    )


def test_global_batch_mismatch_is_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2, micro_batch_size=2, num_micro_batches=4)
    inputs = plan.inputs.model_copy(update={"global_batch_size": 17})
    message = _problems(plan.model_copy(update={"inputs": inputs}))
    assert "global batch 17 != micro-batch size (4) × micro-batches (4) = 16" in message


def test_zero1_needs_more_than_one_replica() -> None:
    plan = _replace_stage(_hetero_plan(), 1, zero_stage=1)
    assert "stage 1 has zero1 with a single replica" in _problems(plan)
    validate_plan(_replace_stage(_hetero_plan(), 0, zero_stage=1))


def test_interleaved_micro_batches_must_divide_by_pp() -> None:
    plan = make_plan(
        [1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b", num_micro_batches=4
    )
    inputs = plan.inputs.model_copy(update={"global_batch_size": 6})
    broken = _replace_parallelism(plan, num_micro_batches=3).model_copy(update={"inputs": inputs})
    assert "micro-batches (3) divisible by pp (2)" in _problems(broken)


def test_interleaved_needs_as_many_layers_as_stages() -> None:
    plan = make_plan([1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b")
    model = plan.inputs.model.model_copy(update={"num_layers": 3})
    broken = plan.model_copy(update={"inputs": plan.inputs.model_copy(update={"model": model})})
    assert "with 4 stages needs at least as many layers (3)" in _problems(broken)


def test_interleaved_chunks_of_a_rank_run_on_the_same_replicas() -> None:
    plan = make_plan(
        [1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b", data_parallel=2
    )
    # Stage 2 (rank 0's second chunk) claims other shares than stage 0.
    replicas = [
        r.model_copy(update={"micro_batch_size": s})
        for r, s in zip(plan.stages[2].replicas, (3, 1), strict=True)
    ]
    broken = _replace_stage(plan, 2, replicas=replicas)
    assert "stages 0 and 2 of pipeline rank 0 have different replicas" in _problems(broken)
    # Recompute may differ per chunk: it is a property of the stage's module.
    recompute = [r.model_copy(update={"recompute": "full"}) for r in plan.stages[2].replicas]
    validate_plan(_replace_stage(plan, 2, replicas=recompute))


# ---- replicas and ranks ----------------------------------------------------------------------


def test_duplicate_rank_is_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2)
    message = _problems(_replace_rank(plan, 1, rank=0))
    assert "missing [1]" in message and "repeated [0]" in message


def test_rank_map_must_agree_with_the_replicas() -> None:
    plan = make_plan([2], data_parallel=2, tensor_parallel=2)
    # Rank 1 is tp index 1 of replica 0; claim it is tp index 0 of replica 1.
    broken = _replace_rank(plan, 1, dp_index=1, tp_index=0)
    assert (
        "rank 1 says (pipeline 0, dp 1, tp 0, local-0, cpu); as tp index 1 of replica 0 of "
        "pipeline rank 0 it is (pipeline 0, dp 0, tp 1, local-0, cpu)"
    ) in _problems(broken)


def test_rank_in_two_replicas_is_caught() -> None:
    plan = _hetero_plan()
    stage0 = plan.stages[0].replicas
    broken = _replace_replica(plan, 2, 0, ranks=list(stage0[0].ranks))
    message = _problems(broken)
    assert "rank 0 belongs to replica 0 of pipeline rank 0 and to replica 0 of pipeline rank 2" in (
        message
    )
    assert "belongs to no replica of its pipeline rank's stages" in message  # the rank it lost


def test_replica_rank_missing_from_rank_map_is_caught() -> None:
    plan = _replace_replica(make_plan([2, 2]), 1, 0, ranks=[7])
    message = _problems(plan)
    assert "replica 0 of pipeline rank 1 lists rank 7, which rank_map lacks" in message


def test_replica_rank_count_must_equal_tp() -> None:
    plan = _replace_replica(_hetero_plan(), 1, 0, ranks=[2])
    assert "replica 0 of pipeline rank 1 lists 1 ranks; its tp is 2" in _problems(plan)


def test_replica_gpu_type_must_be_its_nodes() -> None:
    plan = _replace_replica(_hetero_plan(), 1, 0, gpu_type="cpu")
    assert "replica 0 of pipeline rank 1 says GPU type cpu; node b-0 has cpu2" in _problems(plan)


def test_tp_group_across_nodes_is_caught() -> None:
    plan = _two_node_plan(2)
    # Swap rank 1 (n-0, gpu 1) with rank 2 (n-1, gpu 0): replica 0's GPUs now span two nodes.
    broken = _replace_rank(_replace_rank(plan, 1, node="n-1", local_rank=0), 2, node="n-0")
    broken = _replace_rank(broken, 2, local_rank=1)
    message = _problems(broken)
    assert "rank 1 says (pipeline 0, dp 0, tp 1, n-1, cpu)" in message
    assert "it is (pipeline 0, dp 0, tp 1, n-0, cpu)" in message


# ---- nodes ----------------------------------------------------------------------------------


def test_rank_on_unknown_node_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "node 'ghost-0', not in the cluster" in _problems(_replace_rank(plan, 1, node="ghost-0"))


def test_rank_with_wrong_gpu_type_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "rank 1 says GPU type H100; node local-0 has cpu" in _problems(
        _replace_rank(plan, 1, gpu_type="H100")
    )


def test_local_rank_beyond_node_is_caught() -> None:
    plan = make_plan([2, 2])  # cluster of 2 GPUs
    assert "local rank 7; node local-0 has 2 GPUs" in _problems(
        _replace_rank(plan, 1, local_rank=7)
    )


def test_gpu_used_twice_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "ranks 0 and 1 share GPU 0 of node local-0" in _problems(
        _replace_rank(plan, 1, local_rank=0)
    )


def test_wrong_nproc_per_node_is_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2)
    nodes = [plan.nodes[0].model_copy(update={"nproc_per_node": 3})]
    assert "nproc_per_node 3 but 4 ranks" in _problems(plan.model_copy(update={"nodes": nodes}))


def test_nodes_out_of_launch_order_are_caught() -> None:
    plan = _two_node_plan(1)
    reordered = [
        plan.nodes[1].model_copy(update={"node_rank": 0}),
        plan.nodes[0].model_copy(update={"node_rank": 1}),
    ]
    message = _problems(plan.model_copy(update={"nodes": reordered}))
    assert "node n-1 (launch position 0) holds ranks [2, 3]; torchrun gives it 0..1" in message


# ---- profile ----------------------------------------------------------------------------------


def test_tp_must_divide_layer_degree() -> None:
    plan = _hetero_plan()  # stage 1 (layer 2) has tp 2
    profile = _profile(4, divide=3)
    assert "tp 2 of stage 1 does not divide layer 2 (layers.2)'s 3" in _problems(
        _with_memory(plan, profile), profile
    )
    two = make_plan([2], data_parallel=2, tensor_parallel=2)
    assert "(and 1 more layers)" in _problems(_with_memory(two, profile), _profile(2, divide=3))


def test_profile_of_another_model_is_caught() -> None:
    plan = make_plan([2, 2])
    profile = _profile(4, name="gpt2-small")
    assert "profile is of 'gpt2-small'" in _problems(_with_memory(plan, profile), profile)


# ---- memory ---------------------------------------------------------------------------------


def _estimate(plan: Plan, index: int = 0) -> MemoryEstimate:
    return plan.prediction.memory[index]


def _replace_estimate(plan: Plan, index: int, **update: object) -> Plan:
    memory = list(plan.prediction.memory)
    memory[index] = memory[index].model_copy(update=update)
    return _replace_prediction(plan, memory=memory)


def test_memory_over_capacity_is_caught() -> None:
    plan = make_plan([2, 2])
    capacity = _estimate(plan).capacity_bytes
    broken = _replace_estimate(plan, 0, activations_bytes=capacity + 1, total_bytes=capacity + 1)
    assert (
        "pipeline rank 0's cpu tp 1 replicas with 2 samples need 8.00 GiB per GPU; a cpu has "
        "8.00 GiB"
    ) in _problems(broken)


def test_memory_reserve_counts_against_capacity() -> None:
    plan = make_plan([2, 2])
    capacity = _estimate(plan).capacity_bytes
    fits = _replace_estimate(
        plan, 0, activations_bytes=capacity - 2**30, total_bytes=capacity - 2**30
    )
    validate_plan(fits)
    reserved = _replace_estimate(
        plan,
        0,
        activations_bytes=capacity - 2**30,
        total_bytes=capacity - 2**30,
        reserved_bytes=2**31,
    )
    assert "need 9.00 GiB per GPU (of which 2.00 GiB reserved); a cpu has 8.00 GiB" in (
        _problems(reserved)
    )


def test_memory_parts_must_add_up() -> None:
    plan = _replace_estimate(make_plan([2, 2]), 0, weights_bytes=100, total_bytes=50)
    assert "parts add up to 100 bytes, total says 50" in _problems(plan)


def test_memory_capacity_must_match_the_gpu() -> None:
    plan = _replace_estimate(make_plan([2, 2]), 0, capacity_bytes=80 * 1024**3)
    assert "its spec says 8589934592" in _problems(plan)


def test_every_replica_kind_needs_a_memory_estimate() -> None:
    plan = _hetero_plan()
    kinds = [
        (m.pipeline_rank, m.gpu_type, m.tensor_parallel_degree) for m in plan.prediction.memory
    ]
    assert kinds == [(0, "cpu", 1), (0, "cpu", 1), (1, "cpu2", 2), (2, "cpu", 1)]
    memory = [m for m in plan.prediction.memory if m.micro_batch_size != 1]
    message = _problems(_replace_prediction(plan, memory=memory))
    assert "no memory estimate for pipeline rank 0's cpu tp 1 replicas with 1 sample" in message
    wrong = _replace_estimate(plan, 2, tensor_parallel_degree=1)
    message = _problems(wrong)
    assert "no memory estimate for pipeline rank 1's cpu2 tp 2 replicas with 4 samples" in message
    assert "a memory estimate is for pipeline rank 1's cpu2 tp 1 replicas with 4 samples" in message


def test_states_that_cannot_fit_are_caught_from_the_profile() -> None:
    # 2 layers × 2e8 params × 32 bytes = 11.9 GiB on one 8 GiB "cpu" GPU.
    plan = make_plan([2, 2])
    profile = _profile(4, params=200_000_000)
    message = _problems(plan, profile)
    assert (
        "pipeline rank 0's cpu tp 1 replicas with 2 samples need at least 11.92 GiB per GPU for "
        "weights, gradients and Adam states alone; a cpu has 8.00 GiB"
    ) in message


def test_floor_is_per_replica_kind() -> None:
    """Stage 1 runs on 2 cpu2 GPUs (4 GiB) in tp 2: 1 layer × 2e8 / 2 × 32 B = 2.98 GiB fits;
    the tp-1 cpu stage 0 with 2 layers needs 11.92 GiB and does not."""
    profile = _profile(4, params=200_000_000)
    message = _problems(_hetero_plan(), profile)
    assert "pipeline rank 0's cpu tp 1 replicas with 3 samples need at least 11.92 GiB" in message
    assert "pipeline rank 1's cpu2 tp 2 replicas with 4 samples need at least" not in message


def test_zero1_divides_the_optimizer_floor() -> None:
    plan = make_plan([4], data_parallel=4)
    profile = _profile(4, params=50_000_000)  # 4 × 5e7 × 32 B = 5.96 GiB: fits without ZeRO
    assert "need at least" not in " ".join(plan_problems(plan, profile))
    big = _profile(4, params=80_000_000)  # 9.5 GiB without ZeRO-1, 5.96 GiB with dp=4 ZeRO-1
    assert "need at least 9.54 GiB" in _problems(plan, big)
    zero1 = _replace_stage(plan, 0, zero_stage=1)
    assert all("need at least" not in p for p in plan_problems(zero1, big))


def test_estimate_below_independent_floor_is_caught() -> None:
    plan = make_plan([2, 2])  # the factory's memory estimates are all zero
    profile = _profile(4)
    assert "below the independent floor" in _problems(plan, profile)
    validate_plan(_with_memory(plan, profile), profile)


# ---- prediction -----------------------------------------------------------------------------


def test_throughput_inconsistent_with_iteration_time_is_caught() -> None:
    plan = make_plan([2, 2])
    doubled = plan.prediction.samples_per_s * 2
    assert "samples_per_s" in _problems(
        _replace_prediction(plan, samples_per_s=doubled, tokens_per_s=doubled * 16)
    )


def test_breakdown_must_add_up_to_iteration_time() -> None:
    plan = make_plan([2, 2])
    breakdown = plan.prediction.breakdown.model_copy(update={"bubble_ms": 5.0})
    assert "time breakdown adds up to" in _problems(_replace_prediction(plan, breakdown=breakdown))


def test_tflops_per_gpu_is_over_the_world_size() -> None:
    plan = _hetero_plan()  # 5 GPUs
    seconds = plan.prediction.iteration_time_ms / 1000
    flops = 5e12 * seconds
    validate_plan(_replace_prediction(plan, model_flops_per_iteration=flops, tflops_per_gpu=1.0))
    message = _problems(
        _replace_prediction(plan, model_flops_per_iteration=flops, tflops_per_gpu=5.0)
    )
    assert "model FLOPs / time / 5 GPUs = 1" in message


def test_replica_timings_must_match_the_stage() -> None:
    plan = _hetero_plan()
    timings = list(plan.prediction.stage_timings)
    fast, slow = (
        ReplicaTiming(forward_ms=0.5, backward_ms=1, saved_activation_bytes=0),
        (ReplicaTiming(forward_ms=1, backward_ms=2, saved_activation_bytes=0)),
    )
    timings[0] = timings[0].model_copy(update={"replicas": [slow, fast]})  # stage says 1 and 2
    validate_plan(_replace_prediction(plan, stage_timings=timings))
    timings[0] = timings[0].model_copy(update={"replicas": [fast, fast]})
    assert "its slowest replicas take 0.5 ms and 1 ms" in _problems(
        _replace_prediction(plan, stage_timings=timings)
    )
    timings[0] = timings[0].model_copy(update={"replicas": [slow]})
    assert "stage 0's timing has 1 replica figures; the stage has 2 replicas" in _problems(
        _replace_prediction(plan, stage_timings=timings)
    )


def test_a_weight_gradient_longer_than_its_backward_is_caught() -> None:
    plan = make_plan([2, 2])
    timings = list(plan.prediction.stage_timings)
    backward = timings[1].backward_ms
    timings[1] = timings[1].model_copy(update={"weight_gradient_ms": backward / 2})
    validate_plan(_replace_prediction(plan, stage_timings=timings))
    timings[1] = timings[1].model_copy(update={"weight_gradient_ms": backward * 2})
    assert "stage 1's weight-gradient time" in _problems(
        _replace_prediction(plan, stage_timings=timings)
    )


def test_missing_stage_timing_is_caught() -> None:
    plan = make_plan([2, 2])
    timings = [StageTiming(stage=0, forward_ms=1, backward_ms=2, send_ms=0)]
    assert "stage timings are for stages [0]; the plan has 2" in _problems(
        _replace_prediction(plan, stage_timings=timings)
    )


def test_per_rank_all_reduce_figures_are_checked() -> None:
    plan = _replace_prediction(_hetero_plan(), dp_allreduce_ms=2.0)
    validate_plan(_replace_prediction(plan, rank_dp_allreduce_ms=[2.0, 0.0, 0.0]))
    assert "has 2 figures; the plan has 3 pipeline ranks" in _problems(
        _replace_prediction(plan, rank_dp_allreduce_ms=[2.0, 0.0])
    )
    assert "is not the longest per-rank all-reduce (3 ms)" in _problems(
        _replace_prediction(plan, rank_dp_allreduce_ms=[3.0, 0.0, 0.0])
    )
    assert "pipeline rank 1 has one replica, yet its gradient all-reduce takes 1 ms" in _problems(
        _replace_prediction(plan, rank_dp_allreduce_ms=[2.0, 1.0, 0.0])
    )


def test_idle_gpus_must_be_the_cluster_less_the_used() -> None:
    plan = _hetero_plan()  # 4 cpu + 2 cpu2 in the cluster; uses 3 cpu + 2 cpu2
    assert "so 1 are idle; idle_gpus says 0" in _problems(_replace_prediction(plan, idle_gpus=[]))
    wrong = [IdleGpus(gpu_type="cpu2", count=1, reason="slower")]
    message = _problems(_replace_prediction(plan, idle_gpus=wrong))
    assert "the cluster has 2 cpu2 GPUs and the plan uses 2, so 0 are idle; idle_gpus says 1" in (
        message
    )
    blank = [IdleGpus(gpu_type="cpu", count=1, reason=" ")]
    assert "idle_gpus gives no reason for its 1 cpu" in _problems(
        _replace_prediction(plan, idle_gpus=blank)
    )


def test_every_problem_is_reported_at_once() -> None:
    plan = _replace_rank(make_plan([2, 2], data_parallel=2), 3, local_rank=0)
    inputs = plan.inputs.model_copy(update={"global_batch_size": 1})
    with pytest.raises(PlanInvalidError) as caught:
        validate_plan(plan.model_copy(update={"inputs": inputs}))
    assert len(caught.value.problems) >= 3  # shared GPU, global batch, samples_per_s
    assert "\n" not in str(caught.value)


def test_stage_model_copy_keeps_the_replicas_shape() -> None:
    """The helpers above break one thing at a time: a replaced stage is still a Stage."""
    plan = _replace_stage(_hetero_plan(), 1, zero_stage=1)
    assert isinstance(plan.stages[1], Stage) and plan.stages[1].zero1


# ---- CLI ------------------------------------------------------------------------------------


def test_cli_validates_a_plan_file(tmp_path: Path) -> None:
    from autoplan.cli import app

    plan = _hetero_plan()
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    write_json_model(good, plan)
    write_json_model(bad, _replace_rank(plan, 1, local_rank=0))
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
    assert "3 stages on 5 GPUs" in result.output
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "share GPU 0 of node a-0" in result.output


# ---- plans the solver makes pass the independent checks (need the solver) -----------------


@pytest.mark.parametrize(
    ("cluster_name", "batch", "profile_shape"),
    [
        ("a100x8", 64, (8, 1024, 512)),
        ("a100-v100", 128, (8, 1024, 512)),
        ("h100-a100-l4", 192, (8, 1024, 512)),
        ("cpu-local", 8, (4, 64, 32)),
        ("cpu-hetero", 8, (4, 64, 32)),
    ],
)
@pytest.mark.parametrize("strategy", ["optimal", "megatron"])
def test_solved_plans_pass(
    cluster_name: str, batch: int, profile_shape: tuple[int, int, int], strategy: str
) -> None:
    from autoplan.cluster.catalog import example_cluster_path, load_cluster
    from autoplan.solve import SolveOptions, solve
    from tests.synthetic_profiles import transformer_profile

    blocks, hidden, seq_len = profile_shape
    profile = transformer_profile(blocks, hidden, seq_len, vocab=1000, heads=8)
    cluster = load_cluster(example_cluster_path(cluster_name))
    plan = solve(profile, cluster, batch, SolveOptions(strategy=strategy, time_limit_s=10))
    assert plan_problems(plan, profile) == []
