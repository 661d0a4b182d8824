"""Device classes: the cluster's node groups merged where they are interchangeable.

A stage runs on dp × tp GPUs of one class. Node groups with the same GPU type, GPUs per node
and intra-node link are one class (the planner cannot tell their nodes apart, so it need not
search over them separately).

The inter-node bandwidth of a cluster is a node's (all its NICs together), shared by the
flows that leave the node at once: with tp = t inside a node, the t data-parallel rings (one
per tp index) all cross the node boundary together, each at node bandwidth / t; the GPUs of a
stage that all send their boundary activation to the next stage's node share it likewise. The
intra-node link is per GPU (NVSwitch gives every GPU its own), so it is not shared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup

__all__ = [
    "DeviceClass",
    "block_sizes",
    "device_classes",
    "node_flows",
]


def block_sizes(gpus_per_node: int) -> tuple[int, ...]:
    """GPU counts that pack into nodes of ``gpus_per_node`` without waste or straddling:
    the powers of two dividing it, and the whole node. Each divides the next, so blocks of
    these sizes fill nodes greedily (largest first, aligned) whenever their total fits, as a
    buddy allocator does; tp degrees and single-node stages take these sizes."""
    sizes = []
    size = 1
    while gpus_per_node % size == 0 and size < gpus_per_node:
        sizes.append(size)
        size *= 2
    sizes.append(gpus_per_node)
    return tuple(sizes)


def node_flows(concurrent_flows: int, gpus_per_node: int) -> int:
    """How many of ``concurrent_flows`` inter-node flows (one per GPU at most) leave one
    node of ``gpus_per_node`` GPUs at once, sharing its inter-node bandwidth."""
    return max(1, min(concurrent_flows, gpus_per_node))


@dataclass(frozen=True)
class DeviceClass:
    """Interchangeable nodes: ``num_nodes`` nodes of ``gpus_per_node`` GPUs of ``gpu``."""

    index: int
    gpu: GpuSpec
    groups: tuple[str, ...]
    gpus_per_node: int
    num_nodes: int
    intra_node_bandwidth_gb_per_s: float
    intra_node_latency_us: float
    inter_node_bandwidth_gb_per_s: float
    inter_node_latency_us: float
    host_link_bandwidth_gb_per_s: float = 25.0
    # One GPU's share of its node's host RAM (what activation offload may park there).
    host_memory_bytes_per_gpu: float = math.inf

    @property
    def total_gpus(self) -> int:
        return self.gpus_per_node * self.num_nodes

    def collective_bandwidth_gb_per_s(self, gpus: int) -> float:
        """Bandwidth a collective among ``gpus`` GPUs of one node of this class reaches: the
        intra-node link, except among more GPUs than an NVLink bridge joins on PCIe cards,
        where the ring crosses PCIe and the host (``GpuSpec.pcie_collective_bandwidth_gb_per_s``:
        fitted on the calibration data, ~5 GB/s where the cluster files give the bridges'
        ~25 GB/s)."""
        cap = self.gpu.pcie_collective_bandwidth_gb_per_s
        if cap is None or gpus <= self.gpu.nvlink_bridge_gpus:
            return self.intra_node_bandwidth_gb_per_s
        return min(self.intra_node_bandwidth_gb_per_s, cap)

    @property
    def label(self) -> str:
        return "+".join(self.groups)

    def group_link(self, group_gpus: int, concurrent_flows: int = 1) -> tuple[float, float]:
        """(bandwidth GB/s, latency us) one flow gets on the slowest link a group of
        ``group_gpus`` consecutive GPUs of this class spans: inside one node if it fits, else
        between nodes, where ``concurrent_flows`` flows (e.g. the tp degree's dp rings) share
        each node's bandwidth."""
        if group_gpus <= self.gpus_per_node:
            return self.intra_node_bandwidth_gb_per_s, self.intra_node_latency_us
        share = node_flows(concurrent_flows, self.gpus_per_node)
        return self.inter_node_bandwidth_gb_per_s / share, self.inter_node_latency_us


def device_classes(cluster: Cluster, specs: dict[str, GpuSpec]) -> list[DeviceClass]:
    """The cluster's device classes, in order of first appearance in the file."""
    merged: dict[tuple[str, int, float, float, float, float], list[NodeGroup]] = {}
    for group in cluster.node_groups:
        host = group.host_link_bandwidth_gb_per_s
        ram_gib = group.host_memory_gib
        key = (
            group.gpu,
            group.gpus_per_node,
            group.intra_node_bandwidth_gb_per_s,
            group.intra_node_latency_us,
            specs[group.gpu].host_link_bandwidth_gb_per_s if host is None else host,
            (
                specs[group.gpu].host_memory_gib_per_gpu
                if ram_gib is None
                else ram_gib / group.gpus_per_node
            )
            * 1024**3,
        )
        merged.setdefault(key, []).append(group)
    classes = []
    for index, ((gpu, gpn, bw, lat, host, ram), groups) in enumerate(merged.items()):
        names = tuple(group.name for group in groups)
        classes.append(
            DeviceClass(
                index=index,
                gpu=specs[gpu],
                groups=names,
                gpus_per_node=gpn,
                num_nodes=sum(group.count for group in groups),
                intra_node_bandwidth_gb_per_s=bw,
                # A step of a collective pays the stack's overhead on top of the link's
                # latency (GpuSpec.collective_step_overhead_us).
                intra_node_latency_us=lat + specs[gpu].collective_step_overhead_us,
                inter_node_bandwidth_gb_per_s=cluster.inter_node_bandwidth(set(names)),
                inter_node_latency_us=cluster.inter_node_latency_us
                + specs[gpu].collective_step_overhead_us,
                host_link_bandwidth_gb_per_s=host,
                host_memory_bytes_per_gpu=ram,
            )
        )
    return classes
