"""The alpha-beta model of collectives and point-to-point sends (autoplan.cost.comm)."""

from __future__ import annotations

import math

import pytest

from autoplan.cost.comm import (
    LINK_LATENCY_US,
    allreduce_ms,
    p2p_ms,
    ring_allreduce_ms,
    tree_allreduce_ms,
)


@pytest.mark.parametrize("n", [2, 4, 8, 64, 1024])
def test_alpha_beta_reduces_to_bandwidth_for_large_messages(n: int) -> None:
    bandwidth, latency = 100.0, 10.0
    for payload in (1e13, 1e15):
        ring = ring_allreduce_ms(payload, n, bandwidth, latency)
        assert ring == pytest.approx(2 * (n - 1) / n * payload / 100e9 * 1e3, rel=1e-3)
        tree = tree_allreduce_ms(payload, n, bandwidth, latency)
        assert tree == pytest.approx(2 * payload / (0.9 * 100e9) * 1e3, rel=1e-3)
    assert p2p_ms(1e12, bandwidth, latency) == pytest.approx(1e12 / 100e9 * 1e3, rel=1e-5)


def test_latency_binds_small_messages() -> None:
    # 8 bytes: the ring pays 2(n-1) steps, the tree 2 log2 n, a send one.
    assert ring_allreduce_ms(8, 8, 100.0, 10.0) == pytest.approx(14 * 0.01, rel=1e-5)
    assert tree_allreduce_ms(8, 8, 100.0, 10.0) == pytest.approx(6 * 0.01, rel=1e-5)
    assert p2p_ms(8, 100.0, 10.0) == pytest.approx(0.01, rel=1e-5)
    # A latency doubles the small-message time and leaves a large one nearly unchanged.
    small = ring_allreduce_ms(1e3, 16, 100.0, 20.0) / ring_allreduce_ms(1e3, 16, 100.0, 10.0)
    large = ring_allreduce_ms(1e10, 16, 100.0, 20.0) / ring_allreduce_ms(1e10, 16, 100.0, 10.0)
    assert small == pytest.approx(2.0, rel=0.01)
    assert large == pytest.approx(1.0, abs=2e-3)


def test_nccl_picks_tree_across_nodes_for_small_messages_and_ring_inside() -> None:
    n, bandwidth, latency = 256, 25.0, 10.0
    small, large = 1e5, 1e10
    # Across nodes: the faster of the two (the tree for small messages over many ranks).
    assert allreduce_ms(small, n, bandwidth, latency, across_nodes=True) == pytest.approx(
        tree_allreduce_ms(small, n, bandwidth, latency)
    )
    assert allreduce_ms(large, n, bandwidth, latency, across_nodes=True) == pytest.approx(
        ring_allreduce_ms(large, n, bandwidth, latency)
    )
    # Inside a node always the ring.
    assert allreduce_ms(small, 8, bandwidth, latency) == ring_allreduce_ms(
        small, 8, bandwidth, latency
    )
    assert tree_allreduce_ms(small, 1, bandwidth, latency) == 0.0
    assert ring_allreduce_ms(0, 8, bandwidth, latency) == 0.0


def test_link_latencies_are_those_of_nccls_tuning_model() -> None:
    assert LINK_LATENCY_US["nvlink"] < LINK_LATENCY_US["pcie"] < LINK_LATENCY_US["infiniband"]
    assert all(0 < v < 20 for v in LINK_LATENCY_US.values())
    assert math.isclose(LINK_LATENCY_US["ethernet"], LINK_LATENCY_US["infiniband"])


def test_inter_node_link_latency_is_per_link() -> None:
    from autoplan.cluster.schema import Cluster, InterNodeLink, NodeGroup

    groups = [
        NodeGroup(name=name, gpu="H100", gpus_per_node=8, intra_node_bandwidth_gb_per_s=450)
        for name in ("a", "b", "c")
    ]
    cluster = Cluster(
        name="t",
        node_groups=groups,
        inter_node_bandwidth_gb_per_s=12.5,
        inter_node_latency_us=30.0,
        inter_node_links=[
            InterNodeLink(groups=["a", "b"], bandwidth_gb_per_s=50.0, latency_us=3.0),
            InterNodeLink(groups=["a", "b", "c"], bandwidth_gb_per_s=25.0),
        ],
    )
    assert cluster.inter_node_latency({"a", "b"}) == 3.0  # the fastest joining link's
    assert cluster.inter_node_latency({"a", "c"}) == 30.0  # that link states none
    assert cluster.inter_node_bandwidth({"a", "c"}) == 25.0
