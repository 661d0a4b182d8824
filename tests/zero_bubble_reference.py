"""Closed forms that tests compare the zero-bubble player and simulator against."""

from __future__ import annotations


def zb_h1_time_ms(
    forward_ms: float, input_ms: float, weight_ms: float, pipeline_degree: int, m: int
) -> float:
    """ZB-H1 on p equal stages without send time (Qi et al., ICLR'24, §3):
    m·(F + I + W) + (p − 1)·(F + I − W), exact for PyTorch's interleaved zero bubble with one
    stage per rank when W <= min(F, I) (the deferred Ws fill the cool-down; with a longer W
    the played lists take longer: tests/test_simulate_zero_bubble.py)."""
    per_micro_batch = forward_ms + input_ms + weight_ms
    return m * per_micro_batch + (pipeline_degree - 1) * (forward_ms + input_ms - weight_ms)
