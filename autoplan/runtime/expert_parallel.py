"""Expert parallelism at run time: each rank of an expert group holds E/ep of every MoE
layer's routed experts, and tokens reach them by ``all_to_all_single``.

A stage with ``expert_parallel_degree`` ep > 1 cuts its replicas into expert groups of ep
consecutive replicas (one GPU type, tp and share each: the validator's rule); replica r is at
expert index ``r % ep`` of its group and keeps experts ``[i·E/ep, (i+1)·E/ep)``. The zoo's
:class:`~autoplan.zoo.moe.MoE` routes its micro-batch into an ``(E, capacity, hidden)`` slot
buffer whatever the placement; here its ``exchange`` sends block j of E/ep experts to expert
index j and gathers the blocks the others routed to this rank's experts, which then run on
``ep · capacity`` slots each, and ``exchange_back`` returns each rank its slots. Both are
``torch.distributed.nn.functional.all_to_all_single`` (autograd-aware: the backward is the
reverse all-to-all), on the group of the expert group's ranks at this rank's tp index. All
ranks of an expert group run the same action list, so their all-to-alls meet in order.

Gradients: an expert's gradient on its rank already sums every token of the expert group that
reached it (each replica's loss is weighted by its share of the batch: ``action_list``), so it is
summed only over the replicas holding the same experts in the stage's other expert groups
(``expert_reductions``); the gradient sync of every other parameter leaves experts out.
Routing is computed from each replica's own tokens: with a capacity that drops picks, which
picks drop depends on how the batch is split, as in any expert-parallel trainer.

Experts placed by speed (``Replica.routed_experts``): the replica at place p of its expert
group keeps the x_p experts after those of places 0..p-1, and its slot buffer has its own
capacity C_p (its own share of tokens). ``_UnevenExchange`` first gathers the group's
capacities (one integer each), then sends block j (x_j experts × C_p slots) to place j with
``all_to_all_single``'s split sizes and receives x_p × C_j slots from each place j; its experts
run on all Σ C_j slots; the combine sends each place its slots back with the split sizes
reversed (the autograd backward of each exchange reverses them again).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from torch import nn

from autoplan.plan.schema import Plan, Stage
from autoplan.runtime.grad_sync import ParameterFamily
from autoplan.runtime.process_groups import ProcessGroups
from autoplan.zoo.moe import GroupedExperts, MoE

__all__ = [
    "ExpertReduction",
    "apply_expert_parallel",
    "expert_families",
    "expert_group_ranks",
    "expert_rank_sets",
    "expert_reductions",
    "is_expert_parameter",
    "reduce_expert_gradients",
]


def expert_group_ranks(stage: Stage, replica: int, tp_index: int) -> tuple[int, ...]:
    """The ranks that exchange tokens with tp rank ``tp_index`` of ``replica``: that tp rank
    of each replica of its expert group."""
    ep = stage.expert_parallel_degree
    first = replica - replica % ep
    return tuple(stage.replicas[r].ranks[tp_index] for r in range(first, first + ep))


def _dispatch(group: dist.ProcessGroup, ep: int, slots: torch.Tensor) -> torch.Tensor:
    """(E, C, h) slots by expert → (E/ep, ep·C, h): this rank's experts, every rank's slots."""
    experts, capacity, hidden = slots.shape
    received = dist_fn.all_to_all_single(torch.empty_like(slots), slots.contiguous(), group=group)
    # received[j·E/ep + e] is rank j's slots for local expert e.
    local = received.view(ep, experts // ep, capacity, hidden).transpose(0, 1)
    return local.reshape(experts // ep, ep * capacity, hidden)


def _combine(group: dist.ProcessGroup, ep: int, done: torch.Tensor) -> torch.Tensor:
    """(E/ep, ep·C, h) results → (E, C, h): each rank's own slots back, by expert."""
    local, slots, hidden = done.shape
    by_rank = done.view(local, ep, slots // ep, hidden).transpose(0, 1).contiguous()
    returned = dist_fn.all_to_all_single(
        torch.empty_like(by_rank), by_rank.view(ep * local, slots // ep, hidden), group=group
    )
    return returned.view(ep * local, slots // ep, hidden)


class _UnevenExchange:
    """One MoE layer's exchanges at place ``place`` of an expert group whose places hold
    ``held`` experts each (module docstring: experts placed by speed). The capacities gathered
    by ``dispatch`` are those ``combine`` sends back by: the two run in turn in one forward."""

    def __init__(self, group: dist.ProcessGroup, held: tuple[int, ...], place: int) -> None:
        self.group = group
        self.held = held
        self.place = place
        self.capacities: list[int] = []

    def dispatch(self, slots: torch.Tensor) -> torch.Tensor:
        """(E, C_p, h) slots by expert → (x_p, Σ C_j, h): this rank's experts, every rank's
        slots."""
        experts, capacity, hidden = slots.shape
        mine = torch.tensor([capacity], dtype=torch.int64)
        gathered = [torch.zeros_like(mine) for _ in self.held]
        dist.all_gather(gathered, mine, group=self.group)
        self.capacities = [int(c.item()) for c in gathered]
        own = self.held[self.place]
        received = dist_fn.all_to_all_single(
            slots.new_empty(own * sum(self.capacities), hidden),
            slots.reshape(experts * capacity, hidden),
            output_split_sizes=[own * c for c in self.capacities],
            input_split_sizes=[x * capacity for x in self.held],
            group=self.group,
        )
        # From place j: x_p experts × C_j slots; each expert's slots side by side by place.
        blocks = received.split([own * c for c in self.capacities])
        by_place = [b.view(own, c, hidden) for b, c in zip(blocks, self.capacities, strict=True)]
        return torch.cat(by_place, dim=1)

    def combine(self, done: torch.Tensor) -> torch.Tensor:
        """(x_p, Σ C_j, h) results → (E, C_p, h): each place's slots back, by expert."""
        own, _, hidden = done.shape
        capacity = self.capacities[self.place]
        outgoing = torch.cat(
            [part.reshape(-1, hidden) for part in done.split(self.capacities, dim=1)]
        )
        returned = dist_fn.all_to_all_single(
            done.new_empty(sum(self.held) * capacity, hidden),
            outgoing,
            output_split_sizes=[x * capacity for x in self.held],
            input_split_sizes=[own * c for c in self.capacities],
            group=self.group,
        )
        return returned.view(sum(self.held), capacity, hidden)


def apply_expert_parallel(
    model: nn.Module,
    group: dist.ProcessGroup,
    ep: int,
    expert_index: int,
    held: tuple[int, ...] | None = None,
) -> None:
    """Keep expert block ``expert_index`` of every MoE layer of ``model`` (in place) and route
    its tokens over ``group`` (module docstring); with ``held`` (the experts of each place of
    the expert group, placed by speed), the experts of place ``expert_index``."""
    for module in model.modules():
        if not isinstance(module, MoE):
            continue
        if held is not None:
            if sum(held) != module.num_experts:
                raise ValueError(f"experts held {held} do not make the {module.num_experts}")
            first = sum(held[:expert_index])
            module.experts.keep_experts(first, first + held[expert_index])
            exchange = _UnevenExchange(group, held, expert_index)
            module.exchange = exchange.dispatch
            module.exchange_back = exchange.combine
            continue
        if module.num_experts % ep:
            raise ValueError(f"ep {ep} does not divide the {module.num_experts} experts")
        block = module.num_experts // ep
        module.experts.keep_experts(expert_index * block, (expert_index + 1) * block)
        module.exchange = partial(_dispatch, group, ep)
        module.exchange_back = partial(_combine, group, ep)


def is_expert_parameter(model: nn.Module, name: str) -> bool:
    """Whether parameter ``name`` of ``model`` is a routed expert's weight."""
    owner = name.rsplit(".", 1)[0] if "." in name else ""
    return isinstance(model.get_submodule(owner), GroupedExperts)


@dataclass(frozen=True)
class ExpertReduction:
    """The experts of one stage at one (expert index, tp index): the ranks holding them."""

    stage: int
    ranks: tuple[int, ...]


def expert_reductions(plan: Plan) -> list[ExpertReduction]:
    """Every expert gradient sum of the plan, in one order for every rank (module docstring);
    only those of more than one rank (several expert groups)."""
    found = []
    for stage in plan.stages:
        ep = stage.expert_parallel_degree
        if ep == 1 or len(stage.replicas) == ep:
            continue
        tp = stage.replicas[0].tensor_parallel_degree
        for index in range(ep):
            for t in range(tp):
                ranks = tuple(
                    replica.ranks[t] for r, replica in enumerate(stage.replicas) if r % ep == index
                )
                found.append(ExpertReduction(stage.index, ranks))
    return found


def expert_families(plan: Plan, families: list[ParameterFamily], model: nn.Module) -> set[int]:
    """Indices of ``families`` (of the whole ``model``) that are routed experts of a stage
    with ep > 1: their sums are ``expert_reductions``', not the gradient sync's."""
    split = {stage.index for stage in plan.stages if stage.expert_parallel_degree > 1}
    return {
        index
        for index, family in enumerate(families)
        if any(stage in split and is_expert_parameter(model, name) for stage, name in family.copies)
    }


def expert_rank_sets(plan: Plan) -> list[tuple[int, ...]]:
    """Every rank set expert parallelism needs a group of: the expert groups' exchanges and
    the expert gradient sums (the same list on every rank)."""
    sets = [reduction.ranks for reduction in expert_reductions(plan)]
    for stage in plan.stages:
        if stage.expert_parallel_degree > 1:
            tp = stage.replicas[0].tensor_parallel_degree
            sets += [
                expert_group_ranks(stage, r, t)
                for r in range(len(stage.replicas))
                for t in range(tp)
            ]
    return sets


def reduce_expert_gradients(
    modules: dict[int, nn.Module],
    reductions: list[ExpertReduction],
    groups: ProcessGroups,
    rank: int,
) -> None:
    """Sum each expert gradient this rank holds over the ranks holding the same experts."""
    for reduction in reductions:
        if rank not in reduction.ranks:
            continue
        model = modules[reduction.stage]
        for name, param in model.named_parameters():
            if param.grad is not None and is_expert_parameter(model, name):
                dist.all_reduce(param.grad, group=groups.get(reduction.ranks))
