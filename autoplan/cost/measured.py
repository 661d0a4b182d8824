"""Measured layer times: which of a profile's entries apply to a GPU type, tp and micro-batch.

A profile's layer may carry times measured on real devices (``LayerProfile.measured``), one
entry per (device, tensor-parallel degree, micro-batch size): from ``autoplan profile
--measure`` (the local device, tp 1) or ``autoplan profile import`` (tables measured
elsewhere). For a GPU type, tp degree t and micro-batch size b:

1. Entries of that device at tp t give the time directly, tp communication included (it was
   measured on one GPU of a tp group): at b if measured, else interpolated linearly between the
   nearest measured sizes below and above (a pass's time is close to affine in b: a fixed
   part plus a per-sample part). Above the largest measured size the per-sample time of the
   largest is kept (time ∝ b, the regime large batches reach). Below the smallest, the line
   through the two smallest is followed, but never below proportional scaling of the
   smallest (the fixed part does not go negative) nor above the smallest's time.
2. Else entries of that device at tp 1 give the single-GPU time at b (as above); the cost
   model divides it by the share of the work one tp rank keeps and adds the modelled
   all-reduces.
3. Else there is no measurement: the cost model models the layer.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

from autoplan.profile.schema import LayerProfile, MeasuredTimes

__all__ = ["MeasuredPass", "interpolate", "matches_device", "measured_pass"]


def _tokens(name: str) -> list[str]:
    return [token for token in re.split(r"[^a-z0-9]+", name.lower()) if token]


def matches_device(gpu_type: str, device_name: str) -> bool:
    """Whether a measured entry's device (torch's name, e.g. 'NVIDIA A100-SXM4-80GB', or a
    catalog type) is this catalog GPU type (e.g. 'A100-80GB'): every token of the type appears
    among the device name's tokens."""
    wanted = _tokens(gpu_type)
    have = set(_tokens(device_name))
    return bool(wanted) and all(token in have for token in wanted)


@dataclass(frozen=True)
class MeasuredPass:
    """A layer's measured (or interpolated) forward and backward ms at one micro-batch size,
    on one GPU of a group of ``tensor_parallel_degree``; ``exact`` when that size itself was
    measured."""

    forward_ms: float
    backward_ms: float
    tensor_parallel_degree: int
    exact: bool


def interpolate(points: list[tuple[int, float]], size: int) -> float:
    """The time at micro-batch ``size`` from (size, time) measurements (module docstring)."""
    ordered = sorted(dict(points).items())
    sizes = [s for s, _ in ordered]
    if size in sizes:
        return ordered[sizes.index(size)][1]
    if size > sizes[-1]:
        last, time = ordered[-1]
        return time * size / last
    if size < sizes[0]:
        first, time = ordered[0]
        proportional = time * size / first
        if len(ordered) == 1:
            return proportional
        second, time2 = ordered[1]
        slope = (time2 - time) / (second - first)
        return min(time, max(proportional, time + slope * (size - first)))
    for (lo, t_lo), (hi, t_hi) in itertools.pairwise(ordered):
        if lo < size < hi:
            return t_lo + (t_hi - t_lo) * (size - lo) / (hi - lo)
    raise AssertionError("unreachable: size lies within the measured range")


def _size(entry: MeasuredTimes, profile_micro_batch_size: int) -> int:
    return entry.micro_batch_size or profile_micro_batch_size


def measured_pass(
    layer: LayerProfile,
    gpu_type: str,
    tp: int,
    micro_batch_size: int,
    profile_micro_batch_size: int,
) -> MeasuredPass | None:
    """The measurement that applies to ``layer`` on ``gpu_type`` at (tp, micro-batch size), or
    None (module docstring: tp itself first, else tp 1)."""
    entries = [e for e in layer.measured if matches_device(gpu_type, e.device_name)]
    for degree in dict.fromkeys((tp, 1)):
        chosen = [e for e in entries if e.tensor_parallel_degree == degree]
        if not chosen:
            continue
        sizes = [_size(e, profile_micro_batch_size) for e in chosen]
        return MeasuredPass(
            forward_ms=interpolate(
                [(s, e.forward_ms) for s, e in zip(sizes, chosen, strict=True)], micro_batch_size
            ),
            backward_ms=interpolate(
                [(s, e.backward_ms) for s, e in zip(sizes, chosen, strict=True)], micro_batch_size
            ),
            tensor_parallel_degree=degree,
            exact=micro_batch_size in sizes,
        )
    return None
