"""Closed forms the simulator is checked against.

- Equal stages, no communication: GPipe and 1F1B take ``(m + p - 1) × (f + b)``: p - 1 steps
  to fill, m steps of work, drained the same way.
- Any stage times and any valid order: rank r cannot start before the first micro-batch has
  passed the stages before it, must do all its own work, and its last backward must still pass
  back through those stages. So the pipeline takes at least
  ``max_r [Σ_{j<r} (f_j + b_j + 2·send_j) + m × Σ_{s on r} (f_s + b_s)]``.

The popular 1F1B estimate ``(m - 1) × max_s (f_s + b_s) + Σ_s (f_s + b_s)`` is *not* a bound:
with a slow first stage the later stages hide under it (p = 2, m = 2, f = b = 10 then 1: the
simulated 1F1B takes 40 ms, the estimate says 42 ms).
"""

from __future__ import annotations

from autoplan.plan.schema import StageTiming

__all__ = ["pipeline_lower_bound_ms", "uniform_pipeline_ms"]


def uniform_pipeline_ms(
    pipeline_degree: int, num_micro_batches: int, forward_ms: float, backward_ms: float
) -> float:
    """GPipe/1F1B time of p equal stages with no communication: (m + p - 1) × (f + b)."""
    return (num_micro_batches + pipeline_degree - 1) * (forward_ms + backward_ms)


def pipeline_lower_bound_ms(
    stage_timings: list[StageTiming], pipeline_degree: int, num_micro_batches: int
) -> float:
    """Lower bound on the pipeline time of any schedule (see the module docstring).

    Stage s runs on rank ``s % pipeline_degree``; stages are ``stage_timings`` in stage order.
    """
    timings = sorted(stage_timings, key=lambda timing: timing.stage)
    best = 0.0
    for rank in range(pipeline_degree):
        passes = sum(t.forward_ms + t.backward_ms + 2 * t.send_ms for t in timings[:rank])
        own_work = sum(t.forward_ms + t.backward_ms for t in timings[rank::pipeline_degree])
        best = max(best, passes + num_micro_batches * own_work)
    return best
