"""GPU types and clusters: the hardware a plan runs on.

A cluster file (YAML) lists node groups; each group is ``count`` identical nodes of
``gpus_per_node`` GPUs of one type, joined inside a node by ``intra_node_bandwidth_gb_per_s``.
Links between nodes have one default bandwidth and optional faster links inside named groups
of nodes (a rack, a pod).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "CLUSTER_SCHEMA_VERSION",
    "Cluster",
    "GpuSpec",
    "InterNodeLink",
    "Node",
    "NodeGroup",
]

CLUSTER_SCHEMA_VERSION = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    """Datasheet figures of one GPU type; dense (no sparsity) peaks."""

    name: str = Field(description="Catalog key, e.g. 'A100-80GB'.")
    memory_gib: float = Field(gt=0, description="Device memory in GiB.")
    memory_bandwidth_gb_per_s: float = Field(gt=0, description="HBM/GDDR bandwidth, GB/s.")
    peak_tflops: dict[str, float] = Field(
        description="Dense peak TFLOP/s by dtype ('fp32', 'tf32', 'fp16', 'bf16', 'fp64')."
    )
    efficiency: float = Field(
        gt=0, le=1, description="Fraction of peak that large training matmuls achieve."
    )
    efficiency_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="Measured fraction of that dtype's peak where it differs from `efficiency` "
        "(e.g. fp32/tf32 from calibration data); autoplan.cluster.catalog.efficiency_for "
        "picks between them.",
    )
    datasheet_url: str = Field(default="", description="Where the figures come from.")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * 1024**3)


class NodeGroup(_Strict):
    """``count`` identical nodes."""

    name: str = Field(description="Prefix of the node names: nodes are '<name>-0', '<name>-1'...")
    gpu: str = Field(description="GPU type: a key of the catalog or of the file's `gpu_types`.")
    gpus_per_node: int = Field(ge=1)
    count: int = Field(default=1, ge=1, description="How many such nodes.")
    intra_node_bandwidth_gb_per_s: float = Field(
        gt=0, description="GPU-to-GPU bandwidth inside a node (NVLink or PCIe), GB/s per GPU."
    )
    intra_node_latency_us: float = Field(default=5.0, ge=0, description="Per-message latency.")


class InterNodeLink(_Strict):
    """A faster link among a set of node groups (for example one rack)."""

    groups: list[str] = Field(min_length=1, description="Names of node groups it joins.")
    bandwidth_gb_per_s: float = Field(gt=0, description="Per-node bandwidth, GB/s.")


class Node(_Strict):
    """One expanded node of the cluster."""

    name: str
    group: str
    gpu: str
    gpus: int
    intra_node_bandwidth_gb_per_s: float
    intra_node_latency_us: float


class Cluster(_Strict):
    """A cluster file."""

    schema_version: int = Field(
        default=CLUSTER_SCHEMA_VERSION, description="Version of this schema."
    )
    name: str = Field(description="Short name of the cluster.")
    gpu_types: list[GpuSpec] = Field(
        default_factory=list, description="GPU types added to (or overriding) the catalog."
    )
    node_groups: list[NodeGroup] = Field(min_length=1)
    inter_node_bandwidth_gb_per_s: float = Field(
        gt=0, description="Default per-node bandwidth between nodes, GB/s."
    )
    inter_node_latency_us: float = Field(default=10.0, ge=0)
    inter_node_links: list[InterNodeLink] = Field(
        default_factory=list, description="Faster links among subsets of node groups."
    )

    @model_validator(mode="after")
    def _check_names(self) -> Cluster:
        names = [group.name for group in self.node_groups]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"node group names must be unique; repeated: {duplicates}")
        for link in self.inter_node_links:
            unknown = sorted(set(link.groups) - set(names))
            if unknown:
                raise ValueError(f"inter_node_links names unknown node groups {unknown}")
        return self

    def nodes(self) -> list[Node]:
        """The cluster's nodes in file order, each group expanded into '<name>-<i>'."""
        return [
            Node(
                name=f"{group.name}-{i}",
                group=group.name,
                gpu=group.gpu,
                gpus=group.gpus_per_node,
                intra_node_bandwidth_gb_per_s=group.intra_node_bandwidth_gb_per_s,
                intra_node_latency_us=group.intra_node_latency_us,
            )
            for group in self.node_groups
            for i in range(group.count)
        ]

    def total_gpus(self) -> int:
        return sum(group.gpus_per_node * group.count for group in self.node_groups)

    def inter_node_bandwidth(self, group_names: set[str]) -> float:
        """Bandwidth (GB/s) between nodes of these groups: the fastest declared link that joins
        them all, else the default inter-node bandwidth."""
        joining = [
            link.bandwidth_gb_per_s
            for link in self.inter_node_links
            if group_names <= set(link.groups)
        ]
        return max(joining, default=self.inter_node_bandwidth_gb_per_s)
