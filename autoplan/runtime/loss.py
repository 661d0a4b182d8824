"""The training loss of a model: token cross-entropy for the zoo, a plain sum for factories.

Both are means over the samples of a batch, so the pipelining schedule's average over
micro-batches, and the replicas' weighted average, give the mean over the global batch.

With the vocabulary split across the tensor-parallel group (see
:mod:`autoplan.runtime.tensor_parallel`), the head's logits arrive as a DTensor sharded by
vocabulary. The cross-entropy then runs under ``torch.distributed.tensor.parallel.loss_parallel``,
as Megatron-LM's vocab-parallel cross-entropy does: each rank takes the log-softmax of its
shard with all-reduces of the max and of the sum of exponentials over the group, so the full
logits are never gathered. loss_parallel must also be active during the backward: the pipeline
schedule runs forward and backward inside its ``step``, so the trainer enters
:func:`loss_context` around the whole step (the context only changes the cross-entropy's ops on
DTensors, nothing else the stages compute).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import loss_parallel

from autoplan.runtime.mixed_precision import DynamicLossScale
from autoplan.zoo.registry import LossKind

__all__ = ["LossFunction", "loss_context", "loss_function"]

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_context(split_vocabulary: bool) -> AbstractContextManager[None]:
    """What to run a training step's forward and backward in: ``loss_parallel()`` when the
    logits are split by vocabulary, else nothing."""
    return loss_parallel() if split_vocabulary else contextlib.nullcontext()


def loss_function(
    kind: LossKind, weight: float = 1.0, scale: DynamicLossScale | None = None
) -> LossFunction:
    """``loss(output, targets)`` of ``kind``, times ``weight`` (a replica's batch share) and
    the fp16 loss scale's present value where ``scale`` is given (read at each call).

    'cross_entropy': mean token cross-entropy of logits against target ids. 'sum': the sum of
    the output per sample, averaged over the samples (targets unused): autoplan does not know a
    factory model's loss, and the profile assumed a gradient of ones. Either takes an output
    sharded by vocabulary (a DTensor) and returns a plain tensor, the same on every tp rank.
    """

    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Half-precision logits are upcast: a vocabulary's softmax loses too much in 16 bits.
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        value = F.cross_entropy(logits.flatten(0, -2), targets.reshape(-1))
        if isinstance(value, DTensor):  # replicated over tp: every rank holds the whole loss
            value = value.to_local()
        return _scaled(value * weight if weight != 1.0 else value)

    def summed(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        value = output.sum()
        if isinstance(value, DTensor):  # partial sums of the vocabulary shards: one all-reduce
            value = value.full_tensor()
        value = value / output.shape[0]
        return _scaled(value * weight if weight != 1.0 else value)

    def _scaled(value: torch.Tensor) -> torch.Tensor:
        return value if scale is None else value * scale.value

    return cross_entropy if kind == "cross_entropy" else summed
