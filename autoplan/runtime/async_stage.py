"""One stage of asynchronous Pipelined Backpropagation (``schedule: async_pb``): no flush, one
optimizer step per micro-batch on every stage. ``AsyncStageWorker`` runs a stage's forwards and
backwards at their weight versions; the plan's executor (``async_executor``) drives it.

Order: every rank runs a 1F1B order over the whole stream of micro-batches, never draining in
between: stage s of p does k = p − 1 − s warm-up forwards, then alternates a forward and a
backward (F(j), B(j − k)), and drains only when the stream ends. Each backward is followed at
once by the stage's optimizer step (``PipelinedMomentumSGD``), so the weights a forward sees
are behind by the updates of the micro-batches still in flight: micro-batch i reaches stage s's
backward D_i = min(i, k) updates after its forward (the stage's delay). ``zero_delay=True``
runs every micro-batch through the whole pipeline and back before the next starts (D = 0
everywhere): synchronous per-micro-batch SGD, the reference the tests compare with exactly.

Weights: each forward runs on its own copy of the stage's weights (the prediction ŵ = w − η·D·v
with Linear Weight Prediction, else w as it is), through ``torch.func.functional_call``, so the
backward differentiates at the weights the forward used (PipeDream's weight stashing, which the
in-place updates of w in between would otherwise break) and the gradient is applied to the
current weights (with Spike Compensation when asked). A stage thus holds up to k + 1 weight
copies and k + 1 micro-batches of activations, which the cost model
(``autoplan.cost.async_pb``) counts.

Transport: activations forward and their gradients back with ``torch.distributed`` isend/recv
(gloo on CPU); sends never block the order (waited at the end), receives block, which the 1F1B
order makes deadlock-free. ``run_local`` plays the same orders in one process (a mailbox per
boundary) for tests and for the convergence study.

Replicas and tensor parallelism: ``reduce_gradients`` (given by the plan's executor,
``autoplan.runtime.async_executor``) sums a micro-batch's gradient over the stage's replicas
before the step, so every replica of a stage takes the same step; ``run_local`` and
``run_distributed`` here play one rank per stage. ``check.check_async_plan`` refuses, in one
line, what the async executor cannot run (ZeRO, recompute, offload, weights tied across
stages).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.func import functional_call

from autoplan.runtime.pipelined_sgd import PipelinedMomentumSGD
from autoplan.schedule.async_pb import async_pb_order

__all__ = [
    "AsyncStageWorker",
    "async_pb_order",
    "run_distributed",
    "run_local",
    "stage_delay",
]

Action = tuple[str, int]


def stage_delay(num_stages: int, stage: int, micro_batch: int, zero_delay: bool = False) -> int:
    """D of micro-batch ``micro_batch`` at ``stage``: updates between its forward and its
    gradient's arrival, min(i, p − 1 − s) in the 1F1B order without flush."""
    if zero_delay:
        return 0
    return min(micro_batch, num_stages - 1 - stage)


@dataclass
class _InFlight:
    inputs: torch.Tensor | tuple[torch.Tensor, ...]
    outputs: torch.Tensor
    weights: list[torch.Tensor]
    steps_at_forward: int
    delay: int


@dataclass
class AsyncStageWorker:
    """One pipeline stage: its module, optimizer and the micro-batches in flight.

    ``loss_fn(output, micro_batch)`` is given on the last stage only; ``inputs_of(i)`` on the
    first stage only (the micro-batch's input rows: a tensor or a tuple of them);
    ``reduce_gradients(grads)`` (optional) turns this replica's gradient of a micro-batch
    into the one every replica of the stage steps with (their sum).
    """

    module: torch.nn.Module
    stage: int
    num_stages: int
    optimizer: PipelinedMomentumSGD
    zero_delay: bool = False
    loss_fn: Callable[[torch.Tensor, int], torch.Tensor] | None = None
    inputs_of: Callable[[int], torch.Tensor | tuple[torch.Tensor, ...]] | None = None
    reduce_gradients: Callable[[list[torch.Tensor]], list[torch.Tensor]] | None = None
    losses: dict[int, float] = field(default_factory=dict)
    peak_in_flight: int = 0
    _names: list[str] = field(default_factory=list)
    _flight: dict[int, _InFlight] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._names = [name for name, _ in self.module.named_parameters()]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.num_stages - 1

    def forward(self, i: int, received: torch.Tensor | None) -> torch.Tensor:
        """Forward of micro-batch i at the (predicted or current) weights; returns what goes
        to the next stage (the loss, detached, on the last)."""
        delay = stage_delay(self.num_stages, self.stage, i, self.zero_delay)
        weights = [w.requires_grad_(True) for w in self.optimizer.forward_weights(delay)]
        if self.is_first:
            assert self.inputs_of is not None
            inputs = self.inputs_of(i)
        else:
            assert received is not None
            inputs = received.detach().requires_grad_(True)
        named = dict(zip(self._names, weights, strict=True))
        args = inputs if isinstance(inputs, tuple) else (inputs,)
        outputs = functional_call(self.module, named, args)
        if self.is_last:
            assert self.loss_fn is not None
            outputs = self.loss_fn(outputs, i)
            self.losses[i] = float(outputs.detach())
        self._flight[i] = _InFlight(inputs, outputs, weights, self.optimizer.steps, delay)
        self.peak_in_flight = max(self.peak_in_flight, len(self._flight))
        return outputs.detach()

    def backward(self, i: int, grad_outputs: torch.Tensor | None) -> torch.Tensor | None:
        """Backward of micro-batch i, then the stage's optimizer step; returns the gradient of
        the stage's input (None on the first stage)."""
        state = self._flight.pop(i)
        done = self.optimizer.steps - state.steps_at_forward
        if done != state.delay:
            raise RuntimeError(
                f"stage {self.stage}: micro-batch {i} saw {done} updates, expected {state.delay}"
            )
        wrt = list(state.weights)
        if not self.is_first:
            assert isinstance(state.inputs, torch.Tensor)  # a later stage's input: one tensor
            wrt.append(state.inputs)
        grads = torch.autograd.grad(
            state.outputs,
            wrt,
            grad_outputs=None if self.is_last else grad_outputs,
            allow_unused=True,
            materialize_grads=True,  # a weight this micro-batch does not reach steps with 0
        )
        n = len(state.weights)
        weight_grads = list(grads[:n])
        if self.reduce_gradients is not None:
            weight_grads = self.reduce_gradients(weight_grads)
        self.optimizer.step(weight_grads, state.delay)
        return None if self.is_first else grads[n]


def run_local(workers: list[AsyncStageWorker], num_micro_batches: int) -> None:
    """Play every stage's order in one process: repeatedly run each stage's next action whose
    input has arrived (a mailbox per boundary and direction)."""
    p = len(workers)
    orders = [async_pb_order(p, w.stage, num_micro_batches, w.zero_delay) for w in workers]
    cursor = [0] * p
    acts: dict[tuple[int, int], torch.Tensor] = {}  # (receiving stage, i) -> activation
    grads: dict[tuple[int, int], torch.Tensor] = {}  # (receiving stage, i) -> gradient
    while any(cursor[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s, worker in enumerate(workers):
            if cursor[s] == len(orders[s]):
                continue
            kind, i = orders[s][cursor[s]]
            if kind == "F":
                if s > 0 and (s, i) not in acts:
                    continue
                out = worker.forward(i, acts.pop((s, i), None))
                if s < p - 1:
                    acts[(s + 1, i)] = out
            else:
                if s < p - 1 and (s, i) not in grads:
                    continue
                grad_in = worker.backward(i, grads.pop((s, i), None))
                if s > 0:
                    assert grad_in is not None
                    grads[(s - 1, i)] = grad_in
            cursor[s] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("async_pb orders deadlocked (a bug in async_pb_order)")


def run_distributed(
    worker: AsyncStageWorker,
    num_micro_batches: int,
    boundary_shape: Callable[[int], tuple[int, ...]],
    rank_of_stage: Callable[[int], int],
    dtype: torch.dtype,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Run this rank's stage over the stream with real point-to-point transfers.

    ``boundary_shape(s)`` is the shape of the activation stage s sends to stage s + 1;
    ``rank_of_stage(s)`` the global rank holding stage s.
    """
    s, p = worker.stage, worker.num_stages
    pending: list[dist.Work | None] = []  # None: a send that needed no work (torch's type)
    keep: list[torch.Tensor] = []  # sent tensors stay alive until their sends complete
    for kind, i in async_pb_order(p, s, num_micro_batches, worker.zero_delay):
        if kind == "F":
            received = None
            if s > 0:
                received = torch.empty(boundary_shape(s - 1), dtype=dtype)
                dist.recv(received, src=rank_of_stage(s - 1), group=group)
            out = worker.forward(i, received)
            if s < p - 1:
                out = out.contiguous()
                keep.append(out)
                pending.append(dist.isend(out, dst=rank_of_stage(s + 1), group=group))
        else:
            grad_out = None
            if s < p - 1:
                grad_out = torch.empty(boundary_shape(s), dtype=dtype)
                dist.recv(grad_out, src=rank_of_stage(s + 1), group=group)
            grad_in = worker.backward(i, grad_out)
            if s > 0:
                assert grad_in is not None
                grad_in = grad_in.contiguous()
                keep.append(grad_in)
                pending.append(dist.isend(grad_in, dst=rank_of_stage(s - 1), group=group))
    for work in pending:
        if work is not None:
            work.wait()
