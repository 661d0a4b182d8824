"""The run report: what a run measured, beside what the plan predicted (rank 0 writes it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["RUN_REPORT_SCHEMA_VERSION", "RunReport", "StepRecord"]

RUN_REPORT_SCHEMA_VERSION = 1


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
    measured_tokens_per_s: float = Field(ge=0)
    predicted_tokens_per_s: float = Field(ge=0)
