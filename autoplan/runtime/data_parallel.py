"""The mesh executor's data parallelism over its "dp" dimension: DDP and the optimizers.

Without tensor parallelism the replicas use ``DistributedDataParallel``, the data parallelism
the plan's cost model assumes (full weights and gradients per replica, the gradient all-reduce
overlapping the last micro-batch's backward, optimizer states sharded by
``ZeroRedundancyOptimizer`` when the plan says ZeRO-1). With several pipeline stages, DDP is
built with ``find_unused_parameters=True``: that switches off DDP's first-iteration bucket
rebuild, which miscounts the parameters when a schedule runs the backwards of several
micro-batches (the ``params_.size() == rebuilt_param_indices_.size()`` assert in torch 2.13;
``static_graph=True`` avoids the assert but gave the last stage wrong gradients in our float64
test). The price is one walk of the autograd graph per step. The gradients are views into
DDP's all-reduce buckets (``gradient_as_bucket_view``): otherwise the buckets hold every
gradient once more beside ``.grad`` for the whole run, a second copy the plan would have to
count (``autoplan.cost.engines``).

DDP cannot hold DTensor parameters, so with tensor parallelism the replicas use FSDP2
``fully_shard`` over the "dp" sub-mesh instead (``fsdp.shard_stage``, chosen by
``parallelize``), per layer and then the stage, as torchtitan composes them. FSDP2 shards
weights, gradients and optimizer states across the replicas (less memory than the plan counts;
no ZeRO-1 on top), and keeps the weights gathered between forward and backward
(``reshard_after_forward=False``): each micro-batch would gather them again.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from autoplan.runtime.mixed_precision import MasterWeightAdamW

__all__ = ["make_optimizer", "replicate"]


def replicate(
    model: nn.Module, dp_mesh: DeviceMesh, device: torch.device, find_unused_parameters: bool
) -> nn.Module:
    """``model`` replicated over ``dp_mesh`` by DDP (``find_unused_parameters`` under a
    schedule of several stages: module docstring)."""
    return DistributedDataParallel(
        model,
        process_group=dp_mesh.get_group(),
        device_ids=[device.index] if device.type == "cuda" else None,
        find_unused_parameters=find_unused_parameters,
        gradient_as_bucket_view=True,
    )


def make_optimizer(
    params: list[nn.Parameter], dp_mesh: DeviceMesh, zero1: bool, learning_rate: float
) -> torch.optim.Optimizer | MasterWeightAdamW:
    """AdamW; with ``zero1`` and dp > 1 its states are sharded across the replicas (ZeRO-1).

    16-bit parameters train through fp32 master weights (``MasterWeightAdamW``). Under FSDP2
    (tensor parallel plans) the weights, and so the states, are sharded already.
    """
    sharded = any(_is_fsdp_sharded(p) for p in params)
    sixteen_bit = any(p.dtype in (torch.float16, torch.bfloat16) for p in params)
    shard_states = zero1 and dp_mesh.size() > 1 and not sharded
    if sixteen_bit:
        group = dp_mesh.get_group() if shard_states else None
        return MasterWeightAdamW(params, learning_rate, group)
    if shard_states:
        return ZeroRedundancyOptimizer(
            params,
            optimizer_class=torch.optim.AdamW,
            process_group=dp_mesh.get_group(),
            # One broadcast per rank's flat bucket instead of one per parameter.
            parameters_as_bucket_view=True,
            lr=learning_rate,
        )
    return torch.optim.AdamW(params, lr=learning_rate)


def _is_fsdp_sharded(param: torch.Tensor) -> bool:
    # FSDP2 turns parameters into DTensors on a mesh with the "dp" dimension.
    return isinstance(param, DTensor) and "dp" in (param.device_mesh.mesh_dim_names or ())
