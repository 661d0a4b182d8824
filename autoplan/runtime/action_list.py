"""The groups executor's interpreter: one rank runs its pipeline rank's action list.

The list is ``autoplan.schedule.schedule_order(schedule, pp, m, v)[pipeline rank]``, the one
the simulator plays and that equals torch's GPipe / 1F1B / Interleaved1F1B orders. Each action
is a forward or a backward of one stage on one micro-batch, on this rank's replica of that
stage (its share of the micro-batch's samples):

- ``sF mb``: the stage's input is this replica's rows of the micro-batch (first stage: read from
  the global batch, ``data.sample_rows``; others: received, ``transfers.Mailbox``); its output
  goes to the next stage's replicas, or, on the last stage, into the loss.
- ``sB mb``: backward from the loss, or from the output gradient the next stage sends back; the
  input gradient goes to the previous stage.

Loss weighting: a replica's loss on a micro-batch is the mean over its share, weighted by
share / global batch, so that the sum over replicas and micro-batches is the global batch's
mean loss and the sum of the replicas' gradients its gradient (``grad_sync`` sums them).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.plan.schema import Plan
from autoplan.runtime.data import sample_rows
from autoplan.runtime.loss import LossFunction
from autoplan.runtime.placement import RankPlace, share_ranges
from autoplan.runtime.transfers import Mailbox
from autoplan.schedule import Action

__all__ = ["ActionListRunner", "loss_weight"]


def loss_weight(plan: Plan, share: int) -> float:
    """The weight of a replica's per-micro-batch mean loss: its share of the global batch."""
    return share / plan.inputs.global_batch_size


class ActionListRunner:
    """Runs one step's actions of this rank (``actions``) on its stage modules."""

    def __init__(
        self,
        plan: Plan,
        place: RankPlace,
        modules: dict[int, nn.Module],
        actions: list[Action],
        mailbox: Mailbox,
        loss_fn: LossFunction,
        device: torch.device,
    ) -> None:
        self.plan = plan
        self.place = place
        self.modules = modules
        self.actions = actions
        self.mailbox = mailbox
        self.loss_fn = loss_fn
        self.device = device
        self.last = len(plan.stages) - 1
        self._rows: dict[tuple[int, int], torch.Tensor] = {}

    def _sample_rows(self, stage: int, micro_batch: int) -> torch.Tensor:
        key = (stage, micro_batch)
        if key not in self._rows:
            start, end = share_ranges(self.plan.stages[stage])[self.place.replica]
            self._rows[key] = sample_rows(self.plan, micro_batch, start, end)
        return self._rows[key]

    def run(self, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor) -> list[torch.Tensor]:
        """Run every action; returns the last stage's weighted losses (empty elsewhere)."""
        saved: dict[tuple[int, int], tuple[tuple[torch.Tensor, ...], torch.Tensor]] = {}
        losses: list[torch.Tensor] = []
        for action in self.actions:
            key = (action.stage, action.micro_batch)
            if action.kind == "F":
                args, output = self._forward(action.stage, action.micro_batch, inputs, targets)
                if action.stage == self.last:
                    losses.append(output.detach())
                saved[key] = (args, output)
            else:
                args, output = saved.pop(key)
                self._backward(action.stage, action.micro_batch, args, output)
        self.mailbox.finish()
        return losses

    def _forward(
        self, stage: int, micro_batch: int, inputs: tuple[torch.Tensor, ...], targets: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        if stage == 0:
            rows = self._sample_rows(stage, micro_batch)
            args = tuple(tensor[rows].to(self.device) for tensor in inputs)
        else:
            received = self.mailbox.receive("F", stage, micro_batch)
            args = (received.requires_grad_(),)
        output = self.modules[stage](*args)
        if stage == self.last:
            target = targets[self._sample_rows(stage, micro_batch)].to(self.device)
            return args, self.loss_fn(output, target)
        if isinstance(output, DTensor):
            raise RuntimeError(f"stage {stage} outputs a DTensor; a boundary must be a tensor")
        self.mailbox.send("F", stage, micro_batch, output)
        return args, output

    def _backward(
        self, stage: int, micro_batch: int, args: tuple[torch.Tensor, ...], output: torch.Tensor
    ) -> None:
        if stage == self.last:
            output.backward()
        else:
            gradient = self.mailbox.receive("B", stage, micro_batch)
            if output.requires_grad:
                torch.autograd.backward(output, gradient)
        if stage > 0:
            received = args[0]
            gradient = received.grad if received.grad is not None else torch.zeros_like(received)
            self.mailbox.send("B", stage, micro_batch, gradient)
