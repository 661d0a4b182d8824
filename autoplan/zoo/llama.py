"""LLaMA-style decoder (Llama-2, Llama-3, and through their Hugging Face configs Mistral, Qwen2,
Phi-3 and Gemma): RMSNorm, rotary positions, grouped-query attention, a gated MLP.

The defaults are Llama's: no biases, SwiGLU, untied output head, full causal attention. The
options are what the other families of :mod:`autoplan.zoo.hf` differ by, each at its
parameter-count and cost level: q/k/v biases (Qwen2), a head tied to the embedding (Llama 3.2,
small Qwen2, Gemma), a head width other than hidden / heads (Gemma), sliding-window attention
on some or all layers (Mistral, Phi-3, Gemma 2), a GELU-gated MLP, the embedding scaled by
sqrt(hidden) and (1 + w) RMSNorms (Gemma), norms after attention and MLP too and soft-capped
logits (Gemma 2). Gemma 2's soft-capping of attention scores is not modelled: its attention is
costed as ordinary (flash) attention, which is what fused kernels with a cap cost too.

As in :mod:`autoplan.zoo.gpt`, q, k and v are separate projections so that tensor parallelism
can split them by columns (a fused qkv, as Phi-3 stores it, has the same parameters); the
attention infers its (local) head counts from the projections' outputs, so a shard holding
``heads / tp`` query heads and ``kv_heads / tp`` key/value heads works unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.layered import LayeredModel
from autoplan.zoo.rope import RopeScaling, apply_rotary
from autoplan.zoo.sub_blocks import SplittableBlock

__all__ = ["GatedActivation", "Llama", "LlamaBlock", "LlamaConfig", "OffsetRMSNorm"]

GatedActivation = Literal["silu", "gelu_tanh", "gelu"]


@dataclass(frozen=True)
class LlamaConfig:
    """Shape of a LLaMA-style model.

    Parameters: V·h (embedding) + l·(h·heads·d + 2h·kv·d + heads·d·h + 3h·f + norms) + h (final
    norm) + V·h (head, unless tied), with d the head width (h / heads unless given), kv the
    key/value heads, norms 2h per block (4h with ``sandwich_norms``, 2d more with
    ``qk_norm``), plus the biases asked for.
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
    attention_head_dim: int | None = None
    """Width of one head where it is not hidden / heads (Gemma: 256)."""
    qkv_bias: bool = False
    out_bias: bool = False
    mlp_bias: bool = False
    tie_embeddings: bool = False
    activation: GatedActivation = "silu"
    rope_scaling: RopeScaling | None = None
    rotary_fraction: float = 1.0
    """Share of each head's dimensions that RoPE rotates (Phi-4-mini: 0.75)."""
    sliding_window: int | None = None
    sliding_window_layers: tuple[int, ...] | None = None
    """Blocks that attend to the last ``sliding_window`` tokens only; None: every block."""
    attention_scale: float | None = None
    """Replaces 1/sqrt(head_dim) (Gemma 2: query_pre_attn_scalar ** -0.5)."""
    embedding_multiplier: float | None = None
    """The token embedding's output is multiplied by this (Gemma: sqrt(hidden))."""
    offset_norms: bool = False
    """RMSNorms scale by (1 + w), w starting at zero (Gemma)."""
    sandwich_norms: bool = False
    """A norm after attention and after the MLP too, before each residual add (Gemma 2)."""
    final_logit_softcap: float | None = None
    """Logits become cap · tanh(logits / cap) (Gemma 2: 30)."""
    qk_norm: bool = False
    """Each head's query and key pass an RMSNorm of the head width before RoPE (Qwen3)."""

    def __post_init__(self) -> None:
        if self.attention_head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be divisible by num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if not 0 < self.rotary_fraction <= 1:
            raise ValueError(f"rotary_fraction must be in (0, 1], got {self.rotary_fraction}")
        rotated = int(self.head_dim * self.rotary_fraction)
        if rotated < 2 or rotated % 2:
            # RoPE turns dimensions in pairs (i, i + d/2): an odd count has one left over.
            raise ValueError(
                f"RoPE rotates {rotated} dimensions of each head (head_dim {self.head_dim}"
                f" × rotary_fraction {self.rotary_fraction:g}); it needs an even number >= 2"
            )

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.attention_head_dim or self.hidden_size // self.num_heads

    def window_of(self, index: int) -> int | None:
        """The sliding window of block ``index``, or None where it attends to every token."""
        if self.sliding_window_layers is not None and index not in self.sliding_window_layers:
            return None
        return self.sliding_window


class OffsetRMSNorm(nn.Module):
    """RMSNorm whose scale is (1 + weight), the weight starting at zero (Gemma's)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), eps=self.eps) * (1 + self.weight)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


def _norm(config: LlamaConfig, size: int | None = None) -> nn.Module:
    """The model's RMSNorm over ``size`` features (default: the hidden width)."""
    size, eps = size or config.hidden_size, config.norm_eps
    return OffsetRMSNorm(size, eps) if config.offset_norms else nn.RMSNorm(size, eps=eps)


def _window_mask(seq: int, window: int, device: torch.device) -> torch.Tensor:
    """Causal sliding window as a boolean mask: query i sees keys i - window + 1 … i."""
    query = torch.arange(seq, device=device)[:, None]
    key = torch.arange(seq, device=device)[None, :]
    return (key <= query) & (query - key < window)


class GroupedQueryAttention(nn.Module):
    """Causal attention where groups of ``num_heads / num_kv_heads`` query heads share k and v;
    with ``window``, each token sees only the last ``window`` tokens."""

    def __init__(self, config: LlamaConfig, window: int | None = None) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = head_dim
        self.rope_theta = config.rope_theta
        self.rope_scaling = config.rope_scaling
        self.rotary_dims = (
            None if config.rotary_fraction == 1 else int(head_dim * config.rotary_fraction)
        )
        self.window = window
        self.scale = config.attention_scale
        self.q = nn.Linear(hidden, config.num_heads * head_dim, bias=config.qkv_bias)
        self.k = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=config.qkv_bias)
        self.v = nn.Linear(hidden, config.num_kv_heads * head_dim, bias=config.qkv_bias)
        self.out = nn.Linear(config.num_heads * head_dim, hidden, bias=config.out_bias)
        # One weight of the head width, shared by every head (so tp ranks, each holding some
        # heads, hold it whole: ``autoplan.runtime.tensor_parallel`` sums its gradient).
        self.q_norm = _norm(config, head_dim) if config.qk_norm else None
        self.k_norm = _norm(config, head_dim) if config.qk_norm else None

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        return apply_rotary(
            x, self.rope_theta, rotary_dims=self.rotary_dims, scaling=self.rope_scaling
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # -1 heads: under tensor parallelism each projection holds only the local heads.
        shape = (batch, seq, -1, self.head_dim)
        q, k = self.q(x).view(shape), self.k(x).view(shape)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = self._rope(q.transpose(1, 2))
        k = self._rope(k.transpose(1, 2))
        v = self.v(x).view(shape).transpose(1, 2)
        # The group size is the same on every shard, since tp divides both head counts.
        group = self.num_heads // self.num_kv_heads
        if group > 1:
            k = k.repeat_interleave(group, dim=1)
            v = v.repeat_interleave(group, dim=1)
        if self.window is None or seq <= self.window:
            # A window at least the sequence long is plain causal attention: the same mask,
            # so the fused causal kernel runs (and is what the profile traces).
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            mask = _window_mask(seq, self.window, x.device)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.out(attended.transpose(1, 2).reshape(batch, seq, -1))

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
            f"head_dim={self.head_dim}, rope_theta={self.rope_theta}, "
            f"rope_scaling={self.rope_scaling}, rotary_dims={self.rotary_dims}, "
            f"window={self.window}, scale={self.scale}"
        )


class SwiGLU(nn.Module):
    """down(act(gate(x)) * up(x)): SiLU by default (SwiGLU), tanh-GELU for Gemma (GeGLU)."""

    def __init__(
        self, hidden: int, ffn: int, *, activation: GatedActivation = "silu", bias: bool = False
    ) -> None:
        super().__init__()
        self.activation = activation
        self.gate = nn.Linear(hidden, ffn, bias=bias)
        self.up = nn.Linear(hidden, ffn, bias=bias)
        self.down = nn.Linear(ffn, hidden, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.gate(x)
        if self.activation == "silu":
            gate = F.silu(gate)
        else:
            gate = F.gelu(gate, approximate="tanh" if self.activation == "gelu_tanh" else "none")
        return self.down(gate * self.up(x))

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class LlamaBlock(SplittableBlock):
    """Pre-RMSNorm block: x + attn(norm(x)), then x + mlp(norm(x)); with sandwich norms
    x + norm(attn(norm(x))), then x + norm(mlp(norm(x)))."""

    def __init__(self, config: LlamaConfig, index: int = 0) -> None:
        super().__init__()
        self.attn_norm = _norm(config)
        self.attn = GroupedQueryAttention(config, window=config.window_of(index))
        self.mlp_norm = _norm(config)
        self.mlp: nn.Module = SwiGLU(
            config.hidden_size,
            config.ffn_hidden_size,
            activation=config.activation,
            bias=config.mlp_bias,
        )
        self.attn_post_norm = _norm(config) if config.sandwich_norms else None
        self.mlp_post_norm = _norm(config) if config.sandwich_norms else None
        self._init_parts(
            {
                "attn": ("attn_norm", "attn", "attn_post_norm"),
                "mlp": ("mlp_norm", "mlp", "mlp_post_norm"),
            }
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x + post(attn(norm(x))), then x + post(mlp(norm(x))), through the part views.
        return self.forward_parts(x)


class LlamaEmbedding(nn.Module):
    """Token embedding only (times a constant for Gemma): positions enter through RoPE."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.hidden_size)
        self.multiplier = config.embedding_multiplier

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        embedded = self.token(token_ids)
        return embedded if self.multiplier is None else embedded * self.multiplier

    def extra_repr(self) -> str:
        return f"multiplier={self.multiplier}"


class LlamaHead(nn.Module):
    """Final RMSNorm and the output projection (tied to the token embedding when asked), its
    logits soft-capped where the config says so."""

    def __init__(self, config: LlamaConfig, tied_embedding: nn.Embedding | None = None) -> None:
        super().__init__()
        self.norm = _norm(config)
        self.output = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if tied_embedding is not None:
            self.output.weight = tied_embedding.weight
        self.softcap = config.final_logit_softcap

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.output(self.norm(x))
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def extra_repr(self) -> str:
        return f"softcap={self.softcap}"


class Llama(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head``."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.config = config
        embed = LlamaEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        for index in range(config.num_layers):
            layers[f"block_{index}"] = LlamaBlock(config, index)
        layers["head"] = LlamaHead(config, embed.token if config.tie_embeddings else None)
        self.layers = nn.ModuleDict(layers)
