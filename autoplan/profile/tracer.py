"""Trace one layer's forward and backward on fake tensors and count what it costs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.errors import InputError
from autoplan.profile.bytes_moved import BytesMovedMode
from autoplan.profile.flops import flop_counter
from autoplan.profile.saved import SavedActivationTracker, storage_key

__all__ = ["LayerTrace", "TensorMeta", "loss_of", "trace_layer"]


@dataclass(frozen=True)
class TensorMeta:
    """Shape and dtype of a tensor passed between layers."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return torch.Size(self.shape).numel() * self.dtype.itemsize

    def make(self) -> torch.Tensor:
        """A tensor of this shape (under FakeTensorMode: a fake one); float ones need grad,
        since a pipeline stage sends its input's gradient back."""
        if self.dtype.is_floating_point:
            return torch.empty(self.shape, dtype=self.dtype, requires_grad=True)
        return torch.zeros(self.shape, dtype=self.dtype)


@dataclass(frozen=True)
class LayerTrace:
    """What one forward + backward of one layer cost."""

    forward_flops: int
    backward_flops: int
    forward_bytes_moved: int
    backward_bytes_moved: int
    forward_memory_bound_bytes: int
    backward_memory_bound_bytes: int
    forward_matmul_fixed_bytes: int
    backward_matmul_fixed_bytes: int
    forward_kernels: int
    backward_kernels: int
    saved_activation_bytes: int
    selective_recompute_saved_bytes: int
    selective_recompute_flops: int
    input_activation_bytes: int
    output: TensorMeta
    # Of saved_activation_bytes, what the loss saved (outside the layer's own forward).
    loss_saved_bytes: int = 0
    # K and V bytes the attention core received (context parallelism's ring payload).
    attention_kv_bytes: int = 0


def loss_of(output: torch.Tensor, loss: str) -> torch.Tensor | None:
    """The scalar loss of the last layer's output: 'cross_entropy' (over the last dim, token
    targets) or None for 'sum', whose backward is seeded with ones instead."""
    if loss != "cross_entropy":
        return None
    # Token cross-entropy in fp32, as torchtitan computes it (logits upcast before log-softmax).
    targets = torch.zeros(output.shape[:-1], dtype=torch.long, device=output.device)
    return F.cross_entropy(output.flatten(0, -2).float(), targets.flatten())


def trace_layer(
    layer: nn.Module, inputs: Sequence[torch.Tensor], *, loss: str | None = None
) -> LayerTrace:
    """Run ``layer`` forward and backward once (call under FakeTensorMode) and count.

    ``loss``: 'cross_entropy' for the last layer of a language model, 'sum' for a last layer
    whose loss is unknown (backward seeded with ones), None for any other layer (backward
    seeded with a gradient of the output's shape, as a pipeline stage receives).
    """
    excluded = {storage_key(t) for t in [*layer.parameters(), *layer.buffers()]}
    flops = flop_counter()
    moved = BytesMovedMode(list(layer.parameters()))
    tracker = SavedActivationTracker(excluded, flops.get_total_flops)
    with flops, moved:
        with tracker:
            output = layer(*inputs)
            if not isinstance(output, torch.Tensor):
                raise InputError(
                    f"layer {type(layer).__name__} returned {type(output).__name__}; "
                    "autoplan profiles layers that return one tensor"
                )
            layer_saved = tracker.saved_bytes
            scalar = loss_of(output, loss) if loss else None
        forward_flops = flops.get_total_flops()
        moved.phase = "backward"
        if scalar is not None:
            scalar.backward()
        elif output.requires_grad:
            # The output's gradient arrives from the next stage: creating it is not this
            # layer's traffic.
            moved.paused = True
            seed = torch.ones_like(output)
            moved.paused = False
            output.backward(seed)
        backward_flops = flops.get_total_flops() - forward_flops
    for parameter in layer.parameters():
        parameter.grad = None
    saved = tracker.saved_bytes
    return LayerTrace(
        forward_flops=forward_flops,
        backward_flops=backward_flops,
        forward_bytes_moved=moved.bytes_by_phase["forward"],
        backward_bytes_moved=moved.bytes_by_phase["backward"],
        forward_memory_bound_bytes=moved.memory_bound_bytes_by_phase["forward"],
        backward_memory_bound_bytes=moved.memory_bound_bytes_by_phase["backward"],
        forward_matmul_fixed_bytes=moved.matmul_fixed_bytes_by_phase["forward"],
        backward_matmul_fixed_bytes=moved.matmul_fixed_bytes_by_phase["backward"],
        forward_kernels=moved.kernels_by_phase["forward"],
        backward_kernels=moved.kernels_by_phase["backward"],
        saved_activation_bytes=saved,
        selective_recompute_saved_bytes=min(saved, tracker.selective_recompute_saved_bytes),
        selective_recompute_flops=tracker.core_forward_flops,
        input_activation_bytes=sum(t.numel() * t.element_size() for t in inputs),
        output=TensorMeta(tuple(output.shape), output.dtype),
        loss_saved_bytes=saved - layer_saved,
        attention_kv_bytes=tracker.core_kv_bytes,
    )
