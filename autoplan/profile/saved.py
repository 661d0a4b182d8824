"""What a layer keeps for backward: unique storages packed by autograd, split by whether the
attention core saved them.

``saved_tensors_hooks`` sees every tensor autograd keeps; counting unique storages (not tensors)
charges views of one buffer once. Parameters are excluded (they are weights, not activations).
A torch-function mode marks the span of ``scaled_dot_product_attention`` (the attention core of
Korthikanti et al.'s selective recompute): under selective recompute what only the core saved
is dropped and the core's inputs (q, k, v) are kept to recompute it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["SavedActivationTracker", "storage_key"]


def storage_key(tensor: torch.Tensor) -> int:
    """An identity of the tensor's storage, equal for all views of one buffer while it lives."""
    return tensor.untyped_storage()._cdata


class _AttentionCoreMode(TorchFunctionMode):
    def __init__(self, tracker: SavedActivationTracker) -> None:
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        tracker = self.tracker
        # The keys and values as the core receives them (what ring attention sends around).
        tracker.core_kv_bytes += sum(t.numel() * t.element_size() for t in args[1:3])
        for tensor in args[:3]:
            key = storage_key(tensor)
            tracker.core_input_keys.add(key)
            tracker.storage_bytes.setdefault(key, tensor.untyped_storage().nbytes())
        flops_before = tracker.count_flops()
        tracker.in_core = True
        try:
            return func(*args, **kwargs)
        finally:
            tracker.in_core = False
            tracker.core_forward_flops += tracker.count_flops() - flops_before


class SavedActivationTracker:
    """Context manager for one forward pass: records what autograd saves.

    Args:
        excluded_keys: storage keys not to count (the model's parameters and buffers).
        count_flops: returns FLOPs counted so far (to charge the attention core's FLOPs).
    """

    def __init__(self, excluded_keys: set[int], count_flops: Callable[[], int]) -> None:
        self.excluded_keys = excluded_keys
        self.count_flops = count_flops
        self.storage_bytes: dict[int, int] = {}
        self.saved_outside_core: set[int] = set()
        self.saved_inside_core: set[int] = set()
        self.core_input_keys: set[int] = set()
        self.core_forward_flops = 0
        self.core_kv_bytes = 0
        self.in_core = False
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._core_mode = _AttentionCoreMode(self)

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        key = storage_key(tensor)
        if key not in self.excluded_keys:
            self.storage_bytes[key] = tensor.untyped_storage().nbytes()
            (self.saved_inside_core if self.in_core else self.saved_outside_core).add(key)
        # Keeping the tensor itself keeps its storage (and so its key) alive until backward.
        return tensor

    @staticmethod
    def _unpack(tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def __enter__(self) -> SavedActivationTracker:
        self._hooks.__enter__()
        self._core_mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._core_mode.__exit__(*exc)
        self._hooks.__exit__(*exc)

    @property
    def saved_bytes(self) -> int:
        """Bytes of every unique storage saved for backward."""
        keys = self.saved_outside_core | self.saved_inside_core
        return sum(self.storage_bytes[key] for key in keys)

    @property
    def selective_recompute_saved_bytes(self) -> int:
        """Bytes saved when the attention core is recomputed: all but what only the core saved,
        plus the core's inputs."""
        kept = self.saved_outside_core | (self.core_input_keys - self.excluded_keys)
        return sum(self.storage_bytes[key] for key in kept)
