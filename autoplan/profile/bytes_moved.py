"""Bytes moved per aten op, the memory term of a roofline model.

No PyTorch facility counts memory traffic, so this is a small dispatch mode of our own: each
aten op that is not a view is charged the bytes of every tensor it reads (its tensor arguments)
plus every tensor it writes (its outputs). This is the traffic of an unfused execution, an
upper bound on what a fusing compiler moves; views move nothing and are charged nothing.
Lookups (embedding, index_select, gather) read only the rows they return, not their whole
table: they are charged the indices plus twice the output (rows read, rows written). Ops that
return no tensor (metadata queries such as ``prim.device``) and ``_unsafe_view`` (a reshape
that shares its input's storage though its schema does not say so) move nothing.

The bytes of ops that are not matmul-class (everything but mm/bmm/addmm/baddbmm/linear,
convolutions and the fused attention kernels, forward and backward) are also summed apart:
elementwise, normalisation, softmax, loss, copies and lookups, whose time is their traffic
(their FLOPs are not counted, and their work grows with h while the matmuls' grows with h²).

Two more figures per phase feed the cost model's work-dependent terms:
- The matmul-class bytes that do not grow with the batch (``matmul_fixed_bytes_by_phase``):
  operands that are the layer's parameters, and the outputs of parameter-free matmuls that
  have a parameter's shape (or its transpose): the weight gradients, dW = dYᵀ·X. When the
  micro-batch grows, a GEMM's FLOPs and activation operands grow with it but these do not, so
  its arithmetic intensity rises (``autoplan.cost.efficiency``).
- The kernels launched (``kernels_by_phase``): every op that moves bytes is one launch. A pass
  cannot run faster than the host can launch its kernels, whatever the GPU.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

__all__ = ["BytesMovedMode", "Phase"]

Phase = Literal["forward", "backward"]

_aten = torch.ops.aten
_LOOKUPS = {_aten.embedding.default, _aten.index_select.default, _aten.gather.default}
_FREE = {_aten._unsafe_view.default}
# Ops whose time is their FLOPs (compute-bound on tensor cores); every other op is memory-bound.
_MATMUL_CLASS = {
    getattr(_aten, name)
    for name in (
        "mm",
        "bmm",
        "addmm",
        "baddbmm",
        "addbmm",
        "linear",
        "convolution",
        "convolution_backward",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
    )
    if hasattr(_aten, name)
}


def _tensor_bytes(tree: Any) -> int:
    return sum(
        leaf.numel() * leaf.element_size()
        for leaf in tree_leaves(tree)
        if isinstance(leaf, torch.Tensor)
    )


def _shape_key(shape: torch.Size) -> tuple[int, ...]:
    return tuple(shape)


class BytesMovedMode(TorchDispatchMode):
    """Sums input + output tensor bytes of every non-view aten op, per phase, and apart those
    of the memory-bound (not matmul-class) ops; counts kernels and the matmuls' fixed bytes
    (module docstring). ``parameters``: the layer's parameters (their storages and shapes)."""

    def __init__(self, parameters: list[torch.Tensor] | None = None) -> None:
        super().__init__()
        self.phase: Phase = "forward"
        self.bytes_by_phase: dict[Phase, int] = {"forward": 0, "backward": 0}
        self.memory_bound_bytes_by_phase: dict[Phase, int] = {"forward": 0, "backward": 0}
        self.matmul_fixed_bytes_by_phase: dict[Phase, int] = {"forward": 0, "backward": 0}
        self.kernels_by_phase: dict[Phase, int] = {"forward": 0, "backward": 0}
        self.paused = False
        """While True nothing is charged (e.g. creating the gradient a stage would receive)."""
        parameters = parameters or []
        self._parameter_keys = {p.untyped_storage()._cdata for p in parameters}
        shapes = {_shape_key(p.shape) for p in parameters if p.dim() == 2}
        self._parameter_shapes = shapes | {shape[::-1] for shape in shapes}

    def _matmul_fixed_bytes(self, args: Any, kwargs: Any, out: Any) -> int:
        """Bytes of a matmul's operands that do not scale with the batch (module docstring)."""
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        fixed = [t for t in inputs if t.untyped_storage()._cdata in self._parameter_keys]
        if not fixed:
            fixed = [
                t
                for t in tree_leaves(out)
                if isinstance(t, torch.Tensor) and _shape_key(t.shape) in self._parameter_shapes
            ]
        return _tensor_bytes(fixed)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.paused or func in _FREE or not _tensor_bytes(out):
            return out
        if func in _LOOKUPS:
            indices = [arg for arg in args[1:] if isinstance(arg, torch.Tensor)]
            moved = _tensor_bytes(indices) + 2 * _tensor_bytes(out)
        elif not func.is_view:
            moved = _tensor_bytes((args, kwargs)) + _tensor_bytes(out)
        else:
            return out
        self.bytes_by_phase[self.phase] += moved
        self.kernels_by_phase[self.phase] += 1
        if func.overloadpacket not in _MATMUL_CLASS:
            self.memory_bound_bytes_by_phase[self.phase] += moved
        else:
            self.matmul_fixed_bytes_by_phase[self.phase] += self._matmul_fixed_bytes(
                args, kwargs, out
            )
        return out
