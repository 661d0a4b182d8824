"""FLOP counting: torch's ``FlopCounterMode`` with formulas for the CPU attention kernels.

PyTorch's counter knows the CUDA attention kernels but not
``aten._scaled_dot_product_flash_attention_for_cpu`` (and its backward), which is what
``scaled_dot_product_attention`` dispatches to on fake CPU tensors, so it would count attention
as zero. The formulas are the ones torch uses for the CUDA flash kernel: two matmuls forward
(QKᵀ and PV, the full s×s, no causal halving) and their gradients backward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

__all__ = ["CPU_ATTENTION_FLOP_FORMULAS", "flop_counter"]

_aten = torch.ops.aten


def _cpu_flash_forward_flops(
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def _cpu_flash_backward_flops(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    out_shape: Any = None,
    **kwargs: Any,
) -> int:
    return sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)


# Passed as FlopCounterMode's custom_mapping (which wraps them to receive shapes), so torch's
# global registry is left untouched.
CPU_ATTENTION_FLOP_FORMULAS: dict[Any, Any] = {
    _aten._scaled_dot_product_flash_attention_for_cpu: _cpu_flash_forward_flops,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_flash_backward_flops,
}


def flop_counter() -> FlopCounterMode:
    """A silent FlopCounterMode that also counts CPU flash attention."""
    return FlopCounterMode(display=False, custom_mapping=CPU_ATTENTION_FLOP_FORMULAS)
