"""The asynchronous alternative (``--allow-async``): the best search candidate re-costed as
async Pipelined Backpropagation (``autoplan.cost.async_pb``), reported beside the best
synchronous plan, never chosen silently: it changes the optimisation (stale weights, one
momentum-SGD step per micro-batch), not only the speed.

Candidates are the configurations the synchronous search kept (best first); those with one
stage per rank are re-costed and the fastest feasible one is returned. The cost model prices
any (dp, tp) per stage (data parallelism pays one gradient all-reduce per micro-batch); the
executor (``autoplan.runtime.async_pb``) runs dp = tp = 1 only, which the report says.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cost.async_pb import AsyncCost, async_pb_cost
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.plan.schema import Alternative, Plan
from autoplan.solve.uniform import Candidate

__all__ = [
    "ASYNC_MARK",
    "AsyncChoice",
    "async_alternative",
    "async_line",
    "best_async",
    "runnable_async",
]


@dataclass(frozen=True)
class AsyncChoice:
    """A configuration and its async_pb cost."""

    config: PlanConfig
    cost: AsyncCost


def runnable_async(config: PlanConfig) -> bool:
    """Whether the async executor runs ``config``: one stage per rank, one GPU per stage."""
    return config.chunks == 1 and all(
        len(s.groups) == 1 and s.groups[0].replicas == 1 and s.groups[0].tp == 1
        for s in config.stages
    )


def best_async(model: CostModel, candidates: list[Candidate]) -> AsyncChoice | None:
    """The fastest feasible async_pb re-costing of the runnable candidates (first on ties)."""
    best: AsyncChoice | None = None
    for candidate in candidates:
        if candidate.config.chunks != 1:
            continue
        cost = async_pb_cost(model, candidate.config)
        if cost.feasible and (best is None or cost.iteration_ms < best.cost.iteration_ms):
            best = AsyncChoice(candidate.config, cost)
    return best


def async_alternative(model: CostModel, plan: Plan, choice: AsyncChoice) -> Plan:
    """``plan`` with the async choice appended to its alternatives, marked asynchronous."""
    config = choice.config
    names = [model.classes[s.groups[0].device_class].gpu.name for s in config.stages]
    entry = Alternative(
        rank=len(plan.alternatives) + 1,
        summary=f"{ASYNC_MARK} "
        + config.summary(lambda k: model.classes[k].gpu.name).replace(config.schedule, "async_pb")
        + ("" if runnable_async(config) else " [runtime: needs dp = tp = 1 per stage]"),
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
        "async_pb: no candidate runs asynchronously (it needs one GPU per stage: dp = tp = 1) "
        "or fits with its stashed weight versions"
    )
