"""Megatron-style sequence parallelism (Korthikanti et al. 2022) on top of tensor parallelism,
with torch's parallel styles.

Inside a block the residual stream is sharded along the sequence (dim 1) over the tp group:
the norms run on their shard (``SequenceParallel``), the input of each sub-layer whose
column-split projections fan out (attention's q/k/v, the MLP's up/gate) is all-gathered once
(``PrepareModuleInput`` from ``Shard(1)`` to ``Replicate()``: its backward is the
reduce-scatter), and the row-split projections reduce-scatter their partial sums to the
sequence shards (``RowwiseParallel(output_layouts=Shard(1))``: its backward is the
all-gather). The embedding and the head keep tensor parallelism alone; a run of consecutive
blocks takes its input's own shard (a local slice; the backward all-gathers the gradient) and
gives the whole sequence back at its end (an all-gather; the backward keeps the gradient's
own slice), so what passes between stages, and to the embedding or head, is the whole
activation, as without SP.

The gathered input of a column-split projection is what its matmul saves for the weight
gradient. Kept so, it would hold the whole sequence: without recompute, a saved-tensor hook
keeps the shard instead and all-gathers it again when backward needs it (Megatron's
re-gather), so saved activations divide by t. Under selective recompute the gather is among
the ops recomputed (``autoplan.runtime.recompute``), and under full the whole block is: the
hook is not needed there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ParallelStyle,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = [
    "is_norm",
    "sequence_parallel_plan",
    "shard_sequence_between_layers",
]

_SEQUENCE = Shard(1)


def is_norm(module: nn.Module) -> bool:
    """LayerNorm, RMSNorm and the zoo's norms (a class name ending in 'Norm')."""
    return isinstance(module, nn.LayerNorm | nn.RMSNorm) or type(module).__name__.endswith("Norm")


def sequence_parallel_plan(
    layer: nn.Module, plan: dict[str, ParallelStyle], column_names: frozenset[str]
) -> dict[str, ParallelStyle]:
    """``plan`` (a block's tensor-parallel plan, module name → style) with the sequence
    sharded between its sub-layers (module docstring)."""
    out: dict[str, ParallelStyle] = {}
    for name, style in plan.items():
        out[name] = (
            RowwiseParallel(output_layouts=_SEQUENCE) if type(style) is RowwiseParallel else style
        )
    for name, module in layer.named_modules():
        if name and is_norm(module) and name not in out:  # per-head norms keep their style
            out[name] = SequenceParallel()
        children = {child for child, _ in module.named_children()}
        if name and children & column_names:
            out[name] = PrepareModuleInput(
                input_layouts=(_SEQUENCE,), desired_input_layouts=(Replicate(),)
            )
    return out


def column_inputs(layer: nn.Module, column_names: frozenset[str]) -> list[nn.Module]:
    """The sub-layers of ``layer`` whose children include column-split projections."""
    return [
        module
        for name, module in layer.named_modules()
        if name and {child for child, _ in module.named_children()} & column_names
    ]


class _Regathered:
    """A saved gathered input kept as its sequence shard (see ``_regathering_forward``)."""

    def __init__(self, shard: torch.Tensor, size: torch.Size, stride: tuple[int, ...]) -> None:
        self.shard = shard
        self.size = size
        self.stride = stride


def _regathering_forward(forward: Callable[..., Any], x: Any, *args: Any, **kwargs: Any) -> Any:
    """Run ``forward`` on the gathered input ``x`` with its saved copies kept as the shard."""
    if not isinstance(x, DTensor) or not torch.is_grad_enabled():
        return forward(x, *args, **kwargs)
    mesh = x.device_mesh
    whole = x._local_tensor
    storage = whole.untyped_storage().data_ptr()
    whole_size, whole_stride = whole.size(), whole.stride()
    with torch.no_grad():
        shard = x.redistribute(mesh, [_SEQUENCE]).to_local().clone()
    # The regathered whole input, shared by the projections that saved it (q, k and v save
    # one tensor each), dropped when the last of them has taken it.
    cache: dict[str, Any] = {"packed": 0}

    def pack(saved: torch.Tensor) -> Any:
        local = saved._local_tensor if isinstance(saved, DTensor) else None
        if local is None or local.untyped_storage().data_ptr() != storage:
            return saved
        cache["packed"] += 1
        return _Regathered(shard, saved.size(), (int(local.storage_offset()), *local.stride()))

    def unpack(packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Regathered):
            return packed
        if "whole" not in cache:
            with torch.no_grad():
                gathered = DTensor.from_local(
                    packed.shard,
                    mesh,
                    [_SEQUENCE],
                    run_check=False,
                    shape=whole_size,
                    stride=whole_stride,
                ).redistribute(mesh, [Replicate()])
            cache["whole"] = gathered.to_local()
        local = cache["whole"]
        cache["packed"] -= 1
        if cache["packed"] == 0:
            del cache["whole"]
        offset, *stride = packed.stride
        view = local.as_strided(packed.size, stride, offset)
        return DTensor.from_local(view, mesh, [Replicate()], run_check=False)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        return forward(x, *args, **kwargs)


def keep_saved_inputs_sharded(layer: nn.Module, column_names: frozenset[str]) -> None:
    """Install the re-gather on ``layer``'s column-split sub-layers (module docstring); set on
    the instances, after the styles' hooks have gathered the input."""
    for module in column_inputs(layer, column_names):
        module.forward = functools.partial(_regathering_forward, module.forward)


def _own_shard(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    # Replicate → Shard(1) is a local slice; its backward all-gathers the gradient.
    return (
        DTensor.from_local(x, mesh, [Replicate()], run_check=False)
        .redistribute(mesh, [_SEQUENCE])
        .to_local()
    )


def _whole(x: torch.Tensor, mesh: DeviceMesh) -> torch.Tensor:
    # Shard(1) → Replicate all-gathers; its backward keeps the (replicated) gradient's slice.
    return (
        DTensor.from_local(x, mesh, [_SEQUENCE], run_check=False)
        .redistribute(mesh, [Replicate()])
        .to_local()
    )


def shard_sequence_between_layers(layers: list[tuple[nn.Module, bool]], mesh: DeviceMesh) -> None:
    """Hooks at the ends of each run of sequence-sharded layers of one stage (``layers`` in
    order, with whether each is sharded): its first takes its input's shard, its last gives
    the whole sequence back."""
    for position, (layer, sharded) in enumerate(layers):
        if not sharded:
            continue
        if position == 0 or not layers[position - 1][1]:
            layer.register_forward_pre_hook(
                lambda _module, args: (_own_shard(args[0], mesh), *args[1:])
            )
        if position + 1 == len(layers) or not layers[position + 1][1]:
            layer.register_forward_hook(lambda _module, _args, out: _whole(out, mesh))
