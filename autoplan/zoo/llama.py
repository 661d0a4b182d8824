"""LLaMA-style decoder (Llama-2, Llama-3): RMSNorm, rotary positions, grouped-query attention,
SwiGLU MLP, untied output head, no biases.

As in :mod:`autoplan.zoo.gpt`, q, k and v are separate projections so that tensor parallelism
can split them by columns; the attention infers its (local) head counts from the projections'
outputs, so a shard holding ``heads / tp`` query heads and ``kv_heads / tp`` key/value heads
works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.layered import LayeredModel

__all__ = ["Llama", "LlamaBlock", "LlamaConfig"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a LLaMA model.

    Parameters: V·h (embedding) + l·(2h² + 2h·kv·d + 3h·f + 2h) + h (final norm) + V·h (head),
    with d = h / heads and kv the key/value heads.
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads})"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.hidden_size // self.num_heads


def _rotate(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Apply rotary position embedding to ``x`` of shape (batch, heads, seq, head_dim).

    The angles are computed here rather than kept in a buffer so that the model has no
    non-persistent state to re-initialise after meta-device construction or stage slicing.
    Pairs are (i, i + d/2) as in the Hugging Face layout of LLaMA weights.
    """
    seq, head_dim = x.shape[-2], x.shape[-1]
    half = head_dim // 2
    inv_freq = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32), inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class GroupedQueryAttention(nn.Module):
    """Causal attention where groups of ``num_heads / num_kv_heads`` query heads share k and v."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = head_dim
        self.rope_theta = config.rope_theta
        self.q = nn.Linear(hidden, config.num_heads * head_dim, bias=False)
        self.k = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=False)
        self.v = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=False)
        self.out = nn.Linear(config.num_heads * head_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each projection holds only the local heads.
        shape = (batch, seq, -1, self.head_dim)
        q = _rotate(self.q(x).view(shape).transpose(1, 2), self.rope_theta)
        k = _rotate(self.k(x).view(shape).transpose(1, 2), self.rope_theta)
        v = self.v(x).view(shape).transpose(1, 2)
        # The group size is the same on every shard, since tp divides both head counts.
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(attended.transpose(1, 2).reshape(batch, seq, -1))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, rope_theta={self.rope_theta}"
        )


class SwiGLU(nn.Module):
    """down(silu(gate(x)) * up(x))."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class LlamaBlock(nn.Module):
    """Pre-RMSNorm block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = GroupedQueryAttention(config)
        self.mlp_norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = SwiGLU(config.hidden_size, config.ffn_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class LlamaEmbedding(nn.Module):
    """Token embedding only: positions enter through RoPE inside attention."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.hidden_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.token(token_ids)


class LlamaHead(nn.Module):
    """Final RMSNorm and the (untied) output projection."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


class Llama(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        layers: dict[str, nn.Module] = {"embed": LlamaEmbedding(config)}
        for index in range(config.num_layers):
            layers[f"block_{index}"] = LlamaBlock(config)
        layers["head"] = LlamaHead(config)
        self.layers = nn.ModuleDict(layers)
