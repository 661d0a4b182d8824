"""AdamW over fp32 master weights for 16-bit training, sharded across replicas under ZeRO-1.

Training in bf16/fp16 keeps the model's weights and gradients in 16 bits for compute, but adds
each update to an fp32 master copy (16-bit weights would drop updates smaller than their
resolution) and keeps Adam's moments in fp32: 2 + 2 + 12 bytes per parameter, the count the
plan's memory estimate uses. Under ZeRO-1 each data-parallel rank keeps the master copies and
moments of its own share of the parameters only, updates those, and broadcasts the new 16-bit
weights to the other replicas (as Megatron's distributed optimizer, without its bucketing).

PyTorch has no such optimizer for DDP (``ZeroRedundancyOptimizer`` shards the states of the
parameters it is given, which would be 16-bit ones, and FSDP2's mixed precision keeps fp32
weights sharded instead), hence this small one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["MasterWeightAdamW"]


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _master_dtype(dtype: torch.dtype) -> torch.dtype:
    # 16-bit weights get fp32 masters; wider ones are their own precision already.
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _owners(params: list[nn.Parameter], ranks: int) -> list[int]:
    """Each parameter's owning dp rank: largest first onto the least-loaded rank (as ZeRO)."""
    load = [0] * ranks
    owner = [0] * len(params)
    for index in sorted(range(len(params)), key=lambda i: (-params[i].numel(), i)):
        rank = min(range(ranks), key=lambda r: (load[r], r))
        owner[index] = rank
        load[rank] += params[index].numel()
    return owner


class MasterWeightAdamW:
    """AdamW on fp32 masters of 16-bit ``params`` (wider ones are their own masters); a
    ``dp_group`` shards the masters and moments over it (ZeRO-1)."""

    def __init__(
        self,
        params: list[nn.Parameter],
        learning_rate: float,
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.params = params
        self.dp_group = dp_group
        ranks = dist.get_world_size(dp_group) if dp_group is not None else 1
        me = dist.get_rank(dp_group) if dp_group is not None else 0
        owners = _owners(params, ranks)
        self._owner_global_rank = [
            dist.get_global_rank(dp_group, owner) if dp_group is not None else 0 for owner in owners
        ]
        self._owned = [index for index, owner in enumerate(owners) if owner == me]
        # A parameter already as wide as its master (fp32, fp64) is its own master: no copy.
        # That also makes this the ZeRO-1 optimizer of any dtype for DTensor parameters, which
        # ZeroRedundancyOptimizer cannot broadcast.
        self.masters = [
            params[index]
            if _master_dtype(params[index].dtype) == params[index].dtype
            else nn.Parameter(params[index].detach().clone().to(_master_dtype(params[index].dtype)))
            for index in self._owned
        ]
        self.inner = torch.optim.AdamW(self.masters, lr=learning_rate)

    @property
    def state(self) -> dict:
        """The inner optimizer's states (fp32 moments of the owned parameters)."""
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the 16-bit gradients (the masters' are rebuilt each step)."""
        for param in self.params:
            param.grad = None

    @torch.no_grad()
    def step(self) -> None:
        """Update the owned masters from the 16-bit gradients, then every replica's weights."""
        for master, index in zip(self.masters, self._owned, strict=True):
            if master is not self.params[index]:
                grad = self.params[index].grad
                master.grad = None if grad is None else grad.to(master.dtype)
        self.inner.step()
        for master, index in zip(self.masters, self._owned, strict=True):
            if master is not self.params[index]:
                self.params[index].copy_(master)
        if self.dp_group is not None:
            # One broadcast per owner of all its parameters, flattened (the dtypes of a model's
            # parameters agree), instead of one per parameter.
            for source in sorted(set(self._owner_global_rank)):
                tensors = [
                    _local(param.data)
                    for param, owner in zip(self.params, self._owner_global_rank, strict=True)
                    if owner == source
                ]
                flat = torch.cat([tensor.reshape(-1) for tensor in tensors])
                dist.broadcast(flat, src=source, group=self.dp_group)
                offset = 0
                for tensor in tensors:
                    tensor.copy_(flat[offset : offset + tensor.numel()].view_as(tensor))
                    offset += tensor.numel()

    def master_bytes(self) -> int:
        """Bytes of the fp32 master copies this rank holds (parameters that are their own
        masters count as parameters, not here)."""
        own = {id(param) for param in self.params}
        return sum(
            _local(m).numel() * _local(m).element_size() for m in self.masters if id(m) not in own
        )
