"""Simulating an async_pb plan: its steady state, which a single iteration does not show.

async_pb never flushes, so one iteration's timeline is not the figure: the simulator plays
``ASYNC_ITERATIONS`` iterations as one stream (``autoplan.schedule.async_pb``: the runtime's
orders) and takes the middle iteration's period, from the end of the first stage's last
backward of the first iteration to that of the second. After the fill, every stage runs one
forward and one backward per micro-batch, so the period is m × the slowest stage's
forward + backward (or its sends, if slower): no bubble, what ``autoplan.cost.async_pb``
predicts. The per-micro-batch optimizer steps and gradient all-reduces are not played (the
prediction counts them); the timeline and memory curves cover the whole stream.
"""

from __future__ import annotations

from autoplan.errors import InputError
from autoplan.simulate.result import SimulatedEvent

__all__ = ["ASYNC_ITERATIONS", "ASYNC_NOTE", "steady_iteration_ms"]

ASYNC_ITERATIONS = 3
"""Iterations played as one stream: fill, a steady one (measured), drain."""

ASYNC_NOTE = (
    f"async_pb: {ASYNC_ITERATIONS} iterations played as one stream without flush; the "
    "iteration time is the middle one's period (steady state), without the per-micro-batch "
    "optimizer steps and all-reduces (the prediction counts them); the timeline shows the "
    "whole stream"
)


def steady_iteration_ms(events: list[SimulatedEvent], num_micro_batches: int) -> float:
    """The middle iteration's period: between the ends of stage 0's backwards of the last
    micro-batch of the first and of the second iteration."""
    m = num_micro_batches
    ends = {
        e.micro_batch: e.end_ms
        for e in events
        if e.category == "backward" and e.stage == 0 and e.micro_batch is not None
    }
    if m - 1 not in ends or 2 * m - 1 not in ends:
        raise InputError("the async_pb stream has no backward of stage 0 to time")
    return ends[2 * m - 1] - ends[m - 1]
