"""Fit per-GPU-type efficiency and step overhead to measured runs of plans.

A run report (``autoplan.runtime.report.RunReport``) measures, per step, the schedule's time
(forward, backward and their communication) and the optimizer's; the plan it ran predicted
both, with a breakdown (``Prediction.breakdown``). Of the predicted schedule time, compute and
the bubble scale as 1 / efficiency (the bubble is compute waiting on compute); tp, pipeline
and exposed data-parallel communication do not. So for one run

    measured schedule = s · (compute + bubble) + (tp + pp + dp communication)

gives the factor s by which the GPU type's work ran slower than predicted, and its fitted
efficiency ceiling is the plan's / s (at most 1: a run faster than peak is capped, and said
so). Only the matmuls scale with the ceiling, so where memory-bound ops or launch floors
dominate a run, one refit leaves part of the gap: calibrate again from a run of the new plan.

The optimizer's predicted time is its memory traffic; what the measured optimizer
step takes beyond it is per-step fixed cost (launches, Python, zeroing gradients), so

    step_overhead_ms = measured optimizer − predicted optimizer   (at least 0).

Several reports: each GPU type takes the geometric mean of its runs' s and the mean of their
overheads. A report measures the whole step, not each stage, so every GPU type of one plan
gets that plan's s; a plan of one GPU type calibrates that type exactly, a mixed plan only
their common factor (per-stage times in the report would separate them).

The efficiency fitted is that of the plan's dtype: ``efficiency`` for 16-bit plans, else
``efficiency_by_dtype[dtype]``; the overlay holds whole GpuSpec entries, the fitted figures
replacing the catalog's.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from autoplan.cluster.catalog import efficiency_for, gpu_specs
from autoplan.cluster.schema import GpuSpec
from autoplan.errors import InputError
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport

__all__ = ["CalibrationResult", "RunComparison", "calibrate", "compare_run"]

_SIXTEEN_BIT = ("bf16", "fp16")


@dataclass(frozen=True)
class RunComparison:
    """One run against its plan's prediction (ms per step)."""

    source: str
    gpu_types: tuple[str, ...]
    dtype: str
    measured_schedule_ms: float
    predicted_compute_ms: float  # compute + bubble: what scales with 1 / efficiency
    predicted_comm_ms: float
    measured_optimizer_ms: float
    predicted_optimizer_ms: float

    @property
    def predicted_schedule_ms(self) -> float:
        return self.predicted_compute_ms + self.predicted_comm_ms

    @property
    def compute_factor(self) -> float:
        """s: measured compute time / predicted (module docstring); at least a tiny positive
        value, since communication may have been over-predicted."""
        spent = self.measured_schedule_ms - self.predicted_comm_ms
        if self.predicted_compute_ms <= 0:
            return 1.0
        return max(spent, 1e-6 * self.predicted_compute_ms) / self.predicted_compute_ms

    @property
    def step_overhead_ms(self) -> float:
        return max(0.0, self.measured_optimizer_ms - self.predicted_optimizer_ms)


def compare_run(plan: Plan, report: RunReport, source: str = "") -> RunComparison:
    """``report``'s measurements against ``plan``'s prediction; a report of another plan (by
    its summary or world size) is an InputError."""
    if report.world_size != plan.world_size:
        raise InputError(
            f"{source or 'report'}: world size {report.world_size} is not the plan's "
            f"{plan.world_size}: give the plan this report ran"
        )
    steps = report.steps[1:] if len(report.steps) > 1 else report.steps
    if not steps:
        raise InputError(f"{source or 'report'}: the report has no steps")
    breakdown = plan.prediction.breakdown
    types = tuple(dict.fromkeys(entry.gpu_type for entry in plan.rank_map))
    return RunComparison(
        source=source,
        gpu_types=types,
        dtype=plan.inputs.dtype,
        measured_schedule_ms=statistics.fmean(s.schedule_time_ms for s in steps),
        predicted_compute_ms=breakdown.compute_ms + breakdown.bubble_ms,
        predicted_comm_ms=breakdown.tp_comm_ms + breakdown.pp_comm_ms + breakdown.dp_comm_ms,
        measured_optimizer_ms=statistics.fmean(s.optimizer_time_ms for s in steps),
        predicted_optimizer_ms=breakdown.optimizer_ms,
    )


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted GPU types and the comparisons they come from."""

    gpu_types: list[GpuSpec]
    comparisons: list[RunComparison]
    capped: list[str]  # types whose fitted efficiency would exceed 1


def _with_efficiency(spec: GpuSpec, dtype: str, efficiency: float) -> GpuSpec:
    if dtype in _SIXTEEN_BIT:
        return spec.model_copy(update={"efficiency": efficiency})
    by_dtype = {**spec.efficiency_by_dtype, dtype: efficiency}
    return spec.model_copy(update={"efficiency_by_dtype": by_dtype})


def calibrate(runs: list[tuple[Plan, RunReport, str]]) -> CalibrationResult:
    """Fit every GPU type the runs' plans use (module docstring). ``runs``: (plan, report,
    source name)."""
    if not runs:
        raise InputError("calibrate needs at least one run report")
    comparisons = [compare_run(plan, report, source) for plan, report, source in runs]
    factors: dict[tuple[str, str], list[float]] = {}
    overheads: dict[str, list[float]] = {}
    specs: dict[str, GpuSpec] = {}
    for (plan, _, _), comparison in zip(runs, comparisons, strict=True):
        known = gpu_specs(plan.inputs.cluster)
        for gpu in comparison.gpu_types:
            specs.setdefault(gpu, known[gpu])
            factors.setdefault((gpu, comparison.dtype), []).append(comparison.compute_factor)
            overheads.setdefault(gpu, []).append(comparison.step_overhead_ms)
    fitted: dict[str, GpuSpec] = dict(specs)
    capped = []
    for (gpu, dtype), values in sorted(factors.items()):
        factor = math.exp(statistics.fmean(math.log(v) for v in values))
        efficiency = efficiency_for(specs[gpu], dtype) / factor
        if efficiency > 1:
            capped.append(gpu)
            efficiency = 1.0
        fitted[gpu] = _with_efficiency(fitted[gpu], dtype, round(efficiency, 4))
    for gpu, values in overheads.items():
        fitted[gpu] = fitted[gpu].model_copy(
            update={"step_overhead_ms": round(statistics.fmean(values), 3)}
        )
    return CalibrationResult(
        gpu_types=[fitted[name] for name in sorted(fitted)],
        comparisons=comparisons,
        capped=sorted(set(capped)),
    )
