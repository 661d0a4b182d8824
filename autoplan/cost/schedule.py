"""Pipeline schedules: iteration time (closed forms) and micro-batches in flight per rank.

Time: with per-micro-batch stage times c_s (forward + backward), GPipe and 1F1B both take
(m - 1) × max_s c_s + Σ_s c_s: the slowest stage works m times, the others fill and drain the
pipeline once.

Point-to-point transfers are blocking (``stage_times``): a stage pays every transfer it takes
part in, on either side of it, in the steady state as in the fill and drain. With x_s the
one-way transfer of micro-batch's boundary activation between stages s and s+1 (its gradient
back takes the same), stage s costs per micro-batch

    a_s = c_s + 2 x_{s-1} + 2 x_s

(receive the activation, send the activation on, receive the gradient, send the gradient
back), and the pipeline takes (m - 1) × max_s a_s + Σ_s a_s. This is how the engines plans are
exported to run: Megatron-DeepSpeed's and DeepSpeed's pipeline engines issue each send and
receive as a blocking call between the passes (``SendActivation``, ``RecvGrad``, ...), so the
stage's GPU waits for the transfer, and both sides of a link wait for the same transfer. It is
what the measured runs of ``../shared/calibration/measured_runs.csv`` show: on clusters with
slow links (the RTX runs, 0.1 GB/s between some nodes) an overlapped form (max(c_s, x_s) in the
steady state) predicted 35-60% too fast, the blocking form within 5% on the single-replica
pipelines (``autoplan calibrate check``).

autoplan's own runtime (``autoplan run``) posts its sends as ``isend`` and waits for them at
the end of the step; only its receives block. For it the form above is conservative by up to
one transfer per boundary and direction; it is kept for both because a plan whose speed depends
on overlapping transfers runs slower on the engines users export to, and the search must not
prefer it for that (``autoplan.simulate`` plays the same blocking rule).

Where the closed form is exact (the event simulator, autoplan.simulate, is the reference): for
equal stages (every a_s, and their forward/backward split, alike), any p and m. For uneven
stages it is usually above the played time, since a stage whose backward is slow hides under a
slower neighbour's (p = 2, m = 2, f = (1, 1), b = (2, 1): played 7, form 8), now and then below
it, where the forward/backward split shapes the fill (p = 4, m = 6, f = (5, 1, 3, 1),
b = (4, 10, 1, 2): played 83, form 82). The solver keeps it because its (max, sum) shape is
what the DP composes stage by stage; tests check solver and simulator agree within 2% on the
plans it emits.

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
    "blocking_stage_times",
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


def blocking_stage_times(
    work_ms: list[float], sends_out_ms: list[float], sends_in_ms: list[float]
) -> list[float]:
    """Per-micro-batch time of each pipeline rank with blocking transfers (module docstring):
    its work + twice what it sends on (activation out, gradient in) + twice what it receives
    (activation in, gradient out)."""
    return [c + 2 * x + 2 * y for c, x, y in zip(work_ms, sends_out_ms, sends_in_ms, strict=True)]


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
