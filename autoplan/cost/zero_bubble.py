"""Zero-bubble schedules: the backward split into input and weight gradients, the iteration
time of a schedule's action lists, and the micro-batches in flight per rank.

Split (from the profile): a layer's weight gradient is one matmul per weight, ``2 × params ×
tokens`` FLOPs (the same as the forward's matmuls on those weights); the input gradient is the
rest of the backward (the other matmul per weight, attention's backward, element-wise ops). So
``W = backward × min(1, 2·params·tokens / backward FLOPs)`` and ``I = backward − W``. An
embedding's lookup has no matmul: its "weight gradient" by that count exceeds the backward and
the cap gives W = backward, I = 0, which is right (its input is token ids, with no gradient).

Time: zero-bubble schedules have no closed form in general (their W fills bubbles whose size
depends on all the stage times), so ``play_ms`` plays the action lists: each rank runs its
list in order; an action starts when the rank is free and what it waits for has arrived
(a forward: the previous stage's forward plus the send; a backward or I: the next stage's
B or I plus the send; a W: only its own I, earlier on the same rank); sends on one directed
link between two ranks queue one after another. Transfers block both sides
(``autoplan.cost.schedule``): the sender's rank is busy until its send has gone, and the
receiver's action spends the transfer receiving before it computes. It is exact for the
given per-stage times (the event simulator plays the same rules with replicas and the tail, and
tests/test_simulate_zero_bubble.py checks the two agree); for
pp = 1 or uniform stages it reduces to the closed forms tests/test_cost_zero_bubble.py checks,
e.g. 1F1B's (m − 1)·(F + B) + p·(F + B) and ZB-H1's m·(F + I + W) + (p − 1)·(F + I − W).
It costs O(actions × pp), fast enough for the solver's few schedules per candidate.

Memory: a stage keeps a micro-batch's saved activations from its F until its W (or B): W
needs the saved inputs of the matmuls, so deferring W keeps them longer. ``peak_in_flight``
counts, per rank, the largest number of (stage, micro-batch) forwards whose activations are
held at once; I's share freed early is ignored (a bound from above).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from autoplan.cost.block_parts import piece_spans
from autoplan.schedule.actions import Action, PipelineOrder
from autoplan.schedule.orders import schedule_order

if TYPE_CHECKING:
    from autoplan.cost.config import PlanConfig, StageChoice
    from autoplan.cost.model import CostModel, StageCost

__all__ = [
    "group_weight_gradient_ms",
    "peak_in_flight",
    "play_ms",
    "weight_gradient_share",
    "zero_bubble_pipeline",
]


def weight_gradient_share(params: int, tokens: int, backward_flops: float) -> float:
    """Share of a layer's backward that is the weight gradient (module docstring)."""
    if backward_flops <= 0:
        return 0.0
    return min(1.0, 2.0 * params * tokens / backward_flops)


def play_ms(
    order: PipelineOrder,
    forward_ms: list[float],
    input_ms: list[float],
    weight_ms: list[float],
    send_ms: list[float] | None = None,
) -> float:
    """Iteration time of ``order`` (until the last action ends) with stage s taking
    ``forward_ms[s]``, ``input_ms[s]`` and ``weight_ms[s]`` (a full B takes I + W) and
    ``send_ms[s]`` across the boundary of stages s and s+1 (both directions; none when the
    two stages share a rank, as in the V's turn). The order must be valid (validate_order)."""
    num_stages = len(forward_ms)
    sends = send_ms or [0.0] * num_stages
    rank_of = {action.stage: rank for rank, actions in enumerate(order) for action in actions}
    # When a result is at its consumer: (stage, "F" | "G" (input gradient), mb) -> ms.
    ends: dict[tuple[int, str, int], float] = {}
    # Sends on one directed link between two ranks go one after another, in the order the
    # sender issues them (as in autoplan.simulate.engine): a link slower than the compute
    # between two sends queues them.
    link_free: dict[tuple[int, int], float] = {}
    position = [0] * len(order)
    free = [0.0] * len(order)
    remaining = sum(len(actions) for actions in order)
    while remaining:
        moved = False
        for rank, actions in enumerate(order):
            while position[rank] < len(actions):
                action = actions[position[rank]]
                ready = _ready_ms(action, ends, num_stages)
                if ready is None:
                    break
                start = max(free[rank], ready)
                s = action.stage
                received = _received_ms(action, rank, rank_of, sends, num_stages)
                duration = (
                    received
                    + {
                        "F": forward_ms[s],
                        "I": input_ms[s],
                        "W": weight_ms[s],
                        "B": input_ms[s] + weight_ms[s],
                    }[action.kind]
                )
                free[rank] = start + duration
                # A result goes out when its action ends (PyTorch sends the input gradient
                # after a full B, not midway).
                if action.kind == "F" and s + 1 < num_stages:
                    peer, what, send = s + 1, "F", sends[s]
                elif action.kind in "BI" and s > 0:
                    peer, what, send = s - 1, "G", sends[s - 1]
                else:
                    peer = None
                if peer is not None:
                    arrival = free[rank]
                    if rank_of[peer] != rank:
                        link = (rank, rank_of[peer])
                        arrival = max(arrival, link_free.get(link, 0.0)) + send
                        link_free[link] = arrival
                        free[rank] = arrival  # a blocking send holds the sender
                    ends[(s, what, action.micro_batch)] = arrival
                position[rank] += 1
                remaining -= 1
                moved = True
        if not moved:
            raise ValueError("the action lists deadlock; validate them first")
    return max(free)


def _received_ms(
    action: Action,
    rank: int,
    rank_of: dict[int, int],
    sends: list[float],
    num_stages: int,
) -> float:
    """What ``action`` spends receiving its input from another rank (blocking transfers)."""
    s = action.stage
    if action.kind == "F" and s > 0 and rank_of[s - 1] != rank:
        return sends[s - 1]
    if action.kind in "BI" and s + 1 < num_stages and rank_of[s + 1] != rank:
        return sends[s]
    return 0.0


def _ready_ms(
    action: Action, ends: dict[tuple[int, str, int], float], num_stages: int
) -> float | None:
    """When what ``action`` waits for from another stage has arrived; None if not yet run."""
    s, mb = action.stage, action.micro_batch
    if action.kind == "W":
        return 0.0
    if action.kind == "F":
        if s == 0:
            return 0.0
        key = (s - 1, "F", mb)
    elif s == num_stages - 1:
        return 0.0  # the loss's gradient starts on the stage itself
    else:
        key = (s + 1, "G", mb)
    return ends.get(key)


def peak_in_flight(order: PipelineOrder) -> list[int]:
    """Per rank: the most (stage, micro-batch) forwards whose activations it holds at once,
    each held from its F until its W or B (module docstring)."""
    peaks = []
    for actions in order:
        held = peak = 0
        for action in actions:
            if action.kind == "F":
                held += 1
                peak = max(peak, held)
            elif action.kind in "BW":
                held -= 1
        peaks.append(peak)
    return peaks


def group_weight_gradient_ms(
    model: CostModel, stage: StageChoice, group: int, plan_sequence_parallel: bool = False
) -> float:
    """The weight-gradient part (W) of one micro-batch's backward of ``stage``'s group
    ``group``, layer by layer (module docstring); the plan's StageTiming carries it so that the
    simulator plays the same split. With sequence parallelism where ``CostModel.evaluate``
    costs the stage with it: the model's view, the plan's setting
    (``plan_sequence_parallel``) or the stage's own."""
    profile = model.profile
    tokens = profile.seq_len * profile.micro_batch_size
    choice = stage.groups[group]
    # The tables ``CostModel.evaluate`` costs the group with (its cp: a rank's 1/c of the
    # tokens; its experts' span), so that W is a part of the backward it plays.
    experts = model.expert_span(stage)
    tables = model.tables(
        choice.device_class,
        choice.tp,
        choice.micro_batch_size,
        model.sequence_parallel or plan_sequence_parallel or stage.sequence_parallel,
        choice.cp,
        model.stage_expert_parallel(stage),
        None if experts is None else (experts, group),
    )
    w = 0.0
    for i, span in piece_spans(tables.blocks, stage.layer_start, stage.layer_end):
        if span == 1:
            w += tables.alone[i].backward_compute_ms * weight_gradient_share(
                profile.layers[i].param_count, tokens, profile.layers[i].backward_flops
            )
        else:  # a whole block at sub-block grain (block_parts): its share as a block
            attn, mlp = profile.layers[i], profile.layers[i + 1]
            share = weight_gradient_share(
                attn.param_count + mlp.param_count,
                tokens,
                attn.backward_flops + mlp.backward_flops,
            )
            w += tables.blocks[i].backward_compute_ms * share
    return w


def zero_bubble_pipeline(
    model: CostModel, config: PlanConfig, costs: list[StageCost]
) -> tuple[float, list[int]]:
    """(pipeline ms, chunk-forwards in flight per rank) of a zero-bubble ``config``: the
    schedule's action lists played with each stage's slowest group's F, and its backward split
    into I and W layer by layer (module docstring; a recompute's redone forward stays in I)."""
    forward, input_grad, weight = [], [], []
    for stage, cost in zip(config.stages, costs, strict=True):
        slowest = max(range(len(stage.groups)), key=lambda g: cost.groups[g].backward_ms)
        w = group_weight_gradient_ms(model, stage, slowest, config.sequence_parallel)
        forward.append(cost.forward_ms)
        weight.append(w)
        input_grad.append(cost.groups[slowest].backward_ms - w)
    order = schedule_order(
        config.schedule,  # type: ignore[arg-type]
        config.pipeline_degree,
        config.num_micro_batches,
        config.chunks,
    )
    sends = [cost.send_ms for cost in costs]
    return play_ms(order, forward, input_grad, weight, sends), peak_in_flight(order)
