"""The groups executor: any version-2 plan, each stage with its own replicas.

Per rank it

1. creates every process group any rank needs (``process_groups.ProcessGroups``: each
   replica's tp group, the gradient sync's groups, ZeRO-1's), the same on every rank;
2. gets its stage(s)' modules from the parallelize step (``parallelize``: the seeded model's
   layers with tensor parallelism on its replica's tp DeviceMesh, expert parallelism, the
   replica's recompute and offload, and FSDP2 for ZeRO-2/3 stages);
3. runs its pipeline rank's action list (``action_list``) with the runtime's own stage transfers
   (``transfers``), then sums gradients over each parameter's replicas (``grad_sync``);
5. steps one optimizer per stage: AdamW, or ``MasterWeightAdamW`` for 16-bit weights and for
   ZeRO-1, sharded over the stage's replicas at this rank's tp index.

ZeRO-2/3 stages are FSDP2 ``fully_shard`` over the stage's replicas (``fsdp``): their
gradients are reduce-scattered in each backward, not in step 3, and AdamW steps the shards.

Uniform plans run here too when asked (``train(..., executor="groups")``); their numerics equal
the mesh executor's.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from autoplan.plan.schema import Plan, Stage
from autoplan.runtime.action_list import ActionListRunner, loss_weight
from autoplan.runtime.executor_protocol import Optimizer, RankSetup
from autoplan.runtime.expert_parallel import (
    expert_families,
    expert_rank_sets,
    expert_reductions,
    reduce_expert_gradients,
)
from autoplan.runtime.fsdp import fsdp_families, is_sharded
from autoplan.runtime.grad_sync import GradientSync, parameter_families
from autoplan.runtime.loss import loss_context, loss_function
from autoplan.runtime.mixed_precision import MasterWeightAdamW
from autoplan.runtime.model_stage import meta_model
from autoplan.runtime.parallelize import parallelize
from autoplan.runtime.placement import rank_place
from autoplan.runtime.process_groups import ProcessGroups
from autoplan.runtime.transfers import Mailbox, boundary_shapes
from autoplan.schedule import schedule_order
from autoplan.zoo import get_model_spec

__all__ = ["GroupsExecutor", "group_rank_sets", "zero1_ranks"]

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def zero1_ranks(stage: Stage, tp_index: int, replica: int = 0) -> list[int]:
    """The ranks that share optimizer states with tp rank ``tp_index`` of replica ``replica``
    of ``stage`` under ZeRO-1 (its replicas have one tp degree: ``check_runnable``): that tp
    rank of every replica, or with expert parallelism of every replica of the same expert
    index (they hold the same experts)."""
    ep = stage.expert_parallel_degree
    return [r.ranks[tp_index] for i, r in enumerate(stage.replicas) if i % ep == replica % ep]


def group_rank_sets(plan: Plan, sync: GradientSync) -> list[tuple[int, ...]]:
    """Every rank set any rank will use a group of (the same list on every rank)."""
    sets: list[tuple[int, ...]] = []
    for stage in plan.stages:
        sets += [tuple(r.ranks) for r in stage.replicas if r.tensor_parallel_degree > 1]
        if stage.zero1 and stage.data_parallel_degree > 1:
            tp = stage.replicas[0].tensor_parallel_degree
            indices = range(stage.expert_parallel_degree)
            sets += [tuple(zero1_ranks(stage, t, i)) for t in range(tp) for i in indices]
    return sets + sync.rank_sets() + expert_rank_sets(plan)


class GroupsExecutor:
    """One rank of any plan, on per-stage process groups (see the module docstring)."""

    name = "groups"

    def __init__(self, setup: RankSetup) -> None:
        plan, entry, device = setup.plan, setup.entry, setup.device
        seed, learning_rate, loss_scale = setup.seed, setup.learning_rate, setup.loss_scale
        self.plan = plan
        self.device = device
        place = rank_place(plan, entry.rank)
        self.place = place
        self.place_rank = entry.rank
        whole = meta_model(plan)
        families = parameter_families(plan, whole)
        # FSDP2 sums the gradients of a ZeRO-2/3 stage's own parameters (fsdp), and
        # expert parallelism those of its split experts (expert_parallel).
        by_fsdp = fsdp_families(plan, families) | expert_families(plan, families, whole)
        synced = [family for index, family in enumerate(families) if index not in by_fsdp]
        self.expert_reductions = expert_reductions(plan)
        self.sync = GradientSync(plan, synced, entry.rank)
        self.groups = ProcessGroups(group_rank_sets(plan, self.sync))

        ranks = parallelize(plan, place, self.groups, device, seed)
        my_stages, models = ranks.stages, ranks.models
        spec = get_model_spec(plan.inputs.model.name)
        self.modules: dict[int, nn.Module] = {
            stage.index: module for stage, module in zip(my_stages, ranks.modules, strict=True)
        }
        replica_of = {stage.index: stage.replicas[place.replica] for stage in my_stages}
        self.sync.check_layout(self.modules, replica_of)
        self.models: list[nn.Module] = models
        self.data_parallel_modules: list[nn.Module] = []  # no DDP: its own gradient sync
        replica = my_stages[0].replicas[place.replica]
        # Logits come split by vocabulary on a tp replica of the last stage (tensor_parallel).
        self.split_vocabulary = replica.tensor_parallel_degree > 1
        self.optimizers: list[Optimizer] = [
            self._optimizer(stage, model, learning_rate)
            for stage, model in zip(my_stages, models, strict=True)
        ]

        par = plan.parallelism
        order = schedule_order(
            par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
        )
        self.mailbox = Mailbox(plan, order, entry.rank, self.groups, device)
        last = plan.stages[-1]
        self.is_last = last.index in place.stages
        share = last.shares[place.replica] if self.is_last else 1
        self.executor = ActionListRunner(
            plan,
            place,
            self.modules,
            order[place.pipeline_rank],
            self.mailbox,
            loss_function(spec.loss, loss_weight(plan, share), loss_scale),
            device,
        )
        self.reports_loss = self.is_last and place.tp_index == 0
        # Every group exists everywhere before the first point-to-point operation (NCCL asks
        # that a group's first operation involve all its ranks).
        dist.barrier()
        self._shapes_for: tuple[tuple[int, ...], ...] | None = None

    def _optimizer(self, stage: Stage, model: nn.Module, learning_rate: float) -> Optimizer:
        params = list(model.parameters())
        if is_sharded(stage):
            # FSDP2's parameters are this rank's shards: the states are sharded with them.
            if any(param.dtype in _SIXTEEN_BIT for param in params):
                return MasterWeightAdamW(params, learning_rate)
            return torch.optim.AdamW(params, lr=learning_rate)
        if stage.zero1 and stage.data_parallel_degree > 1:
            group = self.groups.get(zero1_ranks(stage, self.place.tp_index, self.place.replica))
            return MasterWeightAdamW(params, learning_rate, group)
        if any(param.dtype in _SIXTEEN_BIT for param in params):
            return MasterWeightAdamW(params, learning_rate)
        return torch.optim.AdamW(params, lr=learning_rate)

    def run(self, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> float:
        """The action list, then the gradient sums; this rank's part of the mean loss."""
        # Boundary shapes follow the input's (a meta run, no communication), found again
        # only when a batch's per-sample shape changes.
        key = tuple(tuple(tensor.shape[1:]) for tensor in inputs)
        if key != self._shapes_for:
            self.mailbox.set_shapes(boundary_shapes(self.plan, inputs))
            self._shapes_for = key
        with loss_context(self.split_vocabulary):
            losses = self.executor.run(inputs, targets)
        self.sync.synchronize(self.modules, self.groups)
        reduce_expert_gradients(self.modules, self.expert_reductions, self.groups, self.place_rank)
        if not self.reports_loss:
            return 0.0
        return sum(float(value.double().sum()) for value in losses)
