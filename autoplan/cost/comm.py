"""Communication times: the alpha-beta model of all-reduces and point-to-point transfers.

A message of S bytes over a link of bandwidth β (GB/s) and per-message latency α (µs) takes
α + S / β. Collectives are sequences of such steps, as NCCL runs them:

- Ring all-reduce over n ranks: a reduce-scatter then an all-gather, 2(n − 1) steps each
  moving S / n, so 2(n − 1) α + 2(n − 1)/n · S / β. The latency term grows with n; the
  bandwidth term tends to 2 S / β.
- Tree all-reduce (NCCL's double binary tree, used between nodes): a reduce up and a
  broadcast down a tree of depth ⌈log₂ n⌉, pipelined in chunks, so 2 ⌈log₂ n⌉ α +
  2 S / (0.9 β): NCCL's tuning model converts a tree's bus bandwidth to algorithm bandwidth
  with a factor of 1/2 (every link carries the payload up and down) and takes 90% of the
  ring's bus bandwidth for trees. Its latency grows with log n only.
- NCCL picks, per call, the algorithm its model says is faster; it runs trees only across
  nodes (inside a node it uses rings or chains). ``allreduce_ms`` does the same: the ring
  inside a node, the faster of ring and tree across nodes.
- Point-to-point (a pipeline stage's send): one step, α + S / β.

For large messages every form reduces to its bandwidth term; for small ones the latency binds,
which is what makes many small all-reduces (tensor parallelism at small micro-batches) and
rings over many nodes slow.

The latencies are per step. NCCL's own cost model (src/graph/tuning.cc, ``hwLat``, Simple
protocol, ring) uses about 3.4 µs per step over NVLink, 5.7 µs over PCIe and 9.6 µs over the
network, plus a base latency of about 8 µs per call; the cluster file's defaults
(``intra_node_latency_us`` 5, ``inter_node_latency_us`` 10) are of that order
(``LINK_LATENCY_US`` lists them by link kind). What a framework adds per call (Python, the
process group, launching the kernel) comes on top; a cluster file may state an effective
latency that includes it.
"""

from __future__ import annotations

import math

__all__ = [
    "LINK_LATENCY_US",
    "TREE_BANDWIDTH_FRACTION",
    "allreduce_ms",
    "p2p_ms",
    "ring_allreduce_ms",
    "tree_allreduce_ms",
]

# Typical per-step latency by link kind (µs): NCCL's tuning model (src/graph/tuning.cc,
# ring, Simple protocol: NVLink 3.4, PCI 5.7, network 9.6), rounded up to the cluster file's
# defaults for intra-node (5) and inter-node (10) links.
LINK_LATENCY_US: dict[str, float] = {
    "nvlink": 3.4,
    "pcie": 5.7,
    "infiniband": 9.6,
    "ethernet": 9.6,
}


# NCCL's tuning model (src/graph/tuning.cc) gives trees 90% of the ring's bus bandwidth.
TREE_BANDWIDTH_FRACTION = 0.9


def _bandwidth_ms(volume_bytes: float, bandwidth_gb_per_s: float) -> float:
    return volume_bytes / (bandwidth_gb_per_s * 1e9) * 1e3


def ring_allreduce_ms(
    payload_bytes: float, group_size: int, bandwidth_gb_per_s: float, latency_us: float
) -> float:
    """Ring all-reduce of ``payload_bytes`` over ``group_size`` ranks: 2(n − 1) steps of
    latency plus 2(n − 1)/n of the payload per rank at ``bandwidth_gb_per_s``. A group of one
    (or nothing to send) costs nothing."""
    if group_size <= 1 or payload_bytes <= 0:
        return 0.0
    steps = 2 * (group_size - 1)
    volume = steps / group_size * payload_bytes
    return _bandwidth_ms(volume, bandwidth_gb_per_s) + steps * latency_us * 1e-3


def tree_allreduce_ms(
    payload_bytes: float, group_size: int, bandwidth_gb_per_s: float, latency_us: float
) -> float:
    """Tree all-reduce (reduce up, broadcast down a tree of depth ⌈log₂ n⌉): 2 ⌈log₂ n⌉ steps
    of latency plus twice the payload at 90% of ``bandwidth_gb_per_s``."""
    if group_size <= 1 or payload_bytes <= 0:
        return 0.0
    depth = math.ceil(math.log2(group_size))
    bandwidth = TREE_BANDWIDTH_FRACTION * bandwidth_gb_per_s
    return _bandwidth_ms(2 * payload_bytes, bandwidth) + 2 * depth * latency_us * 1e-3


def allreduce_ms(
    payload_bytes: float,
    group_size: int,
    bandwidth_gb_per_s: float,
    latency_us: float,
    *,
    across_nodes: bool = False,
) -> float:
    """All-reduce as NCCL would run it: a ring inside a node; across nodes the faster of a
    ring and a tree (module docstring)."""
    ring = ring_allreduce_ms(payload_bytes, group_size, bandwidth_gb_per_s, latency_us)
    if not across_nodes:
        return ring
    return min(ring, tree_allreduce_ms(payload_bytes, group_size, bandwidth_gb_per_s, latency_us))


def p2p_ms(payload_bytes: float, bandwidth_gb_per_s: float, latency_us: float) -> float:
    """Time to send ``payload_bytes`` from one GPU to another over one link: α + S / β."""
    if payload_bytes <= 0:
        return 0.0
    return _bandwidth_ms(payload_bytes, bandwidth_gb_per_s) + latency_us * 1e-3
