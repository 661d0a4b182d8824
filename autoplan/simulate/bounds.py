"""Closed forms the simulator is checked against.

- Equal stages, no communication: GPipe and 1F1B take ``(m + p - 1) × (f + b)``: p - 1 steps
  to fill, m steps of work, drained the same way.
- Any stage times and any valid order: rank r cannot start before the first micro-batch has
  passed the stages before it, must do all its own work, and its last backward must still pass
  back through those stages. So the pipeline takes at least
  ``max_r [Σ_{j<r} (f_j + b_j + 2·send_j) + m × Σ_{s on r} (f_s + b_s)]``.
- Split backwards (zero bubble: I then W, ``StageTiming.weight_gradient_ms``) and any
  placement whose rank r holds stage r as its lowest (``s % pp`` and the V alike): rank r's last
  action that is not a W is the I (or B) of stage r of some micro-batch (every other action of
  its has a later one on the rank), and after it only Ws are left, ``m × W_r`` at most. That
  gradient must still pass stages r-1..0 (their I and the sends) and stage 0 run its W, so
  ``max_r [Σ_{j<r} (f_j + send_j) + m × Σ_{s on r} (f_s + b_s) + max(0, Σ_{j<r} (i_j + send_j)
  + w_0 − m × W_r)]`` (for r > 0; ``i = b − w``). Unsplit (w = 0) this is the bound above.
- Replicas with their own times (``replica_lower_bound_ms``): the same argument per replica.
  Replica d of rank r runs every one of its actions, m × Σ_{s on r} (f_{s,d} + b_{s,d}), one
  at a time. Its first action is a forward of some stage s ≥ r, which needs the samples to have
  passed stages 0..r-1 on *some* of their replicas, each taking at least that stage's fastest
  forward, and each boundary at least its quickest pair's transfer; its last action is a
  backward whose gradient must still pass back through stages r-1..0 the same way. So the
  pipeline takes at least
  ``max_{r,d} [Σ_{j<r} (min_q f_{j,q} + min_q b_{j,q} + 2·min pair send_j) + m × W_{r,d}]``.
  With one replica per rank this is the bound above.

The popular 1F1B estimate ``(m - 1) × max_s (f_s + b_s) + Σ_s (f_s + b_s)`` is *not* a bound:
with a slow first stage the later stages hide under it (p = 2, m = 2, f = b = 10 then 1: the
simulated 1F1B takes 40 ms, the estimate says 42 ms).
"""

from __future__ import annotations

from autoplan.plan.schema import StageTiming
from autoplan.simulate.engine import replica_times
from autoplan.simulate.regroup import regroup_pairs

__all__ = ["pipeline_lower_bound_ms", "replica_lower_bound_ms", "uniform_pipeline_ms"]


def uniform_pipeline_ms(
    pipeline_degree: int, num_micro_batches: int, forward_ms: float, backward_ms: float
) -> float:
    """GPipe/1F1B time of p equal stages with no communication: (m + p - 1) × (f + b)."""
    return (num_micro_batches + pipeline_degree - 1) * (forward_ms + backward_ms)


def pipeline_lower_bound_ms(
    stage_timings: list[StageTiming],
    pipeline_degree: int,
    num_micro_batches: int,
    stage_rank: list[int] | None = None,
) -> float:
    """Lower bound on the pipeline time of any schedule (see the module docstring).

    Stage s runs on rank ``stage_rank[s]`` (default ``s % pipeline_degree``; rank r's lowest
    stage must be r); stages are ``stage_timings`` in stage order. A stage with
    ``weight_gradient_ms`` counts its backward as split (I then W)."""
    timings = sorted(stage_timings, key=lambda timing: timing.stage)
    ranks = stage_rank or [s % pipeline_degree for s in range(len(timings))]
    if any(min(s for s in range(len(timings)) if ranks[s] == r) != r for r in set(ranks)):
        raise ValueError("pipeline_lower_bound_ms needs rank r's lowest stage to be r")
    weight = [t.weight_gradient_ms or 0.0 for t in timings]
    m = num_micro_batches
    best = 0.0
    for rank in range(pipeline_degree):
        fill = sum(t.forward_ms + t.send_ms for t in timings[:rank])
        drain = sum(timings[j].backward_ms - weight[j] + timings[j].send_ms for j in range(rank))
        drain += weight[0] if rank > 0 else 0.0
        own = [s for s in range(len(timings)) if ranks[s] == rank]
        own_work = sum(timings[s].forward_ms + timings[s].backward_ms for s in own)
        own_weight = sum(weight[s] for s in own)
        best = max(best, fill + m * own_work + max(0.0, drain - m * own_weight))
    return best


def replica_lower_bound_ms(
    stage_timings: list[StageTiming], shares: list[list[int]], num_micro_batches: int
) -> float:
    """Lower bound on the pipeline time of any schedule with per-replica times (module
    docstring); ``shares[r]`` are the replica shares of pipeline rank r, whose stages are
    r, r + pp, ... The quickest pair of a boundary takes its fraction of send_ms (see
    ``autoplan.simulate.regroup``); with pp = 1 stages hand over for free."""
    pp = len(shares)
    timings = sorted(stage_timings, key=lambda timing: timing.stage)
    times = [replica_times(t, len(shares[t.stage % pp])) for t in timings]
    passes = []  # passes[j]: the least time a micro-batch spends at stage j, there and back
    for j, timing in enumerate(timings[: pp - 1]):
        quickest_send = 0.0
        if pp > 1:
            pairs = regroup_pairs(shares[j], shares[j + 1])
            quickest_send = timing.send_ms * min(pair.fraction for pair in pairs)
        fastest_forward = min(f for f, _ in times[j])
        fastest_backward = min(b for _, b in times[j])
        passes.append(fastest_forward + fastest_backward + 2 * quickest_send)
    best = 0.0
    for rank in range(pp):
        before = sum(passes[:rank])
        for replica in range(len(shares[rank])):
            work = sum(f + b for f, b in (times[s][replica] for s in range(rank, len(times), pp)))
            best = max(best, before + num_micro_batches * work)
    return best
