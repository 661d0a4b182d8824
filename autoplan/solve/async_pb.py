"""The asynchronous alternative (``--allow-async``): the best search candidate re-costed as
async Pipelined Backpropagation (``autoplan.cost.async_pb``), reported beside the best
synchronous plan, never chosen silently: it changes the optimisation (stale weights, one
momentum-SGD step per micro-batch), not only the speed.

Candidates are the configurations the synchronous search kept (best first); each with one
stage per rank is re-costed as the async executor (``autoplan.runtime.async_executor``) runs it
(``as_async``: any (dp, tp) and shares per stage, as searched; no ZeRO, recompute or offload,
which it does not run) and the fastest feasible one is returned. Data parallelism pays one
gradient all-reduce per micro-batch (``autoplan.cost.async_pb``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.cost.async_pb import AsyncCost, async_pb_cost
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Alternative, Plan
from autoplan.solve.ranking import Candidate

__all__ = [
    "ASYNC_MARK",
    "AsyncChoice",
    "as_async",
    "async_alternative",
    "async_line",
    "best_async",
]


@dataclass(frozen=True)
class AsyncChoice:
    """A configuration and its async_pb cost."""

    config: PlanConfig
    cost: AsyncCost


def as_async(config: PlanConfig) -> PlanConfig:
    """``config`` as the async executor runs it: ZeRO, recompute and offload off (it keeps
    each forward's weight version, which a recomputed forward would not use)."""
    stages = tuple(
        dataclasses.replace(
            stage,
            zero_stage=0,
            groups=tuple(
                dataclasses.replace(g, recompute="none", offload=False) for g in stage.groups
            ),
        )
        for stage in config.stages
    )
    return dataclasses.replace(config, stages=stages)


def best_async(model: CostModel, candidates: list[Candidate]) -> AsyncChoice | None:
    """The fastest feasible async_pb re-costing of the candidates with one stage per rank,
    each as the async executor runs it (``as_async``; first on ties)."""
    best: AsyncChoice | None = None
    seen: set[PlanConfig] = set()
    for candidate in candidates:
        if candidate.config.chunks != 1:
            continue
        config = as_async(candidate.config)
        if config in seen:
            continue
        seen.add(config)
        cost = async_pb_cost(model, config)
        if cost.feasible and (best is None or cost.iteration_ms < best.cost.iteration_ms):
            best = AsyncChoice(config, cost)
    return best


def async_alternative(model: CostModel, plan: Plan, choice: AsyncChoice) -> Plan:
    """``plan`` with the async choice appended to its alternatives, marked asynchronous."""
    config = choice.config
    names = [model.classes[s.groups[0].device_class].gpu.name for s in config.stages]
    entry = Alternative(
        rank=len(plan.alternatives) + 1,
        summary=f"{ASYNC_MARK} "
        + config.summary(lambda k: model.classes[k].gpu.name).replace(config.schedule, "async_pb"),
        layer_split=[s.num_layers for s in config.stages],
        gpu_types=names,
        iteration_time_ms=choice.cost.iteration_ms,
        samples_per_s=choice.cost.samples_per_s,
    )
    return plan.model_copy(update={"alternatives": [*plan.alternatives, entry]})


ASYNC_MARK = "ASYNC (async_pb: changes the optimisation)"


def async_line(plan: Plan) -> str:
    """One line comparing the async alternative with the plan (the best synchronous one)."""
    sync = plan.prediction.samples_per_s
    for alt in plan.alternatives:
        if alt.summary.startswith(ASYNC_MARK):
            return (
                f"async_pb (asynchronous Pipelined Backpropagation, changes the optimisation): "
                f"{alt.samples_per_s:.1f} samples/s ({alt.samples_per_s / sync:.2f}x) beside the "
                f"best synchronous plan's {sync:.1f} samples/s; reported, not chosen"
            )
    return (
        "async_pb: no candidate runs asynchronously (one stage per rank, without ZeRO, "
        "recompute or offload) and fits with its stashed weight versions"
    )
