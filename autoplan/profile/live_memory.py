"""Memory that real tensors hold, measured with PyTorch's MemTracker.

``torch.distributed._tools`` is private, so it is used only here. MemTracker follows every
storage that aten ops allocate (a dispatch mode plus weak references), a different path from
the profiler's ``saved_tensors_hooks`` count, which is why tests use it as a check.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

__all__ = ["bytes_held_after"]

T = TypeVar("T")


def _total_bytes(snapshot: dict) -> int:
    return sum(per_device.get("Total", 0) for per_device in snapshot.values())


def bytes_held_after(module: nn.Module, run: Callable[[], T]) -> tuple[int, T]:
    """Run ``run()`` on real tensors and return the bytes of storages it allocated that are
    still alive when it returns (for a forward pass: what autograd keeps), and its result.

    ``module``'s parameters are registered first so that they are not counted as new.
    """
    tracker = MemTracker()
    tracker.track_external(module)
    with tracker:
        before = _total_bytes(tracker.get_tracker_snapshot("current"))
        result = run()
        after = _total_bytes(tracker.get_tracker_snapshot("current"))
    return after - before, result
