"""Which attention kernel the profiler traces: fused flash (the default) or the unfused math.

``flash`` leaves ``scaled_dot_product_attention`` alone: on fake CPU tensors it dispatches to
the CPU flash kernel, which never materialises the s×s scores (autoplan's runtime runs SDPA,
flash on GPU). ``math`` replaces each ``scaled_dot_product_attention`` call with the unfused
composition Megatron-LM (2021) ran: QKᵀ as one batched matmul with the scale folded in
(``baddbmm`` alpha, the causal or given mask as its broadcast additive input), a softmax over
the s×s scores in the training dtype, then the product with V. The s×s tensors are written,
read and (the probabilities) saved for backward, so memory-bound bytes grow by the softmax's
traffic and saved activations by the probabilities.

Why not ``sdpa_kernel(SDPBackend.MATH)``: torch's math backend upcasts 16-bit q, k and v to
fp32 (for accuracy), so its s×s tensors are fp32 and its scale and mask are separate
elementwise passes: twice and more the traffic of Megatron-LM's fused scale-mask-softmax,
which reads and writes the scores once in 16 bits. The substitution here is a torch-function
mode, so the selective-recompute tracker (an inner mode on the same function) still sees the
attention core as one call and still counts what it saves as the core's.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from autoplan.errors import InputError
from autoplan.zoo.sdpa import SdpaCall, SdpaMode

__all__ = ["ATTENTION_KERNELS", "AttentionKernel", "UnfusedAttentionMode"]

AttentionKernel = Literal["flash", "math"]
ATTENTION_KERNELS: tuple[AttentionKernel, ...] = ("flash", "math")


class UnfusedAttentionMode(SdpaMode):
    """Runs ``F.scaled_dot_product_attention`` as bmm → softmax over s×s → bmm, in the input's
    dtype. Enter it outside any mode that must see the attention call as one call."""

    def __init__(self) -> None:
        super().__init__()
        # The causal bias depends only on (L, S, dtype, device): built once per profile, so
        # every traced layer does not pay to build it (Megatron-LM's fused kernel builds none).
        self._causal_bias: dict[tuple[int, int, torch.dtype, torch.device], torch.Tensor] = {}

    def _bias(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        attn_mask: torch.Tensor | None,
        is_causal: bool,
    ) -> torch.Tensor:
        """The additive (…, L, S) input of the scores' baddbmm: -inf where attention is masked."""
        length, source = query.shape[-2], key.shape[-2]
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                blocked = torch.full((), -math.inf, dtype=query.dtype, device=query.device)
                return torch.zeros((), dtype=query.dtype, device=query.device).where(
                    attn_mask, blocked
                )
            return attn_mask.to(query.dtype)
        cache_key = (length, source, query.dtype, query.device)
        if cache_key not in self._causal_bias:
            if is_causal:
                bias = torch.full(
                    (length, source), -math.inf, dtype=query.dtype, device=query.device
                ).triu(1)
            else:
                bias = torch.zeros((1, 1), dtype=query.dtype, device=query.device)
            self._causal_bias[cache_key] = bias
        return self._causal_bias[cache_key]

    def attention(self, call: SdpaCall) -> torch.Tensor:
        """Bmm → softmax over s×s → bmm in the input's dtype (module docstring)."""
        query, attn_mask, is_causal = call.query, call.attn_mask, call.is_causal
        if call.dropout_p:
            raise InputError(
                f"attention='math' traces attention without dropout, got dropout_p={call.dropout_p}"
            )
        if attn_mask is not None and is_causal:
            raise InputError("scaled_dot_product_attention takes attn_mask or is_causal, not both")
        key, value = call.kv_per_query_head()
        *batch, length, head_dim = query.shape
        scale = 1 / math.sqrt(head_dim) if call.scale is None else call.scale
        bias = self._bias(query, key, attn_mask, is_causal)
        if query.dim() != 4:
            flat_bias = bias if bias.dim() <= 2 else bias.expand(*batch, length, -1).flatten(0, -3)
            attended = _attention_core(
                query.flatten(0, -3), key.flatten(0, -3), value.flatten(0, -3), flat_bias, scale
            )
            return attended.view(*batch, length, value.shape[-1])
        # One sample at a time: a sample's (heads, L, E) is a strided view of the usual
        # (batch, L, heads, E) layout, as Megatron-LM's [s, b·heads, e] views were, so no copy
        # of q, k or v is made (flattening batch and heads together would copy each).
        if bias.dim() > 2:
            bias = bias.expand(*batch[:-1], *bias.shape[-3:])
        # Split along batch from the (batch, L, heads, E) view, so the gradients stack back
        # into that layout and the caller's head split needs no copy in backward.
        samples = [
            _attention_core(
                query_i.transpose(0, 1),
                key_i.transpose(0, 1),
                value_i.transpose(0, 1),
                bias if bias.dim() <= 2 else bias[index],
                scale,
            ).transpose(0, 1)
            for index, (query_i, key_i, value_i) in enumerate(
                zip(
                    query.transpose(1, 2).unbind(0),
                    key.transpose(1, 2).unbind(0),
                    value.transpose(1, 2).unbind(0),
                    strict=True,
                )
            )
        ]
        # Stacked as (batch, L, heads, E), the layout a fused kernel returns (one copy, as
        # Megatron-LM's output permute made one).
        return torch.stack(samples).transpose(1, 2)


def _attention_core(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, bias: torch.Tensor, scale: float
) -> torch.Tensor:
    """(n, L, E) attention: scores = bias + scale·QKᵀ in one baddbmm, softmax, ·V."""
    scores = torch.baddbmm(bias, query, key.transpose(1, 2), alpha=scale)
    return torch.bmm(torch.softmax(scores, dim=-1), value)
