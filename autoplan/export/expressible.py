"""What another launcher can run of a plan: one shape for the whole pipeline.

Megatron-LM, torchtitan and DeepSpeed build one grid of ranks, (pipeline, data, tensor) in
that order, so they run only plans where every stage has the same data-parallel degree dp,
every replica the same tensor-parallel degree tp and the same share of each micro-batch, every
stage one GPU type, and one recompute mode and one ZeRO level hold everywhere. This module
reduces a plan to that shape (``PlanShape``), or says which part of the plan breaks it in one
line (``NotExpressibleError``). Each target's module (``megatron``, ``torchtitan``,
``deepspeed``) adds its own limits and writes the launcher's own configuration.

Which layers are transformer blocks (Megatron-LM counts only those, torchtitan names them
``layers.N``) comes from the profile the plan was solved from, or, for zoo models, from the
zoo's layout: an embedding, the blocks, a head (``layer_kinds``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from autoplan.checks import ZOO_MODEL_NAMES
from autoplan.errors import InputError
from autoplan.plan.schema import Plan, Recompute
from autoplan.profile.schema import LayerKind, Profile
from autoplan.schedule.names import ScheduleName

__all__ = [
    "ExportResult",
    "NotExpressibleError",
    "PlanShape",
    "TransformerLayout",
    "check_schedule",
    "layer_kinds",
    "plan_shape",
    "tf32_note",
    "transformer_layout",
]


def tf32_note(how_it_trains: str) -> str:
    """The note every target gets for a tf32 plan: none has a tf32 precision, so it trains in
    fp32 (``how_it_trains`` says how, in its words) and PyTorch's switch gives the matmuls."""
    return (
        f"the plan trains in tf32: {how_it_trains}; enable TF32 matmuls in PyTorch "
        "(torch.backends.cuda.matmul.allow_tf32 = True)"
    )


class NotExpressibleError(InputError):
    """The target launcher cannot run the plan; ``part`` names what it cannot run."""

    def __init__(self, target: str, part: str) -> None:
        self.target = target
        self.part = part
        super().__init__(f"{target} cannot run this plan: {part}")


def check_schedule(schedule: ScheduleName, target: str, runs: Sequence[ScheduleName]) -> None:
    """NotExpressibleError unless ``target`` runs ``schedule`` (``runs``: the plan schedules
    it has, by autoplan's names). A launcher given a schedule it lacks would run another one,
    with another bubble and memory than the plan was priced with, so it is refused, not
    mapped."""
    if schedule not in runs:
        raise NotExpressibleError(
            target, f"its schedule is {schedule}; {target} runs {_listing(list(runs))}"
        )


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class PlanShape(_Strict):
    """A plan reduced to what one (pipeline, data, tensor) grid of ranks holds."""

    pipeline_degree: int = Field(ge=1, description="pp: pipeline ranks.")
    virtual_stages_per_rank: int = Field(ge=1, description="Stages per pipeline rank.")
    schedule: ScheduleName
    data_parallel_degree: int = Field(ge=1, description="dp: replicas of every stage.")
    tensor_parallel_degree: int = Field(ge=1, description="tp: GPUs of every replica.")
    context_parallel_degree: int = Field(
        default=1, ge=1, description="cp: tp groups of every replica, each a sequence chunk."
    )
    micro_batch_size: int = Field(ge=1, description="Samples of each micro-batch per replica.")
    num_micro_batches: int = Field(ge=1, description="Micro-batches per iteration.")
    global_batch_size: int = Field(ge=1, description="Samples per iteration, all replicas.")
    seq_len: int = Field(ge=1)
    dtype: str
    recompute: Recompute = Field(description="The one recompute mode of every replica.")
    zero1: bool = Field(description="Optimizer states sharded across dp (False when dp = 1).")
    zero_stage: int = Field(
        default=0,
        ge=0,
        le=3,
        description="The one ZeRO level of every stage: 0-3 (0 when dp = 1); each target "
        "says which it runs.",
    )
    expert_parallel_degree: int = Field(
        default=1, ge=1, description="ep of every stage (1: no expert parallelism)."
    )
    sequence_parallel: bool = Field(
        default=False,
        description="Every stage runs sequence parallelism in its tp groups (tp > 1; a plan "
        "where some stages run it and others do not has no shape).",
    )
    stage_layers: list[int] = Field(description="Layers of each stage, in stage order.")
    world_size: int = Field(ge=1)

    @property
    def num_stages(self) -> int:
        return len(self.stage_layers)


class ExportResult(_Strict):
    """A launcher's configuration for one plan, and what the user should know about it."""

    target: str
    text: str = Field(description="The file's contents.")
    notes: list[str] = Field(
        default_factory=list,
        description="Where the launcher will run the plan differently from its prediction, "
        "or needs something the file cannot hold (one line each).",
    )


@dataclass(frozen=True)
class TransformerLayout:
    """Which of the plan's layers are transformer blocks, per stage."""

    stage_blocks: list[int]
    num_blocks: int
    block_index: list[int | None]  # per layer: its index among the blocks, None if not a block


def _article(kind: str) -> str:
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind!r}"


def _listing(values: Sequence[str]) -> str:
    return ", ".join(dict.fromkeys(values))


def _grid_numbered(plan: Plan, dp: int, cp: int, tp: int) -> bool:
    """Whether the ranks follow rank = ((pipeline rank · dp + replica) · cp + cp index) · tp +
    tp index over exactly those GPUs: Megatron-LM's tp-cp-dp-pp order and torchtitan's
    (pp, dp, cp, tp) mesh (with cp = 1, ``Plan.uniform_shape``)."""
    if cp == 1:
        return plan.uniform_shape() == (dp, tp)
    width = cp * tp
    for stage in plan.stages:
        for d, replica in enumerate(stage.replicas):
            start = (stage.pipeline_rank * dp + d) * width
            if replica.ranks != list(range(start, start + width)):
                return False
    return len(plan.rank_map) == plan.parallelism.pipeline_degree * dp * width


def plan_shape(plan: Plan, target: str) -> PlanShape:
    """The plan's one (pp, dp, tp) shape; NotExpressibleError naming the first stage or part
    that has another (mixed GPU types, unequal tp, dp, shares, recompute or ZeRO level, ranks out
    of the grid's order). Which ZeRO levels a target runs is the target's check."""
    stages = plan.stages
    for stage in stages:
        group = stage.replicas[: stage.expert_parallel_degree]
        if group[0].routed_experts is not None:
            held = " + ".join(f"{r.routed_experts} on {r.gpu_type}" for r in group)
            raise NotExpressibleError(
                target,
                f"stage {stage.index} places experts by GPU speed ({held} per expert group); "
                f"{target} gives every rank of an expert group experts / ep",
            )
        uneven = next((r.context_tokens for r in stage.replicas if r.context_tokens), None)
        if uneven is not None:
            raise NotExpressibleError(
                target,
                f"stage {stage.index} splits each sequence unevenly over its cp ranks "
                f"({' + '.join(map(str, uneven))} tokens); {target} gives every cp rank "
                "seq_len / cp",
            )
        if len(stage.gpu_types) > 1:
            types = _listing(stage.gpu_types)
            raise NotExpressibleError(target, f"stage {stage.index} mixes GPU types ({types})")
        tps = [str(r.tensor_parallel_degree) for r in stage.replicas]
        if len(set(tps)) > 1:
            raise NotExpressibleError(
                target,
                f"stage {stage.index}'s replicas differ in tensor-parallel degree "
                f"({_listing(tps)}); {target} gives every replica one tp",
            )
        shares = [str(share) for share in stage.shares]
        if len(set(shares)) > 1:
            raise NotExpressibleError(
                target,
                f"stage {stage.index}'s replicas take uneven shares of each micro-batch "
                f"({_listing(shares)} samples); {target} gives every replica the same share",
            )
        cps = [str(r.context_parallel_degree) for r in stage.replicas]
        if len(set(cps)) > 1:
            raise NotExpressibleError(
                target,
                f"stage {stage.index}'s replicas differ in context-parallel degree "
                f"({_listing(cps)}); {target} gives every replica one cp",
            )
        modes = [r.recompute for r in stage.replicas]
        if len(set(modes)) > 1:
            raise NotExpressibleError(
                target,
                f"stage {stage.index}'s replicas use different recompute ({_listing(modes)})",
            )
    first = stages[0]
    tp = first.replicas[0].tensor_parallel_degree
    cp = first.replicas[0].context_parallel_degree
    dp = first.data_parallel_degree
    for stage in stages[1:]:
        other_cp = stage.replicas[0].context_parallel_degree
        if other_cp != cp:
            raise NotExpressibleError(
                target,
                f"stages differ in context-parallel degree (stage {first.index}: cp {cp}, "
                f"stage {stage.index}: cp {other_cp}); {target} uses one cp for every stage",
            )
        other = stage.replicas[0].tensor_parallel_degree
        if other != tp:
            raise NotExpressibleError(
                target,
                f"stages differ in tensor-parallel degree (stage {first.index}: tp {tp}, stage "
                f"{stage.index}: tp {other}); {target} uses one tp for every stage",
            )
        if stage.data_parallel_degree != dp:
            raise NotExpressibleError(
                target,
                f"stages differ in data-parallel degree (stage {first.index}: dp {dp}, stage "
                f"{stage.index}: dp {stage.data_parallel_degree}); {target} uses one dp for "
                "every stage",
            )
        mode, mode0 = stage.replicas[0].recompute, first.replicas[0].recompute
        if mode != mode0:
            raise NotExpressibleError(
                target,
                f"stages use different recompute (stage {first.index}: {mode0}, stage "
                f"{stage.index}: {mode}); {target} sets one recompute for every stage",
            )
        if dp > 1 and stage.zero1 != first.zero1:
            on = [str(s.index) for s in stages if s.zero1]
            off = [str(s.index) for s in stages if not s.zero1]
            raise NotExpressibleError(
                target,
                f"ZeRO-1 is on for stages {', '.join(on)} and off for stages {', '.join(off)}; "
                f"{target} sets it for every stage",
            )
        if dp > 1 and stage.zero_stage != first.zero_stage:
            raise NotExpressibleError(
                target,
                f"stages use different ZeRO levels (stage {first.index}: ZeRO-"
                f"{first.zero_stage}, stage {stage.index}: ZeRO-{stage.zero_stage}); {target} "
                "sets one level for every stage",
            )
    degrees = [str(s.expert_parallel_degree) for s in stages]
    if len(set(degrees)) > 1:
        raise NotExpressibleError(
            target,
            f"stages use different expert-parallel degrees ({_listing(degrees)}); {target} "
            "sets one for every stage",
        )
    running = plan.sequence_parallel_stages
    if tp > 1 and running and len(running) < len(stages):
        # Some stages run SP and others, of the same tp, do not (Stage.sequence_parallel): the
        # targets set it for the whole job (Megatron-LM's --sequence-parallel), so either
        # setting would run another plan than the one priced.
        off = [str(s.index) for s in stages if s.index not in running]
        raise NotExpressibleError(
            target,
            f"sequence parallelism is on for stages {', '.join(map(str, running))} and off for "
            f"stages {', '.join(off)}; {target} sets it for every stage",
        )
    if not _grid_numbered(plan, dp, cp, tp):
        # Every check above passed, so only the numbering is off: the launchers number ranks
        # rank = pipeline_rank * dp * tp + replica * tp + tp_index, and torchrun numbers them
        # node by node in the plan's launch order.
        raise NotExpressibleError(
            target,
            "its ranks are not numbered pipeline rank, then replica, then cp index, then tp "
            f"index, as {target} numbers them",
        )
    par = plan.parallelism
    return PlanShape(
        pipeline_degree=par.pipeline_degree,
        virtual_stages_per_rank=par.virtual_stages_per_rank,
        schedule=par.schedule,
        data_parallel_degree=dp,
        tensor_parallel_degree=tp,
        context_parallel_degree=cp,
        micro_batch_size=first.replicas[0].micro_batch_size,
        num_micro_batches=par.num_micro_batches,
        global_batch_size=plan.inputs.global_batch_size,
        seq_len=plan.inputs.seq_len,
        dtype=plan.inputs.dtype,
        recompute=first.replicas[0].recompute,
        zero1=dp > 1 and first.zero1,
        zero_stage=first.zero_stage if dp > 1 else 0,
        expert_parallel_degree=first.expert_parallel_degree,
        sequence_parallel=tp > 1 and bool(running),
        stage_layers=[stage.layer_end - stage.layer_start for stage in stages],
        world_size=plan.world_size,
    )


def layer_kinds(plan: Plan, profile: Profile | None) -> list[LayerKind] | None:
    """What each of the plan's layers is: from ``profile`` when given, else the zoo's layout
    (embedding, blocks, head) for a zoo model; None when neither tells (a factory model)."""
    count = plan.inputs.model.num_layers
    if profile is not None:
        if len(profile.layers) != count:
            raise InputError(
                f"the profile has {len(profile.layers)} layers; the plan's model has {count}"
            )
        return [layer.kind for layer in profile.layers]
    if plan.inputs.model.name in ZOO_MODEL_NAMES and count >= 2:
        blocks: list[LayerKind] = ["block"] * (count - 2)
        return ["embedding", *blocks, "head"]
    return None


def transformer_layout(plan: Plan, kinds: list[LayerKind] | None, target: str) -> TransformerLayout:
    """The plan's layers as an embedding, transformer blocks and a head, the only layout of the
    models ``target`` builds; NotExpressibleError (or InputError without kinds) otherwise."""
    if kinds is None:
        raise InputError(
            f"the plan's model {plan.inputs.model.name!r} is not in the zoo: pass --profile "
            "(the profile the plan was solved from) so that export knows which layers are "
            "transformer blocks"
        )
    last = len(kinds) - 1
    if last < 1:
        raise NotExpressibleError(target, "its model is one layer, not an embedding and a head")
    for index, kind in enumerate(kinds):
        expected = "embedding" if index == 0 else "head" if index == last else "block"
        if kind != expected:
            raise NotExpressibleError(
                target,
                f"layer {index} is {_article(kind)} layer where {target}'s models have "
                f"{_article(expected)} (they are an embedding, transformer blocks and a head)",
            )
    block_index: list[int | None] = [None, *range(last - 1), None]
    stage_blocks = [
        sum(1 for i in range(stage.layer_start, stage.layer_end) if block_index[i] is not None)
        for stage in plan.stages
    ]
    return TransformerLayout(stage_blocks, last - 1, block_index)
