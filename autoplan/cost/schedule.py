"""Pipeline schedules: iteration time (closed forms) and micro-batches in flight per rank.

Time: with per-micro-batch stage times c_s (forward + backward + sends), GPipe and 1F1B both
take (m - 1) × max_s c_s + Σ_s c_s: the slowest stage works m times, the others fill and drain
the pipeline once. Interleaved 1F1B with v chunks per rank divides the fill-and-drain part by
v (Narayanan et al., SC'21, §2.2.2): m × max_r C_r + (Σ_r C_r − max_r C_r) / v, with C_r the
rank's work per micro-batch over all its chunks; for v = 1 this is the 1F1B form.

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


def pipeline_time_ms(rank_times_ms: list[float], num_micro_batches: int, chunks: int = 1) -> float:
    """Iteration time of the pipeline (no data-parallel tail) from each rank's work per
    micro-batch: m × max + (Σ − max) / v (module docstring)."""
    slowest = max(rank_times_ms)
    return num_micro_batches * slowest + (sum(rank_times_ms) - slowest) / chunks


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
