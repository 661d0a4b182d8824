"""Discrete-event simulation of one training iteration of a plan, replica by replica.

Every replica of a pipeline rank (a group of tp GPUs with its share of every micro-batch; all
stages of a rank run on the same replicas) runs the rank's action list (autoplan.schedule) in
order, one compute action at a time, with its own times (``StageTiming.replicas``; the stage's
figures where the plan gives none). An action starts when its replica is free and its inputs
have arrived:

- forward of stage s, micro-batch i on replica r: the activations of r's samples, i.e. the
  forward of stage s-1 of i on every replica of stage s-1 that owns some of them, each followed
  by its transfer (stage 0 reads its data at once);
- backward of stage s on replica r: the gradients of r's samples from the backward of stage
  s+1 on every replica that owns some of them (the last stage starts from its own loss).

So the slowest sender gates a receiver, and samples are regrouped by index between stages with
different replicas (``autoplan.simulate.regroup``: which pairs exchange samples, and each pair's
share of the boundary's ``send_ms``). A result is sent when its action ends, over the directed
link between the two replicas; sends on one link go one after another in the order they were
issued. Transfers block both sides, as the pipeline engines plans are exported to run them
(``autoplan.cost.schedule``): the sender is busy until its sends have gone, and a receiving
action first spends its longest incoming transfer receiving, then computes. Both directions
of the boundary between stages s and s+1 take stage s's ``send_ms``: the gradient has the
activation's shape. Stages on the same pipeline rank (pp = 1) run on the same replicas and
hand over for free.

Zero-bubble schedules split a backward into ``I`` (the input gradient: it waits for the next
stage's gradient and sends to the previous stage when it ends, like a full ``B``) and ``W``
(the weight gradient: it waits for nothing but its own I, earlier in the same list, and sends
nothing), with ``StageTiming.weight_gradient_ms`` (I takes the rest of ``backward_ms``; a full
B takes both). Stages sit on ranks by ``Parallelism.rank_of_stage``: ``s % pp``, or the V of
zbv/dualpipev, whose middle hop (stages pp - 1 and pp, both on the last rank) hands over on
the same GPUs without a send. These are the rules of ``autoplan.cost.zero_bubble.play_ms``,
which the plan's prediction comes from, played here with replicas, links and the tail.

Gradients are all-reduced once per iteration over each pipeline rank's replicas (its stages
share them), taking ``rank_dp_allreduce_ms`` of the rank. PyTorch's PipelineStage runs every
backward but the last under DDP's ``no_sync`` and lets DDP's hooks all-reduce during the last
one (torch 2.13, ``distributed/pipelining/stage.py``, ``backward_maybe_with_nosync``). A
collective needs every member, so the all-reduce starts when the last replica starts its last
backward (B or W: the weight gradients are what it reduces) and ends no earlier than the last
replica ends it: it hides under one backward at most. A plan priced for Megatron-DeepSpeed
(``inputs.engine``) is played as that engine runs it: its pipeline engine reduces after the
schedule (``ReduceGrads`` after the last ``BackwardPass``), so the all-reduce starts when the last
replica ends its last backward; so does a plan priced for autoplan's groups executor
(``parallelism.executor``), which sums the gradients after the stage's last backward. Then
every replica steps its optimizer (``breakdown.optimizer_ms``).

Why hand-written: the model is a worklist over fixed action lists; a general discrete-event
library (e.g. SimPy) would add a dependency and coroutines for nothing. The result does not
depend on the order the worklist visits replicas: an action's inputs are fixed, and the sends on
one link all come from one replica, issued in that replica's own (time) order.
"""

from __future__ import annotations

import logging
from collections import deque

from autoplan.errors import InputError
from autoplan.plan.schema import MemoryEstimate, Plan, Replica, StageTiming
from autoplan.schedule import (
    Action,
    ActionKind,
    InvalidScheduleError,
    PipelineOrder,
    schedule_order,
    validate_order,
)
from autoplan.schedule.async_pb import async_stream_order
from autoplan.schedule.names import V_SCHEDULES
from autoplan.simulate.async_pb import ASYNC_ITERATIONS, ASYNC_NOTE, steady_iteration_ms
from autoplan.simulate.memory import activation_bytes_per_replica, memory_curve
from autoplan.simulate.regroup import regroup_pairs
from autoplan.simulate.result import (
    PASS_CATEGORIES,
    EventCategory,
    RankTimeline,
    ReplicaTimeline,
    SimulatedEvent,
    SimulationResult,
)

__all__ = [
    "replica_times",
    "replica_weight_ms",
    "simulate_order",
    "simulate_plan",
    "simulate_replicas",
]

logger = logging.getLogger(__name__)

# Where one result goes: (stage, replica) of the consumer and the fraction of send_ms it takes.
_Outgoing = dict[tuple[int, int], list[tuple[int, float, int]]]


def replica_times(timing: StageTiming, replicas: int) -> list[tuple[float, float]]:
    """(forward ms, backward ms) of each of a stage's ``replicas``: ``timing.replicas`` where
    given, else the stage's own figures for every replica."""
    if not timing.replicas:
        return [(timing.forward_ms, timing.backward_ms)] * replicas
    if len(timing.replicas) != replicas:
        raise InputError(
            f"stage {timing.stage}'s timing has {len(timing.replicas)} replica figures; the "
            f"stage has {replicas} replicas"
        )
    return [(r.forward_ms, r.backward_ms) for r in timing.replicas]


def replica_weight_ms(timing: StageTiming, replicas: int) -> list[float | None]:
    """The weight-gradient part (W) of each replica's backward: ``timing.replicas``' where
    given, else the stage's ``weight_gradient_ms`` scaled by the replica's share of the
    stage's backward; None where the plan does not split the backward."""
    times = replica_times(timing, replicas)
    out: list[float | None] = []
    for d, (_, backward_ms) in enumerate(times):
        own = timing.replicas[d].weight_gradient_ms if timing.replicas else None
        if own is None and timing.weight_gradient_ms is not None:
            scale = backward_ms / timing.backward_ms if timing.backward_ms > 0 else 0.0
            own = timing.weight_gradient_ms * scale
        if own is not None and own > backward_ms * (1 + 1e-9) + 1e-9:
            raise InputError(
                f"stage {timing.stage}'s weight-gradient time {own:.6g} ms exceeds its "
                f"backward {backward_ms:.6g} ms"
            )
        out.append(None if own is None else min(own, backward_ms))
    return out


def _duration_ms(
    action: Action, forward_ms: float, backward_ms: float, weight_ms: float | None
) -> float:
    if action.kind == "F":
        return forward_ms
    if action.kind == "B":
        return backward_ms
    if weight_ms is None:
        raise InputError(
            f"action {action} splits stage {action.stage}'s backward, but its timing has no "
            "weight_gradient_ms"
        )
    return weight_ms if action.kind == "W" else backward_ms - weight_ms


_CATEGORY: dict[ActionKind, EventCategory] = {
    "F": "forward",
    "B": "backward",
    "I": "input_gradient",
    "W": "weight_gradient",
}


def _links(
    shares: list[list[int]], num_stages: int, stage_rank: list[int]
) -> tuple[_Outgoing, _Outgoing, dict[tuple[int, int], int], dict[tuple[int, int], int]]:
    """Per (stage, replica): where its forward and backward results go, and how many inputs
    its forward and backward wait for."""
    forward_to: _Outgoing = {}
    backward_to: _Outgoing = {}
    forward_inputs: dict[tuple[int, int], int] = {}
    backward_inputs: dict[tuple[int, int], int] = {}
    for boundary in range(num_stages - 1):
        sender, receiver = stage_rank[boundary], stage_rank[boundary + 1]
        for pair in regroup_pairs(shares[sender], shares[receiver]):
            a, b = pair.source, pair.target
            forward_to.setdefault((boundary, a), []).append((b, pair.fraction, pair.samples))
            backward_to.setdefault((boundary + 1, b), []).append((a, pair.fraction, pair.samples))
            forward_inputs[(boundary + 1, b)] = forward_inputs.get((boundary + 1, b), 0) + 1
            backward_inputs[(boundary, a)] = backward_inputs.get((boundary, a), 0) + 1
    return forward_to, backward_to, forward_inputs, backward_inputs


def _compute_event(action: Action, start_ms: float, duration_ms: float) -> SimulatedEvent:
    return SimulatedEvent(
        name=action.label,
        category=_CATEGORY[action.kind],
        track="compute",
        stage=action.stage,
        micro_batch=action.micro_batch,
        start_ms=start_ms,
        end_ms=start_ms + duration_ms,
    )


def _recv_name(action: Action, source_rank: int, many: bool, replica: int) -> str:
    """'recv act s1 mb3' (the input of a forward) or 'recv grad s1 mb3' (of a backward)."""
    what = "act" if action.kind == "F" else "grad"
    pair = f" r{replica}←rank {source_rank}" if many else ""
    return f"recv {what} s{action.stage} mb{action.micro_batch}{pair}"


def _send_name(action: Action, consumer_stage: int, pair: str) -> str:
    what = "act" if action.kind == "F" else "grad"
    return f"send {what} s{action.stage}→s{consumer_stage} mb{action.micro_batch}{pair}"


def simulate_replicas(
    order: PipelineOrder,
    shares: list[list[int]],
    stage_timings: list[StageTiming],
    *,
    allreduce_ms: list[float] | None = None,
    optimizer_ms: float = 0.0,
    stage_rank: list[int] | None = None,
    reduce_after_backward: bool = False,
) -> list[list[list[SimulatedEvent]]]:
    """Timed events ``[rank][replica]`` of every replica, in start order (module docstring).

    ``order[r]`` runs on pipeline rank r, whose replicas take ``shares[r]`` samples of every
    micro-batch; ``stage_timings[s]`` gives stage s's times; ``allreduce_ms[r]`` rank r's
    gradient all-reduce (none when omitted); ``stage_rank[s]`` the rank of stage s (default
    ``s % pp``; the V schedules' from ``Parallelism.rank_of_stage``); ``reduce_after_backward``
    starts the all-reduce after the last backward instead of with it. The order must be valid
    (see validate_order).
    """
    pp = len(order)
    if len(shares) != pp:
        raise InputError(f"{len(shares)} share lists for {pp} pipeline ranks")
    num_stages = 1 + max((action.stage for actions in order for action in actions), default=-1)
    timing_of = {timing.stage: timing for timing in stage_timings}
    if sorted(timing_of) != list(range(num_stages)):
        raise InvalidScheduleError(
            f"stage_timings cover stages {sorted(timing_of)}; expected 0..{num_stages - 1}"
        )
    ranks_of = stage_rank or [s % pp for s in range(num_stages)]
    times = {s: replica_times(timing_of[s], len(shares[ranks_of[s]])) for s in range(num_stages)}
    weights = {
        s: replica_weight_ms(timing_of[s], len(shares[ranks_of[s]])) for s in range(num_stages)
    }
    forward_to, backward_to, forward_inputs, backward_inputs = _links(shares, num_stages, ranks_of)
    many = {p: len(rank_shares) > 1 for p, rank_shares in enumerate(shares)}

    position = [[0] * len(rank_shares) for rank_shares in shares]
    free_ms = [[0.0] * len(rank_shares) for rank_shares in shares]
    last_backward = [[(0.0, 0.0)] * len(rank_shares) for rank_shares in shares]
    # (arrival ms, transfer ms, sender rank, sender replica) of each input, by receiving
    # action and replica.
    arrivals: dict[tuple[Action, int], list[tuple[float, float, int, int]]] = {}
    link_free_ms: dict[tuple[int, int, int, int], float] = {}
    events: list[list[list[SimulatedEvent]]] = [[[] for _ in rank_shares] for rank_shares in shares]
    worklist = deque((p, d) for p in range(pp) for d in range(len(shares[p])))
    queued = set(worklist)

    while worklist:
        p, d = worklist.popleft()
        queued.discard((p, d))
        actions = order[p]
        while position[p][d] < len(actions):
            action = actions[position[p][d]]
            key = (action.stage, d)
            if action.kind == "F":
                needed = forward_inputs.get(key, 0)
                outgoing, target_stage = forward_to.get(key, []), action.stage + 1
            elif action.kind == "W":  # after its own I, earlier in this list; sends nothing
                needed, outgoing, target_stage = 0, [], action.stage
            else:  # B or I: the next stage's input gradient (whichever form it ran)
                needed = backward_inputs.get(key, 0)
                outgoing, target_stage = backward_to.get(key, []), action.stage - 1
            # Arrivals are keyed by the receiving action's stage, direction and micro-batch.
            got = arrivals.get((_arrival_key(action), d), [])
            if len(got) < needed:
                break
            forward_ms, backward_ms = times[action.stage][d]
            start = max([free_ms[p][d], *(arrival for arrival, *_ in got)])
            # A blocking receive: the longest incoming transfer, before the compute. It is an
            # event of its own, so the timeline shows the replica busy receiving.
            longest = max(got, key=lambda g: g[1], default=None)
            if longest is not None and longest[1] > 0:
                _, transfer, source_rank, source_replica = longest
                events[p][d].append(
                    SimulatedEvent(
                        name=_recv_name(action, source_rank, many[p] or many[source_rank], d),
                        category="communication",
                        track="communication",
                        stage=action.stage,
                        micro_batch=action.micro_batch,
                        peer_rank=source_rank,
                        peer_replica=source_replica,
                        start_ms=start,
                        end_ms=start + transfer,
                    )
                )
                start += transfer
            duration = _duration_ms(action, forward_ms, backward_ms, weights[action.stage][d])
            event = _compute_event(action, start, duration)
            events[p][d].append(event)
            free_ms[p][d] = event.end_ms
            if action.kind in "BW":
                last_backward[p][d] = (event.start_ms, event.end_ms)
            position[p][d] += 1
            if not outgoing:
                continue
            target_rank = ranks_of[target_stage]
            consumer = _arrival_key(Action(target_stage, action.kind, action.micro_batch))
            # Both directions across the boundary of stages s, s+1 take stage s's send_ms.
            send_ms = timing_of[min(action.stage, target_stage)].send_ms if outgoing else 0.0
            for target, fraction, samples in outgoing:
                if target_rank == p:  # pp = 1 or the V's turn: the same GPUs hold both
                    arrival, transfer = event.end_ms, 0.0
                else:
                    link = (p, d, target_rank, target)
                    pair = f" r{d}→r{target}" if many[p] or many[target_rank] else ""
                    send_start = max(event.end_ms, link_free_ms.get(link, 0.0))
                    send = SimulatedEvent(
                        name=_send_name(action, target_stage, pair),
                        category="communication",
                        track="communication",
                        stage=action.stage,
                        micro_batch=action.micro_batch,
                        peer_rank=target_rank,
                        peer_replica=target,
                        samples=samples,
                        start_ms=send_start,
                        end_ms=send_start + send_ms * fraction,
                    )
                    link_free_ms[link] = send.end_ms
                    events[p][d].append(send)
                    arrival, transfer = send.end_ms, send.end_ms - send.start_ms
                    # A blocking send holds the sender until it has gone.
                    free_ms[p][d] = max(free_ms[p][d], send.end_ms)
                arrivals.setdefault((consumer, target), []).append((arrival, transfer, p, d))
                if (target_rank, target) not in queued:
                    queued.add((target_rank, target))
                    worklist.append((target_rank, target))

    stuck = {
        (f"rank {p}" if not many[p] else f"rank {p} replica {d}"): str(order[p][position[p][d]])
        for p in range(pp)
        for d in range(len(shares[p]))
        if position[p][d] < len(order[p])
    }
    if stuck:
        raise InvalidScheduleError(f"schedule deadlocks; ranks wait at {stuck}")

    for p in range(pp):
        reduce_ms = allreduce_ms[p] if allreduce_ms else 0.0
        starts, ends = zip(*last_backward[p], strict=True)
        reduce_start = max(ends) if reduce_after_backward else max(starts)
        reduce_end = max(reduce_start + reduce_ms, *(end for _, end in last_backward[p]))
        for d in range(len(shares[p])):
            step_start = max(free_ms[p][d], reduce_end) if reduce_ms > 0 else free_ms[p][d]
            if reduce_ms > 0:
                events[p][d].append(
                    SimulatedEvent(
                        name="dp all-reduce",
                        category="communication",
                        track="communication",
                        start_ms=reduce_start,
                        end_ms=reduce_end,
                    )
                )
            if optimizer_ms > 0:
                events[p][d].append(
                    SimulatedEvent(
                        name="optimizer",
                        category="optimizer",
                        track="compute",
                        start_ms=step_start,
                        end_ms=step_start + optimizer_ms,
                    )
                )
    for rank_events in events:
        for replica_events in rank_events:
            replica_events.sort(key=lambda event: (event.start_ms, event.track != "compute"))
    return events


def _arrival_key(action: Action) -> Action:
    """Inputs of an I and of a full B are the same gradient: one key for both."""
    return Action(action.stage, "B", action.micro_batch) if action.kind == "I" else action


def simulate_order(
    order: PipelineOrder,
    stage_timings: list[StageTiming],
    *,
    dp_allreduce_ms: list[float] | None = None,
    optimizer_ms: float = 0.0,
    stage_rank: list[int] | None = None,
) -> list[list[SimulatedEvent]]:
    """Timed events of every pipeline rank, each rank one replica (``order[r]`` runs on rank
    r); see ``simulate_replicas``."""
    shares = [[1] for _ in order]
    events = simulate_replicas(
        order,
        shares,
        stage_timings,
        allreduce_ms=dp_allreduce_ms,
        optimizer_ms=optimizer_ms,
        stage_rank=stage_rank,
    )
    return [rank_events[0] for rank_events in events]


# ---- plans ----------------------------------------------------------------------------------


def _replicas_of_ranks(plan: Plan) -> list[list[Replica]]:
    replicas = []
    for p in range(plan.parallelism.pipeline_degree):
        stages = plan.stages_of_rank(p)
        if not stages:
            raise InputError(f"pipeline rank {p} of the plan runs no stage")
        replicas.append(stages[0].replicas)
    return replicas


def _estimate_of(plan: Plan, pipeline_rank: int, replica: Replica) -> MemoryEstimate | None:
    """The memory estimate of the replica's kind; else the rank's largest (older plans)."""
    of_rank = [m for m in plan.prediction.memory if m.pipeline_rank == pipeline_rank]
    kind = [
        m
        for m in of_rank
        if (m.gpu_type, m.tensor_parallel_degree, m.micro_batch_size)
        == (replica.gpu_type, replica.tensor_parallel_degree, replica.micro_batch_size)
    ]
    return max(kind or of_rank, key=lambda m: m.total_bytes, default=None)


def _allreduce_per_rank(
    plan: Plan, replicas: list[list[Replica]], memory: list[list[MemoryEstimate | None]]
) -> tuple[list[float], str]:
    """Each rank's gradient all-reduce time, and a note when it had to be estimated."""
    prediction = plan.prediction
    pp = plan.parallelism.pipeline_degree
    if len(prediction.rank_dp_allreduce_ms) == pp:
        return list(prediction.rank_dp_allreduce_ms), ""
    if all(len(rank) == 1 for rank in replicas):
        return [0.0] * pp, ""
    gradients = [
        max((m.gradients_bytes for m in estimates if m), default=0) if len(replicas[p]) > 1 else 0
        for p, estimates in enumerate(memory)
    ]
    largest = max(gradients)
    if largest == 0:
        return [prediction.dp_allreduce_ms if len(rank) > 1 else 0.0 for rank in replicas], (
            "all-reduce: every rank with replicas takes the plan's dp_allreduce_ms (no "
            "per-rank figures)"
        )
    return [prediction.dp_allreduce_ms * g / largest for g in gradients], (
        "all-reduce: the plan's dp_allreduce_ms scaled by each rank's gradient bytes "
        "(the plan has no rank_dp_allreduce_ms)"
    )


def simulate_plan(plan: Plan) -> SimulationResult:
    """Play ``plan``'s schedule with its predicted stage times; see the module docstring."""
    par = plan.parallelism
    asynchronous = par.schedule == "async_pb"
    if asynchronous:  # a stream of iterations without flush (autoplan.simulate.async_pb)
        stream = ASYNC_ITERATIONS * par.num_micro_batches
        order = async_stream_order(par.pipeline_degree, stream)
    else:
        order = schedule_order(
            par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
        )
    stage_rank = [par.rank_of_stage(s) for s in range(par.num_stages)]
    validate_order(
        order,
        par.pipeline_degree,
        par.num_stages,
        stream if asynchronous else par.num_micro_batches,
        v_shape=par.schedule in V_SCHEDULES,
    )
    timings = plan.prediction.stage_timings
    replicas = _replicas_of_ranks(plan)
    shares = [[replica.micro_batch_size for replica in rank] for rank in replicas]
    memory = [
        [_estimate_of(plan, p, replica) for replica in rank] for p, rank in enumerate(replicas)
    ]
    allreduce_ms, allreduce_note = _allreduce_per_rank(plan, replicas, memory)
    if asynchronous:  # per micro-batch in async_pb: the prediction counts them, not the play
        allreduce_ms, allreduce_note = [0.0] * par.pipeline_degree, ""
    events = simulate_replicas(
        order,
        shares,
        timings,
        allreduce_ms=allreduce_ms,
        optimizer_ms=0.0 if asynchronous else plan.prediction.breakdown.optimizer_ms,
        stage_rank=stage_rank,
        reduce_after_backward=(
            plan.inputs.engine == "megatron-deepspeed" or plan.parallelism.executor == "groups"
        ),
    )
    activation_bytes, source = activation_bytes_per_replica(order, timings, memory)
    notes = [note for note in [allreduce_note] if note]
    if source == "derived":
        notes.append(
            "memory: saved activations per micro-batch derived from each replica kind's "
            "activations_bytes / its peak in-flight micro-batches (the plan has no "
            "saved_activation_bytes in its stage timings)"
        )

    all_events = [e for rank in events for replica in rank for e in replica]
    iteration_ms = max((e.end_ms for e in all_events), default=0.0)
    if asynchronous:
        iteration_ms = steady_iteration_ms(all_events, par.num_micro_batches)
        notes.append(ASYNC_NOTE)
    pass_events = [e for e in all_events if e.category in PASS_CATEGORIES]
    pipeline_ms = max((e.end_ms for e in pass_events), default=0.0)
    pass_time = sum(e.duration_ms for e in pass_events)
    lanes = sum(len(rank) for rank in replicas)
    bubble = 1 - pass_time / (pipeline_ms * lanes) if pipeline_ms > 0 else 0.0

    ranks = []
    for p, rank_replicas in enumerate(replicas):
        timelines = []
        for d, replica in enumerate(rank_replicas):
            replica_events = events[p][d]
            estimate = memory[p][d]
            static = (
                estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_bytes
                if estimate
                else 0
            )
            curve = memory_curve(
                replica_events,
                static_bytes=static,
                activation_bytes=activation_bytes[(p, d)],
                transient_bytes=estimate.transient_bytes if estimate else 0,
            )
            busy = sum(e.duration_ms for e in replica_events if e.track == "compute")
            timelines.append(
                ReplicaTimeline(
                    pipeline_rank=p,
                    replica=d,
                    gpu_type=replica.gpu_type,
                    tensor_parallel_degree=replica.tensor_parallel_degree,
                    context_parallel_degree=replica.context_parallel_degree,
                    expert_parallel_degree=plan.stages_of_rank(p)[0].expert_parallel_degree,
                    micro_batch_size=replica.micro_batch_size,
                    node=replica.node,
                    ranks=list(replica.ranks),
                    busy_ms=busy,
                    idle_ms=max(iteration_ms - busy, 0.0),
                    communication_ms=sum(
                        e.duration_ms for e in replica_events if e.track == "communication"
                    ),
                    static_bytes=static,
                    peak_bytes=max(point.allocated_bytes for point in curve),
                    capacity_bytes=estimate.capacity_bytes if estimate else 0,
                    events=replica_events,
                    memory=curve,
                )
            )
        ranks.append(
            RankTimeline(
                pipeline_rank=p,
                stages=[s for s in range(par.num_stages) if stage_rank[s] == p],
                replicas=timelines,
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
