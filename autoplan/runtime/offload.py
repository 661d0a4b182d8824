"""Activation offload per stage: saved activations go to host memory between forward and backward.

``torch.autograd.graph.save_on_cpu`` is the model: saved-tensor hooks that copy each tensor
autograd keeps to host memory (pinned where CUDA is, so the copies run asynchronously on the
copy engine) and back to the device when backward unpacks it. ``HostOffload`` is that context
with three differences the plan's memory model needs:

- parameters (and buffers) stay where they are: they are weights, resident anyway, not
  activations (``save_on_cpu`` would copy every weight a matmul saves, once per micro-batch);
- a storage is copied once however many views of it autograd saves (the profile counts
  activations by unique storage, ``autoplan.profile.saved``), and the views are rebuilt on
  the device from the one copy;
- it counts the bytes it moved, which the memory-model test compares with the prediction.

It is set per layer on the instance (as ``recompute`` does), outside the layer's checkpoint
when the replica also recomputes, so what goes to host is exactly what the recompute mode
keeps. On a CPU-only machine the "host" copy is a second CPU buffer: the numerics and the byte
counts are those of a GPU run, the transfer is a memcpy.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.multiprocessing.reductions import StorageWeakRef

from autoplan.runtime.model_stage import pipeline_layers

__all__ = ["HostOffload", "OffloadCounter", "apply_offload"]


def _key(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage()._cdata


class OffloadCounter:
    """Bytes a set of offloading layers moved to host and kept on the device (parameters).

    With ``track_originals`` it also keeps weak references to the device storages it copied,
    so a test can ask how many of their bytes are still alive (``device_bytes_alive``): what
    offload failed to free. Off in training (the list would grow every micro-batch)."""

    def __init__(self, track_originals: bool = False) -> None:
        self.packed_bytes = 0
        self.kept_bytes = 0
        self.packed_storages = 0
        self.track_originals = track_originals
        self.originals: list[tuple[StorageWeakRef, int]] = []

    def device_bytes_alive(self) -> int:
        """Bytes of the copied device storages that are still alive."""
        return sum(nbytes for ref, nbytes in self.originals if not ref.expired())


def _resident_keys(module: nn.Module) -> set[int]:
    keys = set()
    for tensor in [*module.parameters(), *module.buffers()]:
        local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
        keys.add(_key(local))
    return keys


class HostOffload(torch.autograd.graph.saved_tensors_hooks):
    """Saved-tensor hooks moving what autograd saves in ``module``'s forward to host memory
    (module docstring); ``counter`` accumulates what was moved."""

    def __init__(self, module: nn.Module, counter: OffloadCounter | None = None) -> None:
        self.pin = torch.cuda.is_available()
        self.counter = counter or OffloadCounter()
        resident = _resident_keys(module)
        # Storage key -> (a weak reference to it, its host copy). Views of one buffer may reach
        # the hook after the earlier views died; the storage's weak reference tells whether it
        # is still the same buffer (and keeps its key from being reused meanwhile).
        copies: dict[int, tuple[StorageWeakRef, torch.Tensor]] = {}

        def pack(tensor: torch.Tensor) -> Any:
            if isinstance(tensor, DTensor):
                # Tensor-parallel ops save DTensors: offload the local shard, keep the layout.
                return (
                    "dtensor",
                    pack(tensor._local_tensor),
                    tensor.device_mesh,
                    (
                        tensor.placements,
                        tensor.shape,
                        tensor.stride(),
                    ),
                )
            if type(tensor) is not torch.Tensor and not isinstance(tensor, nn.Parameter):
                # Other tensor subclasses have no storage of their own to copy: left in place.
                self.counter.kept_bytes += tensor.numel() * tensor.element_size()
                return tensor
            key = _key(tensor)
            if key in resident or tensor.layout != torch.strided or tensor.is_quantized:
                self.counter.kept_bytes += tensor.untyped_storage().nbytes()
                return tensor
            cached = copies.get(key)
            if cached is not None and not cached[0].expired():
                host = cached[1]
            else:
                storage = tensor.untyped_storage()
                whole = torch.empty(0, dtype=torch.uint8, device=tensor.device).set_(storage)
                host = torch.empty(whole.shape, dtype=torch.uint8, pin_memory=self.pin)
                host.copy_(whole, non_blocking=self.pin)
                copies[key] = (StorageWeakRef(storage), host)
                self.counter.packed_bytes += storage.nbytes()
                self.counter.packed_storages += 1
                if self.counter.track_originals:
                    self.counter.originals.append((StorageWeakRef(storage), storage.nbytes()))
            view = (tensor.dtype, tensor.size(), tensor.stride(), tensor.storage_offset())
            return tensor.device, host, view

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, torch.Tensor):
                return packed
            if packed[0] == "dtensor":
                _, local, mesh, (placements, shape, stride) = packed
                return DTensor.from_local(
                    unpack(local), mesh, placements, run_check=False, shape=shape, stride=stride
                )
            device, host, (dtype, size, stride, offset) = packed
            storage = host.to(device, non_blocking=self.pin).untyped_storage()
            return torch.empty(0, dtype=dtype, device=device).set_(storage, offset, size, stride)

        super().__init__(pack, unpack)


def _offloaded(
    module: nn.Module, forward: Callable[..., Any], counter: OffloadCounter
) -> Callable[..., Any]:
    @functools.wraps(forward)
    def run(*args: Any, **kwargs: Any) -> Any:
        with HostOffload(module, counter):
            return forward(*args, **kwargs)

    return run


def apply_offload(
    model: nn.Module, offload: bool, counter: OffloadCounter | None = None
) -> OffloadCounter | None:
    """Offload the saved activations of every pipeline layer of ``model`` (after
    ``apply_recompute``, so the hooks sit outside its checkpoints); the counter of what
    moved, or None when ``offload`` is off."""
    if not offload:
        return None
    counter = counter or OffloadCounter()
    for _, layer in pipeline_layers(model):
        layer.forward = _offloaded(layer, layer.forward, counter)
    return counter
