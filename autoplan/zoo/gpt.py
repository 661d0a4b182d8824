"""GPT-style decoder (GPT-2, GPT-3, Megatron-LM GPT, GPT-Neo): learned positions, pre-LayerNorm,
GELU MLP, head optionally tied to the token embedding.

q, k and v are separate projections because tensor parallelism splits them by columns; a fused
qkv weight split by columns would mix q, k and v across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.layered import LayeredModel

__all__ = ["GPT", "GPTBlock", "GPTConfig", "SelfAttention"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT model; parameter count 12lh² + 13lh + (V + s)h + 2h when tied.

    ``qkv_bias=False`` (GPT-Neo) drops the 3h biases of q, k and v in every block.
    ``local_attention_window`` (GPT-Neo: 256) makes every odd block attend only to the last
    that many tokens; ``attention_scale`` replaces 1/sqrt(head_dim) (GPT-Neo: 1.0, unscaled).
    """

    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    ffn_hidden_size: int | None = None
    tie_embeddings: bool = True
    qkv_bias: bool = True
    local_attention_window: int | None = None
    attention_scale: float | None = None

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )

    @property
    def ffn(self) -> int:
        """Inner size of the MLP (4h unless given)."""
        return self.ffn_hidden_size or 4 * self.hidden_size


class GPTEmbedding(nn.Module):
    """Token embedding plus learned position embedding."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_seq_len, config.hidden_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        return self.token(token_ids) + self.position(positions)


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v and out projections (no RoPE).

    Works unchanged on a tensor-parallel shard: q, k and v may hold ``num_heads / tp`` heads'
    columns, so heads are inferred from the projection's output with ``head_dim`` fixed.
    """

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        *,
        causal: bool,
        qkv_bias: bool = True,
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.causal = causal
        self.window = window
        self.scale = scale
        self.q = nn.Linear(hidden, hidden, bias=qkv_bias)
        self.k = nn.Linear(hidden, hidden, bias=qkv_bias)
        self.v = nn.Linear(hidden, hidden, bias=qkv_bias)
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 for the head dim: under tensor parallelism q/k/v hold num_heads / tp heads' columns.
        shape = (batch, seq, -1, self.head_dim)
        q = self.q(x).view(shape).transpose(1, 2)
        k = self.k(x).view(shape).transpose(1, 2)
        v = self.v(x).view(shape).transpose(1, 2)
        if self.window is None:
            attended = F.scaled_dot_product_attention(
                q, k, v, is_causal=self.causal, scale=self.scale
            )
        else:
            attended = F.scaled_dot_product_attention(
                q, k, v, attn_mask=self._local_mask(seq, x.device), scale=self.scale
            )
        return self.out(attended.transpose(1, 2).reshape(batch, seq, -1))

    def _local_mask(self, seq: int, device: torch.device) -> torch.Tensor:
        """Causal sliding window: query i sees keys i - window + 1 … i."""
        assert self.window is not None
        query = torch.arange(seq, device=device)[:, None]
        key = torch.arange(seq, device=device)[None, :]
        return (key <= query) & (query - key < self.window)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, causal={self.causal}, "
            f"window={self.window}, scale={self.scale}"
        )


class GPTMLP(nn.Module):
    """up → GELU (tanh approximation, as GPT-2) → down."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.up(x), approximate="tanh"))


class GPTBlock(nn.Module):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, config: GPTConfig, *, local: bool = False) -> None:
        super().__init__()
        self.attn_norm = nn.LayerNorm(config.hidden_size)
        self.attn = SelfAttention(
            config.hidden_size,
            config.num_heads,
            causal=True,
            qkv_bias=config.qkv_bias,
            window=config.local_attention_window if local else None,
            scale=config.attention_scale,
        )
        self.mlp_norm = nn.LayerNorm(config.hidden_size)
        self.mlp = GPTMLP(config.hidden_size, config.ffn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.mlp_norm(x))


class GPTHead(nn.Module):
    """Final LayerNorm and the output projection (tied to the token embedding when asked)."""

    def __init__(self, config: GPTConfig, tied_embedding: nn.Embedding | None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if tied_embedding is not None:
            self.output.weight = tied_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(x))


class GPT(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head``."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        embed = GPTEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        for index in range(config.num_layers):
            # GPT-Neo alternates global (even) and local (odd) attention when a window is set.
            layers[f"block_{index}"] = GPTBlock(config, local=index % 2 == 1)
        layers["head"] = GPTHead(config, embed.token if config.tie_embeddings else None)
        self.layers = nn.ModuleDict(layers)
