"""Simulate a plan's iteration: per-replica timelines, memory curves, Chrome trace, Gantt PNG."""

from autoplan.simulate.bounds import (
    pipeline_lower_bound_ms,
    replica_lower_bound_ms,
    uniform_pipeline_ms,
)
from autoplan.simulate.engine import simulate_order, simulate_plan, simulate_replicas
from autoplan.simulate.regroup import Transfer, regroup_pairs
from autoplan.simulate.result import (
    EventCategory,
    MemoryPoint,
    RankTimeline,
    ReplicaTimeline,
    SimulatedEvent,
    SimulationResult,
)

__all__ = [
    "EventCategory",
    "MemoryPoint",
    "RankTimeline",
    "ReplicaTimeline",
    "SimulatedEvent",
    "SimulationResult",
    "Transfer",
    "pipeline_lower_bound_ms",
    "regroup_pairs",
    "replica_lower_bound_ms",
    "simulate_order",
    "simulate_plan",
    "simulate_replicas",
    "uniform_pipeline_ms",
]
