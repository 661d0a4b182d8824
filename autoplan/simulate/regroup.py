"""Which replicas of one stage hand samples to which replicas of the next, and how long it takes.

Replica r of a stage owns the samples ``[Σ_{q<r} share_q, Σ_{q<=r} share_q)`` of every
micro-batch (``autoplan.plan.schema``). Across a stage boundary, replica a of the sending stage
sends to replica b of the receiving stage the samples both own: the overlap of their intervals.
Gradients travel back over the same pairs.

Transfer time of one pair: the plan states one figure per boundary, ``StageTiming.send_ms``, the
time of the whole boundary with every replica sending at once (the cost model takes the busiest
link). We give that figure to the pair that moves the most samples and scale the other pairs by
their samples: ``send_ms × samples(a, b) / max over pairs of samples``. On uniform plans (equal
shares at both stages) every replica sends to its namesake alone, so each pair takes exactly
``send_ms``, as a one-replica pipeline does.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

__all__ = ["Transfer", "regroup_pairs", "sample_ranges"]


@dataclass(frozen=True)
class Transfer:
    """Replica ``source`` of the sending stage hands ``samples`` samples to replica ``target``
    of the receiving stage; ``fraction`` of the boundary's send_ms is its transfer time."""

    source: int
    target: int
    samples: int
    fraction: float


def sample_ranges(shares: list[int]) -> list[tuple[int, int]]:
    """Each replica's samples of a micro-batch as [start, end), in replica order."""
    ends = list(accumulate(shares))
    return [(end - share, end) for share, end in zip(shares, ends, strict=True)]


def regroup_pairs(sender_shares: list[int], receiver_shares: list[int]) -> list[Transfer]:
    """Every (sender replica, receiver replica) pair that shares samples, in (source, target)
    order, with its fraction of the boundary's send time (module docstring)."""
    if sum(sender_shares) != sum(receiver_shares):
        raise ValueError(
            f"shares {sender_shares} and {receiver_shares} are not the same micro-batch"
        )
    pairs: list[tuple[int, int, int]] = []
    for a, (a_start, a_end) in enumerate(sample_ranges(sender_shares)):
        for b, (b_start, b_end) in enumerate(sample_ranges(receiver_shares)):
            overlap = min(a_end, b_end) - max(a_start, b_start)
            if overlap > 0:
                pairs.append((a, b, overlap))
    largest = max(samples for _, _, samples in pairs)
    return [Transfer(a, b, samples, samples / largest) for a, b, samples in pairs]
