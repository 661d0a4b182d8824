"""What a mixture-of-experts layer's routed experts cost, traced apart from the rest.

The block's own trace already holds the experts' FLOPs at their capacity (dispatch has static
shapes: :mod:`autoplan.zoo.moe`). Expert parallelism needs them apart: it moves the experts'
weights (not their work: each rank runs E/ep experts on ep times as many slots) and adds the
all-to-alls that carry the ``(experts, capacity, hidden)`` slot buffer to the experts' ranks
and back. So the grouped experts are traced once more on a fake buffer of that shape, with
the router's top-k and the capacity factor the model holds.
"""

from __future__ import annotations

import torch
from torch import nn

from autoplan.profile.schema import ExpertProfile, LayerProfile
from autoplan.profile.tracer import trace_layer
from autoplan.zoo.moe import MoE

__all__ = ["active_parameter_count", "expert_profile"]


def active_parameter_count(layers: list[LayerProfile]) -> int | None:
    """Parameters one token passes through: all but the E - k routed experts it skips in each
    MoE layer; None when no layer has experts."""
    if all(layer.experts is None for layer in layers):
        return None
    skipped = sum(
        layer.experts.expert_param_count
        * (layer.experts.num_experts - layer.experts.top_k)
        // layer.experts.num_experts
        for layer in layers
        if layer.experts is not None
    )
    return sum(layer.param_count for layer in layers) - skipped


def expert_profile(layer: nn.Module, tokens: int, dtype: torch.dtype) -> ExpertProfile | None:
    """The routed experts of ``layer`` (call under FakeTensorMode) for ``tokens`` tokens per
    micro-batch, or None where the layer has none. A layer holds at most one MoE."""
    found = [module for module in layer.modules() if isinstance(module, MoE)]
    if not found:
        return None
    if len(found) > 1:
        raise ValueError(f"a layer holds {len(found)} mixture-of-experts modules; at most one")
    (moe,) = found
    experts, hidden = moe.experts.gate.shape[0], moe.experts.gate.shape[1]
    capacity = moe.capacity(tokens)
    slots = torch.empty(experts, capacity, hidden, dtype=dtype, requires_grad=True)
    trace = trace_layer(moe.experts, [slots])
    return ExpertProfile(
        num_experts=moe.num_experts,
        top_k=moe.top_k,
        capacity_factor=moe.capacity_factor,
        capacity_tokens=capacity,
        expert_param_count=sum(p.numel() for p in moe.experts.parameters()),
        expert_forward_flops=trace.forward_flops // experts,
        expert_backward_flops=trace.backward_flops // experts,
        dispatch_bytes=experts * capacity * hidden * dtype.itemsize,
    )
