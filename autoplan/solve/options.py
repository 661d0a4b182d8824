"""What the user asks of a solve: pinned knobs, strategy, limits."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from autoplan.plan.schema import Recompute, ScheduleName

__all__ = ["SolveOptions", "Space", "Strategy"]

Strategy = Literal["optimal", "megatron", "even-split", "data-parallel"]
Space = Literal["heterogeneous", "uniform"]


class SolveOptions(BaseModel):
    """Knobs left as None are searched; set ones restrict the search to that value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int | None = Field(default=None, ge=1, description="Tensor-parallel degree.")
    pp: int | None = Field(default=None, ge=1, description="Pipeline ranks.")
    dp: int | None = Field(default=None, ge=1, description="Data-parallel replicas.")
    micro_batch_size: int | None = Field(default=None, ge=1, description="Samples per micro-batch.")
    num_micro_batches: int | None = Field(default=None, ge=1, description="Micro-batches.")
    schedule: ScheduleName | None = Field(default=None, description="Pipeline schedule.")
    recompute: Recompute | None = Field(default=None, description="Recompute for every stage.")
    zero1: bool | None = Field(default=None, description="ZeRO-1 optimizer sharding.")
    sequence_parallel: bool | None = Field(
        default=None,
        description="Megatron-style sequence parallelism with tp (None: searched both ways).",
    )
    layer_split: list[int] | None = Field(
        default=None, description="Layers per stage (pins pp to its length)."
    )
    strategy: Strategy = Field(default="optimal", description="Search or a baseline.")
    top_k: int = Field(default=3, ge=1, description="Alternatives to report (besides the best).")
    time_limit_s: float = Field(default=60.0, gt=0, description="Wall-clock limit of the search.")
    efficiency: dict[str, float] = Field(
        default_factory=dict, description="Per-GPU-type efficiency overriding the catalog's."
    )
    space: Space = Field(
        default="heterogeneous",
        description="'uniform' restricts the search to round 1's space: one (dp, tp) and "
        "micro-batch size for every stage (one DeviceMesh).",
    )
    reserve_gb: float | None = Field(
        default=None,
        ge=0,
        description="Device memory (GB) kept free on every GPU, overriding the catalog's and "
        "the cluster's memory_reserve_gib.",
    )
    max_micro_batch_size: int = Field(
        default=16, ge=1, description="Largest micro-batch size searched when not pinned."
    )

    def pinned(self) -> dict[str, str]:
        """The pinned knobs, as strings, for the plan's record."""
        names = ["tp", "pp", "dp", "micro_batch_size", "num_micro_batches", "schedule"]
        names += ["recompute", "zero1", "layer_split", "sequence_parallel"]
        out = {}
        for name in names:
            value = getattr(self, name)
            if value is not None:
                out[name] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        return out
