"""Communication times: ring all-reduce and point-to-point transfers (alpha-beta model)."""

from __future__ import annotations

__all__ = ["p2p_ms", "ring_allreduce_ms"]


def ring_allreduce_ms(
    payload_bytes: float, group_size: int, bandwidth_gb_per_s: float, latency_us: float
) -> float:
    """Time of a ring all-reduce of ``payload_bytes`` over ``group_size`` ranks.

    Each rank sends and receives 2(n-1)/n of the payload (reduce-scatter then all-gather), at
    ``bandwidth_gb_per_s`` per rank, plus one per-message latency. A group of one costs nothing.
    """
    if group_size <= 1 or payload_bytes <= 0:
        return 0.0
    volume = 2.0 * (group_size - 1) / group_size * payload_bytes
    return volume / (bandwidth_gb_per_s * 1e9) * 1e3 + latency_us * 1e-3


def p2p_ms(payload_bytes: float, bandwidth_gb_per_s: float, latency_us: float) -> float:
    """Time to send ``payload_bytes`` from one GPU to another over one link."""
    if payload_bytes <= 0:
        return 0.0
    return payload_bytes / (bandwidth_gb_per_s * 1e9) * 1e3 + latency_us * 1e-3
