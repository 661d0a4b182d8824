"""The groups executor's plan-level logic, without process groups: what check_runnable
refuses, sample routes between stages, message order, the gradient sync's pieces, the device
check and the per-rank memory prediction. (tests/test_runtime_distributed.py runs it.)"""

from __future__ import annotations

import pytest
import torch

from autoplan.errors import InputError, LaunchMismatchError
from autoplan.plan.schema import Plan
from autoplan.runtime.check import check_runnable
from autoplan.runtime.data import replica_rows, sample_rows
from autoplan.runtime.device_check import check_device_identity
from autoplan.runtime.grad_sync import parameter_families, plan_reductions
from autoplan.runtime.launch_check import LaunchEnv, check_launch
from autoplan.runtime.model_stage import meta_model
from autoplan.runtime.placement import Route, boundary_routes, rank_place
from autoplan.runtime.report import predicted_memory_of_rank
from autoplan.runtime.transfers import boundary_shapes, send_sequence
from autoplan.schedule import schedule_order
from autoplan.zoo.dtypes import torch_dtype
from tests.plan_factory import ReplicaSpec, local_cluster, make_plan, make_stages_plan

R = ReplicaSpec


def _mixed_tp_plan() -> Plan:
    # Stage 0: a tp-1 replica (1 sample) and a tp-2 replica (3); stage 1: one tp-1 (4).
    return make_stages_plan([3, 3], [[R(1, 1), R(2, 3)], [R(1, 4)]], num_micro_batches=2)


def _replace_stage(plan: Plan, index: int, **update: object) -> Plan:
    stages = list(plan.stages)
    stages[index] = stages[index].model_copy(update=update)
    return plan.model_copy(update={"stages": stages})


def test_heterogeneous_plans_pass_the_runnable_check() -> None:
    check_runnable(_mixed_tp_plan())
    check_runnable(
        make_stages_plan(
            [1, 2, 2, 1],
            [[R(1, 1), R(1, 1)], [R(2, 2)]],
            virtual_stages_per_rank=2,
            schedule="interleaved_1f1b",
        )
    )


def test_shares_that_do_not_add_up_to_the_micro_batch_are_refused() -> None:
    plan = _mixed_tp_plan()
    replica = plan.stages[1].replicas[0].model_copy(update={"micro_batch_size": 3})
    with pytest.raises(InputError, match=r"stage 1's replicas take 3 = 3 samples .* is 4"):
        check_runnable(_replace_stage(plan, 1, replicas=[replica]))


def test_a_replica_whose_tp_splits_a_kv_head_is_refused() -> None:
    # llama-tiny: 2 kv heads; one replica of tp 4 among tp-1 ones.
    plan = make_stages_plan([3, 3], [[R(1, 2)], [R(4, 2)]], model="llama-tiny")
    with pytest.raises(InputError, match=r"degree 4 does not divide llama-tiny's .* gcd is 2"):
        check_runnable(plan)


def test_interleaved_stages_of_one_rank_on_different_replicas_are_refused() -> None:
    plan = make_stages_plan(
        [1, 2, 2, 1],
        [[R(1, 1), R(1, 1)], [R(2, 2)]],
        virtual_stages_per_rank=2,
        schedule="interleaved_1f1b",
    )
    # Stage 2 on pipeline rank 0 gets one replica of both samples; stage 0 keeps two.
    whole = plan.stages[2].replicas[0].model_copy(update={"micro_batch_size": 2})
    bad = _replace_stage(plan, 2, replicas=[whole])
    with pytest.raises(InputError, match="stages 0 and 2 both run on pipeline rank 0"):
        check_runnable(bad)


def test_zero1_over_replicas_of_different_tp_is_refused() -> None:
    plan = _replace_stage(_mixed_tp_plan(), 0, zero_stage=1)
    with pytest.raises(InputError, match=r"stage 0 shards optimizer states .* tp \[1, 2\]"):
        check_runnable(plan)


def test_replica_ranks_out_of_tp_order_are_refused() -> None:
    plan = _mixed_tp_plan()
    replica = plan.stages[0].replicas[1]
    swapped = replica.model_copy(update={"ranks": list(reversed(replica.ranks))})
    with pytest.raises(InputError, match="distinct and ascending by tp index"):
        check_runnable(_replace_stage(plan, 0, replicas=[plan.stages[0].replicas[0], swapped]))


def test_routes_send_each_sample_to_the_replica_that_owns_it() -> None:
    plan = make_stages_plan([3, 3], [[R(1, 3), R(1, 1)], [R(2, 4)]])
    assert boundary_routes(plan, 0) == [Route(0, 0, 0, 0, 3), Route(0, 1, 0, 3, 4)]
    plan = make_stages_plan([3, 3], [[R(1, 2), R(1, 2)], [R(1, 1), R(1, 3)]])
    assert boundary_routes(plan, 0) == [
        Route(0, 0, 0, 0, 1),
        Route(0, 0, 1, 1, 2),
        Route(0, 1, 1, 2, 4),
    ]


def test_sample_rows_cover_the_batch_once_and_match_the_mesh_layout() -> None:
    plan = make_plan([6], data_parallel=2, num_micro_batches=3, replica_micro_batch_sizes=[3, 1])
    rows = [sample_rows(plan, mb, 0, 4) for mb in range(3)]
    assert sorted(torch.cat(rows).tolist()) == list(range(12))
    # Replica 0's micro-batch mb is rows 3mb..3mb+2 of its block, as the mesh path cuts it.
    assert sample_rows(plan, 1, 0, 3).tolist() == [3, 4, 5]
    block = replica_rows(plan, 1)
    assert torch.cat([sample_rows(plan, mb, 3, 4) for mb in range(3)]).tolist() == list(
        range(block.start, block.stop)
    )


def test_every_message_is_sent_once_and_received_where_the_receiver_runs() -> None:
    plan = make_stages_plan(
        [1, 2, 2, 1],
        [[R(1, 1), R(1, 1)], [R(2, 2)]],
        virtual_stages_per_rank=2,
        schedule="interleaved_1f1b",
        num_micro_batches=4,
    )
    order = schedule_order("interleaved_1f1b", 2, 4, 2)
    messages = [m for rank in range(plan.world_size) for m in send_sequence(plan, order, rank)]
    assert len(messages) == len(set(messages))
    # 3 boundaries × 4 micro-batches × 2 routes, forward and back; tp rank 1 sends nothing.
    assert len(messages) == 3 * 4 * 2 * 2
    assert send_sequence(plan, order, 3) == []
    receivers = {m.receiver(plan) for m in messages}
    assert receivers == {0, 1, 2}


def test_boundary_shapes_come_from_a_meta_run() -> None:
    plan = make_stages_plan([2, 2, 2], [[R(1, 2)], [R(1, 2)], [R(1, 2)]])
    shapes = boundary_shapes(plan, (torch.zeros(4, 16, dtype=torch.long),))
    hidden = meta_model(plan).layers["block_0"].attn.q.in_features
    assert [(s.boundary, s.tail, s.dtype) for s in shapes] == [
        (0, (16, hidden), torch_dtype("fp64")),
        (1, (16, hidden), torch_dtype("fp64")),
    ]


def _reductions(plan: Plan):  # type: ignore[no-untyped-def]
    buckets = plan_reductions(plan, parameter_families(plan, meta_model(plan)))
    return [r for bucket in buckets for r in bucket.reductions]


def test_a_stage_of_tp_1_and_tp_2_replicas_sums_matching_pieces() -> None:
    plan = _mixed_tp_plan()  # ranks: 0 (tp 1), 1 and 2 (tp 2), 3 (stage 1)
    reductions = _reductions(plan)
    token = [r for r in reductions if r.holders[0].name == "layers.embed.token.weight"]
    # gpt-tiny's 128 tokens: rows 0..63 on rank 1, 64..127 on rank 2; rank 0 holds all.
    assert [(r.op, r.ranks, r.length) for r in token] == [("sum", (0, 1), 64), ("sum", (0, 2), 64)]
    assert [(h.rank, h.offset) for h in token[1].holders] == [(0, 64), (2, 0)]
    # A row projection's weight splits along its input (dim 1).
    out = [r for r in reductions if r.holders[0].name == "layers.block_0.attn.out.weight"]
    assert {r.dim for r in out} == {1} and len(out) == 2
    # A norm is replicated: rank 0 and the tp-2 replica's tp rank 0 sum, which broadcasts.
    norm = [r for r in reductions if r.holders[0].name == "layers.block_0.attn_norm.weight"]
    assert [(r.op, r.ranks, r.src) for r in norm] == [
        ("sum", (0, 1), None),
        ("broadcast", (1, 2), 1),
    ]
    # Stage 1 has one replica: nothing to sum.
    assert not [r for r in reductions if any(h.stage == 1 for h in r.holders)]


def test_equal_tp_replicas_sum_by_tp_index() -> None:
    plan = make_stages_plan([6], [[R(2, 1), R(2, 1)]], num_micro_batches=2)
    norm = [r for r in _reductions(plan) if r.holders[0].name == "layers.block_0.attn_norm.weight"]
    assert [(r.op, r.ranks) for r in norm] == [("sum", (0, 2)), ("sum", (1, 3))]


def test_a_tied_weight_is_summed_over_the_replicas_of_both_stages() -> None:
    plan = make_stages_plan(
        [2, 2], [[R(1, 1), R(1, 1)], [R(2, 2)]], model="tests.runtime_models:tied_gpt"
    )
    tied = [r for r in _reductions(plan) if r.holders[0].name == "layers.embed.token.weight"]
    # 33 rows: the head's tp 2 holds 17 + 16; both embedding replicas hold all.
    assert [(r.ranks, r.length) for r in tied] == [((0, 1, 2), 17), ((0, 1, 3), 16)]
    assert [(h.stage, h.name, h.offset) for h in tied[1].holders] == [
        (0, "layers.embed.token.weight", 17),
        (0, "layers.embed.token.weight", 17),
        (1, "layers.head.output.weight", 0),
    ]


def test_rank_place_and_launch_message_of_a_heterogeneous_plan() -> None:
    plan = _mixed_tp_plan()
    place = rank_place(plan, 2)
    assert (place.pipeline_rank, place.replica, place.tp_index, place.stages) == (0, 1, 1, (0,))
    with pytest.raises(LaunchMismatchError, match=r"needs 4 processes \(pp 2, GPUs per replica"):
        check_launch(plan, LaunchEnv(2, 0, 0, 0, 2))


def test_device_check_matches_name_and_memory() -> None:
    cluster = local_cluster(1).model_copy(
        update={
            "node_groups": [
                local_cluster(1).node_groups[0].model_copy(update={"gpu": "A100-80GB"}),
            ]
        }
    )
    plan = make_stages_plan([6], [[R(1, 2)]], cluster=cluster)
    entry = plan.rank_map[0]
    check_device_identity(plan, entry, "NVIDIA A100-SXM4-80GB", 85_097_971_712)
    with pytest.raises(LaunchMismatchError, match=r"found a NVIDIA A100-SXM4-40GB .* A100-80GB"):
        check_device_identity(plan, entry, "NVIDIA A100-SXM4-40GB", 42_505_273_344)
    with pytest.raises(LaunchMismatchError, match="has 80 GiB: a different model"):
        check_device_identity(plan, entry, "NVIDIA A100 80GB", 10 * 2**30)


def test_each_rank_gets_its_replicas_memory_estimate() -> None:
    plan = _mixed_tp_plan()
    shapes = [
        (e.pipeline_rank, e.tensor_parallel_degree, e.micro_batch_size)
        for e in (predicted_memory_of_rank(plan, rank) for rank in range(4))
        if e is not None
    ]
    assert shapes == [(0, 1, 1), (0, 2, 3), (0, 2, 3), (1, 1, 4)]
