"""What the user asks of a solve: pinned knobs, strategy, limits."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoplan import limits
from autoplan.plan.schema import Engine, Recompute
from autoplan.schedule.names import ScheduleName

__all__ = ["SolveOptions", "Space", "Strategy"]

Strategy = Literal["optimal", "megatron", "even-split", "data-parallel"]
Space = Literal["heterogeneous", "uniform"]


class SolveOptions(BaseModel):
    """Knobs left as None are searched; set ones restrict the search to that value."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tp: int | None = Field(
        default=None, ge=1, le=limits.MAX_GPUS_PER_NODE, description="Tensor-parallel degree."
    )
    pp: int | None = Field(
        default=None, ge=1, le=limits.MAX_PIPELINE_DEGREE, description="Pipeline ranks."
    )
    dp: int | None = Field(
        default=None, ge=1, le=limits.MAX_CLUSTER_GPUS, description="Data-parallel replicas."
    )
    micro_batch_size: int | None = Field(
        default=None, ge=1, le=limits.MAX_MICRO_BATCH_SIZE, description="Samples per micro-batch."
    )
    num_micro_batches: int | None = Field(
        default=None, ge=1, le=limits.MAX_NUM_MICRO_BATCHES, description="Micro-batches."
    )
    schedule: ScheduleName | None = Field(default=None, description="Pipeline schedule.")
    recompute: Recompute | None = Field(default=None, description="Recompute for every stage.")
    zero1: bool | None = Field(default=None, description="ZeRO-1 optimizer sharding.")
    zero_stage: int | None = Field(
        default=None,
        ge=0,
        le=3,
        description="ZeRO level of every stage of several replicas (0 none, 1 optimizer "
        "states, 2 also gradients, 3 also parameters); None searches 1-3 per stage.",
    )
    offload: bool | None = Field(
        default=None, description="Activation offload to host memory for every stage."
    )
    sequence_parallel: bool | None = Field(
        default=None,
        description="Megatron-style sequence parallelism with tp (None: searched both ways).",
    )
    expert_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Expert-parallel degree of every stage (None: searched over the divisors "
        "of the experts; 1 for a dense model).",
    )
    experts_by_speed: bool = Field(
        default=True,
        description="Search expert groups that span a mixed stage's two GPU types, each rank "
        "holding its own number of experts (autoplan.solve.expert_span); False: experts even "
        "within expert groups of one type.",
    )
    cp: int | None = Field(
        default=None,
        ge=1,
        description="Context-parallel degree of every stage (ring attention over cp GPUs of a "
        "node); None searches 1 and the degrees the nodes and the sequence allow "
        "(autoplan.solve.context_parallel).",
    )
    cp_min_seq_len: int = Field(
        default=8192,
        ge=1,
        description="Shortest sequence (tokens) at which cp > 1 is searched when cp is not pinned.",
    )
    layer_split: list[int] | None = Field(
        default=None, description="Layers per stage (pins pp to its length)."
    )
    strategy: Strategy = Field(default="optimal", description="Search or a baseline.")
    top_k: int = Field(
        default=3,
        ge=1,
        le=limits.MAX_TOP_K,
        description="Alternatives to report (besides the best).",
    )
    time_limit_s: float = Field(
        default=60.0,
        gt=0,
        le=limits.MAX_TIME_LIMIT_S,
        description="Wall-clock limit of the search.",
    )
    gap: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Stop once the plan is proven within this fraction of the optimum "
        "(0: search until proven optimal or the time limit).",
    )
    efficiency: dict[str, float] = Field(
        default_factory=dict, description="Per-GPU-type efficiency overriding the catalog's."
    )
    space: Space = Field(
        default="heterogeneous",
        description="'uniform' restricts the search to uniform pipelines: one (dp, tp) and "
        "micro-batch size for every stage, one GPU type per stage (one DeviceMesh).",
    )
    reserve_gb: float | None = Field(
        default=None,
        ge=0,
        description="Device memory (GB) kept free on every GPU, overriding the catalog's and "
        "the cluster's memory_reserve_gib.",
    )
    allow_async: bool = Field(
        default=False,
        description="Also cost the asynchronous schedule async_pb (Pipelined Backpropagation: "
        "it changes the optimisation) and report it beside the best synchronous plan.",
    )
    max_micro_batch_size: int = Field(
        default=16, ge=1, description="Largest micro-batch size searched when not pinned."
    )
    engine: Engine = Field(
        default="autoplan",
        description="The engine that will run the plan, whose costs the search minimises "
        "(autoplan.cost.engines): 'autoplan' (torchrun of the plan) or 'megatron-deepspeed'.",
    )
    zero_bubble: bool = Field(
        default=True,
        description="Also try the zero-bubble schedules at the best pipelines found "
        "(autoplan.solve.zero_bubble); a pinned zero-bubble schedule is tried either way.",
    )

    @model_validator(mode="after")
    def _offload_pairs(self) -> SolveOptions:
        if self.offload and self.recompute == "selective":
            raise ValueError(
                "offload pairs with recompute none or full, not selective (selective "
                "recompute keeps its saved tensors outside the hooks offload works through)"
            )
        return self

    def pinned(self) -> dict[str, str]:
        """The pinned knobs, as strings, for the plan's record."""
        names = ["tp", "pp", "dp", "micro_batch_size", "num_micro_batches", "schedule"]
        names += ["recompute", "zero1", "zero_stage", "offload", "layer_split"]
        names += ["sequence_parallel", "expert_parallel", "cp"]
        out = {}
        for name in names:
            value = getattr(self, name)
            if value is not None:
                out[name] = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        if not self.experts_by_speed:  # --even-experts: the space without them
            out["experts_by_speed"] = "False"
        return out
