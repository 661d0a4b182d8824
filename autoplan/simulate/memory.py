"""Memory of one GPU of a replica over an iteration.

static (weights + gradients + optimizer states, from the replica kind's MemoryEstimate)
+ the saved activations of every micro-batch between its forward's start and its backward's end
+ the largest temporary of one pass, while a forward or backward runs.

A zero-bubble schedule's split backward frees a micro-batch's activations when its W ends, not
its I: W needs the saved inputs of the matmuls (``autoplan.cost.zero_bubble.peak_in_flight``
counts the same way, so the curve's peak is the plan's activations_bytes). Part of what I
used could go at I already; neither the cost model nor the curve counts that (from above).
"""

from __future__ import annotations

from collections import Counter
from typing import Literal

from autoplan.plan.schema import MemoryEstimate, StageTiming
from autoplan.schedule import Action, PipelineOrder
from autoplan.simulate.result import PASS_CATEGORIES, MemoryPoint, SimulatedEvent

__all__ = ["activation_bytes_per_replica", "memory_curve", "peak_in_flight"]


def peak_in_flight(actions: list[Action]) -> int:
    """Most micro-batches a rank holds activations for at once (forwards whose B, or W of a
    split backward, has not run yet)."""
    held = peak = 0
    for action in actions:
        if action.kind == "F":
            held += 1
        elif action.kind in "BW":
            held -= 1
        peak = max(peak, held)
    return peak


def _from_plan(timing: StageTiming, replica: int) -> int | None:
    """Saved bytes of one micro-batch of replica ``replica`` as the plan states them."""
    if timing.replicas and replica < len(timing.replicas):
        return timing.replicas[replica].saved_activation_bytes
    return timing.saved_activation_bytes


def activation_bytes_per_replica(
    order: PipelineOrder,
    stage_timings: list[StageTiming],
    memory: list[list[MemoryEstimate | None]],
) -> tuple[dict[tuple[int, int], dict[int, int]], Literal["plan", "derived"]]:
    """Saved-activation bytes of one micro-batch on one GPU, per (pipeline rank, replica) and
    stage, and where the figures came from.

    The plan's figures when every stage has them: the replica's
    ``ReplicaTiming.saved_activation_bytes``, else the stage's ``saved_activation_bytes`` (its
    largest replica's). Otherwise derived: a replica kind's ``activations_bytes`` is what its
    peak number of in-flight micro-batches hold, so one micro-batch holds that divided by the
    peak; a rank's stages (interleaving) share it equally, for the plan does not say how it
    splits. ``memory[p][d]`` is replica d of rank p's estimate.
    """
    timing_of = {timing.stage: timing for timing in stage_timings}
    stages_of = [sorted({action.stage for action in actions}) for actions in order]
    stated = all(
        s in timing_of and _from_plan(timing_of[s], d) is not None
        for p, stages in enumerate(stages_of)
        for d in range(len(memory[p]))
        for s in stages
    )
    per_replica: dict[tuple[int, int], dict[int, int]] = {}
    for p, actions in enumerate(order):
        stages = stages_of[p]
        peak = peak_in_flight(actions)
        for d, estimate in enumerate(memory[p]):
            if stated:
                per_replica[(p, d)] = {s: int(_from_plan(timing_of[s], d) or 0) for s in stages}
            else:
                one = estimate.activations_bytes // peak if estimate and peak else 0
                per_replica[(p, d)] = dict.fromkeys(stages, one)
    return per_replica, "plan" if stated else "derived"


def memory_curve(
    events: list[SimulatedEvent],
    *,
    static_bytes: int,
    activation_bytes: dict[int, int],
    transient_bytes: int,
) -> list[MemoryPoint]:
    """Step curve of one replica's memory from its events (see the module docstring)."""
    changes: Counter[float] = Counter()
    for event in events:
        if event.category not in PASS_CATEGORIES or event.stage is None:
            continue
        changes[event.start_ms] += transient_bytes
        changes[event.end_ms] -= transient_bytes
        saved = activation_bytes.get(event.stage, 0)
        if event.category == "forward":
            changes[event.start_ms] += saved
        elif event.category in ("backward", "weight_gradient"):  # not at I: W still reads them
            changes[event.end_ms] -= saved
    # The first point is the static memory before anything runs; a change at time 0 follows
    # it at the same time, so the curve shows the jump.
    points = [MemoryPoint(time_ms=0.0, allocated_bytes=static_bytes)]
    level = static_bytes
    for time_ms in sorted(changes):
        level += changes[time_ms]
        points.append(MemoryPoint(time_ms=time_ms, allocated_bytes=level))
    return points
