"""The independent plan validator: valid hand-built plans pass, and each rule catches its
violation (plans broken one thing at a time with ``model_copy(update=...)``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.errors import PlanInvalidError
from autoplan.files import write_json_model
from autoplan.plan.ranks import NodeSlice, build_rank_map
from autoplan.plan.schema import MemoryEstimate, Plan
from autoplan.plan.validate import plan_problems, validate_plan
from autoplan.profile.schema import LayerProfile, ModelRef, Profile, ProfileTotals
from autoplan.profile.schema import TensorParallelProfile as TP
from tests.plan_factory import CPU_GPU, make_plan

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
    """The plan with memory estimates that hold each pipeline rank's states exactly."""
    par = plan.parallelism
    estimates = []
    for estimate in plan.prediction.memory:
        layers = sum(
            s.layer_end - s.layer_start
            for s in plan.stages
            if s.pipeline_rank == estimate.pipeline_rank
        )
        params = layers * profile.layers[0].param_count // par.tensor_parallel_degree
        weights, grads, optimizer = 8 * params, 8 * params, 16 * params
        estimates.append(
            estimate.model_copy(
                update={
                    "weights_bytes": weights,
                    "gradients_bytes": grads,
                    "optimizer_bytes": optimizer,
                    "total_bytes": weights + grads + optimizer,
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


def _problems(plan: Plan, profile: Profile | None = None) -> str:
    with pytest.raises(PlanInvalidError) as caught:
        validate_plan(plan, profile)
    return str(caught.value)


def _two_node_cluster() -> Cluster:
    return Cluster(
        name="two-nodes",
        gpu_types=[CPU_GPU],
        node_groups=[
            NodeGroup(
                name="n", gpu="cpu", gpus_per_node=2, count=2, intra_node_bandwidth_gb_per_s=5
            )
        ],
        inter_node_bandwidth_gb_per_s=1,
    )


def _two_node_plan(tensor_parallel: int) -> Plan:
    """pp=1, dp=4/tp, across two nodes of 2 GPUs: valid."""
    cluster = _two_node_cluster()
    base = make_plan([4], data_parallel=4 // tensor_parallel, tensor_parallel=tensor_parallel)
    first, second = cluster.nodes()
    nodes, rank_map = build_rank_map(
        [[NodeSlice(first, 2), NodeSlice(second, 2)]], 4 // tensor_parallel, tensor_parallel
    )
    inputs = base.inputs.model_copy(update={"cluster": cluster})
    return base.model_copy(update={"inputs": inputs, "nodes": nodes, "rank_map": rank_map})


# ---- valid plans pass ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "plan",
    [
        make_plan([2, 2], data_parallel=2),
        make_plan([1, 2, 1], num_micro_batches=3),
        make_plan([2], data_parallel=2, tensor_parallel=2),
        make_plan([1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b"),
        make_plan([4], data_parallel=2, replica_micro_batch_sizes=[3, 1]),
    ],
    ids=["pp2-dp2", "pp3-uneven-layers", "tp2-dp2", "interleaved", "uneven-shares-pp1"],
)
def test_valid_plans_pass_with_and_without_profile(plan: Plan) -> None:
    profile = _profile(plan.inputs.model.num_layers)
    validate_plan(plan)
    validate_plan(_with_memory(plan, profile), profile)
    assert plan_problems(_with_memory(plan, profile), profile) == []


def test_valid_two_node_plans_pass() -> None:
    for tp in (1, 2):
        validate_plan(_two_node_plan(tp))


# ---- layers and stages ---------------------------------------------------------------------


def test_gap_between_stages_is_caught() -> None:
    plan = make_plan([2, 2])
    stages = [plan.stages[0], plan.stages[1].model_copy(update={"layer_start": 3})]
    assert "starts at layer 3; the previous stage ends at 2" in _problems(
        plan.model_copy(update={"stages": stages})
    )


def test_overlapping_stages_are_caught() -> None:
    plan = make_plan([2, 2])
    stages = [plan.stages[0], plan.stages[1].model_copy(update={"layer_start": 1})]
    assert "starts at layer 1" in _problems(plan.model_copy(update={"stages": stages}))


def test_layers_not_covered_are_caught() -> None:
    plan = make_plan([2, 2], num_model_layers=5)
    assert "cover layers up to 4; the model has 5" in _problems(plan)


def test_profile_with_other_layer_count_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "the profile has 6" in _problems(plan, _profile(6))


def test_wrong_stage_pipeline_rank_is_caught() -> None:
    plan = make_plan([1, 1, 1, 1], virtual_stages_per_rank=2, schedule="interleaved_1f1b")
    stages = list(plan.stages)
    stages[2] = stages[2].model_copy(update={"pipeline_rank": 1})
    assert "stage 2 runs on pipeline rank 1; it must be 2 % pp = 0" in _problems(
        plan.model_copy(update={"stages": stages})
    )


def test_stage_gpu_types_must_match_its_ranks() -> None:
    plan = make_plan([2, 2])
    stages = [plan.stages[0].model_copy(update={"gpu_types": ["H100"]}), plan.stages[1]]
    assert "stage 0 says GPU types ['H100']" in _problems(
        plan.model_copy(update={"stages": stages})
    )


# ---- ranks ----------------------------------------------------------------------------------


def test_duplicate_rank_is_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2)
    message = _problems(_replace_rank(plan, 1, rank=0))
    assert "missing [1]" in message and "repeated [0]" in message


def test_rank_convention_is_enforced() -> None:
    plan = make_plan([2], data_parallel=2, tensor_parallel=2)
    # Rank 1 is (p0, d0, t1); claim it is (p0, d1, t0), which is rank 2 by the convention.
    broken = _replace_rank(plan, 1, dp_index=1, tp_index=0)
    assert "rank 1 says (pipeline 0, dp 1, tp 0)" in _problems(broken)


def test_out_of_range_index_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "out of range" in _problems(_replace_rank(plan, 1, pipeline_rank=5))


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


def test_tp_group_across_nodes_is_caught() -> None:
    plan = _two_node_plan(2)
    # Swap rank 1 (n-0, gpu 1) with rank 2 (n-1, gpu 0): tp group (0, 0) now spans both nodes.
    broken = _replace_rank(_replace_rank(plan, 1, node="n-1", local_rank=0), 2, node="n-0")
    broken = _replace_rank(broken, 2, local_rank=1)
    assert "tp group (pipeline 0, dp 0) spans nodes ['n-0', 'n-1']" in _problems(broken)


# ---- batch, schedule, profile ---------------------------------------------------------------


def test_global_batch_mismatch_is_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2, micro_batch_size=2, num_micro_batches=4)
    inputs = plan.inputs.model_copy(update={"global_batch_size": 17})
    message = _problems(plan.model_copy(update={"inputs": inputs}))
    assert (
        "global batch 17 != sum of replica micro-batch sizes (4) × micro-batches (4) = 16"
        in message
    )


def test_uneven_shares_with_pipeline_are_caught() -> None:
    plan = make_plan([2, 2], data_parallel=2, micro_batch_size=2)
    broken = _replace_parallelism(plan, replica_micro_batch_sizes=[3, 1])
    assert "uneven replica shares [3, 1] need pp = 1 (pp is 2)" in _problems(broken)


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


def test_tp_must_divide_layer_degree() -> None:
    plan = make_plan([2], data_parallel=2, tensor_parallel=2)
    profile = _profile(2, divide=3)
    assert "tp 2 does not divide layer 0 (layers.0)'s 3" in _problems(
        _with_memory(plan, profile), profile
    )


def test_profile_of_another_model_is_caught() -> None:
    plan = make_plan([2, 2])
    profile = _profile(4, name="gpt2-small")
    assert "profile is of 'gpt2-small'" in _problems(_with_memory(plan, profile), profile)


# ---- memory ---------------------------------------------------------------------------------


def _estimate(plan: Plan, index: int = 0) -> MemoryEstimate:
    return plan.prediction.memory[index]


def test_memory_over_capacity_is_caught() -> None:
    plan = make_plan([2, 2])
    capacity = _estimate(plan).capacity_bytes
    over = _estimate(plan).model_copy(
        update={"activations_bytes": capacity + 1, "total_bytes": capacity + 1}
    )
    broken = _replace_prediction(plan, memory=[over, _estimate(plan, 1)])
    assert "pipeline rank 0 needs 8.00 GiB per cpu; it has 8.00 GiB" in _problems(broken)


def test_memory_parts_must_add_up() -> None:
    plan = make_plan([2, 2])
    wrong = _estimate(plan).model_copy(update={"weights_bytes": 100, "total_bytes": 50})
    broken = _replace_prediction(plan, memory=[wrong, _estimate(plan, 1)])
    assert "parts add up to 100 bytes, total says 50" in _problems(broken)


def test_memory_capacity_must_match_the_gpu() -> None:
    plan = make_plan([2, 2])
    wrong = _estimate(plan).model_copy(update={"capacity_bytes": 80 * 1024**3})
    assert "its spec says 8589934592" in _problems(
        _replace_prediction(plan, memory=[wrong, _estimate(plan, 1)])
    )


def test_missing_memory_estimate_is_caught() -> None:
    plan = make_plan([2, 2])
    assert "no memory estimate for pipeline ranks [1]" in _problems(
        _replace_prediction(plan, memory=[_estimate(plan)])
    )


def test_states_that_cannot_fit_are_caught_from_the_profile() -> None:
    # 2 layers × 2e8 params × 32 bytes = 11.9 GiB on one 8 GiB "cpu" GPU.
    plan = make_plan([2, 2])
    profile = _profile(4, params=200_000_000)
    message = _problems(plan, profile)
    assert "pipeline rank 0 needs at least 11.92 GiB for weights, gradients and Adam" in message


def test_zero1_divides_the_optimizer_floor() -> None:
    plan = make_plan([4], data_parallel=4)
    profile = _profile(4, params=50_000_000)  # 4 × 5e7 × 32 B = 5.96 GiB: fits without ZeRO
    assert "needs at least" not in " ".join(plan_problems(plan, profile))
    big = _profile(4, params=80_000_000)  # 9.5 GiB without ZeRO-1, 5.96 GiB with dp=4 ZeRO-1
    assert "needs at least 9.54 GiB" in _problems(plan, big)
    zero1 = _replace_parallelism(plan, zero1=True)
    assert all("needs at least" not in p for p in plan_problems(zero1, big))


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


def test_every_problem_is_reported_at_once() -> None:
    plan = _replace_rank(make_plan([2, 2], data_parallel=2), 3, local_rank=0)
    inputs = plan.inputs.model_copy(update={"global_batch_size": 1})
    with pytest.raises(PlanInvalidError) as caught:
        validate_plan(plan.model_copy(update={"inputs": inputs}))
    assert len(caught.value.problems) >= 3  # shared GPU, global batch, samples_per_s
    assert "\n" not in str(caught.value)


# ---- CLI ------------------------------------------------------------------------------------


def test_cli_validates_a_plan_file(tmp_path: Path) -> None:
    from autoplan.cli import app

    plan = make_plan([2, 2], data_parallel=2)
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    write_json_model(good, plan)
    write_json_model(bad, _replace_rank(plan, 1, local_rank=0))
    runner = CliRunner()
    result = runner.invoke(app, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid" in result.output
    result = runner.invoke(app, ["validate", str(bad)])
    assert result.exit_code == 2
    assert "share GPU 0 of node local-0" in result.output


# ---- plans the solver makes pass the independent checks --------------------------------------


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
