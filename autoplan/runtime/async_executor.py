"""The async_pb executor of a plan: asynchronous Pipelined Backpropagation on the plan's own
stages, any (dp, tp) per stage, as ``autoplan run`` and ``train`` run it.

Per rank it

1. gets its stage from the parallelize step (``parallelize``, as every executor does: the
   seeded model's layers with DTensor tensor parallelism on its replica's tp group);
2. plays its stage's async order (``autoplan.schedule.async_pb``: 1F1B over the whole stream of
   steps × m micro-batches, never flushing) through an ``AsyncStageWorker``: each forward at
   its own weight version (stashed, or predicted under Linear Weight Prediction), each
   backward followed at once by the stage's momentum-SGD step (with Spike Compensation when
   the plan asks);
3. moves activations and their gradients with the groups executor's ``Mailbox`` (rows
   regrouped by sample between stages of different replicas, one copy per tp replica), driven
   by the same order written as per-rank action lists;
4. sums each micro-batch's gradient over the stage's replicas before the step
   (``GradientSync``, the groups executor's reductions: replicas of unequal shares and of
   different tp degrees included), so all replicas of a stage hold the same weights.

Sample weighting: a replica's loss on a micro-batch is its mean over its share, weighted by
share / micro-batch size, so the sum over the stage's replicas is the micro-batch's mean loss
and the summed gradient its gradient: with dp replicas a stage steps exactly as one GPU on the
whole micro-batch would (``zero_delay=True``: synchronous per-micro-batch momentum SGD).

Steps: one step is the plan's m micro-batches of one global batch; the stream runs through
the steps without a flush in between. A step's loss is the mean over its micro-batches of
the loss each was trained with (at the stale or predicted weights its forward used); its time
is when the slowest rank finished that step's last backward, less when it finished the one
before.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from autoplan.errors import InputError
from autoplan.runtime.async_stage import AsyncStageWorker
from autoplan.runtime.data import Batch, sample_rows
from autoplan.runtime.executor_protocol import RankSetup
from autoplan.runtime.grad_sync import GradientSync, parameter_families
from autoplan.runtime.groups_executor import group_rank_sets
from autoplan.runtime.loss import loss_context, loss_function
from autoplan.runtime.memory import peak_memory_bytes
from autoplan.runtime.model_stage import meta_model
from autoplan.runtime.parallelize import parallelize
from autoplan.runtime.pipelined_sgd import PipelinedMomentumSGD
from autoplan.runtime.placement import rank_place, share_ranges
from autoplan.runtime.process_groups import ProcessGroups
from autoplan.runtime.report import StepRecord
from autoplan.runtime.transfers import Mailbox, boundary_shapes
from autoplan.schedule.async_pb import async_stream_order
from autoplan.zoo import get_model_spec

__all__ = ["AsyncExecutor"]


class _TimedSGD(PipelinedMomentumSGD):
    """Momentum SGD that adds up the time its steps take (the report's optimizer time)."""

    seconds: float = 0.0

    def step(self, grads: list[torch.Tensor], delay: int) -> None:
        started = time.perf_counter()
        super().step(grads, delay)
        self.seconds += time.perf_counter() - started


class AsyncExecutor:
    """One rank of an async_pb plan (see the module docstring)."""

    name = "async"

    def __init__(self, setup: RankSetup, *, zero_delay: bool = False) -> None:
        plan, entry, device = setup.plan, setup.entry, setup.device
        seed, learning_rate = setup.seed, setup.learning_rate
        settings = plan.parallelism.async_pb
        if settings is None:
            raise InputError(f"schedule {plan.parallelism.schedule!r} is not async_pb")
        self.plan = plan
        self.device = device
        self.zero_delay = zero_delay
        self.place = place = rank_place(plan, entry.rank)
        (index,) = place.stages
        self.stage = stage = plan.stages[index]
        replica = stage.replicas[place.replica]
        self.sync = GradientSync(plan, parameter_families(plan, meta_model(plan)), entry.rank)
        self.groups = ProcessGroups(group_rank_sets(plan, self.sync))
        spec = get_model_spec(plan.inputs.model.name)
        # The parallelize step applies the replica's tp (recompute, offload, ZeRO and experts
        # are refused for async_pb: check.check_async_plan).
        ranks = parallelize(plan, place, self.groups, device, seed)
        (model,) = ranks.modules
        self.modules: dict[int, nn.Module] = {index: model}
        self.sync.check_layout(self.modules, {index: replica})
        self.models: list[nn.Module] = [model]
        self.data_parallel_modules: list[nn.Module] = []  # no DDP: its own gradient sync
        self.params = list(model.parameters())
        self.optimizer = _TimedSGD(
            self.params,
            learning_rate,
            settings.momentum,
            settings.spike_compensation,
            settings.weight_prediction,
        )
        self.optimizers: list[torch.optim.Optimizer] = []  # its optimizer is ``optimizer``
        last = index == len(plan.stages) - 1
        share = stage.shares[place.replica]
        # Logits come split by vocabulary on a tp replica of the last stage (tensor_parallel).
        self.split_vocabulary = last and replica.tensor_parallel_degree > 1
        self.reports_loss = last and place.tp_index == 0
        self.loss = loss_function(spec.loss, share / plan.parallelism.micro_batch_size)
        self.rows = share_ranges(stage)[place.replica]
        self._batches: list[Batch] = []
        dist.barrier()  # every group exists everywhere before the first transfer

    # Data of micro-batch i of the stream: micro-batch i % m of global batch i // m.

    def _where(self, i: int) -> tuple[Batch, torch.Tensor]:
        m = self.plan.parallelism.num_micro_batches
        batch = self._batches[i // m]
        return batch, sample_rows(self.plan, i % m, *self.rows)

    def _inputs_of(self, i: int) -> tuple[torch.Tensor, ...]:
        (inputs, _), rows = self._where(i)
        return tuple(tensor[rows].to(self.device) for tensor in inputs)

    def _loss_of(self, output: torch.Tensor, i: int) -> torch.Tensor:
        (_, targets), rows = self._where(i)
        return self.loss(output, targets[rows].to(self.device))

    @torch.no_grad()
    def _reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        # The groups executor's reductions read and write ``param.grad``.
        for param, grad in zip(self.params, grads, strict=True):
            param.grad = grad
        self.sync.synchronize(self.modules, self.groups)
        summed = [param.grad for param in self.params]
        for param in self.params:
            param.grad = None
        return summed  # type: ignore[return-value]

    def train(self, batches: list[Batch]) -> list[StepRecord]:
        """Run the stream of ``batches`` (one global batch per step) without a flush; returns
        each step's record, the same on every rank."""
        par = self.plan.parallelism
        m, p = par.num_micro_batches, par.pipeline_degree
        n = len(batches) * m
        self._batches = batches
        s = self.stage.index
        worker = AsyncStageWorker(
            module=self.models[0],
            stage=s,
            num_stages=p,
            optimizer=self.optimizer,
            zero_delay=self.zero_delay,
            loss_fn=self._loss_of if s == p - 1 else None,
            inputs_of=self._inputs_of if s == 0 else None,
            reduce_gradients=self._reduce,
        )
        self.worker = worker
        order = async_stream_order(p, n, self.zero_delay)
        mailbox = Mailbox(self.plan, order, self.place.rank, self.groups, self.device)
        mailbox.set_shapes(boundary_shapes(self.plan, batches[0][0]))
        marks: list[float] = []
        optimizer_s: list[float] = []
        started = time.perf_counter()
        with loss_context(self.split_vocabulary):
            for action in order[s]:
                i = action.micro_batch
                if action.kind == "F":
                    received = mailbox.receive("F", s, i) if s > 0 else None
                    out = worker.forward(i, received)
                    if s < p - 1:
                        mailbox.send("F", s, i, out)
                    continue
                grad_out = mailbox.receive("B", s, i) if s < p - 1 else None
                grad_in = worker.backward(i, grad_out)
                if s > 0:
                    assert grad_in is not None
                    mailbox.send("B", s, i, grad_in)
                if (i + 1) % m == 0:
                    marks.append(time.perf_counter())
                    optimizer_s.append(self.optimizer.seconds)
        mailbox.finish()
        return self._records(worker, marks, optimizer_s, started)

    def _records(
        self, worker: AsyncStageWorker, marks: list[float], optimizer_s: list[float], started: float
    ) -> list[StepRecord]:
        m = self.plan.parallelism.num_micro_batches
        steps = len(marks)
        times = [marks[t] - (marks[t - 1] if t else started) for t in range(steps)]
        optimizer = [optimizer_s[t] - (optimizer_s[t - 1] if t else 0.0) for t in range(steps)]
        losses = [0.0] * steps
        if self.reports_loss:
            losses = [sum(worker.losses[t * m + j] for j in range(m)) / m for t in range(steps)]
        summed = torch.tensor(losses, dtype=torch.float64, device=self.device)
        slowest = torch.tensor(
            [*times, *optimizer, peak_memory_bytes(self.device)],
            dtype=torch.float64,
            device=self.device,
        )
        dist.all_reduce(summed)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        summed, slowest = summed.cpu(), slowest.cpu()
        peak = int(slowest[-1])
        records = []
        for t in range(steps):
            step_ms, optimizer_ms = float(slowest[t]) * 1e3, float(slowest[steps + t]) * 1e3
            records.append(
                StepRecord(
                    step=t,
                    time_ms=step_ms,
                    loss=float(summed[t]),
                    peak_memory_bytes=peak,
                    schedule_time_ms=max(step_ms - optimizer_ms, 0.0),
                    optimizer_time_ms=optimizer_ms,
                )
            )
        return records

    def model_state_bytes(self) -> int:
        """This rank's parameters and momentum-SGD velocity (its tp shards), in bytes."""
        from torch.distributed.tensor import DTensor

        def local(tensor: torch.Tensor) -> int:
            value = tensor.to_local() if isinstance(tensor, DTensor) else tensor
            return value.numel() * value.element_size()

        return sum(local(p) for p in self.params) + sum(local(v) for v in self.optimizer.velocity)
