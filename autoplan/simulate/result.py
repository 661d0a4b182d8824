"""What the simulator returns: a timeline per replica of every pipeline rank, with its memory."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoplan.schedule.names import ScheduleName

__all__ = [
    "PASS_CATEGORIES",
    "EventCategory",
    "MemoryPoint",
    "RankTimeline",
    "ReplicaTimeline",
    "SimulatedEvent",
    "SimulationResult",
]

EventCategory = Literal[
    "forward", "backward", "input_gradient", "weight_gradient", "communication", "optimizer"
]
"""``backward`` is a full backward; a zero-bubble schedule splits it into ``input_gradient``
(I) and ``weight_gradient`` (W)."""

PASS_CATEGORIES = ("forward", "backward", "input_gradient", "weight_gradient")
"""The categories of a stage's compute on a micro-batch."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulatedEvent(_Strict):
    """One interval of work on one replica (all its tp GPUs alike)."""

    name: str = Field(
        description="'F s1 mb3', 'B s1 mb3', 'I s1 mb3', 'W s1 mb3', 'send act s1→s2 mb3', "
        "'recv act s2 mb3', 'dp all-reduce'..."
    )
    category: EventCategory
    track: Literal["compute", "communication"] = Field(
        description="Compute runs one at a time; sends and the all-reduce run beside it."
    )
    stage: int | None = Field(default=None, description="Stage the event belongs to, if one.")
    micro_batch: int | None = Field(default=None, description="Micro-batch, if one.")
    peer_rank: int | None = Field(
        default=None, description="Pipeline rank a send goes to or a receive comes from."
    )
    peer_replica: int | None = Field(
        default=None, description="Replica (of peer_rank) a send goes to or comes from."
    )
    samples: int | None = Field(default=None, description="Samples a send carries.")
    start_ms: float = Field(ge=0)
    end_ms: float = Field(ge=0)

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


class MemoryPoint(_Strict):
    """From ``time_ms`` on, one GPU of the replica holds ``allocated_bytes``."""

    time_ms: float = Field(ge=0)
    allocated_bytes: int = Field(ge=0)


class ReplicaTimeline(_Strict):
    """Everything one replica (tp GPUs of one type) of a pipeline rank does in one iteration."""

    pipeline_rank: int = Field(ge=0)
    replica: int = Field(ge=0, description="Index in its stages' replicas (its dp index).")
    gpu_type: str
    tensor_parallel_degree: int = Field(ge=1)
    context_parallel_degree: int = Field(
        default=1, ge=1, description="cp: its tp groups, each a chunk of every sample's sequence."
    )
    expert_parallel_degree: int = Field(
        default=1,
        ge=1,
        description="ep of its stages: it holds experts / ep of each MoE layer and exchanges "
        "tokens with the other replicas of its expert group (inside its forwards and backwards).",
    )
    micro_batch_size: int = Field(ge=1, description="Its share of every micro-batch.")
    node: str = Field(default="", description="The node its GPUs are on.")
    ranks: list[int] = Field(default_factory=list, description="Its global ranks, by tp index.")
    busy_ms: float = Field(ge=0, description="Compute time: forwards, backwards, optimizer.")
    idle_ms: float = Field(ge=0, description="Iteration time minus busy time.")
    communication_ms: float = Field(ge=0, description="Sends issued and the dp all-reduce.")
    static_bytes: int = Field(ge=0, description="Weights + gradients + optimizer states.")
    peak_bytes: int = Field(ge=0, description="Highest point of the memory curve.")
    capacity_bytes: int = Field(ge=0)
    events: list[SimulatedEvent]
    memory: list[MemoryPoint] = Field(description="Step curve of one GPU, points in time order.")

    @property
    def kind(self) -> tuple[str, int, int]:
        """(GPU type, tp, share): replicas of one kind have one memory estimate."""
        return (self.gpu_type, self.tensor_parallel_degree, self.micro_batch_size)

    @property
    def label(self) -> str:
        """E.g. 'A100-80GB tp2, 4 samples' ('H100 tp2 cp4, 1 samples' with cp, 'H100 tp1 ep4,
        3 samples' with ep)."""
        cp = f" cp{self.context_parallel_degree}" if self.context_parallel_degree > 1 else ""
        cp += f" ep{self.expert_parallel_degree}" if self.expert_parallel_degree > 1 else ""
        return (
            f"{self.gpu_type} tp{self.tensor_parallel_degree}{cp}, {self.micro_batch_size} "
            f"sample{'' if self.micro_batch_size == 1 else 's'}"
        )


class RankTimeline(_Strict):
    """One pipeline rank: its stages and its replicas' timelines."""

    pipeline_rank: int = Field(ge=0)
    stages: list[int] = Field(description="Stages this rank runs.")
    replicas: list[ReplicaTimeline] = Field(min_length=1)

    @property
    def gpu_type(self) -> str:
        """Its replicas' GPU types, '+'-joined in order of first appearance."""
        return "+".join(dict.fromkeys(replica.gpu_type for replica in self.replicas))

    @property
    def busy_ms(self) -> float:
        """The busiest replica's compute time."""
        return max(replica.busy_ms for replica in self.replicas)

    @property
    def peak_bytes(self) -> int:
        """The highest memory peak of one GPU over its replicas."""
        return max(replica.peak_bytes for replica in self.replicas)


class SimulationResult(_Strict):
    """One simulated iteration of a plan."""

    schedule: ScheduleName
    pipeline_degree: int = Field(ge=1)
    virtual_stages_per_rank: int = Field(ge=1)
    num_micro_batches: int = Field(ge=1)
    iteration_time_ms: float = Field(ge=0, description="Until the last optimizer step ends.")
    pipeline_time_ms: float = Field(ge=0, description="Until the last backward ends.")
    bubble_fraction: float = Field(
        ge=0,
        le=1,
        description="Share of replicas × pipeline time with no forward or backward running.",
    )
    predicted_iteration_time_ms: float | None = Field(
        default=None, description="The plan's own (closed-form) prediction, when simulating a plan."
    )
    activation_bytes_source: Literal["plan", "derived"] = Field(
        description="'plan': the stage or replica timings' saved_activation_bytes; 'derived': "
        "the replica kind's MemoryEstimate.activations_bytes spread over its peak in-flight "
        "micro-batches."
    )
    notes: list[str] = Field(
        default_factory=list, description="Figures the plan lacked and how they were estimated."
    )
    ranks: list[RankTimeline]

    @property
    def replicas(self) -> list[ReplicaTimeline]:
        """Every replica's timeline, rank by rank."""
        return [replica for rank in self.ranks for replica in rank.replicas]
