"""Unit tests of the cost model, against hand computations and known answers."""

from __future__ import annotations

import math

import pytest

from autoplan.cost.comm import allreduce_ms, p2p_ms, ring_allreduce_ms
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.layers import matches_device
from autoplan.cost.schedule import in_flight_chunks, pipeline_time_ms
from autoplan.plan.validate import validate_plan
from autoplan.profile.schema import MeasuredTimes
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve import solve as _solve
from tests.layer_time import layer_time_ms
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile, transformer_profile


def solve(profile, cluster, batch, options):
    """Solve and check the plan with the independent validator."""
    plan = _solve(profile, cluster, batch, options)
    validate_plan(plan, profile)
    return plan


def test_ring_allreduce_formula() -> None:
    # 2 (n-1)/n × bytes / bandwidth + 2 (n-1) latencies: 1.5 GB over 100 GB/s = 15 ms,
    # + 6 steps × 10 us.
    assert ring_allreduce_ms(1e9, 4, 100.0, 10.0) == pytest.approx(15.0 + 0.06)
    assert ring_allreduce_ms(1e9, 1, 100.0, 10.0) == 0.0
    assert p2p_ms(2e9, 100.0, 0.0) == pytest.approx(20.0)


def test_1f1b_closed_form_and_interleaving() -> None:
    # Equal stages: (m + p - 1) × c. Unequal: (m - 1) × slowest + sum.
    assert pipeline_time_ms([2.0] * 4, 8) == pytest.approx(11 * 2.0)
    assert pipeline_time_ms([1.0, 3.0, 2.0], 5) == pytest.approx(4 * 3.0 + 6.0)
    # Interleaving with v chunks divides the fill-and-drain part (3 × 2 ms) by v.
    assert pipeline_time_ms([2.0] * 4, 8, chunks=2) == pytest.approx(8 * 2.0 + 6.0 / 2)
    # Sends: hidden in the steady state, on the path in the fill and drain.
    assert pipeline_time_ms([2.0, 2.0], 8, fill_ms=[2.5, 2.0]) == pytest.approx(7 * 2.0 + 4.5)


def test_in_flight_micro_batches() -> None:
    assert [in_flight_chunks("1f1b", 4, r, 8) for r in range(4)] == [4, 3, 2, 1]
    assert in_flight_chunks("1f1b", 4, 0, 2) == 2  # never more than m
    assert in_flight_chunks("gpipe", 4, 3, 8) == 8
    # PyTorch's Interleaved1F1B, p = 4, v = 2, m = 8: rank 0 runs (v-1)·4 + 2·3 = 10
    # warm-up forwards, then one more before its first backward.
    assert in_flight_chunks("interleaved_1f1b", 4, 0, 8, 2) == 11
    assert in_flight_chunks("interleaved_1f1b", 4, 3, 8, 2) == 5


def test_roofline_and_measured_times() -> None:
    spec = gpu("A100-80GB", tflops=300.0, memory_gib=80, bandwidth=2000.0)
    big = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**6)
    forward, backward = layer_time_ms(big, spec, "bf16", 1, 1)
    assert forward == pytest.approx(1e12 / (300e12 * 0.5) * 1e3)  # compute-bound
    assert backward == pytest.approx(2 * forward)
    # Twice the micro-batch, tp = 2: the same time.
    assert layer_time_ms(big, spec, "bf16", 2, 2)[0] == pytest.approx(forward)
    memory_bound = layer(0, flops=10, params=10**9, saved=1, output=1)
    assert layer_time_ms(memory_bound, spec, "bf16", 1, 1)[0] == pytest.approx(
        (2e9 + 2) / 2000e9 * 1e3
    )
    measured = big.model_copy(
        update={
            "measured": [
                MeasuredTimes(
                    device_name="NVIDIA A100-SXM4-80GB", forward_ms=7.0, backward_ms=9.0, repeats=5
                )
            ]
        }
    )
    assert layer_time_ms(measured, spec, "bf16", 1, 3) == pytest.approx((21.0, 27.0))
    assert matches_device("A100-80GB", "NVIDIA A100-SXM4-80GB")
    assert not matches_device("A100-40GB", "NVIDIA A100-SXM4-80GB")
    assert matches_device("H200", "NVIDIA H200")


def test_memory_of_a_known_case_equals_hand_computation() -> None:
    params, saved, out = 10**8, 3 * 10**8, 10**7
    layers = [layer(i, flops=10**12, params=params, saved=saved, output=out) for i in range(4)]
    profile = make_profile(layers)
    spec = gpu("G", 100.0, 80.0)
    cluster = make_cluster([("g", spec, 8, 1)])
    model = cost_model(profile, cluster, SolveOptions())

    def stages(zero1: bool) -> tuple[StageChoice, ...]:
        return (
            StageChoice(0, 2, (ReplicaGroup(0, 1, 2, 2, "none"),), zero1),
            StageChoice(2, 4, (ReplicaGroup(0, 1, 2, 2, "selective"),), zero1),
        )

    config = PlanConfig(4, "1f1b", 1, stages(True))
    cost = model.evaluate(config)
    first = cost.memory[0]
    # Rank 0: 2 layers × 1e8 params; bf16 weights and gradients (once: the runtime's DDP
    # makes them views into its buckets), Adam states 12 B/param halved by ZeRO-1 over dp = 2; 1F1B
    # holds p - 0 = 2 micro-batches of 2 samples of 2 layers × 3e8 bytes, and torch
    # pipelining's receive buffer of every micro-batch's output gradient (m = 4, 2 samples:
    # CostModel.transfer_buffer_bytes); transient: two boundary tensors of 2 samples.
    assert first.weights_bytes == 2 * params * 2
    assert first.gradients_bytes == 2 * params * 2
    assert first.optimizer_bytes == 2 * params * 12 / 2
    assert first.activations_bytes == 2 * (2 * 2 * saved) + 4 * 2 * out
    assert cost.stages[0].saved_bytes == 2 * 2 * saved  # one micro-batch of stage 0
    assert first.transient_bytes == 2 * (2 * out)
    second = cost.memory[1]
    # Rank 1, selective recompute keeps 3/4 of the saved bytes, one micro-batch in flight,
    # and the receive buffers of every micro-batch's input; the transient is one layer's full
    # activations (recomputed).
    assert second.activations_bytes == 1 * (2 * 2 * saved * 3 // 4) + 4 * 2 * out
    assert second.transient_bytes == 2 * saved
    total = 2 * params * (2 + 2 + 6) + 8 * saved + 4 * out + 8 * out
    assert first.total_bytes == total
    # 16 bytes per parameter for mixed-precision Adam without ZeRO.
    plain = model.evaluate(PlanConfig(4, "1f1b", 1, stages(False)))
    mem = plain.memory[0]
    assert (mem.weights_bytes + mem.gradients_bytes + mem.optimizer_bytes) == 2 * params * 16
    # As Megatron-DeepSpeed runs it (autoplan.cost.engines): the same model states, and its
    # pipe engine keeps no receive buffer beyond those in flight.
    deepspeed = model.with_engine("megatron-deepspeed").evaluate(config).memory[0]
    assert deepspeed.gradients_bytes == 2 * params * 2
    assert deepspeed.activations_bytes == 2 * (2 * 2 * saved)


def test_slower_gpu_gets_fewer_layers() -> None:
    profile = transformer_profile(blocks=12, hidden=1024, seq_len=512, heads=16)
    cluster = make_cluster(
        [("fast", gpu("FAST", 300.0, 40.0), 1, 1), ("slow", gpu("SLOW", 100.0, 40.0), 1, 1)]
    )
    plan = solve(profile, cluster, 16, SolveOptions(pp=2, dp=1, tp=1))
    layers = {s.gpu_types[0]: s.layer_end - s.layer_start for s in plan.stages}
    assert layers["SLOW"] < layers["FAST"], layers
    # Roughly in proportion to speed (3 : 1), within a layer or two.
    assert layers["FAST"] >= 2 * layers["SLOW"], layers


def test_unlimited_memory_and_free_communication_give_pure_data_parallel() -> None:
    layers = [
        layer(i, flops=10**12, params=10**7, saved=10**6, output=10**6, tp_divides=None)
        for i in range(6)
    ]
    profile = make_profile(layers)
    huge = gpu("BIG", 100.0, 10_000.0, bandwidth=1e9)
    cluster = make_cluster([("n", huge, 4, 2)], intra_gb_per_s=1e12, inter_gb_per_s=1e12)
    cluster = cluster.model_copy(update={"inter_node_latency_us": 0.0})
    cluster = cluster.model_copy(
        update={
            "node_groups": [
                g.model_copy(update={"intra_node_latency_us": 0.0}) for g in cluster.node_groups
            ]
        }
    )
    plan = solve(profile, cluster, 64, SolveOptions())
    assert plan.parallelism.pipeline_degree == 1
    assert [r.tensor_parallel_degree for r in plan.stages[0].replicas] == [1] * 8
    # And the time is the ideal: all FLOPs spread over 8 GPUs at peak × efficiency.
    ideal_ms = 64 * 6 * 3e12 / (8 * 100e12 * 0.5) * 1e3
    assert plan.prediction.iteration_time_ms == pytest.approx(ideal_ms, rel=1e-6)
    assert math.isclose(plan.prediction.mfu, 0.5, rel_tol=1e-6)


def test_tflops_per_gpu_counts_profile_flops_without_recompute() -> None:
    profile = transformer_profile(blocks=4, hidden=1024, seq_len=512, heads=16)
    cluster = make_cluster([("g", gpu("G", 100.0, 80.0), 4, 1)])
    plan = solve(profile, cluster, 8, SolveOptions(recompute="full", pp=1, tp=1, dp=4))
    flops = sum(x.forward_flops + x.backward_flops for x in profile.layers) * 8
    seconds = plan.prediction.iteration_time_ms / 1e3
    assert plan.prediction.model_flops_per_iteration == flops
    assert plan.prediction.tflops_per_gpu == pytest.approx(flops / seconds / 4 / 1e12, rel=1e-5)


def test_single_stage_shares_follow_speed() -> None:
    """With replicas on a 3× faster and a slower type, the faster takes 3× the samples."""
    layers = [
        layer(i, flops=10**12, params=10**6, saved=10**6, output=10**6, tp_divides=None)
        for i in range(3)
    ]
    profile = make_profile(layers)
    cluster = make_cluster(
        [
            ("fast", gpu("FAST", 300.0, 80.0, 1e9), 2, 1),
            ("slow", gpu("SLOW", 100.0, 80.0, 1e9), 2, 1),
        ],
        intra_gb_per_s=1e9,
        inter_gb_per_s=1e9,
    )
    plan = solve(profile, cluster, 32, SolveOptions(pp=1, tp=1))
    shares = plan.stages[0].shares
    assert plan.stages[0].data_parallel_degree == 4
    assert shares[0] == 3 * shares[-1], shares
    assert {entry.gpu_type for entry in plan.rank_map} == {"FAST", "SLOW"}


def test_tensor_parallel_splits_only_the_sharded_work() -> None:
    spec = gpu("G", tflops=100.0, memory_gib=80, bandwidth=1e9)
    base = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**6)
    assert base.tensor_parallel is not None
    half = base.model_copy(
        update={
            "tensor_parallel": base.tensor_parallel.model_copy(
                update={"sharded_forward_flops": 10**12 // 2}
            )
        }
    )
    one, _ = layer_time_ms(half, spec, "bf16", 1, 1)
    four, _ = layer_time_ms(half, spec, "bf16", 4, 1)
    # Half the FLOPs split 4 ways, the other half on every rank: 5/8 of the time.
    assert four == pytest.approx(one * 5 / 8)
    assert layer_time_ms(base, spec, "bf16", 4, 1)[0] == pytest.approx(one / 4)


def test_inter_node_bandwidth_is_shared_by_the_flows_leaving_a_node() -> None:
    # Nodes of 8 GPUs with 100 GB/s each between nodes, 2-byte parameters.
    spec = gpu("G", tflops=100.0, memory_gib=80)
    cluster = make_cluster([("n", spec, 8, 4)], intra_gb_per_s=300.0, inter_gb_per_s=100.0)
    profile = make_profile(
        [layer(i, flops=10**9, params=10**6, saved=10, output=10) for i in range(4)]
    )
    model = cost_model(profile, cluster, SolveOptions())
    inter = cluster.inter_node_latency_us * 1e-3  # one message latency, in ms
    intra = cluster.node_groups[0].intra_node_latency_us * 1e-3

    def allreduce(tp: int, replicas: int, params_per_gpu: float) -> float:
        return model.allreduce_ms((ReplicaGroup(0, tp, replicas, 1, "none"),), (params_per_gpu,))

    # The bandwidth each all-reduce gets (its latency terms are comm.py's, tested there):
    # tp 1, dp 32 over 4 nodes: one ring, the whole node bandwidth (2 GB per GPU).
    def across(payload: float, n: int, bandwidth: float) -> float:
        return allreduce_ms(payload, n, bandwidth, cluster.inter_node_latency_us, across_nodes=True)

    assert allreduce(1, 32, 1e9) == pytest.approx(across(2e9, 32, 100.0))
    # tp 8, dp 4: eight rings (one per tp index) leave each node at once, 12.5 GB/s each:
    # the same as the node's whole gradient (8 × 2 GB) at 100 GB/s.
    assert allreduce(8, 4, 1e9) == pytest.approx(across(16e9, 4, 100.0))
    # tp 2, dp 16: two rings share the node, 50 GB/s each.
    assert allreduce(2, 16, 1e9) == pytest.approx(across(4e9, 16, 100.0))
    # A stage in one block of a node uses NVLink (per GPU, not shared): tp 2, dp 4 = 8 GPUs;
    # 6 GPUs are not a block size of 8-GPU nodes, so the emitter may split them: inter-node.
    intra_ms = ring_allreduce_ms(2e9, 4, 300.0, cluster.node_groups[0].intra_node_latency_us)
    assert allreduce(2, 4, 1e9) == pytest.approx(intra_ms)
    assert allreduce(2, 3, 1e9) == pytest.approx(across(4e9, 3, 100.0))
    # Replicas of different tp in one stage: the tp-1 GPU carries the whole gradient.
    mixed = (ReplicaGroup(0, 1, 1, 1, "none"), ReplicaGroup(0, 2, 2, 1, "none"))
    assert model.allreduce_ms(mixed, (1e9, 0.5e9)) == pytest.approx(across(2e9, 3, 100.0))

    # Stage boundaries: each replica's tp rank 0 sends its samples; the replicas of a stage
    # on one node share its bandwidth. 4 replicas of tp 2 (4 per node), 2 samples each:
    # 8 samples of 1 GB leave the busiest node at 100 GB/s.
    four = model.link_side((ReplicaGroup(0, 2, 4, 2, "none"),))
    one = model.link_side((ReplicaGroup(0, 8, 1, 8, "none"),))
    assert four.node_samples == 8 and one.node_samples == 8
    assert model.boundary_ms(four, one, 1e9) == pytest.approx(8e9 / 100e9 * 1e3 + inter)
    # A class with a single node: every GPU sends over its own NVLink, the largest share counts.
    single = make_cluster([("n", spec, 8, 1)], intra_gb_per_s=300.0, inter_gb_per_s=100.0)
    local = cost_model(profile, single, SolveOptions())
    a = local.link_side((ReplicaGroup(0, 1, 2, 3, "none"),))
    b = local.link_side((ReplicaGroup(0, 1, 6, 1, "none"),))
    assert local.boundary_ms(a, b, 1e9) == pytest.approx(3e9 / 300e9 * 1e3 + intra)


def test_memory_bound_bytes_add_to_the_matmul_time() -> None:
    spec = gpu("A100-80GB", tflops=300.0, memory_gib=80, bandwidth=2000.0)
    base = layer(0, flops=10**12, params=10**6, saved=10**6, output=10**6)
    # Forward: 1e12 FLOPs at 300 TF/s × 0.5 = 6.667 ms; 2 GB moved by memory-bound ops at
    # 2000 GB/s × 0.8 = 1.25 ms more (the other bytes are the matmuls', under their FLOPs).
    # Tensor parallel 2 shards half the memory-bound bytes: 1.5 GB, 0.9375 ms.
    split = base.model_copy(
        update={
            "forward_bytes_moved": 3 * 10**9,
            "forward_memory_bound_bytes": 2 * 10**9,
            "backward_bytes_moved": 6 * 10**9,
            "backward_memory_bound_bytes": 4 * 10**9,
            "tensor_parallel": base.tensor_parallel.model_copy(
                update={
                    "sharded_forward_memory_bound_bytes": 10**9,
                    "sharded_backward_memory_bound_bytes": 2 * 10**9,
                    "sharded_forward_bytes_moved": 2 * 10**9,
                    "sharded_backward_bytes_moved": 4 * 10**9,
                }
            ),
        }
    )
    forward, backward = layer_time_ms(split, spec, "bf16", 1, 1)
    assert forward == pytest.approx(1e12 / 150e12 * 1e3 + 2e9 / 1600e9 * 1e3)
    assert backward == pytest.approx(2e12 / 150e12 * 1e3 + 4e9 / 1600e9 * 1e3)
    forward_tp2, _ = layer_time_ms(split, spec, "bf16", 2, 1)
    assert forward_tp2 == pytest.approx(0.5e12 / 150e12 * 1e3 + 1.5e9 / 1600e9 * 1e3)
    # Matmuls whose own traffic exceeds their FLOPs' time are bounded by it: 10 GB of
    # matmul bytes take 5 ms > 1 ms of FLOPs, plus the 2 GB memory-bound.
    slow = split.model_copy(
        update={"forward_flops": 150 * 10**9, "forward_bytes_moved": 12 * 10**9}
    )
    assert layer_time_ms(slow, spec, "bf16", 1, 1)[0] == pytest.approx(5.0 + 1.25)
    # A profile without the split keeps the whole-layer roofline (max, not sum).
    assert base.forward_memory_bound_bytes is None
    assert layer_time_ms(base, spec, "bf16", 1, 1)[0] == pytest.approx(1e12 / 150e12 * 1e3)


def test_measured_efficiency_of_the_profiles_dtype_is_used_and_overrides_win() -> None:
    # An fp32 profile on a GPU whose catalog entry measured 0.25 of the fp32 peak: layer times
    # (the calibration path) and the plan's cost model must both use 0.25, not the 16-bit 0.5;
    # a user's --efficiency override beats both.
    spec = gpu("MEASURED", tflops=200.0, memory_gib=80).model_copy(
        update={"efficiency_by_dtype": {"fp32": 0.25}}
    )
    big = layer(0, flops=10**12, params=10**3, saved=10**3, output=10**3)
    forward, _ = layer_time_ms(big, spec, "fp32", 1, 1)
    assert forward == pytest.approx(1e12 / (100e12 * 0.25) * 1e3)
    profile = make_profile([big]).model_copy(update={"dtype": "fp32", "dtype_bytes": 4})
    cluster = make_cluster([("m", spec, 1, 1)])
    model = cost_model(profile, cluster, SolveOptions())
    assert model.tables(0, 1, 1).layers[0].forward_compute_ms == pytest.approx(forward)
    pinned = cost_model(profile, cluster, SolveOptions(efficiency={"MEASURED": 0.5}))
    assert pinned.tables(0, 1, 1).layers[0].forward_compute_ms == pytest.approx(forward / 2)
