"""Zero-bubble schedules in the search: each costed pipeline re-run under the zero-bubble
schedules its layout allows, kept when torch can run it.

The zero-bubble schedules have no closed form for the partition DPs to optimise (their time
comes from playing the action lists, ``cost.zero_bubble``), so they are searched at the
partitions the 1F1B-family search found best: a 1F1B plan (one stage per rank) is also tried
as ZB-H1 (``interleaved_zero_bubble``, v = 1), an interleaved 1F1B plan with v chunks as ZB1P
(same stages on the same ranks), and one with v = 2 as ZB-V and DualPipeV (the same layer
ranges, placed in the V: rank r holds stages r and 2p − 1 − r, when every stage has the same
groups). Each is costed by ``CostModel.evaluate`` (time and memory); what torch 2.13 cannot run
(``schedule.zero_bubble.zero_bubble_problem``: dp > 1, selective recompute, DualPipeV's m >=
2p, zero bubble's micro-batch rounds) is never produced. This is exact among these schedules
at those partitions, not a joint optimum over partitions and zero-bubble schedules.
"""

from __future__ import annotations

from collections.abc import Iterable

from autoplan.cost.config import PlanConfig
from autoplan.schedule.zero_bubble import zero_bubble_problem

__all__ = ["zero_bubble_variants"]


def zero_bubble_variants(
    configs: Iterable[PlanConfig], pinned: str | None = None
) -> list[PlanConfig]:
    """The zero-bubble versions of ``configs`` (module docstring), in a fixed order; only
    schedule ``pinned`` when given."""
    found: list[PlanConfig] = []
    seen: set[tuple] = set()
    for config in configs:
        pp, v, m = config.pipeline_degree, config.chunks, config.num_micro_batches
        if pp < 2 or config.schedule not in ("1f1b", "interleaved_1f1b"):
            continue
        replicas = max(sum(g.replicas for g in stage.groups) for stage in config.stages)
        modes = tuple(group.recompute for stage in config.stages for group in stage.groups)
        names = ["interleaved_zero_bubble"]
        if v == 2 and len({stage.groups for stage in config.stages}) == 1:
            names += ["zbv", "dualpipev"]
        for name in names:
            if pinned is not None and name != pinned:
                continue
            if zero_bubble_problem(name, pp, m, replicas, modes) is not None:
                continue
            variant = PlanConfig(m, name, v, config.stages, config.sequence_parallel)
            key = (name, v, m, config.stages)
            if key not in seen:
                seen.add(key)
                found.append(variant)
    return found
