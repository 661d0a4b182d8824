"""Schedules as data: autoplan's action lists against PyTorch's own, and the validator."""

from __future__ import annotations

import pytest
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _Action,
    _ComputationType,
    _validate_schedule,
)

from autoplan.errors import InputError
from autoplan.schedule import (
    Action,
    InvalidScheduleError,
    schedule_order,
    validate_order,
)


class RecordingStage:
    """Stands in for a PipelineStage: holds what PyTorch's schedule constructors read and logs
    the compute calls its ``_step_microbatches`` makes. No process group or tensors needed:
    its send/recv lists are empty, so the schedule runs its control flow alone."""

    def __init__(self, stage_index: int, num_stages: int, pipeline_degree: int) -> None:
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = pipeline_degree
        self.group_rank = stage_index % pipeline_degree
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.ran: list[str] = []

    def get_fwd_recv_ops(self, micro_batch: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, micro_batch: int, *args: object, **kwargs: object) -> None:
        self.ran.append(f"{self.stage_index}F{micro_batch}")

    def backward_one_chunk(self, micro_batch: int, **kwargs: object) -> None:
        self.ran.append(f"{self.stage_index}B{micro_batch}")

    def perform_reduce_grad(self, *args: object) -> None:
        pass


def _ours(schedule: str, pp: int, m: int, v: int = 1) -> dict[int, list[str]]:
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    return {rank: [str(action) for action in actions] for rank, actions in enumerate(order)}


def _compute_only(actions: list) -> list[str]:
    kinds = (_ComputationType.FORWARD, _ComputationType.FULL_BACKWARD)
    return [str(a) for a in actions if a is not None and a.computation_type in kinds]


def _executed(schedule_class: type, pp: int, m: int) -> dict[int, list[str]]:
    """What PyTorch's single-stage schedule actually runs on each rank."""
    ran = {}
    for rank in range(pp):
        stage = RecordingStage(rank, pp, pp)
        schedule = schedule_class(stage, m)
        # Stage set-up would exchange shapes with the neighbours; there are none here.
        schedule._initialize_stage = lambda *args, **kwargs: None
        schedule._step_microbatches()
        ran[rank] = stage.ran
    return ran


SINGLE_STAGE_CASES = [(1, 1), (1, 3), (2, 2), (2, 4), (3, 5), (4, 4), (4, 8), (5, 12)]


@pytest.mark.parametrize(("pp", "m"), SINGLE_STAGE_CASES)
def test_gpipe_equals_pytorch(pp: int, m: int) -> None:
    ours = _ours("gpipe", pp, m)
    assert ours == _executed(ScheduleGPipe, pp, m)
    listed = ScheduleGPipe(RecordingStage(0, pp, pp), m).pipeline_order
    assert ours == {rank: _compute_only(listed[rank]) for rank in range(pp)}


@pytest.mark.parametrize(("pp", "m"), SINGLE_STAGE_CASES)
def test_1f1b_equals_pytorch(pp: int, m: int) -> None:
    ours = _ours("1f1b", pp, m)
    assert ours == _executed(Schedule1F1B, pp, m)
    # PyTorch's 1F1B `pipeline_order` (its IR for the visualizer) numbers the last rank's
    # forwards from 1 to m instead of 0 to m-1 (torch 2.13); the run above is what executes,
    # so the listed IR is compared on the other ranks only.
    listed = Schedule1F1B(RecordingStage(0, pp, pp), m).pipeline_order
    for rank in range(pp - 1):
        assert ours[rank] == _compute_only(listed[rank])


@pytest.mark.parametrize(
    ("pp", "v", "m"),
    [(2, 2, 2), (2, 2, 4), (2, 3, 6), (4, 2, 4), (4, 2, 8), (4, 2, 10), (4, 3, 7), (3, 2, 6)],
)
def test_interleaved_1f1b_equals_pytorch(pp: int, v: int, m: int) -> None:
    """Interleaved 1F1B runs its IR: `pipeline_order`, lowered with sends and receives."""
    # Rank 0's stages; the schedule computes every rank's list from them.
    stages = [RecordingStage(local * pp, pp * v, pp) for local in range(v)]
    schedule = ScheduleInterleaved1F1B(stages, m)
    ours = _ours("interleaved_1f1b", pp, m, v)
    assert ours == {rank: _compute_only(schedule.pipeline_order[rank]) for rank in range(pp)}
    lowered = schedule.pipeline_order_with_comms
    assert ours == {rank: _compute_only(lowered[rank]) for rank in range(pp)}


def test_interleaved_rounds_rule_matches_pytorch() -> None:
    """pp=4, m=9: 2 rounds, and 9 is not a multiple of 2; both refuse."""
    with pytest.raises(ValueError, match="multiple of the number of rounds"):
        ScheduleInterleaved1F1B([RecordingStage(0, 8, 4), RecordingStage(4, 8, 4)], 9)
    with pytest.raises(InputError, match="not a multiple of 2"):
        schedule_order("interleaved_1f1b", 4, 9, 2)


def test_1f1b_refuses_fewer_micro_batches_than_stages() -> None:
    with pytest.raises(InputError, match=r"micro-batches \(2\).*stages \(3\)"):
        schedule_order("1f1b", 3, 2)


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "v"),
    [("gpipe", 4, 6, 1), ("1f1b", 4, 6, 1), ("interleaved_1f1b", 4, 8, 2), ("1f1b", 1, 3, 1)],
)
def test_generated_schedules_are_valid(schedule: str, pp: int, m: int, v: int) -> None:
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    validate_order(order, pp, pp * v, m)
    every = [action for actions in order for action in actions]
    assert len(every) == len(set(every)) == 2 * pp * v * m


def _parse(rows: list[str]) -> list[list[Action]]:
    return [[Action.parse(text) for text in row.split()] for row in rows]


def test_action_text_round_trips() -> None:
    assert str(Action.parse("12B3")) == "12B3"
    assert Action.parse("2F0") == Action(2, "F", 0)
    with pytest.raises(InputError, match="'2X0'"):
        Action.parse("2X0")


def test_validator_reports_backward_before_forward_on_the_grid() -> None:
    order = _parse(["0F0 0B0 0F1 0B1", "1F0 1B1 1F1 1B0"])
    with pytest.raises(InvalidScheduleError) as caught:
        validate_order(order, 2, 2, 2)
    message = str(caught.value)
    assert "rank 1, step 1: 1B1: backward before its forward" in message
    error_lines = [line for line in message.splitlines() if "<-- ERROR HERE" in line]
    assert error_lines == ["Step 1: 0B0    1B1 <-- ERROR HERE"]


def test_validator_finds_deadlock_and_marks_the_stuck_step() -> None:
    # Rank 0 waits for 1B0 before sending 0F1; rank 1 waits for 0F1 before running 1B0.
    order = _parse(["0F0 0B0 0F1 0B1", "1F0 1F1 1B0 1B1"])
    with pytest.raises(InvalidScheduleError) as caught:
        validate_order(order, 2, 2, 2)
    message = str(caught.value)
    assert "deadlock" in message
    assert "rank 0's 0B0 waits for 1B0" in message
    assert "rank 1's 1F1 waits for 0F1" in message
    assert "Step 2: (0B0?) (1F1?) <-- ERROR HERE" in message


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        (["0F0 0F0 0B0", "1F0 1B0"], "runs twice"),
        (["0F0 0B0", "1F0"], "1 actions never run: 1B0"),
        (["0F0 1F0 0B0", "1B0"], "stage 1 runs on rank 1"),
        (["0F0 0B0 0F5", "1F0 1B0"], "micro-batch 5 is not in 0..0"),
    ],
)
def test_validator_rejects_malformed_lists(rows: list[str], expected: str) -> None:
    with pytest.raises(InvalidScheduleError, match=expected):
        validate_order(_parse(rows), 2, 2, 1)


def _as_pytorch(order: list[list[Action]]) -> dict[int, list]:
    """Our lists in PyTorch's IR, through its own parser of the "2F0" text form."""
    return {
        rank: [_Action.from_str(str(action)) for action in actions]
        for rank, actions in enumerate(order)
    }


@pytest.mark.parametrize(
    ("schedule", "pp", "m", "v"),
    [
        ("gpipe", 3, 4, 1),
        ("1f1b", 4, 6, 1),
        ("interleaved_1f1b", 4, 8, 2),
        ("interleaved_1f1b", 2, 6, 3),
    ],
)
def test_pytorch_validator_accepts_our_lists(schedule: str, pp: int, m: int, v: int) -> None:
    order = schedule_order(schedule, pp, m, v)  # type: ignore[arg-type]
    stage_to_rank = _validate_schedule(_as_pytorch(order), pp, pp * v, m)
    assert stage_to_rank == {stage: stage % pp for stage in range(pp * v)}


def test_both_validators_reject_a_backward_before_its_forward() -> None:
    order = _parse(["0F0 0B0 0F1 0B1", "1F0 1B1 1F1 1B0"])
    with pytest.raises(AssertionError, match="Rank 1, step 1: Running Full Backward"):
        _validate_schedule(_as_pytorch(order), 2, 2, 2)
    with pytest.raises(InvalidScheduleError, match="rank 1, step 1"):
        validate_order(order, 2, 2, 2)
