"""Pipeline schedules: iteration time (closed forms) and micro-batches in flight per rank.

Time: with per-micro-batch stage times c_s (forward + backward), GPipe and 1F1B both take
(m - 1) × max_s c_s + Σ_s c_s: the slowest stage works m times, the others fill and drain the
pipeline once. Point-to-point sends are asynchronous: in the steady state a transfer overlaps
the next computation, so a stage costs a_s = max(c_s, send_s) there (the link binds only when
slower than compute; activations and gradients travel in opposite directions of a full-duplex
link), while the fill and drain wait for each transfer, b_s = c_s + 2 × send_s:
(m - 1) × max_s a_s + Σ_s b_s.

Where this is exact (the event simulator, autoplan.simulate, is the reference; checked in
tests/test_simulate_zero_bubble.py): for equal stages (every f_s, b_s alike) without sends,
any p and m. Otherwise it is neither an upper nor a lower bound; the solver keeps it because
its (max, sum) shape is what the DP composes stage by stage:
- uneven stages: usually above the played time, since a stage whose backward is slow hides
  under a slower neighbour's (p = 2, m = 2, f = (1, 1), b = (2, 1): played 7, form 8; the
  player check's 60.4 ms by the form vs 57.4 ms played was such an over-estimate), now and
  then below it, where the forward/backward split shapes the fill (p = 4, m = 6,
  f = (5, 1, 3, 1), b = (4, 10, 1, 2): played 83, form 82);
- sends: below the played time even on equal stages (p = 2, m = 3, f = b = send = 1: played
  12, form 10). 1F1B's steady state is a cycle: rank r's B of micro-batch i waits for i's
  round trip through the later ranks, so ranks r..q together take per micro-batch at least
  (Σ_{k=r..q} c_k + 2 Σ_{k=r..q-1} send_k) / (q − r + 1), which max(c, send) does not see.
  That cycle mean as the steady term fixes most such cases but is still not exact (the fill
  and drain shift with it), and it would not compose in the DP, so it is not used.

Interleaved 1F1B with v chunks per rank divides the fill-and-drain part by v (Narayanan et
al., SC'21, §2.2.2): m × max_r A_r + (Σ_r B_r − max_r A_r) / v, with A_r, B_r summed over
the rank's chunks; for v = 1 this is the 1F1B form.

Memory: micro-batches whose activations a rank holds at its peak. GPipe: all m. 1F1B: rank r
of p holds p − r (at most m). Interleaved 1F1B as PyTorch schedules it
(torch.distributed.pipelining.schedules.ScheduleInterleaved1F1B): rank r runs
(v − 1) × micro_batches_per_round + 2 × (p − 1 − r) warm-up forwards, then one more forward
before its first backward, so that many chunk-forwards are in flight (at most m × v).
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "ScheduleKind",
    "in_flight_chunks",
    "interleaved_ok",
    "pipeline_time_ms",
]

ScheduleKind = Literal["gpipe", "1f1b", "interleaved_1f1b"]


def pipeline_time_ms(
    steady_ms: list[float],
    num_micro_batches: int,
    chunks: int = 1,
    fill_ms: list[float] | None = None,
) -> float:
    """Iteration time of the pipeline (no data-parallel tail): m × max_r a_r + (Σ_r b_r −
    max_r a_r) / v, with a_r a rank's steady-state time per micro-batch and b_r its time on
    the fill-and-drain path (``fill_ms``, default a_r); see the module docstring."""
    slowest = max(steady_ms)
    fill = steady_ms if fill_ms is None else fill_ms
    return num_micro_batches * slowest + (sum(fill) - slowest) / chunks


def interleaved_ok(num_micro_batches: int, pipeline_degree: int) -> bool:
    """Whether PyTorch's Interleaved1F1B accepts m micro-batches on p ranks and autoplan's
    memory formula applies: we require m to be a positive multiple of p (PyTorch itself needs
    m % max(1, m // p) == 0, which a multiple of p satisfies)."""
    return num_micro_batches >= pipeline_degree and num_micro_batches % pipeline_degree == 0


def in_flight_chunks(
    schedule: ScheduleKind,
    pipeline_degree: int,
    pipeline_rank: int,
    num_micro_batches: int,
    chunks: int = 1,
) -> int:
    """Chunk-forwards whose saved activations rank ``pipeline_rank`` holds at its peak."""
    if schedule == "gpipe":
        return num_micro_batches * chunks
    if schedule == "1f1b":
        return min(num_micro_batches, pipeline_degree - pipeline_rank)
    rounds = max(1, num_micro_batches // pipeline_degree)
    per_round = num_micro_batches // rounds
    warmup = (chunks - 1) * per_round + 2 * (pipeline_degree - 1 - pipeline_rank)
    return min(num_micro_batches * chunks, warmup + 1)
