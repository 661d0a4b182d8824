"""The async_pb schedule as data: asynchronous Pipelined Backpropagation's per-rank orders.

Every rank runs a 1F1B order over the whole stream of micro-batches (all iterations, one
after another) and never drains in between: stage s of p does k = p − 1 − s warm-up
forwards, then alternates a forward and a backward (F(j), B(j − k)), and drains only when the
stream ends. ``zero_delay`` runs every micro-batch through the whole pipeline and back before
the next starts (synchronous per-micro-batch SGD, the tests' reference). The runtime
(``autoplan.runtime.async_stage``) and the simulator play these same orders.
"""

from __future__ import annotations

from autoplan.schedule.actions import Action, PipelineOrder

__all__ = ["async_pb_order", "async_stream_order"]


def async_pb_order(
    num_stages: int, stage: int, num_micro_batches: int, zero_delay: bool = False
) -> list[tuple[str, int]]:
    """The stage's actions, ("F", i) and ("B", i), over the whole stream of micro-batches."""
    n = num_micro_batches
    if zero_delay:
        return [a for i in range(n) for a in (("F", i), ("B", i))]
    warmup = min(n, num_stages - 1 - stage)
    order: list[tuple[str, int]] = [("F", i) for i in range(warmup)]
    for j in range(warmup, n):
        order += [("F", j), ("B", j - warmup)]
    order += [("B", i) for i in range(n - warmup, n)]
    return order


def async_stream_order(
    num_stages: int, num_micro_batches: int, zero_delay: bool = False
) -> PipelineOrder:
    """Every pipeline rank's async order (rank s runs stage s) as action lists."""
    return [
        [
            Action(s, "F" if kind == "F" else "B", i)
            for kind, i in async_pb_order(num_stages, s, num_micro_batches, zero_delay)
        ]
        for s in range(num_stages)
    ]
