"""Simulate a plan's iteration: per-rank timeline, memory curve, Chrome trace and Gantt PNG."""

from autoplan.simulate.bounds import pipeline_lower_bound_ms, uniform_pipeline_ms
from autoplan.simulate.engine import simulate_order, simulate_plan
from autoplan.simulate.result import (
    EventCategory,
    MemoryPoint,
    RankTimeline,
    SimulatedEvent,
    SimulationResult,
)

__all__ = [
    "EventCategory",
    "MemoryPoint",
    "RankTimeline",
    "SimulatedEvent",
    "SimulationResult",
    "pipeline_lower_bound_ms",
    "simulate_order",
    "simulate_plan",
    "uniform_pipeline_ms",
]
