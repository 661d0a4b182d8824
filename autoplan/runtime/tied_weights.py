"""Weights tied across pipeline stages (embedding and output head) of a uniform plan: one copy
per stage, with their gradients summed after each backward, as Megatron-LM does. (The groups
executor sums ties with the rest of its gradients: ``grad_sync``.)

Every copy starts from the same bits (every rank builds the model from one seed), gets the same
summed gradient and so takes the same optimizer step: the copies stay equal, and the summed
gradient is exactly the gradient of the shared weight in single-process training.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.plan.schema import Plan, RankEntry
from autoplan.runtime.model_stage import TiedWeight

__all__ = ["TiedGradientSync"]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    # Under FSDP2 a gradient is a DTensor sharded over dp; every copy is sharded alike (same
    # shape, same dp mesh), so the local shards of the copies line up.
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


class TiedGradientSync:
    """Sums, on each call, the gradients of this rank's copies of each tied weight with those of
    the other pipeline ranks holding a copy (at the same dp and tp index)."""

    def __init__(
        self,
        plan: Plan,
        tied: list[TiedWeight],
        models_by_stage: dict[int, nn.Module],
        entry: RankEntry,
    ) -> None:
        uniform = plan.mesh_shape()
        if uniform is None:
            raise ValueError("TiedGradientSync is the mesh executor's; see grad_sync for others")
        dp, cp, tp = uniform
        group_size = dp * cp * tp
        my_offset = (entry.dp_index * cp + entry.cp_index) * tp + entry.tp_index
        # (module, parameter name) pairs, looked up at each call: tensor parallelism and FSDP2
        # replace a module's parameters after this object is made.
        self._weights: list[tuple[list[tuple[nn.Module, str]], dist.ProcessGroup | None]] = []
        for weight in tied:
            pipeline_ranks = sorted({plan.stages[s].pipeline_rank for s in weight.stages})
            group = None
            if len(pipeline_ranks) > 1:
                # new_group is collective: every rank creates every group, in the same order.
                for offset in range(group_size):
                    ranks = [p * group_size + offset for p in pipeline_ranks]
                    created = dist.new_group(ranks)
                    if entry.pipeline_rank in pipeline_ranks and offset == my_offset:
                        group = created
            copies = [
                (models_by_stage[stage], name)
                for stage, name in zip(weight.stages, weight.names, strict=True)
                if stage in models_by_stage
            ]
            self._weights.append((copies, group))

    def synchronize(self) -> None:
        """Replace each copy's gradient by the sum over all copies."""
        for copies, group in self._weights:
            if not copies:
                continue
            params = [module.get_parameter(name) for module, name in copies]
            grads = []
            for param in params:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                grads.append(_local(param.grad))
            total = grads[0] if len(grads) == 1 else torch.stack(grads).sum(dim=0)
            if group is not None:
                dist.all_reduce(total, group=group)
            for grad in grads:
                if grad is not total:
                    grad.copy_(total)
