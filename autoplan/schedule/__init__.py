"""Pipeline schedules as data: per-rank action lists, their validator, no torch."""

from autoplan.schedule.actions import Action, ActionKind, PipelineOrder, format_order
from autoplan.schedule.orders import (
    gpipe_order,
    interleaved_1f1b_order,
    interleaved_rounds,
    one_f_one_b_order,
    schedule_order,
)
from autoplan.schedule.validate import (
    InvalidScheduleError,
    format_grid,
    unit_step_grid,
    validate_order,
    waits_for,
)
from autoplan.schedule.zero_bubble import (
    dualpipev_order,
    interleaved_zero_bubble_order,
    zbv_order,
    zero_bubble_rounds,
)

__all__ = [
    "Action",
    "ActionKind",
    "InvalidScheduleError",
    "PipelineOrder",
    "dualpipev_order",
    "format_grid",
    "format_order",
    "gpipe_order",
    "interleaved_1f1b_order",
    "interleaved_rounds",
    "interleaved_zero_bubble_order",
    "one_f_one_b_order",
    "schedule_order",
    "unit_step_grid",
    "validate_order",
    "waits_for",
    "zbv_order",
    "zero_bubble_rounds",
]
