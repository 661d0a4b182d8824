"""What a sweep returns: one row per configuration (cluster size × global batch), solved or
saying why not."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["SweepRow"]


class SweepRow(BaseModel):
    """One configuration of a sweep and what its best plan predicts.

    An infeasible configuration (no plan, or a baseline's best that does not fit in memory)
    has ``feasible`` False, a short ``note`` and the solver's whole ``reason``, and no figures
    (None)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    nodes: int = Field(ge=1, description="Nodes of the configuration.")
    global_batch_size: int = Field(ge=1, description="Samples per iteration.")
    batch_per_gpu: bool = Field(
        default=False,
        description="No global batch was given: the configuration takes one sample per GPU "
        "(the batch grows with the cluster).",
    )
    cluster_name: str = Field(description="Name of the scaled cluster, '<name>-<nodes>n'.")
    node_counts: dict[str, int] = Field(description="Nodes per node group of the cluster file.")
    gpus: dict[str, int] = Field(description="GPUs of the configuration per GPU type.")
    gpus_used: dict[str, int] = Field(
        default_factory=dict,
        description="GPUs the plan uses per GPU type (the rest idle); empty when infeasible.",
    )
    feasible: bool = Field(description="A plan exists and fits in memory.")
    note: str = Field(
        default="",
        description="A short phrase: why there is no plan, or that the time limit stopped the "
        "search, or which GPUs the plan leaves idle.",
    )
    reason: str = Field(default="", description="The solver's whole message when infeasible.")
    timed_out: bool = Field(
        default=False, description="The time limit stopped the search: not proven optimal."
    )
    search_status: Literal["proven", "gap", "limit"] | None = Field(
        default=None,
        description="The plan's certificate (Plan.search.status); None for a baseline or "
        "without a plan.",
    )
    gap: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="How far from optimal the plan can be at most (Plan.search.gap).",
    )
    tokens_per_s: float | None = Field(default=None, gt=0, description="Predicted tokens/s.")
    samples_per_s: float | None = Field(default=None, gt=0, description="Predicted samples/s.")
    mfu: float | None = Field(default=None, ge=0, description="Predicted model FLOPs utilisation.")
    iteration_time_ms: float | None = Field(default=None, gt=0, description="One iteration.")
    pipeline_degree: int | None = Field(default=None, ge=1, description="The plan's pp.")
    train_tokens: float = Field(gt=0, description="Tokens the run trains on.")
    train_time_s: float | None = Field(
        default=None, gt=0, description="train_tokens / tokens_per_s."
    )
    usd_per_hour: float | None = Field(
        default=None,
        ge=0,
        description="Σ GPUs of the configuration of a type × its price per GPU-hour; idle GPUs "
        "are paid for too (None without prices).",
    )
    cost_usd: float | None = Field(
        default=None, ge=0, description="usd_per_hour × train_time_s / 3600 (None without prices)."
    )
    solve_time_s: float = Field(ge=0, description="Wall time of this configuration's solve.")

    @property
    def total_gpus(self) -> int:
        """GPUs of the configuration, all types."""
        return sum(self.gpus.values())
