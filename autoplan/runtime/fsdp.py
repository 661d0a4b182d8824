"""ZeRO-2 and ZeRO-3: FSDP2 ``fully_shard`` of one stage over its replicas, in both executors.

Sharding is per layer and then per stage, with ``reshard_after_forward`` off at level 2 (a
micro-batch's parameters stay gathered from its forward to its backward) and on at level 3
(gathered again for the backward). Gradients are reduce-scattered in every micro-batch's
backward and accumulated into the shards: what ``autoplan.cost.sharding`` costs.

**Mesh executor.** torch's ``PipelineStage`` treats an ``FSDPModule`` specially: it switches
gradient sync and resharding after backward off for every micro-batch and reduce-scatters once
after the last, so every gradient and parameter stays unsharded for the whole step and nothing
is sharded at the peak (torch 2.13, ``_PipelineStageBase.backward_maybe_with_nosync``). The
stage is therefore handed to the pipeline inside ``PerMicroBatchSync``, a plain module that
PipelineStage does not recognise: FSDP2's own hooks then run as in ordinary training, one
reduce-scatter per micro-batch, parameters resharded after each backward.

**Groups executor.** The plan space gives a ZeRO-2/3 stage replicas of one tp degree
(``validate``), so tp rank t of every replica forms the stage's data-parallel group
(``zero1_ranks``; the same group ZeRO-1 uses). Its DeviceMesh is built from the process groups
the executor already has (``DeviceMesh.from_group``, no collective): 1-D ``("dp",)`` without
tp, and with tp a 2-D ``("dp", "tp")`` mesh of the stage's ranks (one row per replica), whose
"tp" sub-mesh carries DTensor tensor parallelism and whose "dp" sub-mesh FSDP2. FSDP2 needs both
to come from one parent mesh (it concatenates them into its 2-D sharding spec; two separate 1-D
meshes are refused), which is why the tp mesh of such a stage is this mesh's child rather than
``process_groups.tp_mesh``. The executor calls each stage's forward and backward itself (no
``PipelineStage``), so FSDP2's hooks run as in ordinary training.

Each replica's loss is weighted by its share of the global batch (``action_list.loss_weight``),
so the gradient is the *sum* over replicas, not FSDP2's default mean: the reduce-scatter is
set to a plain sum (divide factor 1, sum-only collectives, which gloo supports).

A weight tied across stages (embedding and head on two pipeline ranks) is left out of FSDP2
(``ignored_params``): its stages may have different replica counts, so the shards would not
line up; it stays whole and ``grad_sync`` sums it over every holder, as without ZeRO.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from autoplan.plan.schema import Plan, Stage
from autoplan.runtime.grad_sync import ParameterFamily
from autoplan.runtime.model_stage import pipeline_layers
from autoplan.runtime.process_groups import ProcessGroups

__all__ = [
    "PerMicroBatchSync",
    "fsdp_families",
    "is_sharded",
    "shard_stage",
    "stage_rank_grid",
    "zero_mesh",
]


def is_sharded(stage: Stage) -> bool:
    """Whether FSDP2 shards ``stage``: ZeRO-2/3 over more than one replica."""
    return stage.zero_stage >= 2 and stage.data_parallel_degree > 1


def fsdp_families(plan: Plan, families: list[ParameterFamily]) -> set[int]:
    """Indices of ``families`` whose gradients FSDP2 reduces: held by one sharded stage only
    (a weight tied across stages is left to ``grad_sync``, module docstring)."""
    return {
        index
        for index, family in enumerate(families)
        if len(family.copies) == 1 and is_sharded(plan.stages[family.copies[0][0]])
    }


def stage_rank_grid(stage: Stage) -> list[list[int]]:
    """The stage's ranks as rows of replicas, columns of tp index (one tp: ``validate``)."""
    return [list(replica.ranks) for replica in stage.replicas]


def zero_mesh(
    groups: ProcessGroups, stage: Stage, tp_index: int, replica: int, device: torch.device
) -> DeviceMesh:
    """This rank's DeviceMesh of ``stage``: ("dp",) over tp rank ``tp_index`` of each replica,
    or ("dp", "tp") when the replicas have tp > 1 (module docstring)."""
    grid = stage_rank_grid(stage)
    dp_group = groups.get([row[tp_index] for row in grid])
    if dp_group is None:
        raise ValueError(f"stage {stage.index} has one replica: nothing to shard")
    if len(grid[0]) == 1:
        return DeviceMesh.from_group(dp_group, device.type, mesh_dim_names=("dp",))
    tp_group = groups.get(grid[replica])
    assert tp_group is not None  # len(grid[0]) > 1 ranks
    return DeviceMesh.from_group(
        [dp_group, tp_group],
        device.type,
        mesh=torch.tensor(grid, dtype=torch.int),
        mesh_dim_names=("dp", "tp"),
    )


def _sum_gradients(module: FSDPModule) -> None:
    # The replicas' losses carry their share weights: the sum is the global-batch mean.
    module.set_gradient_divide_factor(1.0)
    module.set_force_sum_reduction_for_comms(True)


def shard_stage(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    reshard_after_forward: bool,
    ignored: set[nn.Parameter],
    sum_gradients: bool,
) -> nn.Module:
    """``model`` sharded by FSDP2 over ``dp_mesh`` per layer and as a whole (ZeRO-3 with
    ``reshard_after_forward``, else ZeRO-2), the parameters of ``ignored`` left whole; the
    gradients summed over the replicas with ``sum_gradients``, else averaged."""
    layers = [layer for _, layer in pipeline_layers(model) if layer is not model]
    uses = Counter(id(p) for layer in layers for p in layer.parameters())
    sharded: list[FSDPModule] = []
    for layer in layers:
        params = list(layer.parameters())
        # A weight two layers of the stage share (tied embeddings on one stage) is left to
        # the stage-level group; one tied to another stage is left out altogether.
        if params and all(uses[id(p)] == 1 and p not in ignored for p in params):
            sharded.append(
                fully_shard(layer, mesh=dp_mesh, reshard_after_forward=reshard_after_forward)
            )
    sharded.append(
        fully_shard(
            model,
            mesh=dp_mesh,
            reshard_after_forward=reshard_after_forward,
            ignored_params=ignored or None,
        )
    )
    if sum_gradients:
        for module in sharded:
            _sum_gradients(module)
    return model


class PerMicroBatchSync(nn.Module):
    """``inner`` (an FSDP2 module) as a plain module, so that the pipeline stage leaves
    FSDP2's per-backward gradient reduce-scatter on (module docstring)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)
