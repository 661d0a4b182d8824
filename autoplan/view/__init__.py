"""Rich renderings of plans for ``autoplan show`` and ``autoplan compare`` (no torch)."""

from autoplan.view.compare import compare_table
from autoplan.view.memory_bars import memory_table
from autoplan.view.plan_tables import (
    alternatives_table,
    breakdown_table,
    plan_overview,
    plan_renderables,
    stages_table,
)

__all__ = [
    "alternatives_table",
    "breakdown_table",
    "compare_table",
    "memory_table",
    "plan_overview",
    "plan_renderables",
    "stages_table",
]
