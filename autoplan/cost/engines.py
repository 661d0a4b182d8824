"""The training engines a plan's cost is computed for, and where they differ in a cost term.

A plan is searched for and run by autoplan's own runtime (``autoplan run``); users also price
configurations of, and compare measured runs from, Megatron-DeepSpeed. The two run the same
schedule of forward and backward passes, but not every term the same way:

- The gradient all-reduce. autoplan's runtime wraps each replica in DDP, whose buckets
  all-reduce while the last micro-batch's backward still produces the earlier layers'
  gradients (``autoplan.runtime.data_parallel``): the all-reduce hides behind that backward.
  DeepSpeed's pipeline engine runs ``ReduceGrads`` as an instruction after the schedule's last
  ``BackwardPass`` (and its plain engine all-reduces on the accumulation boundary after the
  backward, at ZeRO stage 0 and 1 without ``overlap_comm``): nothing hides it.

Everything else (blocking pipeline transfers, the 1F1B order, tp collectives, the optimizer
step) is costed the same for both; ``autoplan.cost.model`` says where its forms are
conservative for autoplan's runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ENGINES", "Engine", "EngineTraits"]

Engine = Literal["autoplan", "megatron-deepspeed"]


@dataclass(frozen=True)
class EngineTraits:
    """What one engine does differently in a cost term (module docstring)."""

    overlaps_grad_reduce: bool  # the all-reduce hides behind the last backward


ENGINES: dict[str, EngineTraits] = {
    "autoplan": EngineTraits(overlaps_grad_reduce=True),
    "megatron-deepspeed": EngineTraits(overlaps_grad_reduce=False),
}
