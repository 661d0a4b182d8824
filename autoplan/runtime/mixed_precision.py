"""16-bit training: AdamW over fp32 master weights (sharded across replicas under ZeRO-1), and
dynamic loss scaling for fp16.

Training in bf16/fp16 keeps the model's weights and gradients in 16 bits for compute, but adds
each update to an fp32 master copy (16-bit weights would drop updates smaller than their
resolution) and keeps Adam's moments in fp32: 2 + 2 + 12 bytes per parameter, the count the
plan's memory estimate uses. Under ZeRO-1 each data-parallel rank keeps the master copies and
moments of its own share of the parameters only, updates those, and broadcasts the new 16-bit
weights to the other replicas (as Megatron's distributed optimizer, without its bucketing).

PyTorch has no such optimizer for DDP (``ZeroRedundancyOptimizer`` shards the states of the
parameters it is given, which would be 16-bit ones, and FSDP2's mixed precision keeps fp32
weights sharded instead), hence this small one.

fp16 (for GPUs without bf16 tensor cores: V100, Turing) has bf16's precision to spare but not
its range: gradients under ~6e-8 flush to zero. ``DynamicLossScale`` multiplies the loss by a
scale S before backward (the gradients are S times larger, above fp16's underflow) and the
optimizer divides them by S in fp32, on the master copies. Its policy is
``torch.amp.GradScaler``'s (S starts at 2^16, halves on a step whose gradients hold an inf or
NaN, which is then skipped, and doubles after 2000 clean steps). GradScaler itself does not fit:
it unscales the gradients of a torch optimizer's own parameters in place (here the fp16
gradients, where unscaling would underflow again) and decides per optimizer, whereas a
pipeline's stages and replicas must skip a step together: the decision is one all-reduce over
the world, and it detects with PyTorch's own check (``_amp_foreach_non_finite_check_and_unscale_``).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

__all__ = ["DynamicLossScale", "MasterWeightAdamW"]


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
        # The loss scale the gradients carry (``DynamicLossScale``): divided out in fp32.
        self.grad_scale = 1.0

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
                master.grad = None if grad is None else grad.to(master.dtype) / self.grad_scale
            elif master.grad is not None and self.grad_scale != 1.0:
                master.grad.div_(self.grad_scale)
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


class DynamicLossScale:
    """The loss scale of fp16 training (module docstring): ``value`` multiplies the loss;
    ``check`` says whether this step's gradients are finite on every rank; ``update`` moves
    the scale after the step (GradScaler's defaults)."""

    def __init__(
        self,
        initial: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
    ) -> None:
        self.value = initial
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.growth_interval = growth_interval
        self.clean_steps = 0
        self.skipped_steps = 0

    def check(self, models: list[nn.Module], device: torch.device) -> bool:
        """True when every gradient of every rank is finite (a collective: all ranks call it)."""
        found = torch.zeros(1, device=device)
        unit = torch.ones(1, device=device)
        grads = [
            _local(param.grad)
            for model in models
            for param in model.parameters()
            if param.grad is not None
        ]
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for grad in grads:
            by_dtype.setdefault(grad.dtype, []).append(grad)
        for group in by_dtype.values():
            # Checks for inf/NaN (sets found to 1); the scale of 1 leaves them as they are.
            torch._amp_foreach_non_finite_check_and_unscale_(group, found, unit)
        if dist.is_initialized():
            dist.all_reduce(found, op=dist.ReduceOp.MAX)
        return bool(found.item() == 0)

    def update(self, finite: bool) -> None:
        """After a step: back off (the step was skipped) or count towards growing."""
        if not finite:
            self.value *= self.backoff_factor
            self.clean_steps = 0
            self.skipped_steps += 1
            return
        self.clean_steps += 1
        if self.clean_steps == self.growth_interval:
            self.value *= self.growth_factor
            self.clean_steps = 0
