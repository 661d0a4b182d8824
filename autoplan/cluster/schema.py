"""GPU types and clusters: the hardware a plan runs on.

A cluster file (YAML) lists node groups; each group is ``count`` identical nodes of
``gpus_per_node`` GPUs of one type, joined inside a node by ``intra_node_bandwidth_gb_per_s``.
Links between nodes have one default bandwidth and optional faster links inside named groups
of nodes (a rack, a pod).
"""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from autoplan import limits
from autoplan.names import NAME_RULE, check_name

__all__ = [
    "CLUSTER_SCHEMA_VERSION",
    "Cluster",
    "GpuSpec",
    "InterNodeLink",
    "Node",
    "NodeGroup",
]

CLUSTER_SCHEMA_VERSION = 1

# Names reach launch scripts, file names and Slurm (autoplan.names): a safe character set only.
SafeName = Annotated[str, AfterValidator(check_name), Field(description=f"A name: {NAME_RULE}.")]
# Rates are bounded on both sides: a near-zero bandwidth would make times infinite.
Bandwidth = Annotated[
    float, Field(ge=limits.MIN_BANDWIDTH_GB_PER_S, le=limits.MAX_BANDWIDTH_GB_PER_S)
]
Latency = Annotated[float, Field(ge=0, le=limits.MAX_LATENCY_US)]
# A fixed time the training stack adds (per pass, per step).
Overhead = Annotated[float, Field(ge=0, le=limits.MAX_OVERHEAD_MS)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuSpec(_Strict):
    """Datasheet figures of one GPU type; dense (no sparsity) peaks."""

    name: SafeName = Field(description="Catalog key, e.g. 'A100-80GB'.")
    memory_gib: float = Field(
        ge=limits.MIN_MEMORY_GIB, le=limits.MAX_MEMORY_GIB, description="Device memory in GiB."
    )
    memory_bandwidth_gb_per_s: Bandwidth = Field(description="HBM/GDDR bandwidth, GB/s.")
    peak_tflops: dict[
        str, Annotated[float, Field(ge=limits.MIN_PEAK_TFLOPS, le=limits.MAX_PEAK_TFLOPS)]
    ] = Field(
        max_length=16,
        description="Dense peak TFLOP/s by dtype ('fp32', 'tf32', 'fp16', 'bf16', 'fp64').",
    )
    efficiency: float = Field(
        gt=0,
        le=1,
        description="Fraction of peak that matmuls of high arithmetic intensity achieve (the "
        "ceiling of the efficiency curve, autoplan.cost.efficiency).",
    )
    efficiency_by_dtype: dict[str, Annotated[float, Field(gt=0, le=1)]] = Field(
        default_factory=dict,
        max_length=16,
        description="Measured fraction of that dtype's peak where it differs from `efficiency` "
        "(e.g. fp32/tf32 from calibration data); autoplan.cluster.catalog.efficiency_for "
        "picks between them.",
    )
    datasheet_url: str = Field(default="", description="Where the figures come from.")
    matmul_half_intensity_ridges: float = Field(
        default=0.0,
        ge=0,
        description="Arithmetic intensity (FLOP per byte of operands) at which a matmul reaches "
        "half of `efficiency`, in units of the dtype's ridge point (peak / memory bandwidth): "
        "efficiency(I) = efficiency × I / (I + this × ridge). 1 is the additive roofline "
        "(compute and operand traffic do not overlap); 0 (the default) makes every matmul run "
        "at `efficiency` up to the bandwidth roofline.",
    )
    matmul_half_intensity_by_dtype: dict[str, float] = Field(
        default_factory=dict,
        description="matmul_half_intensity_ridges of dtypes where it differs (fitted per "
        "precision); autoplan.cluster.catalog.spec_for_dtype picks between them.",
    )
    backward_matmul_efficiency: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="Efficiency of backward matmuls relative to forward ones (weight-gradient "
        "GEMMs reduce over the tokens into a weight-sized output: few output tiles for small "
        "hidden sizes).",
    )
    kernel_launch_us: float = Field(
        default=0.0,
        ge=0,
        description="Host time to issue one kernel: a layer's pass takes at least its kernels "
        "× this (small work is launch-bound, whatever the GPU's speed).",
    )
    pcie_collective_bandwidth_gb_per_s: float | None = Field(
        default=None,
        gt=0,
        le=limits.MAX_BANDWIDTH_GB_PER_S,
        description="For GPUs joined by PCIe (at most NVLink-bridged in pairs): the bandwidth "
        "a collective among more GPUs than a bridge joins reaches inside one node, whatever "
        "the cluster file's intra-node link (a ring over more than two such GPUs crosses "
        "PCIe and the host). None for GPUs on a switched NVLink fabric.",
    )
    nvlink_bridge_gpus: int = Field(
        default=2,
        ge=1,
        le=limits.MAX_GPUS_PER_NODE,
        description="With pcie_collective_bandwidth_gb_per_s: how many GPUs one NVLink bridge "
        "joins (collectives within them use the intra-node link).",
    )
    collective_step_overhead_us: Latency = Field(
        default=0.0,
        description="What the training stack adds to every step of a collective or transfer on "
        "this GPU beyond the link's latency (kernel launch, stream synchronisation, the "
        "framework's call): the cost model adds it to the cluster's per-step latencies.",
    )
    pass_overhead_ms: Overhead = Field(
        default=0.0,
        description="Fixed time of one stage's forward or backward pass of one micro-batch "
        "beyond its layers' roofline (kernel launches, framework work).",
    )
    step_overhead_ms: Overhead = Field(
        default=0.0,
        description="Fixed time per training step (optimizer launch, Python).",
    )
    memory_reserve_gib: float = Field(
        default=0.0,
        ge=0,
        le=limits.MAX_MEMORY_GIB,
        description="Device memory no plan may use: CUDA context, NCCL buffers, allocator "
        "fragmentation.",
    )

    host_link_bandwidth_gb_per_s: Bandwidth = Field(
        default=limits.DEFAULT_HOST_LINK_GB_PER_S,
        description="Effective bandwidth of one GPU's link to host memory, GB/s per direction "
        "(PCIe or NVLink-C2C; full duplex): what activation offload copies over.",
    )
    host_memory_gib_per_gpu: float = Field(
        default=limits.DEFAULT_HOST_MEMORY_GIB_PER_GPU,
        ge=0,
        le=limits.MAX_MEMORY_GIB,
        description="Host (CPU) memory of a typical server with this GPU, per GPU, GiB: the "
        "share of its node's RAM that activation offload may park saved activations in.",
    )

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * limits.GIB)


class NodeGroup(_Strict):
    """``count`` identical nodes."""

    name: SafeName = Field(
        description="Prefix of the node names: nodes are '<name>-0', '<name>-1'..."
    )
    gpu: SafeName = Field(
        description="GPU type: a key of the catalog or of the file's `gpu_types`."
    )
    gpus_per_node: int = Field(ge=1, le=limits.MAX_GPUS_PER_NODE)
    count: int = Field(
        default=1, ge=1, le=limits.MAX_CLUSTER_NODES, description="How many such nodes."
    )
    intra_node_bandwidth_gb_per_s: Bandwidth = Field(
        description="GPU-to-GPU bandwidth inside a node (NVLink or PCIe), GB/s per GPU."
    )
    intra_node_latency_us: Latency = Field(default=5.0, description="Per-message latency.")
    host_link_bandwidth_gb_per_s: Bandwidth | None = Field(
        default=None,
        description="Each GPU's link to host memory, GB/s per direction, overriding the GPU "
        "type's catalog figure (e.g. a PCIe switch shared by two GPUs halves it).",
    )
    host_memory_gib: float | None = Field(
        default=None,
        ge=0,
        le=limits.MAX_MEMORY_GIB,
        description="Host (CPU) memory of one node, GiB, shared evenly by its GPUs for "
        "activation offload, overriding the GPU type's catalog host_memory_gib_per_gpu.",
    )


class InterNodeLink(_Strict):
    """A faster link among a set of node groups (for example one rack)."""

    groups: list[SafeName] = Field(
        min_length=1,
        max_length=limits.MAX_NODE_GROUPS,
        description="Names of node groups it joins.",
    )
    bandwidth_gb_per_s: Bandwidth = Field(description="Per-node bandwidth, GB/s.")
    latency_us: Latency | None = Field(
        default=None,
        description="Per-message latency of this link (alpha of the alpha-beta model); None: "
        "the cluster's inter_node_latency_us.",
    )


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
    name: SafeName = Field(description="Short name of the cluster.")
    gpu_types: list[GpuSpec] = Field(
        default_factory=list,
        max_length=limits.MAX_GPU_TYPES,
        description="GPU types added to (or overriding) the catalog.",
    )
    node_groups: list[NodeGroup] = Field(min_length=1, max_length=limits.MAX_NODE_GROUPS)
    inter_node_bandwidth_gb_per_s: Bandwidth = Field(
        description="Default per-node bandwidth between nodes, GB/s."
    )
    inter_node_latency_us: Latency = Field(
        default=10.0,
        description="Per-message latency between nodes, us (alpha of the alpha-beta model; "
        "autoplan.cost.comm lists typical values per link kind).",
    )
    inter_node_links: list[InterNodeLink] = Field(
        default_factory=list,
        max_length=limits.MAX_INTER_NODE_LINKS,
        description="Faster links among subsets of node groups.",
    )
    memory_reserve_gib: float | None = Field(
        default=None,
        ge=0,
        description="Device memory kept free on every GPU of this cluster (CUDA context, NCCL "
        "buffers, fragmentation), overriding each GPU type's catalog memory_reserve_gib.",
    )

    @model_validator(mode="after")
    def _check_names(self) -> Cluster:
        # Sizes first: nodes() expands every group, so it must never see 10**12 nodes.
        nodes = sum(group.count for group in self.node_groups)
        if nodes > limits.MAX_CLUSTER_NODES:
            raise ValueError(
                f"the cluster has {nodes} nodes; autoplan takes at most {limits.MAX_CLUSTER_NODES}"
            )
        gpus = self.total_gpus()
        if gpus > limits.MAX_CLUSTER_GPUS:
            raise ValueError(
                f"the cluster has {gpus} GPUs; autoplan takes at most {limits.MAX_CLUSTER_GPUS}"
            )
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

    def inter_node_latency(self, group_names: set[str]) -> float:
        """Latency (us) between nodes of these groups: that of the link
        ``inter_node_bandwidth`` picks (the fastest declared link joining them all) where it
        states one, else the cluster's inter_node_latency_us."""
        joining = [link for link in self.inter_node_links if group_names <= set(link.groups)]
        if not joining:
            return self.inter_node_latency_us
        fastest = max(joining, key=lambda link: link.bandwidth_gb_per_s)
        return self.inter_node_latency_us if fastest.latency_us is None else fastest.latency_us

    def inter_node_bandwidth(self, group_names: set[str]) -> float:
        """Bandwidth (GB/s) between nodes of these groups: the fastest declared link that joins
        them all, else the default inter-node bandwidth."""
        joining = [
            link.bandwidth_gb_per_s
            for link in self.inter_node_links
            if group_names <= set(link.groups)
        ]
        return max(joining, default=self.inter_node_bandwidth_gb_per_s)
