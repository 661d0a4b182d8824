"""The run report: what a run measured, beside what the plan predicted (rank 0 writes it).

The plan predicts memory per kind of replica (pipeline rank, GPU type, tp, share:
``MemoryEstimate``); :func:`predicted_memory_of_rank` finds each rank's, so the report lists
measured and predicted figures rank by rank.
"""

from __future__ import annotations

from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from autoplan.plan.schema import MemoryEstimate, Plan

__all__ = ["RUN_REPORT_SCHEMA_VERSION", "RunReport", "StepRecord", "predicted_memory_of_rank"]

RUN_REPORT_SCHEMA_VERSION: Final = 1


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepRecord(_Strict):
    """One training step."""

    step: int = Field(ge=0)
    time_ms: float = Field(ge=0, description="Wall time of the step, slowest rank.")
    loss: float = Field(description="Mean cross-entropy over the global batch.")
    peak_memory_bytes: int = Field(ge=0, description="Peak memory so far, largest rank.")
    schedule_time_ms: float = Field(
        ge=0,
        description="Forward, backward and their communication (the pipeline schedule, "
        "with DDP's all-reduce), slowest rank.",
    )
    optimizer_time_ms: float = Field(ge=0, description="Optimizer step, slowest rank.")


class RunReport(_Strict):
    """A training run of a plan: per-step figures and measured-vs-predicted summary."""

    schema_version: Literal[1] = Field(
        default=RUN_REPORT_SCHEMA_VERSION, description="Version of this schema."
    )
    plan_summary: str = Field(description="The plan's knobs in one line.")
    model: str
    world_size: int = Field(ge=1)
    backend: str = Field(description="torch.distributed backend: 'nccl' or 'gloo'.")
    device_type: str = Field(description="'cuda' or 'cpu'.")
    global_batch_size: int = Field(ge=1)
    seq_len: int = Field(ge=1)
    steps: list[StepRecord]
    memory_measure: Literal["cuda_max_allocated", "cpu_max_rss"] = Field(
        description="What peak memory means: torch.cuda.max_memory_allocated, or the process's "
        "peak resident set size on CPU (includes the Python runtime and libraries)."
    )
    measured_step_time_ms: float = Field(
        ge=0, description="Mean step time, leaving out the first step (warm-up) when steps > 1."
    )
    predicted_iteration_time_ms: float = Field(ge=0, description="plan.prediction's time.")
    measured_optimizer_time_ms: float = Field(
        ge=0, description="Mean optimizer step time, over the same steps."
    )
    predicted_optimizer_time_ms: float = Field(
        ge=0, description="plan.prediction's optimizer time (breakdown.optimizer_ms)."
    )
    measured_peak_memory_bytes: int = Field(ge=0, description="Largest rank's peak memory.")
    predicted_peak_memory_bytes: int = Field(
        ge=0, description="Largest per-GPU total of plan.prediction.memory."
    )
    peak_memory_per_rank_bytes: list[int] = Field(description="Peak memory of each rank.")
    measured_model_state_bytes: int = Field(
        ge=0,
        description="Largest rank's parameters + gradients + optimizer states, as held (sharded).",
    )
    predicted_model_state_bytes: int = Field(
        ge=0, description="Largest weights + gradients + optimizer of plan.prediction.memory."
    )
    model_state_per_rank_bytes: list[int] = Field(description="Model-state bytes of each rank.")
    predicted_peak_memory_per_rank_bytes: list[int] = Field(
        default_factory=list,
        description="Each rank's predicted total (its replica's MemoryEstimate; 0 if none).",
    )
    predicted_model_state_per_rank_bytes: list[int] = Field(
        default_factory=list,
        description="Each rank's predicted weights + gradients + optimizer states.",
    )
    executor: Literal["mesh", "groups", "async"] = Field(
        default="mesh",
        description="'mesh': one (pp, dp, tp) DeviceMesh with torch's pipelining (uniform "
        "plans); 'groups': per-stage process groups and the runtime's own stage transfers; "
        "'async': asynchronous Pipelined Backpropagation (schedule async_pb, no flush).",
    )
    measured_tokens_per_s: float = Field(ge=0)
    predicted_tokens_per_s: float = Field(ge=0)


def predicted_memory_of_rank(plan: Plan, rank: int) -> MemoryEstimate | None:
    """The plan's memory estimate for ``rank``: the one of its pipeline rank, GPU type, tp and
    share; failing that, the largest of its pipeline rank and GPU type; None if neither."""
    entry = plan.rank_map[rank]
    replica = plan.stages_of_rank(entry.pipeline_rank)[0].replicas[entry.dp_index]
    candidates = [
        estimate
        for estimate in plan.prediction.memory
        if estimate.pipeline_rank == entry.pipeline_rank and estimate.gpu_type == entry.gpu_type
    ]
    for estimate in candidates:
        if (estimate.tensor_parallel_degree, estimate.micro_batch_size) == (
            replica.tensor_parallel_degree,
            replica.micro_batch_size,
        ):
            return estimate
    return max(candidates, key=lambda estimate: estimate.total_bytes, default=None)
