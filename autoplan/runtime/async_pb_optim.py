"""Per-micro-batch momentum SGD for asynchronous Pipelined Backpropagation (Kosson et al.,
"Pipelined Backpropagation at Scale: Training Large Models without Batches", MLSys 2021).

Symbols as in the paper: weights w, velocity v, gradient g, learning rate η, momentum α, and the
delay D of a stage: how many updates of that stage's weights happen between the forward of a
micro-batch and the arrival of its gradient (in a 1F1B steady state without flush, stage s of
p has D = p − 1 − s; the last stage has none).

Plain momentum SGD (what ``torch.optim.SGD(momentum=α, dampening=0)`` does)::

    v ← α·v + g            w ← w − η·v

Spike Compensation (SC). Under momentum a gradient's total effect on w is η·g·Σ_k α^k, spread
over the following steps; a gradient D steps late has missed the first D terms, and the delayed
velocity then over-shoots (a "spike"). SC applies the missed share at once and scales the
velocity's term so the gradient's total contribution is unchanged::

    v ← α·v + g            w ← w − η·(a·v + b·g),   a = α^D,  b = (1 − α^D) / (1 − α)

Linear Weight Prediction (LWP). The forward of a micro-batch whose gradient will come D updates
later uses the weights extrapolated along the velocity, the direction the next D steps will move
them::

    ŵ = w − η·D·v

With D = 0 both reduce to plain momentum SGD (a = 1, b = 0, ŵ = w): the executor's zero-delay
run equals synchronous per-micro-batch SGD, which the tests check bit for bit.

Note: the formulas above were derived here from the paper's description of the two methods
(SC: keep each gradient's total momentum-weighted contribution; LWP: extrapolate by the delay
along the velocity); the exact paper text could not be consulted from this machine.
"""

from __future__ import annotations

import torch

__all__ = ["PipelinedMomentumSGD", "spike_coefficients"]


def spike_coefficients(momentum: float, delay: int) -> tuple[float, float]:
    """(a, b) of Spike Compensation for momentum α and delay D: a = α^D, b = Σ_{k<D} α^k."""
    a = momentum**delay
    b = float(sum(momentum**k for k in range(delay)))
    return a, b


class PipelinedMomentumSGD:
    """Momentum SGD on one stage's parameters, stepped once per micro-batch, with optional
    Spike Compensation and Linear Weight Prediction (see the module docstring)."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        lr: float,
        momentum: float,
        spike_compensation: bool,
        weight_prediction: bool,
    ) -> None:
        self.params = params
        self.lr = lr
        self.momentum = momentum
        self.spike_compensation = spike_compensation
        self.weight_prediction = weight_prediction
        self.velocity = [torch.zeros_like(p) for p in params]
        self.steps = 0

    @torch.no_grad()
    def forward_weights(self, delay: int) -> list[torch.Tensor]:
        """The weights a forward whose gradient comes ``delay`` updates later uses: ŵ = w −
        η·D·v with LWP, else a copy of w (the backward needs the forward's weights unchanged
        while w moves on: these copies are the stashed versions the cost model counts)."""
        if self.weight_prediction and delay > 0:
            pairs = zip(self.params, self.velocity, strict=True)
            return [p - self.lr * delay * v for p, v in pairs]
        return [p.detach().clone() for p in self.params]

    @torch.no_grad()
    def step(self, grads: list[torch.Tensor], delay: int) -> None:
        """One update with the gradient of a micro-batch that is ``delay`` updates late."""
        a, b = spike_coefficients(self.momentum, delay) if self.spike_compensation else (1.0, 0.0)
        for p, v, g in zip(self.params, self.velocity, grads, strict=True):
            v.mul_(self.momentum).add_(g)
            if b == 0.0:
                p.add_(v, alpha=-self.lr * a)
            else:
                p.add_(a * v + b * g, alpha=-self.lr)
        self.steps += 1
