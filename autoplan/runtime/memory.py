"""What a rank's memory holds: its peak, and the bytes of its model states.

The peak is CUDA's ``max_memory_allocated`` on a GPU; on CPU only the process's peak resident
set size exists, which includes Python and torch themselves (some 300 MB), so the model-state
bytes (parameters, gradients and optimizer states, as this rank holds them after sharding) are
measured too: they compare directly with the plan's weights + gradients + optimizer estimate.
DDP's gradient buckets count with the gradients (``gradient_bucket_bytes``): the cost model
counts them there (``autoplan.cost.engines``).
"""

from __future__ import annotations

import resource
import sys

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from autoplan.runtime.mixed_precision import MasterWeightAdamW

__all__ = ["gradient_bucket_bytes", "model_state_bytes", "peak_memory_bytes"]


def peak_memory_bytes(device: torch.device) -> int:
    """Peak memory of this process so far: CUDA allocations, or the CPU peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def _local_bytes(tensor: torch.Tensor) -> int:
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def gradient_bucket_bytes(module: nn.Module) -> int:
    """Bytes of the flat gradient buckets DDP's reducer allocated for ``module`` (0 for any
    other module, and where the gradients are views into the buckets). Read from DDP's own
    logging data (torch 2.13's ``_get_ddp_logging_data``: its ``bucket_sizes`` in bytes)."""
    if not isinstance(module, DistributedDataParallel):
        return 0
    data = module._get_ddp_logging_data()
    if data.get("gradient_as_bucket_view"):
        return 0
    return sum(int(size) for size in str(data.get("bucket_sizes", "")).split(",") if size)


def model_state_bytes(
    models: list[nn.Module],
    optimizers: list[torch.optim.Optimizer | MasterWeightAdamW],
    data_parallel_modules: list[nn.Module] | None = None,
) -> int:
    """Bytes of this rank's parameters, gradients and optimizer states (its shards only), and
    the gradient buckets of its ``data_parallel_modules`` (``gradient_bucket_bytes``)."""
    seen: set[int] = set()
    total = sum(gradient_bucket_bytes(m) for m in data_parallel_modules or [])
    for model in models:
        for param in model.parameters():
            if id(param) in seen:
                continue
            seen.add(id(param))
            total += _local_bytes(param)
            if param.grad is not None:
                total += _local_bytes(param.grad)
    for optimizer in optimizers:
        # ZeroRedundancyOptimizer keeps this rank's shard of the states in a local optimizer;
        # MasterWeightAdamW keeps fp32 master weights besides its states.
        local_optimizer = getattr(optimizer, "optim", optimizer)
        if isinstance(optimizer, MasterWeightAdamW):
            total += optimizer.master_bytes()
        for state in local_optimizer.state.values():
            for value in state.values():
                if isinstance(value, torch.Tensor):
                    total += _local_bytes(value)
    return total
