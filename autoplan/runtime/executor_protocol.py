"""What the trainer asks of an executor: one step's forward, backward and gradient sync.

Three executors implement it: ``mesh_executor`` (uniform plans, PyTorch's pipelining on one
(pp, dp, tp) DeviceMesh), ``groups_executor`` (any plan: per-stage process groups, the
runtime's own stage transfers, its action lists run by ``action_list``) and
``async_executor`` (async_pb plans: a stream of steps without a flush). The trainer times them,
calls the optimizers and reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn

from autoplan.plan.schema import Plan, RankEntry
from autoplan.runtime.mixed_precision import DynamicLossScale, MasterWeightAdamW

__all__ = ["Executor", "Optimizer", "RankSetup"]

Optimizer = torch.optim.Optimizer | MasterWeightAdamW


@dataclass(frozen=True)
class RankSetup:
    """What every executor is built from: the plan, this rank's entry in its rank map, the
    device, the seed every rank builds the same initial model from, the learning rate and,
    for fp16 plans, the loss scale."""

    plan: Plan
    entry: RankEntry
    device: torch.device
    seed: int
    learning_rate: float
    loss_scale: DynamicLossScale | None = None


class Executor(Protocol):
    """One rank's part of a plan, set up and ready to train."""

    name: str
    """'mesh', 'groups' or 'async' (shown in the run report)."""
    device: torch.device
    models: list[nn.Module]
    """This rank's stage modules, unwrapped (parameter names as in the whole model)."""
    optimizers: list[Optimizer]
    data_parallel_modules: list[nn.Module]
    """This rank's stage modules as wrapped for data parallelism where the wrapper holds
    memory of its own (DDP's gradient buckets: ``memory.gradient_bucket_bytes``); else empty."""

    def run(self, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> float:
        """Forward and backward of the global batch's micro-batches on this rank's stages,
        then the gradient sync; returns this rank's part of the global batch's mean loss (the
        parts of all ranks add up to it)."""
        ...
