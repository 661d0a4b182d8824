"""The pipeline schedules by name, which of them run several stages per rank, and which rank
runs each stage: the one place the plan schema, the cost model, the simulator, the validators
and the runtime read these from."""

from __future__ import annotations

from typing import Literal

__all__ = [
    "MULTI_STAGE_SCHEDULES",
    "V_SCHEDULES",
    "ZERO_BUBBLE_SCHEDULES",
    "ScheduleName",
    "stage_rank",
]

ScheduleName = Literal[
    "gpipe", "1f1b", "interleaved_1f1b", "interleaved_zero_bubble", "zbv", "dualpipev", "async_pb"
]
# Schedules that run more than one stage per pipeline rank (``virtual_stages_per_rank``).
MULTI_STAGE_SCHEDULES = ("interleaved_1f1b", "interleaved_zero_bubble", "zbv", "dualpipev")
# Schedules whose ranks hold two stages in a V: rank r runs stages r and 2·pp − 1 − r.
V_SCHEDULES = ("zbv", "dualpipev")
# Schedules that split the backward into input (I) and weight (W) gradients.
ZERO_BUBBLE_SCHEDULES = ("interleaved_zero_bubble", "zbv", "dualpipev")


def stage_rank(stage_index: int, pipeline_degree: int, *, v_shape: bool) -> int:
    """The pipeline rank that runs stage ``stage_index``: ``s % pp`` (round robin, as
    interleaved 1F1B places its chunks), or in a V (``V_SCHEDULES``) stage s < pp on rank s
    and stage s >= pp on rank 2·pp − 1 − s."""
    if v_shape and stage_index >= pipeline_degree:
        return 2 * pipeline_degree - 1 - stage_index
    return stage_index % pipeline_degree
