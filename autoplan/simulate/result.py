"""What the simulator returns: a timeline per pipeline rank and its memory over time."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoplan.plan.schema import ScheduleName

__all__ = [
    "EventCategory",
    "MemoryPoint",
    "RankTimeline",
    "SimulatedEvent",
    "SimulationResult",
]

EventCategory = Literal["forward", "backward", "communication", "optimizer"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulatedEvent(_Strict):
    """One interval of work on one pipeline rank."""

    name: str = Field(description="'F s1 mb3', 'B s1 mb3', 'send s1→s2 mb3', 'dp all-reduce'...")
    category: EventCategory
    track: Literal["compute", "communication"] = Field(
        description="Compute runs one at a time; sends and the all-reduce run beside it."
    )
    stage: int | None = Field(default=None, description="Stage the event belongs to, if one.")
    micro_batch: int | None = Field(default=None, description="Micro-batch, if one.")
    peer_rank: int | None = Field(default=None, description="Pipeline rank a send goes to.")
    start_ms: float = Field(ge=0)
    end_ms: float = Field(ge=0)

    @property
    def duration_ms(self) -> float:
        return self.end_ms - self.start_ms


class MemoryPoint(_Strict):
    """From ``time_ms`` on, one GPU of the rank holds ``allocated_bytes``."""

    time_ms: float = Field(ge=0)
    allocated_bytes: int = Field(ge=0)


class RankTimeline(_Strict):
    """Everything one pipeline rank does in one iteration (all its dp × tp GPUs alike)."""

    pipeline_rank: int = Field(ge=0)
    gpu_type: str
    stages: list[int] = Field(description="Stages this rank runs.")
    busy_ms: float = Field(ge=0, description="Compute time: forwards, backwards, optimizer.")
    idle_ms: float = Field(ge=0, description="Iteration time minus busy time.")
    communication_ms: float = Field(ge=0, description="Sends issued and the dp all-reduce.")
    static_bytes: int = Field(ge=0, description="Weights + gradients + optimizer states.")
    peak_bytes: int = Field(ge=0, description="Highest point of the memory curve.")
    capacity_bytes: int = Field(ge=0)
    events: list[SimulatedEvent]
    memory: list[MemoryPoint] = Field(description="Step curve, points in time order.")


class SimulationResult(_Strict):
    """One simulated iteration of a plan."""

    schedule: ScheduleName
    pipeline_degree: int = Field(ge=1)
    virtual_stages_per_rank: int = Field(ge=1)
    num_micro_batches: int = Field(ge=1)
    iteration_time_ms: float = Field(ge=0, description="Until the last rank's optimizer ends.")
    pipeline_time_ms: float = Field(ge=0, description="Until the last backward ends.")
    bubble_fraction: float = Field(
        ge=0, le=1, description="Share of ranks × pipeline time with no forward or backward."
    )
    predicted_iteration_time_ms: float | None = Field(
        default=None, description="The plan's own (closed-form) prediction, when simulating a plan."
    )
    activation_bytes_source: Literal["plan", "derived"] = Field(
        description="'plan': StageTiming.saved_activation_bytes; 'derived': the rank's "
        "MemoryEstimate.activations_bytes spread over its peak in-flight micro-batches."
    )
    notes: list[str] = Field(
        default_factory=list, description="Figures the plan lacked and how they were estimated."
    )
    ranks: list[RankTimeline]
