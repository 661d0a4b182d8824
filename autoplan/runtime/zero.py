"""ZeRO-2 and ZeRO-3 of one stage: FSDP2 ``fully_shard`` over the stage's replicas, with the
gradients reduce-scattered in every micro-batch's backward.

Level 2 shards with ``reshard_after_forward=False`` (a micro-batch's parameters stay gathered
from its forward to its backward), level 3 with ``reshard_after_forward=True`` (gathered again
for the backward). torch's ``PipelineStage`` treats an ``FSDPModule`` specially: it switches
gradient sync and resharding after backward off for every micro-batch and reduce-scatters once
after the last, so every gradient and parameter stays unsharded for the whole step and nothing
is sharded at the peak (torch 2.13, ``_PipelineStageBase.backward_maybe_with_nosync``). The
stage is therefore handed to the pipeline inside ``PerMicroBatchSync``, a plain module that
PipelineStage does not recognise: FSDP2's own hooks then run as in ordinary training, one
reduce-scatter per micro-batch accumulating into the sharded gradients, parameters resharded
after each backward. This is what ``autoplan.cost.sharding`` costs.
"""

from __future__ import annotations

from torch import nn

__all__ = ["PerMicroBatchSync"]


class PerMicroBatchSync(nn.Module):
    """``inner`` (an FSDP2 module) as a plain module, so that the pipeline stage leaves
    FSDP2's per-backward gradient reduce-scatter on (module docstring)."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)
