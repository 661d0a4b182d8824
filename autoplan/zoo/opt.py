"""OPT-350M-style decoder: post-LayerNorm blocks with ReLU, a narrower word embedding projected
in and out of the hidden size, learned positions offset by 2, and no final LayerNorm.

This follows Hugging Face's ``OPTForCausalLM`` for facebook/opt-350m (331,196,416 parameters):
``word_embed_proj_dim`` 512, hidden 1024, ``do_layer_norm_before=False``; the larger OPT models
are pre-LayerNorm like GPT and are not in the zoo.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autoplan.zoo.bert import PostNormBlock
from autoplan.zoo.layered import LayeredModel

__all__ = ["OPT", "OPTConfig"]

# OPT's learned position table has two extra rows that the first two positions skip.
_POSITION_OFFSET = 2


@dataclass(frozen=True)
class OPTConfig:
    """Shape of a post-LayerNorm OPT model."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    word_embed_size: int

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"hidden_size ({self.hidden_size}) must be divisible by "
                f"num_heads ({self.num_heads})"
            )


class OPTEmbedding(nn.Module):
    """Word embedding (narrow), projected to the hidden size, plus learned positions."""

    def __init__(self, config: OPTConfig) -> None:
        super().__init__()
        self.token = nn.Embedding(config.vocab_size, config.word_embed_size)
        self.project_in = nn.Linear(config.word_embed_size, config.hidden_size, bias=False)
        self.position = nn.Embedding(config.max_seq_len + _POSITION_OFFSET, config.hidden_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device) + _POSITION_OFFSET
        return self.project_in(self.token(token_ids)) + self.position(positions)


class OPTHead(nn.Module):
    """Projection back to the word-embedding size, then the output tied to the word embedding."""

    def __init__(self, config: OPTConfig, word_embedding: nn.Embedding) -> None:
        super().__init__()
        self.project_out = nn.Linear(config.hidden_size, config.word_embed_size, bias=False)
        self.output = nn.Linear(config.word_embed_size, config.vocab_size, bias=False)
        self.output.weight = word_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(self.project_out(x))


class OPT(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head``."""

    def __init__(self, config: OPTConfig) -> None:
        super().__init__()
        self.config = config
        embed = OPTEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        for index in range(config.num_layers):
            layers[f"block_{index}"] = PostNormBlock(
                config.hidden_size,
                config.num_heads,
                config.ffn_hidden_size,
                causal=True,
                activation="relu",
                norm_eps=1e-5,
            )
        layers["head"] = OPTHead(config, embed.token)
        self.layers = nn.ModuleDict(layers)
