"""Per-rank action orders of the zero-bubble schedules, computed from (pp, v, m) without torch.

These are the compute orders of PyTorch's ScheduleInterleavedZeroBubble (ZB1P of Qi et al.,
"Zero Bubble Pipeline Parallelism", ICLR'24; with one stage per rank it is ZB-H1),
ScheduleZBVZeroBubble (their ZB-V, §6) and ScheduleDualPipeV (DeepSeek-V3's DualPipe folded
into a V), as torch 2.13 computes them in ``_calculate_single_rank_operations``; the
construction is followed step by step so that tests/test_schedule_zero_bubble.py can prove the
lists equal PyTorch's ``pipeline_order``. The backward is split into ``I`` (input gradient,
what the previous stage waits for) and ``W`` (weight gradient, deferred to fill bubbles).

Placement: interleaved zero bubble puts stage ``s`` on rank ``s % p`` like interleaved 1F1B;
the V schedules put stages ``r`` and ``2p - 1 - r`` on rank ``r``
(``Parallelism.rank_of_stage``). DualPipeV's overlapped forward+backward pairs
(``OVERLAP_F_B``) are written as their two sub-actions, forward first, the order PyTorch
runs them in on one device; the idle steps (None) PyTorch pads its grids with are dropped.
"""

from __future__ import annotations

from autoplan.errors import InputError
from autoplan.schedule.actions import Action, ActionKind, PipelineOrder
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES

__all__ = [
    "dualpipev_order",
    "interleaved_zero_bubble_order",
    "zbv_order",
    "zero_bubble_problem",
    "zero_bubble_rounds",
]


def zero_bubble_rounds(pipeline_degree: int, num_micro_batches: int) -> tuple[int, int]:
    """(rounds, micro-batches per round) of interleaved zero bubble, as PyTorch computes them:
    ``rounds = max(1, m // p)``, and ``m`` must be a multiple of ``rounds``."""
    if pipeline_degree < 1 or num_micro_batches < 1:
        raise InputError(
            f"zero bubble needs pp >= 1 and micro-batches >= 1, got pp={pipeline_degree}, "
            f"m={num_micro_batches}"
        )
    rounds = max(1, num_micro_batches // pipeline_degree)
    if num_micro_batches % rounds:
        raise InputError(
            f"interleaved zero bubble with pp={pipeline_degree} runs {rounds} rounds of "
            f"micro-batches; {num_micro_batches} micro-batches is not a multiple of {rounds}"
        )
    return rounds, num_micro_batches // rounds


class _RankList:
    """One rank's list under construction, with the next micro-batch per (stage, kind) as
    PyTorch's per-stage index dicts, and DualPipeV's queue of deferred weight gradients."""

    def __init__(self) -> None:
        self.actions: list[Action] = []
        self.next: dict[tuple[int, str], int] = {}
        self.weight_queue: list[tuple[int, int]] = []

    def take(self, stage: int, kind: str) -> int:
        micro_batch = self.next.get((stage, kind), 0)
        self.next[(stage, kind)] = micro_batch + 1
        return micro_batch

    def done(self, stage: int, kind: str) -> int:
        return self.next.get((stage, kind), 0)

    def add(self, stage: int, kind: ActionKind) -> None:
        self.actions.append(Action(stage, kind, self.take(stage, kind)))

    def add_dualpipe(self, stage: int, kind: ActionKind) -> None:
        """DualPipeV's counting: a full backward takes the I counter's micro-batch and bumps
        both I and W; an I queues its W."""
        if kind == "B":
            micro_batch = self.take(stage, "I")
            self.take(stage, "W")
        else:
            micro_batch = self.take(stage, kind)
            if kind == "I":
                self.weight_queue.append((stage, micro_batch))
        self.actions.append(Action(stage, kind, micro_batch))

    def add_pending_weight(self) -> None:
        if self.weight_queue:
            stage, micro_batch = self.weight_queue.pop(0)
            self.take(stage, "W")
            self.actions.append(Action(stage, "W", micro_batch))


def interleaved_zero_bubble_order(
    pipeline_degree: int, virtual_stages_per_rank: int, num_micro_batches: int
) -> PipelineOrder:
    """ZB1P (ZB-H1 for v = 1): 1F1B with I in place of B; rank r runs its first r backwards
    whole-step (I only, W queued) and from then on one deferred W after each I, then drains
    the queued Ws. Warm-up forwards: (v - 1) × round + (p - 1 - r), capped at m × v."""
    p, v = pipeline_degree, virtual_stages_per_rank
    if v < 1:
        raise InputError(f"virtual stages per rank must be >= 1, got {v}")
    _, per_round = zero_bubble_rounds(p, num_micro_batches)
    total = v * num_micro_batches
    order: PipelineOrder = []
    for rank in range(p):
        warmup = min((v - 1) * per_round + (p - 1 - rank), total)

        def forward_stage(op: int, rank: int = rank) -> int:
            return (op // per_round) % v * p + rank

        def backward_stage(op: int, rank: int = rank, warmup: int = warmup) -> int:
            return (v - 1 - ((op - warmup) // per_round) % v) * p + rank

        ranked = _RankList()
        add = ranked.add
        backward_ops: list[int] = []
        weights_done = 0
        for op in range(warmup + total):
            if op < total:
                add(forward_stage(op), "F")
            if op >= warmup:
                add(backward_stage(op), "I")
                backward_ops.append(op)
                # PyTorch: the first `rank` backwards of the steady part keep their W queued.
                if op - warmup >= rank:
                    add(backward_stage(backward_ops[weights_done]), "W")
                    weights_done += 1
        while weights_done < len(backward_ops):
            add(backward_stage(backward_ops[weights_done]), "W")
            weights_done += 1
        order.append(ranked.actions)
    return order


def zbv_order(pipeline_degree: int, num_micro_batches: int) -> PipelineOrder:
    """ZB-V: rank r holds stages r (chunk 0) and 2p - 1 - r (chunk 1). Warm-up
    2(p - r) - 1 chunk-0 forwards, r (F1, F0) pairs, p - r (F1, I1, W1); steady (F0, I0, W0,
    F1, I1, W1); cool-down r (I0, I1), p - r (I0, W0), then the queued W1s and W0s. PyTorch
    builds it for max(2p - 1, m) micro-batches and blanks those past m, so they are dropped."""
    p, m = pipeline_degree, num_micro_batches
    if p < 1 or m < 1:
        raise InputError(f"ZB-V needs pp >= 1 and micro-batches >= 1, got pp={p}, m={m}")
    n_micro = max(2 * p - 1, m)
    order: PipelineOrder = []
    for rank in range(p):
        chunk0, chunk1 = rank, 2 * p - 1 - rank
        ranked = _RankList()
        add, done = ranked.add, ranked.done
        for _ in range(2 * (p - rank) - 1):
            add(chunk0, "F")
        for _ in range(rank):
            add(chunk1, "F")
            add(chunk0, "F")
        for _ in range(p - rank):
            add(chunk1, "F")
            add(chunk1, "I")
            add(chunk1, "W")
        while done(chunk1, "F") < done(chunk0, "F") or done(chunk0, "F") < n_micro:
            if done(chunk0, "F") < n_micro:
                add(chunk0, "F")
            add(chunk0, "I")
            add(chunk0, "W")
            add(chunk1, "F")
            add(chunk1, "I")
            add(chunk1, "W")
        for _ in range(rank):
            add(chunk0, "I")
            add(chunk1, "I")
        for _ in range(p - rank):
            add(chunk0, "I")
            add(chunk0, "W")
        while done(chunk1, "W") < done(chunk1, "I"):
            add(chunk1, "W")
        while done(chunk0, "W") < done(chunk0, "I"):
            add(chunk0, "W")
        order.append([action for action in ranked.actions if action.micro_batch < m])
    return order


def dualpipev_order(pipeline_degree: int, num_micro_batches: int) -> PipelineOrder:
    """DualPipeV as PyTorch builds it (from deepseek-ai/DualPipe): eight phases per rank of
    forwards, full backwards, split I/W backwards and overlapped F+B pairs; PyTorch requires
    m >= 2p (at least as many micro-batches as stages)."""
    p, m = pipeline_degree, num_micro_batches
    if p < 1 or m < 2 * p:
        raise InputError(
            f"DualPipeV needs at least as many micro-batches ({m}) as stages ({2 * p})"
        )
    order: PipelineOrder = []
    for rank in range(p):
        stage0, stage1 = rank, 2 * p - 1 - rank
        ranked = _RankList()
        add, add_pending_weight = ranked.add_dualpipe, ranked.add_pending_weight

        for _ in range((p - rank - 1) * 2):
            add(stage0, "F")
        for _ in range(rank + 1):
            add(stage0, "F")
            add(stage1, "F")
        for _ in range(p - rank - 1):
            add(stage1, "I")
            add_pending_weight()
            add(stage1, "F")
        # Main phase: overlapped pairs (F of one chunk with B of the other); PyTorch runs the
        # last rank's first pair unoverlapped, which on one device is the same order.
        for _ in range(m - 2 * p + rank + 1):
            add(stage0, "F")
            add(stage1, "B")
            add(stage1, "F")
            add(stage0, "B")
        for _ in range(p - rank - 1):
            add(stage1, "B")
            add(stage1, "F")
            add(stage0, "B")
        split = False
        steps = rank + 1
        for i in range(steps):
            if i == steps // 2 and rank % 2 == 1:
                split = True
            add(stage1, "I" if split else "B")
            if i == steps // 2 and rank % 2 == 0:
                split = True
            add(stage0, "I" if split else "B")
        for _ in range(p - rank - 1):
            add_pending_weight()
            add(stage0, "I" if split else "B")
        for _ in range(rank + 1):
            add_pending_weight()
        order.append(ranked.actions)
    return order


def zero_bubble_problem(
    schedule: str,
    pipeline_degree: int,
    num_micro_batches: int,
    data_parallel_degree: int,
    recompute_modes: tuple[str, ...] = (),
) -> str | None:
    """Why PyTorch cannot run (or autoplan will not emit) this zero-bubble plan, in one line;
    None when it can, or when ``schedule`` is not a zero-bubble one.

    The rules are torch's (micro-batch rounds of interleaved zero bubble, m >= 2p for
    DualPipeV; v = 2 for the V schedules is the plan schema's) and two found by running
    torch 2.13 on gloo (tests/test_runtime_zero_bubble.py runs what passes): with dp > 1 the
    split backward under DDP stops at the first W ("gradient which is undefined, but still
    allreduced by DDP reducer"), and under selective recompute it stops at the W too ("backward
    an extra time ... selective activation checkpoint"). Full recompute runs and is exact."""
    if schedule not in ZERO_BUBBLE_SCHEDULES:
        return None
    if data_parallel_degree > 1:
        return (
            f"schedule {schedule} with data parallel {data_parallel_degree}: torch 2.13's "
            "zero-bubble schedules fail under DDP with dp > 1; use dp 1 or another schedule"
        )
    if "selective" in recompute_modes:
        return (
            f"schedule {schedule} with selective recompute: torch 2.13's selective checkpoint "
            "refuses the split backward; use none or full recompute, or another schedule"
        )
    try:
        if schedule == "interleaved_zero_bubble":
            zero_bubble_rounds(pipeline_degree, num_micro_batches)
        elif schedule == "dualpipev":
            dualpipev_order(pipeline_degree, num_micro_batches)
    except InputError as error:
        return str(error)
    return None
