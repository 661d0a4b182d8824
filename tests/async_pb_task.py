"""A small deterministic task for the async Pipelined Backpropagation tests: a student MLP
(tanh, float64) regressing a fixed random teacher MLP on generated inputs, cut into stages.

Shared by the single-process tests (``run_local``), the torchrun driver
(``tests/async_pb_driver.py``) and the single-process synchronous reference
(``torch.optim.SGD`` stepped per micro-batch on the whole model).
"""

from __future__ import annotations

import torch

from autoplan.runtime.async_stage import AsyncStageWorker
from autoplan.runtime.pipelined_sgd import PipelinedMomentumSGD

WIDTH = 16
LAYERS = 8
MICRO_BATCH = 4
LR = 0.02
# The convergence study's learning rate: high enough that staleness costs (at pp 4 the
# uncompensated run ends ~25% above synchronous SGD), low enough that all variants converge.
LR_STUDY = 0.1
MOMENTUM = 0.9


def _mlp(seed: int) -> torch.nn.Sequential:
    gen = torch.Generator().manual_seed(seed)
    layers: list[torch.nn.Module] = []
    for _ in range(LAYERS):
        lin = torch.nn.Linear(WIDTH, WIDTH, dtype=torch.float64)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(WIDTH, WIDTH, generator=gen, dtype=torch.float64))
            lin.weight.mul_(1.2 / WIDTH**0.5)
            lin.bias.copy_(0.1 * torch.randn(WIDTH, generator=gen, dtype=torch.float64))
        layers += [lin, torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def full_model() -> torch.nn.Sequential:
    """The student, whole (its seed is fixed)."""
    return _mlp(1)


def micro_batch(i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and teacher targets of micro-batch i (deterministic per i)."""
    gen = torch.Generator().manual_seed(1000 + i)
    x = torch.randn(MICRO_BATCH, WIDTH, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = _TEACHER(x)
    return x, y


_TEACHER = _mlp(7)


def split(model: torch.nn.Sequential, num_stages: int) -> list[torch.nn.Sequential]:
    """Cut the model into ``num_stages`` stages of whole Linear+Tanh pairs, as even as can be."""
    pairs = [model[2 * k : 2 * k + 2] for k in range(LAYERS)]
    base, extra = divmod(LAYERS, num_stages)
    out, start = [], 0
    for s in range(num_stages):
        n = base + (1 if s < extra else 0)
        out.append(torch.nn.Sequential(*[m for pair in pairs[start : start + n] for m in pair]))
        start += n
    return out


def workers(
    num_stages: int,
    zero_delay: bool,
    weight_prediction: bool,
    spike_compensation: bool,
    stages: list[int] | None = None,
    lr: float = LR,
) -> list[AsyncStageWorker]:
    """Workers of the given stages (all by default), each with its own optimizer."""
    modules = split(full_model(), num_stages)
    out = []
    for s in stages if stages is not None else range(num_stages):
        opt = PipelinedMomentumSGD(
            list(modules[s].parameters()), lr, MOMENTUM, spike_compensation, weight_prediction
        )
        out.append(
            AsyncStageWorker(
                module=modules[s],
                stage=s,
                num_stages=num_stages,
                optimizer=opt,
                zero_delay=zero_delay,
                loss_fn=(lambda out, i: torch.nn.functional.mse_loss(out, micro_batch(i)[1])),
                inputs_of=lambda i: micro_batch(i)[0],
            )
        )
    return out


def reference_losses(num_micro_batches: int, lr: float = LR) -> tuple[list[float], list]:
    """Synchronous SGD with momentum (``torch.optim.SGD``), one step per micro-batch: the loss
    of each micro-batch before its step, and the final parameters."""
    model = full_model()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    losses = []
    for i in range(num_micro_batches):
        x, y = micro_batch(i)
        loss = torch.nn.functional.mse_loss(model(x), y)
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, [p.detach().clone() for p in model.parameters()]


def eval_loss(stages: list[torch.nn.Module]) -> float:
    """Mean-squared error of the stages chained, on 512 held-out generated samples."""
    gen = torch.Generator().manual_seed(99)
    x = torch.randn(512, WIDTH, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        y = _TEACHER(x)
        for stage in stages:
            x = stage(x)
        return float(torch.nn.functional.mse_loss(x, y))


def load_params(model: torch.nn.Module, params: list[torch.Tensor]) -> torch.nn.Module:
    """Copy ``params`` (in ``model.parameters()`` order) into ``model``."""
    with torch.no_grad():
        for p, value in zip(model.parameters(), params, strict=True):
            p.copy_(value)
    return model


def tail_mean(losses: list[float], last: int) -> float:
    """Mean of the last ``last`` micro-batch losses (the convergence figure compared)."""
    return sum(losses[-last:]) / last
