"""Cost of a configuration run as asynchronous Pipelined Backpropagation (``async_pb``).

Time: the pipeline never flushes, so in the steady state every pipeline rank r takes, per
micro-batch, t_r = c_r + 2 x_{r-1} + 2 x_r + exposed_r + step_r: its forward + backward and its
blocking transfers on both sides (``autoplan.cost.schedule``), the part of its gradient
all-reduce over replicas that its backward does not hide (each micro-batch's gradient is
applied at once, so data parallelism pays one all-reduce per micro-batch), and its optimizer
step, now once per micro-batch. The slowest rank sets the pace and nobody waits on a fill or
drain: an iteration of m micro-batches takes m × max_r t_r, with no bubble (the one-time fill
of a stream of many iterations is amortised to nothing; ``autoplan.runtime.async_stage`` runs
exactly this order).

Memory: rank r holds the activations of p − r micro-batches in flight, as in 1F1B, and, for
each of them, the copy of its weights the forward used (the stashed version, or the predicted
ŵ = w − η·D·v under Linear Weight Prediction): (p − r) × its weight bytes on top of the
synchronous figure. The optimizer states are counted as the synchronous model counts them
(Adam's, an upper bound of momentum SGD's one velocity).

The per-stage costs come from ``CostModel.evaluate`` of the same configuration as 1F1B (the
same per-micro-batch work, sends and memory), so the two figures differ only in what the
asynchronous schedule changes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel, PlanCost

__all__ = ["AsyncCost", "AsyncRankMemory", "async_pb_cost", "async_pb_time_ms"]


def async_pb_time_ms(per_micro_batch_ms: list[float], num_micro_batches: int) -> float:
    """m × max_r t_r: the steady state of a pipeline that never flushes (no bubble)."""
    return num_micro_batches * max(per_micro_batch_ms)


@dataclass(frozen=True)
class AsyncRankMemory:
    """Peak memory of one GPU of a replica group of pipeline rank r under async_pb (bytes)."""

    pipeline_rank: int
    gpu_type: str
    synchronous_bytes: float  # what 1F1B holds: weights, grads, states, activations, transient
    stash_bytes: float  # (p − r) weight versions of the micro-batches in flight
    capacity_bytes: int
    reserved_bytes: int

    @property
    def total_bytes(self) -> float:
        return self.synchronous_bytes + self.stash_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes + self.reserved_bytes <= self.capacity_bytes


@dataclass(frozen=True)
class AsyncCost:
    """What the cost model says about a configuration run as async_pb."""

    iteration_ms: float
    samples_per_iteration: int
    bubble_ms: float
    rank_micro_batch_ms: list[float]
    synchronous: PlanCost
    memory: list[AsyncRankMemory]
    violations: list[str] = field(default_factory=list)

    @property
    def samples_per_s(self) -> float:
        return self.samples_per_iteration / self.iteration_ms * 1e3

    @property
    def feasible(self) -> bool:
        return not self.violations


def async_pb_cost(model: CostModel, config: PlanConfig) -> AsyncCost:
    """Cost ``config`` as async_pb (module docstring). One stage per rank (no interleaving)."""
    if config.chunks != 1:
        raise ValueError(f"async_pb runs one stage per rank; the configuration has {config.chunks}")
    sync = model.evaluate(dataclasses.replace(config, schedule="1f1b"))
    pp = config.pipeline_degree
    per_mb: list[float] = []
    for r, stage in enumerate(config.stages):
        cost = sync.stages[r]
        steps = [
            model.optimizer_ms(g.params_per_gpu, group.device_class, stage.replicas, stage.zero1)
            + model.step_overhead_ms(group.device_class)
            for g, group in zip(cost.groups, stage.groups, strict=True)
        ]
        allreduce = sync.rank_allreduce_ms[r]
        # The async executor sums gradients with the groups executor's sync: nothing hides.
        shortest = min(g.backward_ms for g in cost.groups)
        exposed = model.exposed_allreduce_ms(allreduce, shortest, "groups")
        received = sync.stages[r - 1].send_ms if r > 0 else 0.0
        per_mb.append(cost.work_ms + 2 * cost.send_ms + 2 * received + exposed + max(steps))
    memory, violations = [], []
    for mem in sync.memory:
        r = mem.pipeline_rank
        entry = AsyncRankMemory(
            pipeline_rank=r,
            gpu_type=mem.gpu_type,
            synchronous_bytes=mem.total_bytes,
            stash_bytes=(pp - r) * mem.weights_bytes,
            capacity_bytes=mem.capacity_bytes,
            reserved_bytes=mem.reserved_bytes,
        )
        memory.append(entry)
        if not entry.fits:
            violations.append(
                f"pipeline rank {r} on {mem.gpu_type} needs "
                f"{(entry.total_bytes + entry.reserved_bytes) / 1e9:.2f} GB with {pp - r} "
                f"stashed weight versions; it has {entry.capacity_bytes / 1e9:.2f} GB"
            )
    return AsyncCost(
        iteration_ms=async_pb_time_ms(per_mb, config.num_micro_batches),
        samples_per_iteration=config.samples_per_iteration,
        bubble_ms=0.0,
        rank_micro_batch_ms=per_mb,
        synchronous=sync,
        memory=memory,
        violations=violations,
    )
