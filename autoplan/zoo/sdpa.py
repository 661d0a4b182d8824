"""The attention call every zoo model makes (``F.scaled_dot_product_attention``), as data, and
a torch-function mode that runs it another way.

The profiler's unfused attention (``autoplan.profile.attention``) and the runtime's ring
attention (``autoplan.runtime.context_parallel``) are both such a mode: the models keep
calling SDPA, and the mode decides what runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

__all__ = ["SdpaCall", "SdpaMode"]


@dataclass(frozen=True)
class SdpaCall:
    """One ``F.scaled_dot_product_attention`` call's arguments by name, torch's defaults."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None = None
    dropout_p: float = 0.0
    is_causal: bool = False
    scale: float | None = None
    enable_gqa: bool = False

    def kv_per_query_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Key and value with each head repeated for the query heads that share it under
        grouped-query attention (``enable_gqa``, fewer key-value heads); else as given."""
        key, value = self.key, self.value
        if self.enable_gqa and key.shape[-3] != self.query.shape[-3]:
            group = self.query.shape[-3] // key.shape[-3]
            key = key.repeat_interleave(group, dim=-3)
            value = value.repeat_interleave(group, dim=-3)
        return key, value


class SdpaMode(TorchFunctionMode):
    """Within it, each ``F.scaled_dot_product_attention`` call runs as ``attention(call)``;
    every other function runs as it is."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is not F.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return self.attention(SdpaCall(*args, **kwargs))

    def attention(self, call: SdpaCall) -> torch.Tensor:
        """The attention's output for ``call``: what the subclass runs in SDPA's place."""
        raise NotImplementedError
