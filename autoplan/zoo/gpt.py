"""GPT-style decoder (GPT-2, GPT-3, Megatron-LM GPT, GPT-Neo, GPT-NeoX/Pythia and, as blocks,
OPT): learned positions, pre-LayerNorm, GELU MLP, head optionally tied to the token embedding.

GPT-NeoX differs by options: rotary positions on part of each head instead of a position table,
the parallel residual x + attn(ln1(x)) + mlp(ln2(x)), exact GELU and an untied head; OPT's
pre-LayerNorm blocks by a ReLU MLP.

q, k and v are separate projections because tensor parallelism splits them by columns; a fused
qkv weight split by columns would mix q, k and v across ranks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.layered import LayeredModel
from autoplan.zoo.positions import positions_of
from autoplan.zoo.rope import apply_rotary
from autoplan.zoo.sub_blocks import SplittableBlock

__all__ = ["GPT", "GPTBlock", "GPTConfig", "MLPActivation", "SelfAttention"]

MLPActivation = Literal["gelu_tanh", "gelu", "relu"]


@dataclass(frozen=True)
class GPTConfig:
    """Shape of a GPT model; parameter count 12lh² + 13lh + (V + s)h + 2h when tied.

    ``qkv_bias=False`` (GPT-Neo) drops the 3h biases of q, k and v in every block.
    ``local_attention_window`` (GPT-Neo: 256) makes every odd block attend only to the last
    that many tokens; ``attention_scale`` replaces 1/sqrt(head_dim) (GPT-Neo: 1.0, unscaled).
    ``rotary_fraction`` (GPT-NeoX: 0.25) drops the position table (s·h parameters) for RoPE on
    that share of each head's dimensions; ``parallel_residual`` adds attention and MLP to the
    same input (GPT-NeoX); ``activation`` is the MLP's (GPT-2: tanh GELU, NeoX: exact, OPT: ReLU).
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
    activation: MLPActivation = "gelu_tanh"
    norm_eps: float = 1e-5
    rotary_fraction: float | None = None
    rope_theta: float = 10000.0
    parallel_residual: bool = False

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.rotary_fraction is not None and not 0 < self.rotary_fraction <= 1:
            raise ValueError(f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}")
        rotated = self.rotary_dims
        if rotated is not None and (rotated < 2 or rotated % 2):
            # RoPE turns dimensions in pairs (i, i + d/2): an odd count has one left over.
            raise ValueError(
                f"RoPE rotates {rotated} dimensions of each head (rotary_fraction "
                f"{self.rotary_fraction:g}); it needs an even number >= 2"
            )

    @property
    def rotary_dims(self) -> int | None:
        """Dimensions of each head that RoPE rotates (None: learned positions instead)."""
        if self.rotary_fraction is None:
            return None
        return int(self.hidden_size // self.num_heads * self.rotary_fraction)

    @property
    def ffn(self) -> int:
        """Inner size of the MLP (4h unless given)."""
        return self.ffn_hidden_size or 4 * self.hidden_size


class GPTEmbedding(nn.Module):
    """Token embedding plus learned position embedding (none with rotary positions)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = (
            nn.Embedding(config.max_seq_len, config.hidden_size)
            if config.rotary_fraction is None
            else None
        )

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        if self.position is None:
            return self.token(token_ids)
        positions = positions_of(token_ids.shape[1], token_ids.device)  # cp: global positions
        return self.token(token_ids) + self.position(positions)


class SelfAttention(nn.Module):
    """Multi-head self-attention with separate q, k, v and out projections; RoPE on the first
    ``rotary_dims`` dimensions of each head when given (GPT-NeoX), no positions otherwise.

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
        rotary_dims: int | None = None,
        rope_theta: float = 10000.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = hidden // num_heads
        self.causal = causal
        self.window = window
        self.scale = scale
        self.rotary_dims = rotary_dims
        self.rope_theta = rope_theta
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
        if self.rotary_dims is not None:
            q = apply_rotary(q, self.rope_theta, rotary_dims=self.rotary_dims)
            k = apply_rotary(k, self.rope_theta, rotary_dims=self.rotary_dims)
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
            + (
                ""
                if self.rotary_dims is None
                else f", rotary_dims={self.rotary_dims}, rope_theta={self.rope_theta}"
            )
        )


class GPTMLP(nn.Module):
    """up → activation (GELU's tanh approximation, as GPT-2, by default) → down."""

    def __init__(self, hidden: int, ffn: int, activation: MLPActivation = "gelu_tanh") -> None:
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.up(x)
        if self.activation == "relu":
            inner = F.relu(inner)
        else:
            inner = F.gelu(inner, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.down(inner)

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class GPTBlock(SplittableBlock):
    """Pre-LayerNorm transformer block: x + attn(ln(x)), then x + mlp(ln(x)); with the
    parallel residual x + attn(ln1(x)) + mlp(ln2(x)) (which cannot be cut between its parts)."""

    def __init__(self, config: GPTConfig, *, local: bool = False) -> None:
        super().__init__()
        self.parallel_residual = config.parallel_residual
        self.attn_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.attn = SelfAttention(
            config.hidden_size,
            config.num_heads,
            causal=True,
            qkv_bias=config.qkv_bias,
            window=config.local_attention_window if local else None,
            scale=config.attention_scale,
            rotary_dims=config.rotary_dims,
            rope_theta=config.rope_theta,
        )
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.mlp = GPTMLP(config.hidden_size, config.ffn, config.activation)
        if not self.parallel_residual:
            self._init_parts({"attn": ("attn_norm", "attn"), "mlp": ("mlp_norm", "mlp")})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.parallel_residual:
            return x + self.attn(self.attn_norm(x)) + self.mlp(self.mlp_norm(x))
        # x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)), through the part views.
        return self.forward_parts(x)

    def extra_repr(self) -> str:
        return f"parallel_residual={self.parallel_residual}"


class GPTHead(nn.Module):
    """Final LayerNorm and the output projection (tied to the token embedding when asked)."""

    def __init__(self, config: GPTConfig, tied_embedding: nn.Embedding | None) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
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
