"""Per-rank action orders of GPipe, 1F1B and interleaved 1F1B, computed from (pp, v, m).

These are the orders ``torch.distributed.pipelining`` runs (ScheduleGPipe, Schedule1F1B and
ScheduleInterleaved1F1B); tests/test_schedule.py checks them against PyTorch's own lists. They
are written here without torch because the solve path, the simulator and the viewers must not
import it, and PyTorch computes its lists inside schedule objects that need pipeline stages.

Only the order of each rank's actions is kept: PyTorch pads its lists with idle steps (None) to
draw them as a grid; here the simulator finds the idle time from real durations instead.
"""

from __future__ import annotations

from autoplan.errors import InputError
from autoplan.schedule.actions import Action, PipelineOrder
from autoplan.schedule.names import ScheduleName
from autoplan.schedule.zero_bubble import (
    dualpipev_order,
    interleaved_zero_bubble_order,
    zbv_order,
)

__all__ = [
    "gpipe_order",
    "interleaved_1f1b_order",
    "interleaved_rounds",
    "one_f_one_b_order",
    "schedule_order",
]


def _check_sizes(pipeline_degree: int, num_micro_batches: int) -> None:
    if pipeline_degree < 1:
        raise InputError(f"pipeline degree must be >= 1, got {pipeline_degree}")
    if num_micro_batches < 1:
        raise InputError(f"number of micro-batches must be >= 1, got {num_micro_batches}")


def gpipe_order(pipeline_degree: int, num_micro_batches: int) -> PipelineOrder:
    """GPipe: every rank runs all forwards, then all backwards, in micro-batch order."""
    _check_sizes(pipeline_degree, num_micro_batches)
    micro_batches = range(num_micro_batches)
    return [
        [Action(rank, "F", mb) for mb in micro_batches]
        + [Action(rank, "B", mb) for mb in micro_batches]
        for rank in range(pipeline_degree)
    ]


def one_f_one_b_order(pipeline_degree: int, num_micro_batches: int) -> PipelineOrder:
    """1F1B: rank r runs ``p - r`` forwards, then alternates backward/forward, then drains.

    PyTorch's Schedule1F1B refuses fewer micro-batches than stages, so this does too.
    """
    _check_sizes(pipeline_degree, num_micro_batches)
    if num_micro_batches < pipeline_degree:
        raise InputError(
            f"1F1B needs at least as many micro-batches ({num_micro_batches}) as pipeline "
            f"stages ({pipeline_degree})"
        )
    order: PipelineOrder = []
    for rank in range(pipeline_degree):
        warmup = pipeline_degree - rank
        actions = [Action(rank, "F", mb) for mb in range(warmup)]
        for backward_mb in range(num_micro_batches):
            actions.append(Action(rank, "B", backward_mb))
            forward_mb = backward_mb + warmup
            if forward_mb < num_micro_batches:
                actions.append(Action(rank, "F", forward_mb))
        order.append(actions)
    return order


def interleaved_rounds(pipeline_degree: int, num_micro_batches: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of interleaved 1F1B, as PyTorch computes them.

    PyTorch runs micro-batches in rounds of ``m // rounds`` with ``rounds = max(1, m // p)``
    and requires ``m`` to be a multiple of ``rounds``.
    """
    _check_sizes(pipeline_degree, num_micro_batches)
    rounds = max(1, num_micro_batches // pipeline_degree)
    if num_micro_batches % rounds:
        raise InputError(
            f"interleaved 1F1B with pp={pipeline_degree} runs {rounds} rounds of micro-batches; "
            f"{num_micro_batches} micro-batches is not a multiple of {rounds}"
        )
    return rounds, num_micro_batches // rounds


def interleaved_1f1b_order(
    pipeline_degree: int, virtual_stages_per_rank: int, num_micro_batches: int
) -> PipelineOrder:
    """Interleaved 1F1B (Narayanan et al., SC'21) in PyTorch's depth-first variant.

    Rank r holds stages ``r, r + p, r + 2p, ...``. Forwards visit its stages in turn, one round
    of micro-batches per stage; backwards visit them in reverse. Rank r runs
    ``(v - 1) * round + 2 * (p - 1 - r)`` forwards before its first backward (capped at all of
    them), then alternates forward/backward, then drains the backwards.
    """
    if virtual_stages_per_rank < 1:
        raise InputError(f"virtual stages per rank must be >= 1, got {virtual_stages_per_rank}")
    _, per_round = interleaved_rounds(pipeline_degree, num_micro_batches)
    local_stages = virtual_stages_per_rank
    total = local_stages * num_micro_batches  # forwards (and backwards) per rank
    order: PipelineOrder = []
    for rank in range(pipeline_degree):
        warmup = min((local_stages - 1) * per_round + 2 * (pipeline_degree - 1 - rank), total)

        def forward_stage(op: int, rank: int = rank) -> int:
            return (op // per_round) % local_stages * pipeline_degree + rank

        def backward_stage(op: int, rank: int = rank, warmup: int = warmup) -> int:
            local = local_stages - 1 - ((op - warmup) // per_round) % local_stages
            return local * pipeline_degree + rank

        next_forward_mb: dict[int, int] = {}
        next_backward_mb: dict[int, int] = {}

        def take(counter: dict[int, int], stage: int) -> int:
            micro_batch = counter.get(stage, 0)
            counter[stage] = micro_batch + 1
            return micro_batch

        actions: list[Action] = []
        for op in range(warmup + total):
            if op < total:
                stage = forward_stage(op)
                actions.append(Action(stage, "F", take(next_forward_mb, stage)))
            if op >= warmup:
                stage = backward_stage(op)
                actions.append(Action(stage, "B", take(next_backward_mb, stage)))
        order.append(actions)
    return order


def schedule_order(
    schedule: ScheduleName,
    pipeline_degree: int,
    num_micro_batches: int,
    virtual_stages_per_rank: int = 1,
) -> PipelineOrder:
    """The per-rank action lists of ``schedule`` (the plan's ``parallelism.schedule``)."""
    if schedule in ("zbv", "dualpipev"):
        if virtual_stages_per_rank != 2:
            raise InputError(
                f"schedule {schedule!r} runs two stages per rank in a V; got "
                f"{virtual_stages_per_rank} virtual stages per rank"
            )
        if schedule == "zbv":
            return zbv_order(pipeline_degree, num_micro_batches)
        return dualpipev_order(pipeline_degree, num_micro_batches)
    if schedule == "interleaved_zero_bubble":
        return interleaved_zero_bubble_order(
            pipeline_degree, virtual_stages_per_rank, num_micro_batches
        )
    if schedule != "interleaved_1f1b" and virtual_stages_per_rank != 1:
        raise InputError(
            f"schedule {schedule!r} runs one stage per rank; got {virtual_stages_per_rank} "
            "virtual stages per rank"
        )
    if schedule == "gpipe":
        return gpipe_order(pipeline_degree, num_micro_batches)
    if schedule == "1f1b":
        return one_f_one_b_order(pipeline_degree, num_micro_batches)
    if schedule == "interleaved_1f1b":
        return interleaved_1f1b_order(pipeline_degree, virtual_stages_per_rank, num_micro_batches)
    raise InputError(
        f"unknown schedule {schedule!r}; known: gpipe, 1f1b, interleaved_1f1b, "
        "interleaved_zero_bubble, zbv, dualpipev"
    )
