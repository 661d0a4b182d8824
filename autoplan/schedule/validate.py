"""Check a schedule before anything runs it, and show where a bad one goes wrong.

Three checks, each failing with PyTorch's picture of a schedule (a step × rank grid with
``<-- ERROR HERE`` on the step at fault):

1. every action runs on the rank that holds its stage and is one of the run's stages and
   micro-batches, once; a backward comes after its forward;
2. every stage runs a forward and a backward of every micro-batch;
3. the ranks, each running its list in order, can all finish: one step per action, an action
   runs once the action it waits for (the previous stage's forward, the next stage's backward)
   ran at an earlier step. If at some step no rank can move, the schedule would deadlock.
"""

from __future__ import annotations

from itertools import zip_longest

from autoplan.errors import InputError
from autoplan.schedule.actions import Action, ActionKind, PipelineOrder
from autoplan.schedule.names import stage_rank

__all__ = [
    "InvalidScheduleError",
    "format_grid",
    "unit_step_grid",
    "validate_order",
    "waits_for",
]


class InvalidScheduleError(InputError):
    """A schedule that cannot run; the message holds the grid with ``<-- ERROR HERE``."""


Grid = list[list[str]]
"""``grid[r][t]``: what rank ``r`` does at step ``t`` ("" when idle)."""


# A full backward (B) and its input-gradient half (I) run the same backward twice.
_OTHER_HALF: dict[ActionKind, ActionKind] = {"B": "I", "I": "B"}


def format_grid(grid: Grid, error_step: int | None = None) -> str:
    """Steps as rows and ranks as columns, as PyTorch prints a pipeline order."""
    num_steps = max((len(row) for row in grid), default=0)
    width_of_step = len(str(max(num_steps - 1, 0)))
    step_labels = [f"Step {str(step).zfill(width_of_step)}" for step in range(num_steps)]
    columns = [list(row) + [""] * (num_steps - len(row)) for row in grid]
    rank_labels = [f"Rank {rank}" for rank in range(len(grid))]
    widths = [
        max(len(label), *(len(cell) for cell in column))
        for label, column in zip(rank_labels, columns, strict=True)
    ]
    lines = [
        " " * (len(step_labels[0]) + 2 if step_labels else 0)
        + " ".join(label.ljust(width) for label, width in zip(rank_labels, widths, strict=True))
    ]
    for step, cells in enumerate(zip_longest(*columns, fillvalue="")):
        marker = " <-- ERROR HERE" if step == error_step else ""
        row = " ".join(cell.ljust(width) for cell, width in zip(cells, widths, strict=True))
        lines.append(f"{step_labels[step]}: {row.rstrip()}{marker}")
    return "\n".join(lines) + "\n"


def _list_grid(order: PipelineOrder) -> Grid:
    return [[str(action) for action in actions] for actions in order]


def _fail(message: str, grid: Grid, step: int | None) -> InvalidScheduleError:
    return InvalidScheduleError(f"{message}\n\nFull pipeline schedule:\n{format_grid(grid, step)}")


def _check_actions(
    order: PipelineOrder,
    pipeline_degree: int,
    num_stages: int,
    num_micro_batches: int,
    v_shape: bool = False,
) -> None:
    grid = _list_grid(order)
    seen: dict[Action, int] = {}
    for rank, actions in enumerate(order):
        for step, action in enumerate(actions):
            where = f"rank {rank}, step {step}: {action}"
            if not 0 <= action.stage < num_stages:
                raise _fail(
                    f"{where}: stage {action.stage} is not in 0..{num_stages - 1}", grid, step
                )
            if not 0 <= action.micro_batch < num_micro_batches:
                raise _fail(
                    f"{where}: micro-batch {action.micro_batch} is not in "
                    f"0..{num_micro_batches - 1}",
                    grid,
                    step,
                )
            holder = stage_rank(action.stage, pipeline_degree, v_shape=v_shape)
            if holder != rank:
                rule = "the V placement" if v_shape else "stage % pp"
                raise _fail(
                    f"{where}: stage {action.stage} runs on rank {holder} ({rule}), "
                    f"not rank {rank}",
                    grid,
                    step,
                )
            if action in seen:
                raise _fail(f"{where}: runs twice (first at step {seen[action]})", grid, step)
            other_half = _OTHER_HALF.get(action.kind)
            if other_half and Action(action.stage, other_half, action.micro_batch) in seen:
                raise _fail(f"{where}: backward runs twice (as B and as I)", grid, step)
            if action.kind in "BI" and Action(action.stage, "F", action.micro_batch) not in seen:
                raise _fail(f"{where}: backward before its forward", grid, step)
            if action.kind == "W" and Action(action.stage, "I", action.micro_batch) not in seen:
                raise _fail(f"{where}: weight gradient before its input gradient", grid, step)
            seen[action] = step
    missing = [
        str(Action(stage, kind, mb))
        for stage in range(num_stages)
        for mb in range(num_micro_batches)
        # A split backward (I then W) stands for B.
        for kind in (("F", "I", "W") if Action(stage, "I", mb) in seen else ("F", "B"))
        if Action(stage, kind, mb) not in seen
    ]
    if missing:
        shown = " ".join(missing[:8]) + (
            f" (and {len(missing) - 8} more)" if len(missing) > 8 else ""
        )
        raise _fail(f"{len(missing)} actions never run: {shown}", grid, None)


def waits_for(action: Action, num_stages: int) -> Action | None:
    """The action on another stage that must finish before ``action`` can start, if any.

    A backward (B, or its input half I) waits for the next stage's input gradient, written
    ``B`` whichever form that stage runs (the unit-step run records an I as its B). A weight
    half W waits only for its own I on the same rank, which the list order already ensures."""
    if action.kind == "W":
        return None
    if action.kind == "F":
        return Action(action.stage - 1, "F", action.micro_batch) if action.stage > 0 else None
    if action.stage < num_stages - 1:
        return Action(action.stage + 1, "B", action.micro_batch)
    return None  # the last stage's backward starts from its own loss


def _run_unit_steps(
    order: PipelineOrder, num_stages: int
) -> tuple[Grid, int | None, dict[int, Action]]:
    position = [0] * len(order)
    done_at: dict[Action, int] = {}
    grid: Grid = [[] for _ in order]
    step = 0
    while any(position[rank] < len(actions) for rank, actions in enumerate(order)):
        moved: list[Action] = []
        for rank, actions in enumerate(order):
            cell = ""
            if position[rank] < len(actions):
                action = actions[position[rank]]
                needed = waits_for(action, num_stages)
                if needed is None or done_at.get(needed, step) < step:
                    cell = str(action)
                    moved.append(action)
                    position[rank] += 1
            grid[rank].append(cell)
        if not moved:
            blocked = {
                rank: actions[position[rank]]
                for rank, actions in enumerate(order)
                if position[rank] < len(actions)
            }
            for rank, action in blocked.items():
                grid[rank][-1] = f"({action}?)"
            return grid, step, blocked
        for action in moved:
            done_at[action] = step
            if action.kind == "I":  # the input gradient is what the previous stage waits for
                done_at[Action(action.stage, "B", action.micro_batch)] = step
        step += 1
    return grid, None, {}


def unit_step_grid(order: PipelineOrder, num_stages: int) -> tuple[Grid, int | None]:
    """Run the lists with one step per action: the grid, and the step where all ranks are stuck.

    Within a step the ranks move at once: an action may only use results of earlier steps, as
    in PyTorch's grids. At a stuck step each rank's blocked action shows as ``(0B0?)``.
    """
    grid, stuck_step, _ = _run_unit_steps(order, num_stages)
    return grid, stuck_step


def validate_order(
    order: PipelineOrder,
    pipeline_degree: int,
    num_stages: int,
    num_micro_batches: int,
    v_shape: bool = False,
) -> None:
    """Raise InvalidScheduleError (with the grid) unless ``order`` is a runnable schedule.

    ``v_shape``: stages sit in a V (rank r holds r and 2pp-1-r: zbv, dualpipev)."""
    if len(order) != pipeline_degree:
        raise InvalidScheduleError(
            f"schedule has {len(order)} ranks; the pipeline has {pipeline_degree}"
        )
    if num_stages % pipeline_degree:
        raise InvalidScheduleError(
            f"{num_stages} stages do not split evenly over {pipeline_degree} pipeline ranks"
        )
    _check_actions(order, pipeline_degree, num_stages, num_micro_batches, v_shape)
    grid, stuck_step, blocked = _run_unit_steps(order, num_stages)
    if stuck_step is not None:
        waits = "; ".join(
            f"rank {rank}'s {action} waits for {waits_for(action, num_stages)}"
            for rank, action in blocked.items()
        )
        raise _fail(f"step {stuck_step}: no rank can move (deadlock): {waits}", grid, stuck_step)
