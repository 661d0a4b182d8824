"""Zero-bubble schedules as data: autoplan's I/W action lists against PyTorch's own."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import (
    ScheduleDualPipeV,
    ScheduleInterleavedZeroBubble,
    ScheduleZBVZeroBubble,
    _Action,
    _ComputationType,
    _validate_schedule,
)

from autoplan.errors import InputError, PlanInvalidError
from autoplan.plan.validate import plan_problems, validate_plan
from autoplan.schedule import Action, InvalidScheduleError, schedule_order, validate_order
from autoplan.schedule.zero_bubble import zero_bubble_problem
from tests.plan_factory import make_plan
from tests.test_schedule import RecordingStage

_COMPUTE = (
    _ComputationType.FORWARD,
    _ComputationType.FULL_BACKWARD,
    _ComputationType.BACKWARD_INPUT,
    _ComputationType.BACKWARD_WEIGHT,
)
_CLASSES = {
    "interleaved_zero_bubble": ScheduleInterleavedZeroBubble,
    "zbv": ScheduleZBVZeroBubble,
    "dualpipev": ScheduleDualPipeV,
}


class ModuleFreeStage(RecordingStage):
    """The zero-bubble constructors look for torch.compile'd modules in ``submod``."""

    submod = None


def _compute_only(actions: list) -> list[str]:
    """PyTorch's IR without idle steps; an overlapped F+B pair as its two sub-actions."""
    out: list[str] = []
    for action in actions:
        if action is None:
            continue
        if action.computation_type == _ComputationType.OVERLAP_F_B:
            out.extend(str(sub) for sub in action.sub_actions)
        elif action.computation_type in _COMPUTE:
            out.append(str(action))
    return out


def _pytorch(schedule: str, pp: int, v: int, m: int) -> dict[int, list[str]]:
    if schedule == "interleaved_zero_bubble":
        stages = [ModuleFreeStage(local * pp, pp * v, pp) for local in range(v)]
    else:  # rank 0's two stages of the V
        stages = [ModuleFreeStage(0, 2 * pp, pp), ModuleFreeStage(2 * pp - 1, 2 * pp, pp)]
    built = _CLASSES[schedule](stages, m)
    return {rank: _compute_only(built.pipeline_order[rank]) for rank in range(pp)}


def _ours(schedule: str, pp: int, v: int, m: int) -> dict[int, list[str]]:
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    return {rank: [str(action) for action in actions] for rank, actions in enumerate(order)}


CASES = (
    [
        ("interleaved_zero_bubble", pp, v, m)
        for pp, v, m in [
            (1, 1, 3),
            (2, 1, 2),
            (4, 1, 4),
            (4, 1, 8),
            (3, 1, 6),
            (2, 2, 4),
            (4, 2, 8),
            (4, 2, 12),
            (3, 3, 6),
            (4, 2, 3),
        ]
    ]
    + [("zbv", pp, 2, m) for pp, m in [(1, 1), (2, 2), (2, 3), (3, 5), (4, 8), (4, 12), (3, 2)]]
    + [("dualpipev", pp, 2, m) for pp, m in [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 11)]]
)


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), CASES)
def test_zero_bubble_orders_equal_pytorch(schedule: str, pp: int, v: int, m: int) -> None:
    ours = _ours(schedule, pp, v, m)
    assert ours == _pytorch(schedule, pp, v, m)
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    validate_order(order, pp, pp * v, m, v_shape=schedule != "interleaved_zero_bubble")
    # Each (stage, micro-batch) runs F and either B or I + W, once each.
    every = [action for actions in order for action in actions]
    assert len(every) == len(set(every))
    for stage in range(pp * v):
        for mb in range(m):
            split = Action(stage, "I", mb) in every
            assert (Action(stage, "W", mb) in every) == split
            assert (Action(stage, "B", mb) in every) != split


@pytest.mark.parametrize(("schedule", "pp", "v", "m"), [CASES[7], CASES[12], CASES[-2]])
def test_pytorch_validator_accepts_our_split_lists(schedule: str, pp: int, v: int, m: int) -> None:
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    ir = {r: [_Action.from_str(str(a)) for a in acts] for r, acts in enumerate(order)}
    stage_to_rank = _validate_schedule(ir, pp, pp * v, m)
    if schedule == "interleaved_zero_bubble":
        assert stage_to_rank == {stage: stage % pp for stage in range(pp * v)}
    else:
        assert stage_to_rank == {s: s if s < pp else 2 * pp - 1 - s for s in range(2 * pp)}


def test_zero_bubble_defers_weight_gradients() -> None:
    """ZB-H1 on 4 ranks: rank r's first r backwards leave W queued; rank 0 never defers."""
    order = schedule_order("interleaved_zero_bubble", 4, 8, 1)
    for rank, actions in enumerate(order):
        first_w = next(i for i, a in enumerate(actions) if a.kind == "W")
        inputs_before = sum(1 for a in actions[:first_w] if a.kind == "I")
        assert inputs_before == rank + 1


@pytest.mark.parametrize(
    ("schedule", "pp", "v", "m", "message"),
    [
        ("interleaved_zero_bubble", 4, 2, 9, "not a multiple of 2"),
        ("dualpipev", 3, 2, 5, r"micro-batches \(5\) as stages \(6\)"),
        ("zbv", 3, 3, 6, "two stages per rank in a V"),
    ],
)
def test_refusals_match_pytorch(schedule: str, pp: int, v: int, m: int, message: str) -> None:
    with pytest.raises(InputError, match=message):
        schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    if schedule != "zbv":
        with pytest.raises(ValueError):
            _pytorch(schedule, pp, v, m)


def _parse(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(text) for text in row.split()] for row in rows]


@pytest.mark.parametrize(
    ("rows", "v_shape", "expected"),
    [
        (["0F0 0W0 0I0", "1F0 1B0"], False, "weight gradient before its input gradient"),
        (["0F0 0I0 0B0 0W0", "1F0 1B0"], False, "backward runs twice"),
        (["0F0 0I0", "1F0 1B0"], False, "1 actions never run: 0W0"),
        (["0F0 1F0 1B0 0B0", ""], False, "stage 1 runs on rank 1"),
        (["0F0 2F0 2B0 0B0", "1F0 1B0 3F0 3B0"], True, r"stage 2 runs on rank 1 \(the V"),
    ],
)
def test_validator_checks_split_backwards(rows: list[str], v_shape: bool, expected: str) -> None:
    with pytest.raises(InvalidScheduleError, match=expected):
        validate_order(_parse(rows), 2, 4 if v_shape else 2, 1, v_shape=v_shape)


def test_input_gradient_unblocks_the_previous_stage() -> None:
    """Stage 0's backward waits for stage 1's I, not for its W (which comes last)."""
    order = _parse(["0F0 0I0 0W0", "1F0 1I0 1W0"])
    validate_order(order, 2, 2, 1)
    deadlock = _parse(["0F0 0B0", "1F0 1W0 1I0"])
    with pytest.raises(InvalidScheduleError, match="weight gradient before"):
        validate_order(deadlock, 2, 2, 1)


def test_validator_refuses_zero_bubble_plans_torch_cannot_run() -> None:
    """dp > 1 and selective recompute stop torch 2.13's split backward (see zero_bubble)."""
    zbv = {"virtual_stages_per_rank": 2, "schedule": "zbv", "num_micro_batches": 4}
    assert plan_problems(make_plan([2, 1, 1, 2], **zbv)) == []
    dp2 = plan_problems(make_plan([2, 1, 1, 2], data_parallel=2, **zbv))
    assert [p for p in dp2 if "zbv" in p] == [
        "schedule zbv with data parallel 2: torch 2.13's zero-bubble schedules fail under DDP "
        "with dp > 1; use dp 1 or another schedule"
    ]
    selective = plan_problems(make_plan([2, 1, 1, 2], recompute="selective", **zbv))
    assert any("selective checkpoint refuses the split backward" in p for p in selective)
    short = plan_problems(
        make_plan(
            [1, 1, 1, 1, 1, 1],
            virtual_stages_per_rank=2,
            schedule="dualpipev",
            num_micro_batches=5,
            micro_batch_size=2,
        )
    )
    assert any(
        "DualPipeV needs at least as many micro-batches (5) as stages (6)" in p for p in short
    )
    with pytest.raises(PlanInvalidError, match="zero-bubble schedules fail under DDP"):
        validate_plan(make_plan([3, 3], data_parallel=2, schedule="interleaved_zero_bubble"))


def test_zero_bubble_problem_passes_other_schedules() -> None:
    assert zero_bubble_problem("1f1b", 4, 8, 8, ("selective",)) is None
    assert zero_bubble_problem("interleaved_zero_bubble", 4, 8, 1, ("full", "none")) is None
    assert "not a multiple of 2" in str(zero_bubble_problem("interleaved_zero_bubble", 4, 9, 1))
