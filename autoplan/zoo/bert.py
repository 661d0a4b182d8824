"""BERT-style encoder (BERT-large) with its masked-language-model head, and the post-LayerNorm
block that BERT and OPT-350M share.

Parameter count of ``bert-large`` is that of Hugging Face's ``BertForMaskedLM`` for
bert-large-uncased, 335,174,458: the encoder and the MLM head (whose decoder weight is tied to
the word embedding), without the pooler that only next-sentence prediction uses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from autoplan.zoo.gpt import SelfAttention
from autoplan.zoo.layered import LayeredModel

__all__ = ["Bert", "BertConfig", "PostNormBlock"]

Activation = Literal["gelu", "relu"]


@dataclass(frozen=True)
class BertConfig:
    """Shape of a BERT model (the published models use ffn = 4h and two token types)."""

    num_layers: int
    hidden_size: int
    num_heads: int
    vocab_size: int
    max_seq_len: int
    ffn_hidden_size: int | None = None
    type_vocab_size: int = 2
    norm_eps: float = 1e-12

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


class PostNormMLP(nn.Module):
    """up → activation → down, with the names tensor parallelism expects."""

    def __init__(self, hidden: int, ffn: int, activation: Activation) -> None:
        super().__init__()
        self.up = nn.Linear(hidden, ffn)
        self.down = nn.Linear(ffn, hidden)
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        inner = self.up(x)
        inner = F.gelu(inner) if self.activation == "gelu" else F.relu(inner)
        return self.down(inner)

    def extra_repr(self) -> str:
        return f"activation={self.activation}"


class PostNormBlock(nn.Module):
    """Post-LayerNorm block (original Transformer, BERT, OPT-350M): norm(x + f(x)) twice."""

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        ffn: int,
        *,
        causal: bool,
        activation: Activation,
        norm_eps: float,
    ) -> None:
        super().__init__()
        self.attn = SelfAttention(hidden, num_heads, causal=causal)
        self.attn_norm = nn.LayerNorm(hidden, eps=norm_eps)
        self.mlp = PostNormMLP(hidden, ffn, activation)
        self.mlp_norm = nn.LayerNorm(hidden, eps=norm_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attn_norm(x + self.attn(x))
        return self.mlp_norm(x + self.mlp(x))


class BertEmbedding(nn.Module):
    """Word + position + token-type embeddings, then LayerNorm (all tokens of type 0 here)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position = nn.Embedding(config.max_seq_len, config.hidden_size)
        self.token_type = nn.Embedding(config.type_vocab_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device)
        types = torch.zeros_like(positions)
        return self.norm(self.token(token_ids) + self.position(positions) + self.token_type(types))


class BertMLMHead(nn.Module):
    """dense → GELU → LayerNorm → decoder (tied to the word embedding) with its own bias."""

    def __init__(self, config: BertConfig, word_embedding: nn.Embedding) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
        self.output = nn.Linear(config.hidden_size, config.vocab_size)
        self.output.weight = word_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.norm(F.gelu(self.dense(x))))


class Bert(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head`` (masked-LM head)."""

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.config = config
        embed = BertEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        for index in range(config.num_layers):
            layers[f"block_{index}"] = PostNormBlock(
                config.hidden_size,
                config.num_heads,
                config.ffn,
                causal=False,
                activation="gelu",
                norm_eps=config.norm_eps,
            )
        layers["head"] = BertMLMHead(config, embed.token)
        self.layers = nn.ModuleDict(layers)
