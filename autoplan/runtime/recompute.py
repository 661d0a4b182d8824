"""Activation recompute per stage: 'full' recomputes each block, 'selective' all but matmuls.

Both use ``torch.utils.checkpoint`` (non-reentrant) around each block's forward, set on the
instance, so the module tree and parameter names stay as in single-process training (a
``checkpoint_wrapper`` would insert ``_checkpoint_wrapped_module`` into every name). 'selective'
follows Megatron's selective recompute with a checkpoint policy: the matmul outputs are kept,
the attention core (scaled dot-product attention) and the elementwise ops are recomputed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from autoplan.plan.schema import Recompute
from autoplan.runtime.model_stage import pipeline_layers

__all__ = ["apply_recompute"]

# Outputs kept under 'selective': the matmuls (the FLOPs). Everything else in a block is
# recomputed in backward: the attention core (the point of selective recompute: its softmax
# inputs are the s² activations) and the cheap elementwise ops around it. Keeping only a known
# list, rather than "everything but attention", is what makes it safe: PyTorch refuses a saved
# output that is later changed in place (RMSNorm's ``add_``, a collective's ``wait_tensor``).
_SAVED_OPS = {
    torch.ops.aten.mm,
    torch.ops.aten.addmm,
    torch.ops.aten.bmm,
    torch.ops.aten.baddbmm,
}


def _matmuls_only_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    if getattr(op, "overloadpacket", op) in _SAVED_OPS:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_matmuls_only_policy)


def _checkpointed(forward: Callable[..., Any], selective: bool) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        if selective:
            return checkpoint(
                forward, *args, use_reentrant=False, context_fn=_selective_context, **kwargs
            )
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def _is_block(layer: nn.Module) -> bool:
    # Blocks are the layers with attention or MLP projections; embeddings and heads keep
    # their activations (they are few, and recomputing an embedding saves nothing).
    return sum(isinstance(m, nn.Linear) for m in layer.modules()) > 1


def apply_recompute(model: nn.Module, mode: Recompute) -> int:
    """Checkpoint each block among ``model``'s pipeline layers per ``mode``; returns how many."""
    if mode == "none":
        return 0
    wrapped = 0
    for _, layer in pipeline_layers(model):
        if _is_block(layer):
            layer.forward = _checkpointed(layer.forward, selective=mode == "selective")
            wrapped += 1
    return wrapped
