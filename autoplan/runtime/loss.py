"""The training loss of a model: token cross-entropy for the zoo, a plain sum for factories.

Both are means over the samples of a batch, so the pipelining schedule's average over
micro-batches, and the replicas' weighted average, give the mean over the global batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from autoplan.zoo.registry import LossKind

__all__ = ["LossFunction", "loss_function"]

LossFunction = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def loss_function(kind: LossKind, weight: float = 1.0) -> LossFunction:
    """``loss(output, targets)`` of ``kind``, times ``weight`` (a replica's batch share).

    'cross_entropy': mean token cross-entropy of logits against target ids. 'sum': the sum of
    the output per sample, averaged over the samples (targets unused): autoplan does not know a
    factory model's loss, and the profile assumed a gradient of ones.
    """

    def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # Half-precision logits are upcast: a vocabulary's softmax loses too much in 16 bits.
        if logits.dtype in (torch.float16, torch.bfloat16):
            logits = logits.float()
        value = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        return value * weight if weight != 1.0 else value

    def summed(output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        value = output.sum() / output.shape[0]
        return value * weight if weight != 1.0 else value

    return cross_entropy if kind == "cross_entropy" else summed
