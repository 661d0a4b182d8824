"""The plan: what ``autoplan solve`` writes and the runtime, simulator and viewers read.

Rank layout (the one convention every reader relies on): the world is a DeviceMesh of shape
``(pp, dp, tp)`` over ranks ``0..world-1`` in row-major order, so rank
``r = pipeline_rank * dp * tp + dp_index * tp + tp_index``. Nodes are listed in launch order
(``node_rank``); torchrun gives node ``k`` the ranks after those of nodes ``0..k-1``, so the
emitter orders nodes such that each rank lands on the GPU type its stage was planned for.

With ``virtual_stages_per_rank = v`` (interleaved 1F1B) there are ``pp * v`` stages and stage
``s`` runs on pipeline rank ``s % pp``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan.cluster.schema import Cluster
from autoplan.profile.schema import ModelRef

__all__ = [
    "PLAN_SCHEMA_VERSION",
    "Alternative",
    "MemoryEstimate",
    "Parallelism",
    "Plan",
    "PlanInputs",
    "PlanNode",
    "Prediction",
    "RankEntry",
    "Recompute",
    "ScheduleName",
    "Stage",
    "StageTiming",
    "TimeBreakdown",
]

PLAN_SCHEMA_VERSION = 1

ScheduleName = Literal["gpipe", "1f1b", "interleaved_1f1b"]
Recompute = Literal["none", "selective", "full"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanInputs(_Strict):
    """What the plan was made from, so that it can be reproduced and checked."""

    model: ModelRef
    profile_sha256: str = Field(description="SHA-256 of the profile JSON the plan was solved on.")
    seq_len: int = Field(ge=1)
    dtype: str = Field(description="Training dtype.")
    cluster: Cluster = Field(description="The whole cluster file, as read.")
    global_batch_size: int = Field(ge=1, description="Samples per iteration, all replicas.")
    strategy: str = Field(description="'optimal' or the baseline that produced the plan.")
    pinned: dict[str, str] = Field(
        default_factory=dict, description="Knobs the user pinned, e.g. {'tp': '2'}."
    )


class Parallelism(_Strict):
    """The shape of the run: one (dp, tp) for every stage (one DeviceMesh)."""

    pipeline_degree: int = Field(ge=1, description="pp: pipeline ranks.")
    data_parallel_degree: int = Field(ge=1, description="dp: replicas of each stage.")
    tensor_parallel_degree: int = Field(ge=1, description="tp: GPUs splitting each layer.")
    virtual_stages_per_rank: int = Field(
        default=1, ge=1, description="Stages per pipeline rank (>1 only for interleaved 1F1B)."
    )
    schedule: ScheduleName
    num_micro_batches: int = Field(ge=1, description="Micro-batches per replica per iteration.")
    replica_micro_batch_sizes: list[int] = Field(
        min_length=1,
        description="Samples per micro-batch of each dp replica; equal unless the plan gives "
        "faster GPU types a larger share (single-stage heterogeneous plans).",
    )
    zero1: bool = Field(description="Optimizer states sharded across dp (ZeRO stage 1).")

    @model_validator(mode="after")
    def _check(self) -> Parallelism:
        if len(self.replica_micro_batch_sizes) != self.data_parallel_degree:
            raise ValueError(
                f"replica_micro_batch_sizes has {len(self.replica_micro_batch_sizes)} entries; "
                f"data_parallel_degree is {self.data_parallel_degree}"
            )
        if min(self.replica_micro_batch_sizes) < 1:
            raise ValueError("every replica_micro_batch_sizes entry must be >= 1")
        if self.schedule != "interleaved_1f1b" and self.virtual_stages_per_rank != 1:
            raise ValueError(
                f"virtual_stages_per_rank ({self.virtual_stages_per_rank}) > 1 needs "
                "schedule 'interleaved_1f1b'"
            )
        uneven = len(set(self.replica_micro_batch_sizes)) > 1
        if uneven and self.pipeline_degree > 1:
            raise ValueError("uneven replica batch shares are only supported with pp = 1")
        return self

    @property
    def world_size(self) -> int:
        return self.pipeline_degree * self.data_parallel_degree * self.tensor_parallel_degree

    @property
    def micro_batch_size(self) -> int:
        """The largest replica's micro-batch size (all equal when shares are even)."""
        return max(self.replica_micro_batch_sizes)

    @property
    def num_stages(self) -> int:
        return self.pipeline_degree * self.virtual_stages_per_rank


class Stage(_Strict):
    """A contiguous range of layers run by one pipeline rank."""

    index: int = Field(ge=0)
    pipeline_rank: int = Field(ge=0, description="Which pipeline rank runs it (index % pp).")
    layer_start: int = Field(ge=0, description="First layer (inclusive).")
    layer_end: int = Field(ge=1, description="One past the last layer (exclusive).")
    gpu_types: list[str] = Field(min_length=1, description="GPU types its ranks run on.")
    recompute: Recompute = Field(description="Activation recompute for this stage's layers.")


class PlanNode(_Strict):
    """A node the plan uses, in launch order."""

    node_rank: int = Field(ge=0, description="torchrun --node-rank.")
    name: str = Field(description="Node name from the cluster file.")
    gpu_type: str
    nproc_per_node: int = Field(ge=1, description="Processes (GPUs) used on this node.")


class RankEntry(_Strict):
    """Where one global rank runs and what it does."""

    rank: int = Field(ge=0)
    node: str
    node_rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    gpu_type: str
    pipeline_rank: int = Field(ge=0)
    dp_index: int = Field(ge=0)
    tp_index: int = Field(ge=0)


class StageTiming(_Strict):
    """Cost-model times of one stage for one micro-batch, the simulator's input."""

    stage: int = Field(ge=0)
    forward_ms: float = Field(ge=0, description="Forward compute + tp comm of one micro-batch.")
    backward_ms: float = Field(
        ge=0, description="Backward (with recompute) + tp comm of one micro-batch."
    )
    send_ms: float = Field(
        ge=0, description="Point-to-point time of the boundary activation to the next stage."
    )
    saved_activation_bytes: int | None = Field(
        default=None,
        ge=0,
        description="Activations one micro-batch leaves saved on one GPU of this stage from its "
        "forward until its backward (after recompute). The simulator's memory curve uses it; "
        "when absent it derives it from MemoryEstimate.activations_bytes.",
    )


class TimeBreakdown(_Strict):
    """Where an iteration's time goes (exposed time, so the parts add up to the total)."""

    compute_ms: float = Field(ge=0)
    bubble_ms: float = Field(ge=0)
    tp_comm_ms: float = Field(ge=0)
    pp_comm_ms: float = Field(ge=0)
    dp_comm_ms: float = Field(ge=0, description="Gradient all-reduce not hidden by backward.")
    optimizer_ms: float = Field(ge=0)


class MemoryEstimate(_Strict):
    """Peak memory of one GPU of one pipeline rank (the largest over its GPU types)."""

    pipeline_rank: int = Field(ge=0)
    gpu_type: str
    weights_bytes: int = Field(ge=0)
    gradients_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0, description="Saved activations of in-flight batches.")
    transient_bytes: int = Field(ge=0, description="Largest temporary of one layer's pass.")
    total_bytes: int = Field(ge=0)
    capacity_bytes: int = Field(ge=0, description="Device memory of gpu_type.")


class Prediction(_Strict):
    """What the cost model predicts for one iteration."""

    iteration_time_ms: float = Field(gt=0)
    breakdown: TimeBreakdown
    samples_per_s: float = Field(gt=0)
    tokens_per_s: float = Field(gt=0)
    model_flops_per_iteration: float = Field(
        ge=0, description="FLOPs of forward + backward (no recompute) per iteration."
    )
    tflops_per_gpu: float = Field(ge=0, description="Model TFLOP/s per GPU (no recompute).")
    mfu: float = Field(ge=0, description="Model FLOPs / (iteration time × Σ used GPUs' peak).")
    stage_timings: list[StageTiming]
    dp_allreduce_ms: float = Field(ge=0, description="Full gradient all-reduce time.")
    rank_dp_allreduce_ms: list[float] = Field(
        default_factory=list,
        description="Gradient all-reduce time of each pipeline rank (index = pipeline rank); "
        "the simulator uses it when given, else scales dp_allreduce_ms by gradient bytes.",
    )
    memory: list[MemoryEstimate]


class Alternative(_Strict):
    """A runner-up plan, summarised."""

    rank: int = Field(ge=1, description="1 = the best after the chosen plan.")
    summary: str = Field(description="Knobs in one line, e.g. 'pp=2 dp=4 tp=1 mbs=2 m=8 1f1b'.")
    layer_split: list[int] = Field(description="Layers per stage.")
    gpu_types: list[str] = Field(description="GPU types per stage.")
    iteration_time_ms: float = Field(gt=0)
    samples_per_s: float = Field(gt=0)


class Plan(_Strict):
    """A complete, executable parallelization plan."""

    schema_version: Literal[1] = Field(
        default=PLAN_SCHEMA_VERSION, description="Version of this schema."
    )
    inputs: PlanInputs
    parallelism: Parallelism
    stages: list[Stage] = Field(min_length=1)
    nodes: list[PlanNode] = Field(min_length=1)
    rank_map: list[RankEntry] = Field(min_length=1)
    prediction: Prediction
    alternatives: list[Alternative] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_shape(self) -> Plan:
        par = self.parallelism
        if len(self.stages) != par.num_stages:
            raise ValueError(
                f"{len(self.stages)} stages, but pp ({par.pipeline_degree}) × virtual stages "
                f"({par.virtual_stages_per_rank}) = {par.num_stages}"
            )
        if len(self.rank_map) != par.world_size:
            raise ValueError(
                f"rank_map has {len(self.rank_map)} ranks; pp × dp × tp = {par.world_size}"
            )
        return self
