"""Memory of one GPU of a pipeline rank over an iteration.

static (weights + gradients + optimizer states, from the plan's MemoryEstimate)
+ the saved activations of every micro-batch between its forward's start and its backward's end
+ the largest temporary of one pass, while a forward or backward runs.
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from autoplan.plan.schema import MemoryEstimate, StageTiming
from autoplan.schedule import PipelineOrder
from autoplan.simulate.result import MemoryPoint, SimulatedEvent

__all__ = ["activation_bytes_per_stage", "memory_curve", "peak_in_flight"]


def peak_in_flight(actions: list) -> int:
    """Most micro-batches a rank holds activations for at once (forwards not yet backed)."""
    held = peak = 0
    for action in actions:
        held += 1 if action.kind == "F" else -1
        peak = max(peak, held)
    return peak


def activation_bytes_per_stage(
    order: PipelineOrder,
    stage_timings: list[StageTiming],
    memory: list[MemoryEstimate | None],
) -> tuple[dict[int, int], Literal["plan", "derived"]]:
    """Saved-activation bytes of one micro-batch per stage, and where the figure came from.

    The plan's ``StageTiming.saved_activation_bytes`` when every stage has it. Otherwise derived:
    a rank's ``activations_bytes`` is what its peak number of in-flight micro-batches hold, so
    one micro-batch holds that divided by the peak; a rank's stages (interleaving) share it
    equally, for the plan does not say how it splits.
    """
    if stage_timings and all(t.saved_activation_bytes is not None for t in stage_timings):
        return {t.stage: int(t.saved_activation_bytes or 0) for t in stage_timings}, "plan"
    per_stage: dict[int, int] = {}
    for rank, actions in enumerate(order):
        estimate = memory[rank] if rank < len(memory) else None
        peak = peak_in_flight(actions)
        per_micro_batch = estimate.activations_bytes // peak if estimate and peak else 0
        for stage in {action.stage for action in actions}:
            per_stage[stage] = per_micro_batch
    return per_stage, "derived"


def memory_curve(
    events: list[SimulatedEvent],
    *,
    static_bytes: int,
    activation_bytes: dict[int, int],
    transient_bytes: int,
) -> list[MemoryPoint]:
    """Step curve of one rank's memory from its events (see the module docstring)."""
    changes: Counter[float] = Counter()
    for event in events:
        if event.category not in ("forward", "backward") or event.stage is None:
            continue
        changes[event.start_ms] += transient_bytes
        changes[event.end_ms] -= transient_bytes
        saved = activation_bytes.get(event.stage, 0)
        if event.category == "forward":
            changes[event.start_ms] += saved
        else:
            changes[event.end_ms] -= saved
    # The first point is the static memory before anything runs; a change at time 0 follows
    # it at the same time, so the curve shows the jump.
    points = [MemoryPoint(time_ms=0.0, allocated_bytes=static_bytes)]
    level = static_bytes
    for time_ms in sorted(changes):
        level += changes[time_ms]
        points.append(MemoryPoint(time_ms=time_ms, allocated_bytes=level))
    return points
