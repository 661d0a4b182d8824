"""The parallelize step: this rank's stage modules, every parallelism of the plan applied.

Every executor gets its modules here (as torchtitan's trainers get theirs from one
``parallelize_llama``) and only runs its schedule's actions over them. What differs between
executors is where the meshes and groups come from, the rank's *world*: a uniform plan's
DeviceMesh (``process_groups.UniformMesh``, the mesh executor) or per-stage process groups
(``process_groups.ProcessGroups``, the groups and async executors). :func:`stage_layouts`
reads, from the plan and the world, what applies to each of this rank's stages (a
:class:`StageLayout`); :func:`parallelize` builds the stages' layers from the seed
(``model_stage``) and applies the layout to each, always in this order:

1. **Tensor parallelism**, with sequence parallelism inside it on the stages that run it
   (``Plan.stage_sequence_parallel``: every stage, or the stage's own; SP is local to a stage,
   which passes the whole activation on) (``tensor_parallel``: DTensor column/row splits, the
   vocabulary split). First, because it replaces parameters with
   DTensors and changes what a layer's forward computes: everything after wraps that forward
   or holds those parameters. (Sequence parallelism's saved-input hook depends on whether the
   replica recomputes, so it is told the recompute mode here rather than applied after.)
2. **Context parallelism** (ring attention around each layer's forward) and **expert
   parallelism** (this rank's experts kept, tokens routed over the ep group). Both change the
   layer's forward, and sit inside recompute's wrapper so that a block rerun in backward runs
   under the ring and the routing too.
3. **Activation recompute**: each block's forward checkpointed (``recompute``).
4. **Activation offload**: saved-tensor hooks around the checkpointed forward (``offload``),
   so what goes to host is exactly what the recompute mode keeps.
5. **Move to the device**, once every layer is in its final shape.
6. **Data parallelism** last, over the final parameters (:class:`DataParallel`): DDP
   (full replicas), or FSDP2 per layer and then per stage (``fsdp``: ZeRO-2/3, and the mesh
   executor's tensor-parallel stages, whose DTensor parameters DDP cannot hold). FSDP2 shards
   the DTensors tensor parallelism made, on a mesh of one parent with the tp mesh.

ZeRO-1 (sharded optimizer states) and the optimizers are the executors': they are made over
what this step returns, not applied to the modules.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from autoplan.plan.schema import Plan, Stage
from autoplan.runtime import tensor_parallel
from autoplan.runtime.context_parallel import apply_context_parallel
from autoplan.runtime.data_parallel import replicate
from autoplan.runtime.expert_parallel import apply_expert_parallel, expert_group_ranks
from autoplan.runtime.fsdp import PerMicroBatchSync, is_sharded, shard_stage, zero_mesh
from autoplan.runtime.model_stage import TiedWeight, build_stage_models
from autoplan.runtime.offload import apply_offload
from autoplan.runtime.placement import RankPlace
from autoplan.runtime.process_groups import ProcessGroups, UniformMesh, tp_mesh
from autoplan.runtime.recompute import apply_recompute
from autoplan.zoo import get_model_spec

__all__ = [
    "DataParallel",
    "ExpertParallel",
    "RankModules",
    "StageLayout",
    "parallelize",
    "parallelize_stage",
    "stage_layouts",
]


@dataclass(frozen=True)
class ExpertParallel:
    """This rank's part of a stage's expert parallelism."""

    group: dist.ProcessGroup
    """The ranks whose experts together make the stage's (one per expert index)."""
    degree: int
    """ep: the experts are split in this many blocks."""
    index: int
    """The block of experts this rank keeps."""
    held: tuple[int, ...] | None = None
    """Experts placed by speed: how many each place of the expert group keeps (None: E/ep)."""


@dataclass(frozen=True)
class DataParallel:
    """How a stage's replicas share its gradients (the parallelize step's last part)."""

    mesh: DeviceMesh
    """The ranks holding the same part of the stage (one per replica, and per cp rank)."""
    shard: bool
    """FSDP2 ``fully_shard`` (weights, gradients and states sharded) rather than DDP."""
    reshard_after_forward: bool
    """FSDP2 gathers the weights again for the backward (ZeRO-3)."""
    sum_gradients: bool
    """FSDP2 sums the replicas' gradients instead of averaging them: the replicas' losses
    carry their share weights (the groups executor)."""
    per_micro_batch_sync: bool
    """The module goes to torch's ``PipelineStage`` inside ``PerMicroBatchSync``, so FSDP2
    reduce-scatters in every micro-batch's backward (``fsdp``)."""
    find_unused_parameters: bool
    """DDP under a schedule of several stages (``data_parallel``)."""
    left_whole: frozenset[str]
    """Parameters FSDP2 leaves out: weights tied to another stage's copy (``grad_sync`` sums
    them)."""


@dataclass(frozen=True)
class StageLayout:
    """What the parallelize step applies to this rank's copy of one stage."""

    stage: Stage
    tp_mesh: DeviceMesh | None
    """The replica's 1-D tensor-parallel mesh; None without tensor parallelism."""
    cp_group: dist.ProcessGroup | None
    """The context-parallel ring; None without context parallelism."""
    expert: ExpertParallel | None
    """None without expert parallelism."""
    data_parallel: DataParallel | None
    """None when the executor syncs gradients itself, or the stage has one replica."""


@dataclass(frozen=True)
class RankModules:
    """This rank's stages after the parallelize step."""

    stages: list[Stage]
    """This rank's stages, in order."""
    models: list[nn.Module]
    """Each stage's layers, unwrapped (parameter names as in the whole model): what the
    optimizers, checkpoints and gradient syncs read."""
    modules: list[nn.Module]
    """What the executor runs: ``models``, or their DDP / ``PerMicroBatchSync`` wrappers."""
    tied: list[TiedWeight]
    """Weights shared by layers of different stages (one copy per stage)."""


def _left_whole(tied: list[TiedWeight], stage: Stage) -> frozenset[str]:
    return frozenset(
        name
        for weight in tied
        for name, index in zip(weight.names, weight.stages, strict=True)
        if index == stage.index
    )


def _uniform_layout(plan: Plan, stage: Stage, world: UniformMesh) -> StageLayout:
    tp = world.mesh["tp"] if world.mesh["tp"].size() > 1 else None
    data_parallel = None
    if world.data.size() > 1:
        # DDP cannot hold DTensor parameters: a tensor-parallel stage is sharded by FSDP2.
        shard = tp is not None or stage.zero_stage >= 2
        data_parallel = DataParallel(
            mesh=world.data,
            shard=shard,
            reshard_after_forward=stage.zero_stage == 3,
            sum_gradients=False,
            per_micro_batch_sync=stage.zero_stage >= 2,
            find_unused_parameters=plan.parallelism.num_stages > 1,
            left_whole=frozenset(),
        )
    return StageLayout(stage, tp, world.cp_group, None, data_parallel)


def _groups_layout(
    stage: Stage,
    place: RankPlace,
    world: ProcessGroups,
    tied: list[TiedWeight],
    device: torch.device,
) -> StageLayout:
    replica = stage.replicas[place.replica]
    sharded = None
    if is_sharded(stage):
        sharded = zero_mesh(world, stage, place.tp_index, place.replica, device)
    tp = None
    if replica.tensor_parallel_degree > 1:
        # FSDP2 with tp needs both meshes from one parent (fsdp).
        tp = sharded["tp"] if sharded is not None else tp_mesh(world, replica, device)
    expert = None
    if stage.expert_parallel_degree > 1:
        ep = stage.expert_parallel_degree
        group = world.get(expert_group_ranks(stage, place.replica, place.tp_index))
        assert group is not None  # ep > 1 ranks
        first = place.replica - place.replica % ep
        counts = [r.routed_experts for r in stage.replicas[first : first + ep]]
        held = None if None in counts else tuple(x for x in counts if x is not None)
        expert = ExpertParallel(group, ep, place.replica % ep, held)
    data_parallel = None
    if sharded is not None:
        data_parallel = DataParallel(
            mesh=sharded["dp"] if sharded.ndim > 1 else sharded,
            shard=True,
            reshard_after_forward=stage.zero_stage == 3,
            sum_gradients=True,
            per_micro_batch_sync=False,
            find_unused_parameters=False,
            left_whole=_left_whole(tied, stage),
        )
    return StageLayout(stage, tp, None, expert, data_parallel)


def stage_layouts(
    plan: Plan,
    place: RankPlace,
    world: UniformMesh | ProcessGroups,
    tied: list[TiedWeight],
    device: torch.device,
) -> list[StageLayout]:
    """What applies to each of ``place``'s stages on ``world`` (module docstring).

    On per-stage groups, data parallelism here is FSDP2 of ZeRO-2/3 stages only: the groups
    executor sums every other gradient itself (``grad_sync``). Context parallelism runs on a
    uniform mesh only (``trainer.select_executor``)."""
    stages = [plan.stages[index] for index in place.stages]
    if isinstance(world, UniformMesh):
        return [_uniform_layout(plan, stage, world) for stage in stages]
    return [_groups_layout(stage, place, world, tied, device) for stage in stages]


def _data_parallel(model: nn.Module, setting: DataParallel, device: torch.device) -> nn.Module:
    if not setting.shard:
        return replicate(model, setting.mesh, device, setting.find_unused_parameters)
    left_whole = {model.get_parameter(name) for name in setting.left_whole}
    shard_stage(
        model, setting.mesh, setting.reshard_after_forward, left_whole, setting.sum_gradients
    )
    return PerMicroBatchSync(model) if setting.per_micro_batch_sync else model


def parallelize_stage(
    plan: Plan, model: nn.Module, layout: StageLayout, place: RankPlace, device: torch.device
) -> nn.Module:
    """Apply ``layout`` to ``model`` (one stage's layers, in place) in the module docstring's
    order; returns the module to run (``model`` or its data-parallel wrapper)."""
    replica = layout.stage.replicas[place.replica]
    if layout.tp_mesh is not None:
        tensor_parallel.apply_tensor_parallel(
            model,
            layout.tp_mesh,
            get_model_spec(plan.inputs.model.name).tensor_parallel_divisor,
            sequence_parallel=plan.stage_sequence_parallel(layout.stage),
            recompute=replica.recompute,
        )
    if layout.cp_group is not None:
        apply_context_parallel(model, layout.cp_group, plan.inputs.seq_len, replica.context_tokens)
    if layout.expert is not None:
        expert = layout.expert
        apply_expert_parallel(model, expert.group, expert.degree, expert.index, expert.held)
    apply_recompute(model, replica.recompute)
    apply_offload(model, replica.offload)
    model.to(device)
    if layout.data_parallel is None:
        return model
    return _data_parallel(model, layout.data_parallel, device)


def parallelize(
    plan: Plan,
    place: RankPlace,
    world: UniformMesh | ProcessGroups,
    device: torch.device,
    seed: int,
) -> RankModules:
    """This rank's stage modules: built from ``seed`` (the same weights on every rank) and
    parallelized on ``world`` (module docstring)."""
    stages = [plan.stages[index] for index in place.stages]
    models, tied = build_stage_models(plan, stages, seed)
    layouts = stage_layouts(plan, place, world, tied, device)
    modules = [
        parallelize_stage(plan, model, layout, place, device)
        for model, layout in zip(models, layouts, strict=True)
    ]
    return RankModules(stages, models, modules, tied)
