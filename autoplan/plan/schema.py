"""The plan: what ``autoplan solve`` writes and the runtime, simulator and viewers read.

Schema version 2: heterogeneous stages are the general case. A pipeline is a sequence of
stages; each stage holds a contiguous range of layers and lists its own data-parallel
replicas. A replica is a group of ``tensor_parallel_degree`` GPUs of one type on one node
(its ``ranks``, by tp index) that runs ``micro_batch_size`` samples of every micro-batch, with
its own activation recompute. The replicas of a stage may differ in GPU type, tp degree and
share; their shares add up to the plan's micro-batch (``Parallelism.micro_batch_size``), the
same for every stage. Different stages may have different replicas: between two stages the
samples of a micro-batch are regrouped by index (replica r of a stage owns the samples
``[Σ_{q<r} share_q, Σ_{q<=r} share_q)`` of each micro-batch).

With ``virtual_stages_per_rank = v`` (interleaved 1F1B) there are ``pp * v`` stages and stage
``s`` runs on pipeline rank ``s % pp``; all stages of one pipeline rank run on the same
replicas (the same GPUs), so a pipeline rank is a set of GPUs and the stages are chunks of
work on it.

Ranks: every GPU the plan uses has one global rank, listed in ``rank_map`` with its node, local
rank, pipeline rank, replica index (``dp_index``) and tp index. Nodes are listed in launch
order (``node_rank``); torchrun gives node ``k`` the ranks after those of nodes ``0..k-1``.
A plan whose every pipeline rank has the same number of replicas of the same tp, with the same
shares, and whose ranks follow ``r = pipeline_rank * dp * tp + dp_index * tp + tp_index`` is
*uniform*: one DeviceMesh of shape ``(pp, dp, tp)`` describes it (``Plan.is_uniform``).

Context parallelism: a replica of ``context_parallel_degree`` c > 1 is c × tp GPUs of one node;
each of its c cp groups of tp GPUs runs a chunk of every sample's sequence (ring attention),
and its ``ranks`` list cp index by cp index, tp index within (rank ``i`` is cp index
``i // tp``, tp index ``i % tp``). Plans written before the field have c = 1. The chunks are
equal unless ``context_tokens`` gives each cp rank's tokens (uneven chunks: the faster GPUs of
a cp group hold more; schema version 5); such a cp group may span nodes of two GPU types, its
``gpu_type`` and ``node`` then those of its first cp rank, each cp rank's tp group on one node
(the rank map says which).
"""

from __future__ import annotations

from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan import limits
from autoplan.cluster.schema import Cluster
from autoplan.plan.upgrade import upgrade_plan_data
from autoplan.profile.schema import ModelRef
from autoplan.schedule.names import (
    MULTI_STAGE_SCHEDULES,
    V_SCHEDULES,
    ScheduleName,
    stage_rank,
)

__all__ = [
    "PLAN_SCHEMA_VERSION",
    "Alternative",
    "AsyncPB",
    "Engine",
    "Executor",
    "IdleGpus",
    "MemoryEstimate",
    "Parallelism",
    "Plan",
    "PlanInputs",
    "PlanNode",
    "Prediction",
    "RankEntry",
    "Recompute",
    "Replica",
    "ReplicaTiming",
    "SearchRecord",
    "Stage",
    "StageTiming",
    "TimeBreakdown",
    "ZeroStage",
]

PLAN_SCHEMA_VERSION: Final = 6

Recompute = Literal["none", "selective", "full"]
# The training engine a plan is priced for (``autoplan.cost.engines`` says what differs).
Engine = Literal["autoplan", "megatron-deepspeed"]
# How autoplan's runtime runs a plan: on one DeviceMesh with torch's pipelining and DDP, which
# all-reduces gradients during the last backward ("mesh"), or on per-stage process groups,
# which sum them after the stage's last backward ("groups"; any plan).
Executor = Literal["mesh", "groups"]
ZeroStage = Literal[0, 1, 2, 3]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanInputs(_Strict):
    """What the plan was made from, so that it can be reproduced and checked."""

    model: ModelRef
    profile_sha256: str = Field(description="SHA-256 of the profile JSON the plan was solved on.")
    seq_len: int = Field(ge=1, le=limits.MAX_SEQ_LEN)
    dtype: str = Field(description="Training dtype.")
    cluster: Cluster = Field(description="The whole cluster file, as read.")
    global_batch_size: int = Field(
        ge=1, le=limits.MAX_GLOBAL_BATCH_SIZE, description="Samples per iteration, all replicas."
    )
    strategy: str = Field(description="'optimal' or the baseline that produced the plan.")
    pinned: dict[str, str] = Field(
        default_factory=dict, description="Knobs the user pinned, e.g. {'tp': '2'}."
    )
    engine: Engine = Field(
        default="autoplan",
        description="The engine the plan was searched and priced for: 'autoplan' (autoplan's "
        "runtime: DDP hides the gradient all-reduce behind the last backward) or "
        "'megatron-deepspeed' (its all-reduce after the last backward, nothing hidden).",
    )


class AsyncPB(_Strict):
    """Asynchronous Pipelined Backpropagation (Kosson et al., MLSys 2021): no flush, each
    stage steps momentum SGD once per micro-batch on weights D updates stale. It changes the
    optimisation (not only the speed): see ``autoplan.runtime.pipelined_sgd``."""

    weight_prediction: bool = Field(
        default=True, description="Linear Weight Prediction: forward at w − η·D·v."
    )
    spike_compensation: bool = Field(
        default=True, description="Spike Compensation: w ← w − η(α^D·v + (1−α^D)/(1−α)·g)."
    )
    momentum: float = Field(default=0.9, ge=0, lt=1, description="Momentum α of SGD.")


class Parallelism(_Strict):
    """The pipeline's shape and schedule; each stage's replicas are in ``Stage.replicas``."""

    pipeline_degree: int = Field(
        ge=1, le=limits.MAX_PIPELINE_DEGREE, description="pp: pipeline ranks."
    )
    virtual_stages_per_rank: int = Field(
        default=1,
        ge=1,
        le=limits.MAX_VIRTUAL_STAGES,
        description="Stages per pipeline rank (>1 only for the multi-stage schedules: "
        "interleaved 1F1B and zero bubble, and 2 for the V schedules zbv and dualpipev).",
    )
    schedule: ScheduleName
    num_micro_batches: int = Field(
        ge=1, le=limits.MAX_NUM_MICRO_BATCHES, description="Micro-batches per iteration."
    )
    micro_batch_size: int = Field(
        ge=1,
        le=limits.MAX_MICRO_BATCH_SIZE,
        description="Samples per micro-batch, all replicas of a stage together (the same for "
        "every stage); global batch = micro_batch_size × num_micro_batches.",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="Megatron-style sequence parallelism in every tp group: norms and dropout "
        "sharded along the sequence, all-gather/reduce-scatter in place of all-reduce. "
        "Stage.sequence_parallel: one stage's tp groups only.",
    )

    async_pb: AsyncPB | None = Field(
        default=None,
        description="Settings of the asynchronous schedule async_pb (Pipelined "
        "Backpropagation); set exactly when schedule is async_pb.",
    )
    executor: Executor | None = Field(
        default=None,
        description="The executor of autoplan's runtime the prediction is priced for: 'mesh' "
        "(one DeviceMesh, DDP all-reduces during the last backward) or 'groups' (per-stage "
        "process groups, gradients summed after the last backward); autoplan run uses it. "
        "None (plans written before it): the runtime picks mesh for a plan one mesh holds.",
    )

    @model_validator(mode="after")
    def _check(self) -> Parallelism:
        v = self.virtual_stages_per_rank
        if (self.schedule == "async_pb") != (self.async_pb is not None):
            raise ValueError(
                f"schedule {self.schedule!r} and async_pb settings "
                f"({'set' if self.async_pb is not None else 'unset'}) disagree: async_pb "
                "settings are given exactly with schedule 'async_pb'"
            )
        if self.schedule not in MULTI_STAGE_SCHEDULES and v != 1:
            raise ValueError(
                f"virtual_stages_per_rank ({v}) > 1 needs a multi-stage schedule "
                f"({', '.join(MULTI_STAGE_SCHEDULES)})"
            )
        if self.schedule in V_SCHEDULES and v != 2:
            raise ValueError(
                f"schedule {self.schedule!r} runs two stages per rank in a V: "
                f"virtual_stages_per_rank must be 2, not {v}"
            )
        return self

    def rank_of_stage(self, stage_index: int) -> int:
        """The pipeline rank that runs stage ``stage_index``: ``s % pp``, or the V of
        ``V_SCHEDULES`` (stage s < pp on rank s, stage s >= pp on rank 2·pp − 1 − s)."""
        return stage_rank(stage_index, self.pipeline_degree, v_shape=self.schedule in V_SCHEDULES)

    @property
    def num_stages(self) -> int:
        return self.pipeline_degree * self.virtual_stages_per_rank


class Replica(_Strict):
    """One data-parallel replica of a stage: tp GPUs of one type on one node."""

    gpu_type: str = Field(
        description="GPU type of its GPUs (of its first cp rank's where its cp group spans GPU "
        "types: context_tokens; the rank map gives each rank's)."
    )
    node: str = Field(
        description="The node its GPUs are on (a tp group never spans nodes; a cp group of "
        "uneven chunks may: this is its first cp rank's)."
    )
    tensor_parallel_degree: int = Field(
        ge=1, le=limits.MAX_GPUS_PER_NODE, description="tp: GPUs splitting each layer."
    )
    context_parallel_degree: int = Field(
        default=1,
        ge=1,
        le=limits.MAX_GPUS_PER_NODE,
        description="cp: GPUs splitting every sample's sequence (ring attention, load-balanced "
        "causal chunks); the replica is cp × tp GPUs and its cp ranks reduce gradients with "
        "the stage's replicas.",
    )
    ranks: list[int] = Field(
        min_length=1,
        max_length=limits.MAX_GPUS_PER_NODE,
        description="Global ranks of its GPUs, by cp index then tp index (len = cp × tp).",
    )
    micro_batch_size: int = Field(
        ge=1,
        le=limits.MAX_MICRO_BATCH_SIZE,
        description="Samples of every micro-batch this replica runs (its share).",
    )
    recompute: Recompute = Field(description="Activation recompute of its layers.")
    offload: bool = Field(
        default=False,
        description="Saved activations (what recompute keeps) move to host memory after "
        "forward and back before backward, over the host link.",
    )
    routed_experts: int | None = Field(
        default=None,
        ge=1,
        le=limits.MAX_FILE_INT,
        description="Routed experts of each MoE layer its ranks hold where its stage's expert "
        "groups span GPU types and place experts by speed (the replicas of one expert group "
        "hold consecutive experts, in replica order, summing to the layer's experts); None: "
        "experts / ep, the same on every replica.",
    )
    context_tokens: list[int] | None = Field(
        default=None,
        min_length=2,
        max_length=limits.MAX_GPUS_PER_NODE,
        description="Tokens of every sample each of its cp ranks holds, by cp index (uneven "
        "chunks: two mirrored pieces of half as many tokens each, so every count is even and "
        "they sum to the sequence length); None: equal chunks of seq_len / cp.",
    )

    @model_validator(mode="after")
    def _check(self) -> Replica:
        tp, cp = self.tensor_parallel_degree, self.context_parallel_degree
        if len(self.ranks) != tp * cp:
            degree = f"tensor_parallel_degree is {tp}"
            if cp > 1:
                degree = (
                    f"tensor_parallel_degree ({tp}) × context_parallel_degree ({cp}) is {tp * cp}"
                )
            raise ValueError(f"replica on {self.node} lists {len(self.ranks)} ranks; its {degree}")
        if self.context_tokens is not None and len(self.context_tokens) != cp:
            raise ValueError(
                f"replica on {self.node} gives context_tokens for {len(self.context_tokens)} cp "
                f"ranks; its context_parallel_degree is {cp}"
            )
        return self


class Stage(_Strict):
    """A contiguous range of layers and the replicas that run it."""

    index: int = Field(ge=0)
    pipeline_rank: int = Field(ge=0, description="Which pipeline rank runs it (index % pp).")
    layer_start: int = Field(ge=0, description="First layer (inclusive).")
    layer_end: int = Field(
        ge=1, le=limits.MAX_LAYERS, description="One past the last layer (exclusive)."
    )
    replicas: list[Replica] = Field(
        min_length=1,
        max_length=limits.MAX_CLUSTER_GPUS,
        description="Its data-parallel replicas, in sample order: replica r takes the samples "
        "after those of replicas 0..r-1 in every micro-batch.",
    )
    zero_stage: ZeroStage = Field(
        default=0,
        description="ZeRO sharding across this stage's replicas: 0 none, 1 optimizer states, "
        "2 + gradients, 3 + parameters (FSDP2 fully_shard).",
    )
    expert_parallel_degree: int = Field(
        default=1,
        ge=1,
        le=limits.MAX_CLUSTER_GPUS,
        description="ep: the routed experts of its MoE layers split over expert groups of ep "
        "consecutive replicas (inside the data-parallel group: ep divides the replicas of "
        "each GPU type and tp, and the experts); each rank holds experts / ep of each layer "
        "and tokens reach them by all-to-all. 1: every replica holds every expert.",
    )
    sequence_parallel: bool = Field(
        default=False,
        description="This stage's tp groups run sequence parallelism whatever the other "
        "stages do (SP is local to a stage: the whole activation passes between stages); "
        "parallelism.sequence_parallel: every stage does. Set only on a stage with tp > 1.",
    )

    @model_validator(mode="before")
    @classmethod
    def _legacy_zero1(cls, data: object) -> object:
        # Version-2 plans written before zero_stage said ``"zero1": true|false``.
        if isinstance(data, dict) and "zero1" in data and "zero_stage" not in data:
            legacy = data["zero1"]
            data = {k: v for k, v in data.items() if k != "zero1"}
            data["zero_stage"] = 1 if legacy is True else legacy
        return data

    @property
    def zero1(self) -> bool:
        """Optimizer states sharded (ZeRO stage 1 or higher)."""
        return self.zero_stage >= 1

    @property
    def data_parallel_degree(self) -> int:
        return len(self.replicas)

    @property
    def micro_batch_size(self) -> int:
        """Samples per micro-batch over all replicas."""
        return sum(replica.micro_batch_size for replica in self.replicas)

    @property
    def gpu_types(self) -> list[str]:
        """GPU types of its replicas, in order of first appearance."""
        seen: list[str] = []
        for replica in self.replicas:
            if replica.gpu_type not in seen:
                seen.append(replica.gpu_type)
        return seen

    @property
    def ranks(self) -> list[int]:
        """Every rank of the stage, replica by replica."""
        return [rank for replica in self.replicas for rank in replica.ranks]

    @property
    def shares(self) -> list[int]:
        """Samples per micro-batch of each replica."""
        return [replica.micro_batch_size for replica in self.replicas]


class PlanNode(_Strict):
    """A node the plan uses, in launch order."""

    node_rank: int = Field(ge=0, description="torchrun --node-rank.")
    name: str = Field(description="Node name from the cluster file.")
    gpu_type: str
    nproc_per_node: int = Field(
        ge=1, le=limits.MAX_GPUS_PER_NODE, description="Processes (GPUs) used on this node."
    )


class RankEntry(_Strict):
    """Where one global rank runs and what it does."""

    rank: int = Field(ge=0)
    node: str
    node_rank: int = Field(ge=0)
    local_rank: int = Field(ge=0)
    gpu_type: str
    pipeline_rank: int = Field(ge=0)
    dp_index: int = Field(ge=0, description="Index of its replica in its stages' replicas.")
    tp_index: int = Field(ge=0, description="Its position in its replica's tp group.")
    cp_index: int = Field(
        default=0, ge=0, description="Its position in its replica's cp ring (0 without cp)."
    )


class ReplicaTiming(_Strict):
    """Cost-model times of one replica of a stage for one micro-batch (its share)."""

    forward_ms: float = Field(ge=0, description="Forward compute + tp comm of its share.")
    backward_ms: float = Field(ge=0, description="Backward (with recompute) + tp comm.")
    saved_activation_bytes: int = Field(
        ge=0,
        description="Activations its share leaves saved on one of its GPUs from forward to "
        "backward (after recompute).",
    )
    measured_layers: int = Field(
        default=0,
        ge=0,
        description="Of the stage's layers, how many are timed from measurements on this GPU "
        "type (profile --measure or profile import); the others are modelled.",
    )
    weight_gradient_ms: float | None = Field(
        default=None,
        ge=0,
        description="Of backward_ms, the weight-gradient half (W) a zero-bubble schedule runs "
        "apart from the input gradient (I = backward_ms - W); None: the backward is not split.",
    )


class StageTiming(_Strict):
    """Cost-model times of one stage for one micro-batch, the simulator's input."""

    stage: int = Field(ge=0)
    forward_ms: float = Field(ge=0, description="Slowest replica's forward of one micro-batch.")
    backward_ms: float = Field(ge=0, description="Slowest replica's backward of one micro-batch.")
    send_ms: float = Field(
        ge=0,
        description="Time to move one micro-batch's boundary activation to the next stage "
        "(and its gradient back), all of the stage's replicas sending at once.",
    )
    saved_activation_bytes: int | None = Field(
        default=None,
        ge=0,
        description="The largest saved activations one micro-batch leaves on one GPU of this "
        "stage (over its replicas); the simulator's memory curve uses it.",
    )
    weight_gradient_ms: float | None = Field(
        default=None,
        ge=0,
        description="Of backward_ms, the weight-gradient half (W) of the slowest replica, which "
        "a zero-bubble schedule defers (I = backward_ms - W); None: the backward is not split.",
    )
    replicas: list[ReplicaTiming] = Field(
        default_factory=list,
        description="Per replica, in the stage's replica order (empty: every replica takes "
        "the stage's forward_ms/backward_ms).",
    )


class TimeBreakdown(_Strict):
    """Where an iteration's time goes (exposed time, so the parts add up to the total)."""

    compute_ms: float = Field(ge=0)
    bubble_ms: float = Field(ge=0)
    tp_comm_ms: float = Field(ge=0)
    pp_comm_ms: float = Field(ge=0)
    dp_comm_ms: float = Field(
        ge=0,
        description="Gradient all-reduce not hidden by backward, and ZeRO-2/3's all-gathers "
        "and reduce-scatters not hidden by their passes.",
    )
    optimizer_ms: float = Field(ge=0)


class MemoryEstimate(_Strict):
    """Peak memory of one GPU of one kind of replica of a pipeline rank."""

    pipeline_rank: int = Field(ge=0)
    gpu_type: str
    tensor_parallel_degree: int = Field(default=1, ge=1, description="tp of these replicas.")
    micro_batch_size: int = Field(default=1, ge=1, description="Their share of a micro-batch.")
    weights_bytes: int = Field(ge=0)
    gradients_bytes: int = Field(ge=0)
    optimizer_bytes: int = Field(ge=0)
    activations_bytes: int = Field(ge=0, description="Saved activations of in-flight batches.")
    transient_bytes: int = Field(ge=0, description="Largest temporary of one layer's pass.")
    total_bytes: int = Field(ge=0, description="Sum of the five parts above.")
    reserved_bytes: int = Field(
        default=0,
        ge=0,
        description="Kept free for the CUDA context, NCCL buffers and allocator "
        "fragmentation; total_bytes + reserved_bytes <= capacity_bytes.",
    )
    capacity_bytes: int = Field(ge=0, description="Device memory of gpu_type.")


class IdleGpus(_Strict):
    """GPUs of one type the plan leaves unused, and why."""

    gpu_type: str
    count: int = Field(ge=1)
    reason: str = Field(description="Why using them would not pay.")


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
    dp_allreduce_ms: float = Field(ge=0, description="Longest gradient all-reduce of a rank.")
    rank_dp_allreduce_ms: list[float] = Field(
        default_factory=list,
        description="Gradient all-reduce time of each pipeline rank over its replicas (index = "
        "pipeline rank).",
    )
    memory: list[MemoryEstimate]
    idle_gpus: list[IdleGpus] = Field(
        default_factory=list, description="GPUs of the cluster the plan leaves unused."
    )
    costed_sha256: str | None = Field(
        default=None,
        description="SHA-256 of the inputs, parallelism and stages these figures were "
        "computed for (autoplan.plan.fingerprint); a plan edited since no longer matches it. "
        "None in plans written before it was recorded.",
    )


class Alternative(_Strict):
    """A runner-up plan, summarised."""

    rank: int = Field(ge=1, description="1 = the best after the chosen plan.")
    summary: str = Field(description="Knobs in one line, e.g. 'pp=2 m=8 1f1b ...'.")
    layer_split: list[int] = Field(description="Layers per stage.")
    gpu_types: list[str] = Field(description="GPU types per stage ('+'-joined when mixed).")
    iteration_time_ms: float = Field(gt=0)
    samples_per_s: float = Field(gt=0)


class SearchRecord(_Strict):
    """What the search proved about the plan (``autoplan.solve.certificate``): a lower bound
    on the best plan of the space searched, beside the plan's own predicted time."""

    status: Literal["proven", "gap", "limit"] = Field(
        description="'proven': no plan of the space is faster (gap 0); 'gap': the search "
        "ended with the plan within ``gap`` of the bound (``--gap`` reached, or a part of the "
        "space bounded only loosely); 'limit': the time limit stopped it."
    )
    lower_bound_ms: float | None = Field(
        ge=0,
        description="No plan of the space has a predicted iteration time below this (ms); "
        "None when the search proved no positive bound.",
    )
    gap: float | None = Field(
        ge=0,
        le=1,
        description="(plan's iteration time - lower_bound_ms) / plan's time: how far from "
        "optimal the plan can be at most; None without a bound.",
    )
    # No wall-clock time here: the same inputs write the same bytes (solve prints it).
    explored: int = Field(
        ge=0, description="Candidates the search considered (groups, pipelines and labels)."
    )

    @model_validator(mode="after")
    def _check_status(self) -> SearchRecord:
        if self.status == "proven" and self.gap != 0:
            raise ValueError(f"a proven plan has gap 0; got gap {self.gap}")
        return self

    def words(self) -> str:
        """What it proves, in words: 'optimal (proven)', 'within 0.4% of optimal (bound
        9,774 ms)', 'time limit: no bound'; never 'optimal' unless proven."""
        if self.status == "proven":
            return "optimal (proven)"
        prefix = "time limit: " if self.status == "limit" else ""
        if self.lower_bound_ms is None or self.gap is None:
            return f"{prefix}no bound"
        bound = self.lower_bound_ms
        bound_text = f"{bound:,.0f}" if bound >= 100 else f"{bound:.3g}"
        gap_text = f"{self.gap:.1%}" if self.gap >= 0.001 else "0.1%"
        return f"{prefix}within {gap_text} of optimal (bound {bound_text} ms)"


class Plan(_Strict):
    """A complete, executable parallelization plan."""

    schema_version: Literal[6] = Field(
        default=PLAN_SCHEMA_VERSION, description="Version of this schema."
    )
    inputs: PlanInputs
    parallelism: Parallelism
    stages: list[Stage] = Field(
        min_length=1, max_length=limits.MAX_PIPELINE_DEGREE * limits.MAX_VIRTUAL_STAGES
    )
    nodes: list[PlanNode] = Field(min_length=1, max_length=limits.MAX_CLUSTER_NODES)
    rank_map: list[RankEntry] = Field(min_length=1, max_length=limits.MAX_CLUSTER_GPUS)
    prediction: Prediction
    alternatives: list[Alternative] = Field(default_factory=list)
    search: SearchRecord | None = Field(
        default=None,
        description="The search's certificate (bound, gap, status); None for a baseline "
        "strategy's plan and for plans written before schema version 3.",
    )

    @classmethod
    def upgrade_data(cls, data: dict[str, Any]) -> dict[str, Any]:
        """Parsed JSON of an older plan version as this version (see ``plan.upgrade``)."""
        return upgrade_plan_data(data)

    @model_validator(mode="after")
    def _check_shape(self) -> Plan:
        par = self.parallelism
        if len(self.stages) != par.num_stages:
            raise ValueError(
                f"{len(self.stages)} stages, but pp ({par.pipeline_degree}) × virtual stages "
                f"({par.virtual_stages_per_rank}) = {par.num_stages}"
            )
        return self

    @property
    def world_size(self) -> int:
        return len(self.rank_map)

    def stage_sequence_parallel(self, stage: Stage) -> bool:
        """Whether ``stage`` runs sequence parallelism: the plan's setting, or its own."""
        return self.parallelism.sequence_parallel or stage.sequence_parallel

    @property
    def sequence_parallel_stages(self) -> list[int]:
        """Indices of the stages that run sequence parallelism (the plan's or their own)."""
        return [stage.index for stage in self.stages if self.stage_sequence_parallel(stage)]

    def stages_of_rank(self, pipeline_rank: int) -> list[Stage]:
        """The stages pipeline rank ``pipeline_rank`` runs, in stage order."""
        return [stage for stage in self.stages if stage.pipeline_rank == pipeline_rank]

    def uniform_shape(self) -> tuple[int, int] | None:
        """(dp, tp) when every stage has dp replicas of tp GPUs with the same shares and
        recompute-independent layout, and the ranks follow the (pp, dp, tp) row-major mesh
        convention; None otherwise (then the runtime uses per-stage process groups)."""
        first = self.stages[0]
        dp = first.data_parallel_degree
        tp = first.replicas[0].tensor_parallel_degree
        shares = first.shares
        for stage in self.stages:
            if stage.shares != shares:
                return None
            if any(replica.context_parallel_degree != 1 for replica in stage.replicas):
                return None  # a (pp, dp, tp) mesh has no cp dimension
            if any(replica.tensor_parallel_degree != tp for replica in stage.replicas):
                return None
            for d, replica in enumerate(stage.replicas):
                expected = [stage.pipeline_rank * dp * tp + d * tp + t for t in range(tp)]
                if replica.ranks != expected:
                    return None
        if len(self.rank_map) != self.parallelism.pipeline_degree * dp * tp:
            return None
        return dp, tp

    def mesh_shape(self) -> tuple[int, int, int] | None:
        """(dp, cp, tp) when every stage has dp replicas of cp × tp GPUs with the same shares
        and the ranks follow the (pp, dp, cp, tp) row-major mesh; None otherwise. With cp = 1
        it is ``uniform_shape`` with cp 1."""
        first = self.stages[0]
        dp = first.data_parallel_degree
        tp = first.replicas[0].tensor_parallel_degree
        cp = first.replicas[0].context_parallel_degree
        width = cp * tp
        for stage in self.stages:
            if stage.shares != first.shares:
                return None
            # The pipeline passes cp rank i's chunk to cp rank i of the next stage: the same
            # tokens at every stage.
            if [r.context_tokens for r in stage.replicas] != [
                r.context_tokens for r in first.replicas
            ]:
                return None
            for d, replica in enumerate(stage.replicas):
                shape = (replica.tensor_parallel_degree, replica.context_parallel_degree)
                start = (stage.pipeline_rank * dp + d) * width
                if shape != (tp, cp) or replica.ranks != list(range(start, start + width)):
                    return None
        if len(self.rank_map) != self.parallelism.pipeline_degree * dp * width:
            return None
        return dp, cp, tp

    def runs_on_mesh(self) -> bool:
        """Whether autoplan's runtime runs the plan on its mesh executor (one DeviceMesh:
        ``mesh_shape``), which has no expert parallelism; else per-stage process groups."""
        experts = any(stage.expert_parallel_degree > 1 for stage in self.stages)
        return self.mesh_shape() is not None and not experts

    @property
    def is_uniform(self) -> bool:
        return self.uniform_shape() is not None
