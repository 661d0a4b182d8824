"""Async_pb *plans* for the async runtime tests: hand-made plans of gpt-tiny (float64) with
stages of several replicas (unequal shares) and tensor parallelism, the data they train on,
and the single-process synchronous reference (momentum SGD stepped once per micro-batch).

The data is a cycle of ``CYCLE`` fixed global batches, so that a few steps train measurably
(the model memorises them): a convergence figure that async and synchronous runs can be
compared on (``eval_loss``).
"""

from __future__ import annotations

import torch

from autoplan.plan.schema import AsyncPB, Plan
from autoplan.runtime.data import Batch, sample_rows, training_batches
from autoplan.runtime.loss import loss_function
from autoplan.runtime.model_stage import build_full_model
from tests.plan_factory import ReplicaSpec, make_stages_plan

CYCLE = 2
LR = 0.1
MOMENTUM = 0.9


def async_plan(
    stage_layers: list[int],
    stage_replicas: list[list[ReplicaSpec]],
    weight_prediction: bool = True,
    spike_compensation: bool = True,
) -> Plan:
    """A hand-made gpt-tiny plan (``make_stages_plan``) with schedule async_pb."""
    plan = make_stages_plan(stage_layers, stage_replicas)
    data = plan.parallelism.model_dump()
    settings = AsyncPB(
        weight_prediction=weight_prediction,
        spike_compensation=spike_compensation,
        momentum=MOMENTUM,
    )
    data.update(schedule="async_pb", async_pb=settings.model_dump())
    return Plan.model_validate({**plan.model_dump(), "parallelism": data})


def batches(plan: Plan, steps: int) -> list[Batch]:
    """The global batches of ``steps`` steps: a cycle of ``CYCLE`` synthetic batches."""
    source = training_batches(plan, 1)
    cycle = [next(source) for _ in range(CYCLE)]
    return [cycle[step % CYCLE] for step in range(steps)]


def eval_loss(plan: Plan, params: dict[str, torch.Tensor]) -> float:
    """Mean loss of the whole model at ``params`` over the cycle's batches."""
    model = build_full_model(plan.inputs.model.name, plan.inputs.dtype, 0)
    model.load_state_dict(params, strict=True)
    loss_fn = loss_function("cross_entropy")
    with torch.no_grad():
        values = [float(loss_fn(model(*x), y)) for x, y in batches(plan, CYCLE)]
    return sum(values) / len(values)


def synchronous_reference(
    plan: Plan, steps: int, lr: float = LR, data: list[Batch] | None = None
) -> tuple[list[float], dict[str, torch.Tensor]]:
    """``torch.optim.SGD`` (momentum, no dampening) on the whole model, one step per
    micro-batch in the plan's order, on ``data`` (default ``batches``); per step the mean of
    its micro-batches' losses, and the final parameters by name."""
    model = build_full_model(plan.inputs.model.name, plan.inputs.dtype, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    loss_fn = loss_function("cross_entropy")
    m, size = plan.parallelism.num_micro_batches, plan.parallelism.micro_batch_size
    losses = []
    for (inputs,), targets in data if data is not None else batches(plan, steps):
        total = 0.0
        for j in range(m):
            rows = sample_rows(plan, j, 0, size)
            loss = loss_fn(model(inputs[rows]), targets[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += float(loss.detach())
        losses.append(total / m)
    return losses, {name: p.detach().clone() for name, p in model.named_parameters()}
