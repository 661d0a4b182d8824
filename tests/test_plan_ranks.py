"""Placement: replicas in aligned blocks on their class's nodes; ranks as torchrun numbers them.

Uniform plans come out row-major as (pp, dp, tp), the layout one DeviceMesh reads; any mix
of block sizes fits whenever the GPUs add up (buddy packing)."""

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.plan.ranks import build_rank_map
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.placement import place
from tests.synthetic_profiles import layer, make_profile


def _cluster(a_per_node: int = 8, a_count: int = 2) -> Cluster:
    return Cluster(
        name="two-types",
        node_groups=[
            NodeGroup(
                name="a",
                gpu="A100-80GB",
                gpus_per_node=a_per_node,
                count=a_count,
                intra_node_bandwidth_gb_per_s=300,
            ),
            NodeGroup(
                name="v", gpu="V100-32GB", gpus_per_node=4, intra_node_bandwidth_gb_per_s=150
            ),
        ],
        inter_node_bandwidth_gb_per_s=25,
    )


def _model(cluster: Cluster, layers: int = 4):
    profile = make_profile(
        [layer(i, flops=10**9, params=10**6, saved=10**6, output=10**5) for i in range(layers)]
    )
    return cost_model(profile, cluster, SolveOptions())


def _stage(start: int, end: int, *groups: tuple[int, int, int]) -> StageChoice:
    return StageChoice(
        start, end, tuple(sorted(ReplicaGroup(k, t, n, 1, "none") for k, t, n in groups))
    )


def test_uniform_plan_is_row_major_across_nodes() -> None:
    model = _model(_cluster())
    config = PlanConfig(4, "1f1b", 1, (_stage(0, 2, (0, 2, 4)), _stage(2, 4, (0, 2, 4))))
    nodes, entries, ranks = build_rank_map(place(model, config))
    assert [(n.name, n.nproc_per_node) for n in nodes] == [("a-0", 8), ("a-1", 8)]
    for entry in entries:
        assert entry.rank == entry.pipeline_rank * 8 + entry.dp_index * 2 + entry.tp_index
    assert ranks[1][0][3] == [14, 15]
    assert [e.node_rank for e in entries] == [0] * 8 + [1] * 8


def test_a_stage_in_one_block_keeps_its_replicas_on_one_node() -> None:
    # Stage 0 takes 2 GPUs (one block), stage 1 a whole node: the larger block goes first.
    model = _model(_cluster(a_per_node=4, a_count=2))
    config = PlanConfig(4, "1f1b", 1, (_stage(0, 2, (0, 1, 2)), _stage(2, 4, (0, 1, 4))))
    placement = place(model, config)
    assert {slots.node.name for slots in placement[0][0]} == {"a-1"}
    assert {slots.node.name for slots in placement[1][0]} == {"a-0"}
    nodes, entries, _ = build_rank_map(placement)
    assert [n.name for n in nodes] == ["a-1", "a-0"]  # launch order: first used by stage 0
    assert [(e.rank, e.pipeline_rank) for e in entries] == [
        (0, 0),
        (1, 0),
        (2, 1),
        (3, 1),
        (4, 1),
        (5, 1),
    ]


def test_types_in_any_order_share_nodes_and_ranks_stay_per_node() -> None:
    # A, V, A: both A stages on node a-0; torchrun's blocks of ranks per node still hold.
    model = _model(_cluster(a_count=1))
    config = PlanConfig(
        4, "1f1b", 1, (_stage(0, 1, (0, 1, 2)), _stage(1, 3, (1, 4, 1)), _stage(3, 4, (0, 2, 2)))
    )
    nodes, entries, ranks = build_rank_map(place(model, config))
    assert [n.name for n in nodes] == ["a-0", "v-0"]
    on = {name: [e.rank for e in entries if e.node == name] for name in ("a-0", "v-0")}
    assert on["a-0"] == list(range(6)) and on["v-0"] == [6, 7, 8, 9]
    assert ranks[1][0][0] == [6, 7, 8, 9]
    assert all(r == sorted(r) for p in ranks for g in p for r in g)


def test_more_gpus_than_a_class_has_are_refused() -> None:
    model = _model(_cluster(a_count=1))
    config = PlanConfig(4, "1f1b", 1, (_stage(0, 2, (1, 4, 1)), _stage(2, 4, (1, 2, 1))))
    with pytest.raises(ValueError, match="no aligned block"):
        place(model, config)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from([(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (1, 3)]), max_size=6))
def test_any_blocks_that_add_up_fit(shape) -> None:
    """Buddy packing: stages of whole tp groups (tp in 1, 2, 4) fit whenever their GPUs add up
    to at most the class's 16, each replica on one node, no GPU used twice."""
    model = _model(_cluster(a_per_node=8, a_count=2), layers=max(1, len(shape)))
    stages = tuple(_stage(i, i + 1, (0, t, n)) for i, (t, n) in enumerate(shape))
    if not stages or sum(t * n for t, n in shape) > 16:
        return
    config = PlanConfig(len(stages), "gpipe", 1, stages)
    placement = place(model, config)
    used = [(s.node.name, slot) for p in placement for g in p for s in g for slot in s.slots]
    assert len(used) == len(set(used)) == sum(t * n for t, n in shape)
    for p, (t, _) in zip(placement, shape, strict=True):
        for slots in itertools.chain.from_iterable(p):
            assert len(slots.slots) == t and slots.slots[0] % t == 0
