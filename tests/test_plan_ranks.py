"""The rank map follows the (pp, dp, tp) row-major convention and refuses unlaunchable layouts."""

import pytest

from autoplan.cluster.schema import Cluster, NodeGroup
from autoplan.plan.ranks import NodeSlice, build_rank_map


def _cluster() -> Cluster:
    return Cluster(
        name="two-types",
        node_groups=[
            NodeGroup(
                name="a",
                gpu="A100-80GB",
                gpus_per_node=8,
                count=2,
                intra_node_bandwidth_gb_per_s=300,
            ),
            NodeGroup(
                name="v", gpu="V100-32GB", gpus_per_node=4, intra_node_bandwidth_gb_per_s=150
            ),
        ],
        inter_node_bandwidth_gb_per_s=25,
    )


def test_ranks_follow_mesh_convention_across_nodes() -> None:
    a0, a1, _ = _cluster().nodes()
    nodes, ranks = build_rank_map(
        [[NodeSlice(a0, 8)], [NodeSlice(a1, 8)]], data_parallel=4, tensor_parallel=2
    )
    assert [n.name for n in nodes] == ["a-0", "a-1"]
    assert [n.nproc_per_node for n in nodes] == [8, 8]
    for entry in ranks:
        assert entry.rank == entry.pipeline_rank * 8 + entry.dp_index * 2 + entry.tp_index
    assert {(e.node, e.local_rank) for e in ranks} == {
        (f"a-{n}", local) for n in range(2) for local in range(8)
    }
    assert [e.node_rank for e in ranks] == [0] * 8 + [1] * 8


def test_two_stages_may_share_a_node() -> None:
    a0, _, v0 = _cluster().nodes()
    nodes, ranks = build_rank_map(
        [[NodeSlice(a0, 4)], [NodeSlice(a0, 4)], [NodeSlice(v0, 4)]],
        data_parallel=2,
        tensor_parallel=2,
    )
    assert [(n.name, n.nproc_per_node) for n in nodes] == [("a-0", 8), ("v-0", 4)]
    assert [e.local_rank for e in ranks[:8]] == list(range(8))
    assert {e.gpu_type for e in ranks if e.pipeline_rank == 2} == {"V100-32GB"}


def test_non_contiguous_node_is_refused() -> None:
    a0, a1, _ = _cluster().nodes()
    with pytest.raises(ValueError, match="non-contiguously"):
        build_rank_map(
            [[NodeSlice(a0, 4)], [NodeSlice(a1, 4)], [NodeSlice(a0, 4)]],
            data_parallel=4,
            tensor_parallel=1,
        )


def test_tp_group_spanning_nodes_is_refused() -> None:
    a0, a1, _ = _cluster().nodes()
    with pytest.raises(ValueError, match="whole tp groups"):
        build_rank_map([[NodeSlice(a0, 3), NodeSlice(a1, 1)]], data_parallel=2, tensor_parallel=2)


def test_oversubscribed_node_is_refused() -> None:
    _, _, v0 = _cluster().nodes()
    with pytest.raises(ValueError, match="has 4 GPUs"):
        build_rank_map([[NodeSlice(v0, 8)]], data_parallel=8, tensor_parallel=1)
