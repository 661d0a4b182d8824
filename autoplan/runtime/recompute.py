"""Activation recompute per stage: 'full' recomputes each block, 'selective' only attention.

Both use ``torch.utils.checkpoint`` (non-reentrant) around each block's forward, set on the
instance, so the module tree and parameter names stay as in single-process training (a
``checkpoint_wrapper`` would insert ``_checkpoint_wrapped_module`` into every name). 'selective'
is Megatron's selective recompute: a checkpoint policy that saves every op's output except the
attention core's (scaled dot-product attention), which backward recomputes.
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

__all__ = ["apply_recompute"]

_ATTENTION_CORE_OPS = {
    op
    for op in (
        getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None),
        getattr(torch.ops.aten, "_scaled_dot_product_flash_attention", None),
        getattr(torch.ops.aten, "_scaled_dot_product_efficient_attention", None),
        getattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention", None),
        getattr(torch.ops.aten, "_scaled_dot_product_attention_math", None),
    )
    if op is not None
}


def _attention_core_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    packet = getattr(op, "overloadpacket", op)
    if packet in _ATTENTION_CORE_OPS:
        return CheckpointPolicy.PREFER_RECOMPUTE
    return CheckpointPolicy.PREFER_SAVE


def _selective_context() -> Any:
    return create_selective_checkpoint_contexts(_attention_core_policy)


def _checkpointed(forward: Callable[..., Any], selective: bool) -> Callable[..., Any]:
    extra = {"context_fn": _selective_context} if selective else {}

    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        return checkpoint(forward, *args, use_reentrant=False, **extra, **kwargs)

    return run


def _is_block(layer: nn.Module) -> bool:
    # Blocks are the layers with attention or MLP projections; embeddings and heads keep
    # their activations (they are few, and recomputing an embedding saves nothing).
    return sum(isinstance(m, nn.Linear) for m in layer.modules()) > 1


def apply_recompute(model: nn.Module, mode: Recompute) -> int:
    """Checkpoint each block of ``model.layers`` per ``mode``; returns how many were wrapped."""
    if mode == "none":
        return 0
    wrapped = 0
    for layer in model.layers.values():
        if _is_block(layer):
            layer.forward = _checkpointed(layer.forward, selective=mode == "selective")
            wrapped += 1
    return wrapped
