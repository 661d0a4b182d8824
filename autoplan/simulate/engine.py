"""Discrete-event simulation of one training iteration of a plan.

Each pipeline rank runs its action list (autoplan.schedule) in order, one compute action at a
time. An action starts when its rank is free and its input has arrived:

- forward of stage s, micro-batch i: the activation of stage s-1's forward of i (stage 0 reads
  its data at once);
- backward of stage s: the gradient from stage s+1's backward of i (the last stage starts from
  its own loss); its own forward ran earlier on the same rank.

A result bound for another rank is sent when its action ends, over the directed link between the
two ranks; sends on one link go one after another in the order they were issued, and the sender
does not wait for them (PyTorch's pipelining posts isend/irecv and waits only when it needs the
data). Both directions of the boundary between stages s and s+1 take ``stage_timings[s].send_ms``:
the gradient has the activation's shape. Stages on the same rank hand over for free.

Gradients are all-reduced over dp once per iteration (``dp_allreduce_ms``, the whole
all-reduce of the stage). PyTorch's PipelineStage runs every backward but the last under DDP's
``no_sync`` and lets DDP's hooks all-reduce during the last one (torch 2.13,
``distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``), so the all-reduce starts
with the rank's last backward and ends no earlier than it: it hides under that one backward at
most. Then the rank steps its optimizer (``breakdown.optimizer_ms``).

Why hand-written: the model is a few dozen lines of list scheduling over a fixed order; a
general discrete-event library (e.g. SimPy) would add a dependency and coroutines for nothing.
"""

from __future__ import annotations

import logging

from autoplan.plan.schema import MemoryEstimate, Plan, StageTiming
from autoplan.schedule import (
    Action,
    InvalidScheduleError,
    PipelineOrder,
    schedule_order,
    validate_order,
)
from autoplan.simulate.memory import activation_bytes_per_stage, memory_curve
from autoplan.simulate.result import RankTimeline, SimulatedEvent, SimulationResult

__all__ = ["simulate_order", "simulate_plan"]

logger = logging.getLogger(__name__)


def _consumer(action: Action, num_stages: int) -> Action | None:
    """The action on the neighbouring stage that waits for ``action``'s result."""
    if action.kind == "F":
        if action.stage + 1 < num_stages:
            return Action(action.stage + 1, "F", action.micro_batch)
        return None
    return Action(action.stage - 1, "B", action.micro_batch) if action.stage > 0 else None


def _compute_event(action: Action, start_ms: float, timing: StageTiming) -> SimulatedEvent:
    duration = timing.forward_ms if action.kind == "F" else timing.backward_ms
    return SimulatedEvent(
        name=action.label,
        category="forward" if action.kind == "F" else "backward",
        track="compute",
        stage=action.stage,
        micro_batch=action.micro_batch,
        start_ms=start_ms,
        end_ms=start_ms + duration,
    )


def _send_event(
    action: Action, consumer: Action, *, peer_rank: int, start_ms: float, duration_ms: float
) -> SimulatedEvent:
    what = "act" if action.kind == "F" else "grad"
    return SimulatedEvent(
        name=f"send {what} s{action.stage}→s{consumer.stage} mb{action.micro_batch}",
        category="communication",
        track="communication",
        stage=action.stage,
        micro_batch=action.micro_batch,
        peer_rank=peer_rank,
        start_ms=start_ms,
        end_ms=start_ms + duration_ms,
    )


def simulate_order(
    order: PipelineOrder,
    stage_timings: list[StageTiming],
    *,
    dp_allreduce_ms: list[float] | None = None,
    optimizer_ms: float = 0.0,
) -> list[list[SimulatedEvent]]:
    """Timed events of every pipeline rank (``order[r]`` runs on rank r), in start order.

    ``stage_timings[s]`` gives stage s's times; ``dp_allreduce_ms[r]`` rank r's gradient
    all-reduce (none when omitted). The order must be valid (see validate_order).
    """
    pipeline_degree = len(order)
    num_stages = 1 + max((action.stage for actions in order for action in actions), default=-1)
    timing_of = {timing.stage: timing for timing in stage_timings}
    if sorted(timing_of) != list(range(num_stages)):
        raise InvalidScheduleError(
            f"stage_timings cover stages {sorted(timing_of)}; expected 0..{num_stages - 1}"
        )
    position = [0] * pipeline_degree
    rank_free_ms = [0.0] * pipeline_degree
    rank_last_start_ms = [0.0] * pipeline_degree
    input_ready_ms: dict[Action, float] = {}
    link_free_ms: dict[tuple[int, int], float] = {}
    events: list[list[SimulatedEvent]] = [[] for _ in range(pipeline_degree)]

    remaining = sum(len(actions) for actions in order)
    while remaining:
        progressed = False
        for rank, actions in enumerate(order):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                needs_input = (action.kind == "F" and action.stage > 0) or (
                    action.kind == "B" and action.stage < num_stages - 1
                )
                if needs_input and action not in input_ready_ms:
                    break
                start = max(rank_free_ms[rank], input_ready_ms.get(action, 0.0))
                event = _compute_event(action, start, timing_of[action.stage])
                events[rank].append(event)
                rank_free_ms[rank] = event.end_ms
                rank_last_start_ms[rank] = event.start_ms
                position[rank] += 1
                remaining -= 1
                progressed = True
                consumer = _consumer(action, num_stages)
                if consumer is None:
                    continue
                target = consumer.stage % pipeline_degree
                if target == rank:
                    input_ready_ms[consumer] = event.end_ms
                    continue
                # Both directions across the boundary of stages s, s+1 take stage s's send_ms.
                boundary = min(action.stage, consumer.stage)
                send = _send_event(
                    action,
                    consumer,
                    peer_rank=target,
                    start_ms=max(event.end_ms, link_free_ms.get((rank, target), 0.0)),
                    duration_ms=timing_of[boundary].send_ms,
                )
                link_free_ms[(rank, target)] = send.end_ms
                input_ready_ms[consumer] = send.end_ms
                events[rank].append(send)
        if not progressed:
            stuck = {
                rank: str(order[rank][position[rank]])
                for rank in range(pipeline_degree)
                if position[rank] < len(order[rank])
            }
            raise InvalidScheduleError(f"schedule deadlocks; ranks wait at {stuck}")

    for rank in range(pipeline_degree):
        # A rank's list ends with a backward (each backward follows its forward).
        last_start = rank_last_start_ms[rank]
        reduce_ms = dp_allreduce_ms[rank] if dp_allreduce_ms else 0.0
        reduce_end = max(rank_free_ms[rank], last_start + reduce_ms)
        if reduce_ms > 0:
            events[rank].append(
                SimulatedEvent(
                    name="dp all-reduce",
                    category="communication",
                    track="communication",
                    start_ms=last_start,
                    end_ms=reduce_end,
                )
            )
        if optimizer_ms > 0:
            events[rank].append(
                SimulatedEvent(
                    name="optimizer",
                    category="optimizer",
                    track="compute",
                    start_ms=reduce_end,
                    end_ms=reduce_end + optimizer_ms,
                )
            )
    for rank_events in events:
        rank_events.sort(key=lambda event: (event.start_ms, event.track != "compute"))
    return events


def _memory_of_rank(plan: Plan, pipeline_rank: int) -> MemoryEstimate | None:
    candidates = [m for m in plan.prediction.memory if m.pipeline_rank == pipeline_rank]
    return max(candidates, key=lambda m: m.total_bytes, default=None)


def _allreduce_per_rank(plan: Plan, memory: list[MemoryEstimate | None]) -> tuple[list[float], str]:
    """Each rank's gradient all-reduce time, and a note when it had to be estimated."""
    par = plan.parallelism
    prediction = plan.prediction
    if par.data_parallel_degree == 1:
        return [0.0] * par.pipeline_degree, ""
    if len(prediction.rank_dp_allreduce_ms) == par.pipeline_degree:
        return list(prediction.rank_dp_allreduce_ms), ""
    gradients = [estimate.gradients_bytes if estimate else 0 for estimate in memory]
    largest = max(gradients, default=0)
    if largest == 0:
        return [prediction.dp_allreduce_ms] * par.pipeline_degree, (
            "all-reduce: every rank takes the plan's dp_allreduce_ms (no per-rank figures)"
        )
    return [prediction.dp_allreduce_ms * g / largest for g in gradients], (
        "all-reduce: the plan's dp_allreduce_ms scaled by each rank's gradient bytes "
        "(the plan has no rank_dp_allreduce_ms)"
    )


def simulate_plan(plan: Plan) -> SimulationResult:
    """Play ``plan``'s schedule with its predicted stage times; see the module docstring."""
    par = plan.parallelism
    order = schedule_order(
        par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
    )
    validate_order(order, par.pipeline_degree, par.num_stages, par.num_micro_batches)
    timings = plan.prediction.stage_timings
    memory = [_memory_of_rank(plan, rank) for rank in range(par.pipeline_degree)]
    allreduce_ms, allreduce_note = _allreduce_per_rank(plan, memory)
    events = simulate_order(
        order,
        timings,
        dp_allreduce_ms=allreduce_ms,
        optimizer_ms=plan.prediction.breakdown.optimizer_ms,
    )
    activation_bytes, source = activation_bytes_per_stage(order, timings, memory)
    notes = [note for note in [allreduce_note] if note]
    if source == "derived":
        notes.append(
            "memory: saved activations per micro-batch derived from each rank's "
            "activations_bytes / its peak in-flight micro-batches (the plan has no "
            "StageTiming.saved_activation_bytes)"
        )

    compute_events = [e for rank_events in events for e in rank_events if e.track == "compute"]
    all_events = [e for rank_events in events for e in rank_events]
    iteration_ms = max((e.end_ms for e in all_events), default=0.0)
    pass_events = [e for e in compute_events if e.category in ("forward", "backward")]
    pipeline_ms = max((e.end_ms for e in pass_events), default=0.0)
    pass_time = sum(e.duration_ms for e in pass_events)
    bubble = 1 - pass_time / (pipeline_ms * par.pipeline_degree) if pipeline_ms > 0 else 0.0

    gpu_type_of = {}
    for entry in plan.rank_map:
        gpu_type_of.setdefault(entry.pipeline_rank, entry.gpu_type)
    ranks = []
    for rank, rank_events in enumerate(events):
        estimate = memory[rank]
        static = (
            estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
            if estimate
            else 0
        )
        curve = memory_curve(
            rank_events,
            static_bytes=static,
            activation_bytes=activation_bytes,
            transient_bytes=estimate.transient_bytes if estimate else 0,
        )
        busy = sum(e.duration_ms for e in rank_events if e.track == "compute")
        ranks.append(
            RankTimeline(
                pipeline_rank=rank,
                gpu_type=estimate.gpu_type if estimate else gpu_type_of.get(rank, "?"),
                stages=list(range(rank, par.num_stages, par.pipeline_degree)),
                busy_ms=busy,
                idle_ms=max(iteration_ms - busy, 0.0),
                communication_ms=sum(
                    e.duration_ms for e in rank_events if e.track == "communication"
                ),
                static_bytes=static,
                peak_bytes=max(point.allocated_bytes for point in curve),
                capacity_bytes=estimate.capacity_bytes if estimate else 0,
                events=rank_events,
                memory=curve,
            )
        )
    logger.info("simulated %s: %.3f ms per iteration", par.schedule, iteration_ms)
    return SimulationResult(
        schedule=par.schedule,
        pipeline_degree=par.pipeline_degree,
        virtual_stages_per_rank=par.virtual_stages_per_rank,
        num_micro_batches=par.num_micro_batches,
        iteration_time_ms=iteration_ms,
        pipeline_time_ms=pipeline_ms,
        bubble_fraction=min(max(bubble, 0.0), 1.0),
        predicted_iteration_time_ms=plan.prediction.iteration_time_ms,
        activation_bytes_source=source,
        notes=notes,
        ranks=ranks,
    )
