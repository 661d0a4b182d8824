"""What a real split-backward pipeline step holds between a micro-batch's F, its I and its W.

Used by tests/distributed_driver.py for plans whose name ends in ``_memory``. MemTracker
(``autoplan.profile.live_memory``) cannot watch a zero-bubble step in torch 2.13: its module
tracker puts multi-grad hooks on every module's outputs, and the input-gradient half (I), which
PyTorch runs with ``torch.autograd.grad``, stops in them ("A leaf node was passed to
_will_engine_execute_node but we are currently running autograd.grad()"). So this counts the
way MemTracker counts, without module hooks: a dispatch mode active only inside
``forward_one_chunk`` keeps a weak reference to every storage an op there creates, and the
bytes a forward's storages still hold are summed before and after every F, I (``backward_one_
chunk``) and W (``backward_weight_one_chunk``) of the step. Storages the stage received into
(its input) are not counted: PyTorch's receive buffers are allocated outside the forward.
What a W leaves of its micro-batch's forward is the stage's output (and on the last stage the
logits), which the schedule keeps until the step ends.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.pipelining import schedules, stage
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["recording_split_backward_memory"]


class _ForwardStorages(TorchDispatchMode):
    """Weak references to the storages ops create while active, with their sizes."""

    def __init__(self, live: dict[int, tuple[weakref.ref, int]]) -> None:
        super().__init__()
        self.live = live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for value in tree_flatten(out)[0]:
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                storage = value.untyped_storage()
                key = storage.data_ptr()
                known = self.live.get(key)
                if known is None or known[0]() is None:
                    self.live[key] = (weakref.ref(storage), storage.nbytes())
        return out


@contextmanager
def recording_split_backward_memory(path: Path) -> Iterator[None]:
    """While active, every pipeline step's actions are recorded; on exit ``path`` gets a JSON
    list of steps, each a list of [kind "F" | "I" | "W" | "B", stage, micro-batch, bytes held
    before, bytes held after], bytes being what the step's forwards allocated and still hold."""
    live: dict[int, tuple[weakref.ref, int]] = {}
    steps: list[list[list[Any]]] = []

    def held() -> int:
        return sum(size for ref, size in list(live.values()) if ref() is not None)

    base = stage._PipelineStageBase
    original_step = schedules.PipelineScheduleMulti.step
    original = {
        name: getattr(base, name)
        for name in ("forward_one_chunk", "backward_one_chunk", "backward_weight_one_chunk")
    }

    def step(self, *args, **kwargs):
        live.clear()  # what earlier steps left is not this step's
        steps.append([])
        return original_step(self, *args, **kwargs)

    def forward(self, chunk, *args, **kwargs):
        before = held()
        with _ForwardStorages(live):
            out = original["forward_one_chunk"](self, chunk, *args, **kwargs)
        steps[-1].append(["F", self.stage_index, chunk, before, held()])
        return out

    def backward(self, chunk, *args, **kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        before = held()
        out = original["backward_one_chunk"](self, chunk, *args, **kwargs)
        steps[-1].append(["B" if full else "I", self.stage_index, chunk, before, held()])
        return out

    def weight(self, chunk, *args, **kwargs):
        before = held()
        out = original["backward_weight_one_chunk"](self, chunk, *args, **kwargs)
        steps[-1].append(["W", self.stage_index, chunk, before, held()])
        return out

    schedules.PipelineScheduleMulti.step = step  # type: ignore[method-assign]
    base.forward_one_chunk = forward  # type: ignore[method-assign]
    base.backward_one_chunk = backward  # type: ignore[method-assign]
    base.backward_weight_one_chunk = weight  # type: ignore[method-assign]
    try:
        yield
    finally:
        schedules.PipelineScheduleMulti.step = original_step  # type: ignore[method-assign]
        for name, function in original.items():
            setattr(base, name, function)
        path.write_text(json.dumps(steps))
