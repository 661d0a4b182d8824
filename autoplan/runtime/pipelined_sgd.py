"""Per-micro-batch momentum SGD for asynchronous Pipelined Backpropagation (Kosson et al.,
"Pipelined Backpropagation at Scale: Training Large Models without Batches", MLSys 2021).

Symbols as in the paper: weights w, velocity v, gradient g, learning rate η, momentum
coefficient m (``momentum`` here; α in older notes of this file), step t, and the delay D of a
stage: how many updates of that stage's weights happen between the forward of a micro-batch
and the arrival of its gradient (in a 1F1B steady state without flush, stage s of p has
D = p − 1 − s; the last stage has none). The gradient that arrives at step t was computed at
the weights of step t − D.

Plain momentum SGD (the paper's SGDM, what ``torch.optim.SGD(momentum=m, dampening=0)``
does)::

    v_{t+1} = m·v_t + g_t            w_{t+1} = w_t − η·v_{t+1}

Spike Compensation (SC). Under momentum a gradient's total effect on w is η·g·Σ_k m^k,
spread over the steps after it arrives; a gradient D steps late has missed the first D
terms, and the late velocity then over-shoots (a "spike"). SC applies the missed share at
once and scales down the velocity's term::

    v_{t+1} = m·v_t + g_t            w_{t+1} = w_t − η·(a·v_{t+1} + b·g_t),
    a = m^D,  b = (1 − m^D) / (1 − m)  (= Σ_{k<D} m^k)

so that a gradient's total contribution, b + a/(1 − m) = 1/(1 − m), is that of SGDM.

Linear Weight Prediction (LWP). The forward of a micro-batch whose gradient will come D
updates later runs at the weights extrapolated along the velocity, the direction the next D
steps will move them (the paper's horizon T, taken equal to D)::

    ŵ_{t+D} = w_t − η·D·v_t

With D = 0 both reduce to plain momentum SGD (a = 1, b = 0, ŵ = w): the executor's zero-delay
run equals synchronous per-micro-batch SGD, which the tests check bit for bit.

Checked against the paper: a = m^D and b = (1 − m^D)/(1 − m) for SC and ŵ = w − ηDv for LWP
(and their combination, LWP_D + SC_D, which ``weight_prediction`` and ``spike_compensation``
together give) are the paper's formulas; ``spike_coefficients`` computes b as the finite sum,
the same number. (The search tool reached only the paper's abstract and introduction, so
this check rests on the method section as recalled, not re-read here: whoever has the paper
at hand should confirm the SC and LWP equations.) One deliberate
difference from the paper's Pipelined Backpropagation: there the backward of a micro-batch
runs at the weights current when its gradient arrives (weight inconsistency); here it runs at
the weights its forward used (``autoplan.runtime.async_stage`` keeps that version, PipeDream's
weight stashing), which the cost model counts as memory. Only the gradient's delay remains,
which SC and LWP address.
"""

from __future__ import annotations

import torch

__all__ = ["PipelinedMomentumSGD", "spike_coefficients"]


def spike_coefficients(momentum: float, delay: int) -> tuple[float, float]:
    """(a, b) of Spike Compensation for momentum m and delay D: a = m^D, b = Σ_{k<D} m^k."""
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
