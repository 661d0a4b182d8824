"""fp16 training for GPUs without bf16 tensor cores: the loss is scaled so that small
gradients survive fp16, the optimizer divides the scale out in fp32, and a step whose
gradients overflow is skipped on every rank with the scale halved (GradScaler's policy)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn

from autoplan.runtime.loss import loss_function
from autoplan.runtime.mixed_precision import DynamicLossScale, MasterWeightAdamW
from autoplan.runtime.trainer import _scaled_step, train
from tests.plan_factory import make_plan


@dataclass
class _Engine:
    """What ``_scaled_step`` reads of an engine: its models, optimizers and device."""

    models: list[nn.Module]
    optimizers: list[MasterWeightAdamW]
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


def test_scaled_loss_keeps_gradients_fp16_would_flush_to_zero() -> None:
    start = torch.full((8,), 0.5)
    # d(loss)/dw = 1e-9 per weight: below fp16's smallest subnormal (6e-8), so it is 0 in fp16.
    plain = nn.Linear(8, 1, bias=False).half()
    plain.weight.data.copy_(start)
    (plain.weight.float().sum() * 1e-9).half().backward()
    assert torch.count_nonzero(plain.weight.grad) == 0

    scaled = nn.Linear(8, 1, bias=False).half()
    scaled.weight.data.copy_(start)
    loss_scale = DynamicLossScale()
    loss = loss_function("sum", weight=1e-9, scale=loss_scale)
    loss(scaled.weight.float(), torch.zeros(1)).half().backward()
    assert torch.count_nonzero(scaled.weight.grad) == 8
    optimizer = MasterWeightAdamW([scaled.weight], learning_rate=1e-3)
    engine = _Engine([scaled], [optimizer])
    assert _scaled_step(engine, loss_scale, 1e-9 * loss_scale.value, 0) == 1e-9  # loss unscaled
    # The master's gradient is the true one, 1e-9 (within fp16's rounding of the scaled one).
    (master,) = optimizer.masters
    assert torch.allclose(master.grad, torch.full_like(master.grad, 1e-9), rtol=1e-3)


def test_an_overflowing_step_is_skipped_and_the_scale_moves() -> None:
    model = nn.Linear(4, 1, bias=False).half()
    before = model.weight.detach().clone()
    optimizer = MasterWeightAdamW(list(model.parameters()), learning_rate=1e-1)
    loss_scale = DynamicLossScale(initial=1024.0, growth_interval=2)
    engine = _Engine([model], [optimizer])
    model.weight.grad = torch.tensor([[1.0, float("inf"), 0.0, 1.0]], dtype=torch.float16)
    _scaled_step(engine, loss_scale, 0.0, 0)
    assert torch.equal(model.weight.detach(), before)  # skipped: no update
    assert (loss_scale.value, loss_scale.skipped_steps) == (512.0, 1)
    for step in (1, 2):
        model.weight.grad = torch.ones(1, 4, dtype=torch.float16)
        _scaled_step(engine, loss_scale, 0.0, step)
    assert not torch.equal(model.weight.detach(), before)
    assert loss_scale.value == 1024.0  # two clean steps: doubled back


def test_an_fp16_plan_trains_as_fp32_does_and_closer_than_bf16() -> None:
    environ = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29533"}
    losses = {}
    try:
        for dtype in ("fp32", "fp16", "bf16"):
            plan = make_plan([6], num_micro_batches=2, dtype=dtype)
            losses[dtype] = [step.loss for step in train(plan, 3, environ=environ).steps]
            dist.destroy_process_group()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    fp16 = max(abs(a - b) for a, b in zip(losses["fp16"], losses["fp32"], strict=True))
    bf16 = max(abs(a - b) for a, b in zip(losses["bf16"], losses["fp32"], strict=True))
    # The reported loss is the true one (the scale divided out), fp16 within its precision.
    assert fp16 < 5e-3 < bf16, losses
