"""What the trainer asks of an executor: one step's forward, backward and gradient sync.

Two executors implement it: ``mesh_engine`` (uniform plans, PyTorch's pipelining on one
(pp, dp, tp) DeviceMesh) and ``groups_engine`` (any plan: per-stage process groups, the
runtime's own stage transfers). The trainer times them, calls the optimizers and reports.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from autoplan.runtime.mixed_precision import MasterWeightAdamW

__all__ = ["Engine", "Optimizer"]

Optimizer = torch.optim.Optimizer | MasterWeightAdamW


class Engine(Protocol):
    """One rank's part of a plan, set up and ready to train."""

    name: str
    """'mesh', 'groups' or 'async' (shown in the run report)."""
    device: torch.device
    models: list[nn.Module]
    """This rank's stage modules, unwrapped (parameter names as in the whole model)."""
    optimizers: list[Optimizer]

    def run(self, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> float:
        """Forward and backward of the global batch's micro-batches on this rank's stages,
        then the gradient sync; returns this rank's part of the global batch's mean loss (the
        parts of all ranks add up to it)."""
        ...
