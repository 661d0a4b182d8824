"""OPT decoders as Hugging Face's ``OPTForCausalLM`` builds them: ReLU MLPs, learned positions
offset by 2, the head tied to the word embedding.

OPT-350M (``do_layer_norm_before=False``, the zoo's ``opt-350m``, 331,196,416 parameters) has
post-LayerNorm blocks, a word embedding of 512 projected in and out of the hidden size 1024, and
no final LayerNorm. Every other OPT (125M, 1.3B … 66B, through :mod:`autoplan.zoo.hf`) is
pre-LayerNorm like GPT (``pre_norm``), with a final LayerNorm and no projections (its word
embedding is as wide as the hidden size).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autoplan.zoo.bert import PostNormBlock
from autoplan.zoo.gpt import GPTBlock, GPTConfig
from autoplan.zoo.layered import LayeredModel

__all__ = ["OPT", "OPTConfig"]

# OPT's learned position table has two extra rows that the first two positions skip.
_POSITION_OFFSET = 2


@dataclass(frozen=True)
class OPTConfig:
    """Shape of an OPT model: post-LayerNorm (OPT-350M) unless ``pre_norm``."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int
    max_seq_len: int
    word_embed_size: int
    pre_norm: bool = False
    final_norm: bool | None = None
    """A LayerNorm before the head; None: where ``pre_norm`` (Hugging Face's default)."""

    @property
    def has_final_norm(self) -> bool:
        """Whether the head starts with a LayerNorm."""
        return self.pre_norm if self.final_norm is None else self.final_norm

    @property
    def projects(self) -> bool:
        """Whether the word embedding is narrower than the hidden size (projected in and out)."""
        return self.word_embed_size != self.hidden_size

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
        self.project_in = (
            nn.Linear(config.word_embed_size, config.hidden_size, bias=False)
            if config.projects
            else None
        )
        self.position = nn.Embedding(config.max_seq_len + _POSITION_OFFSET, config.hidden_size)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(token_ids.shape[1], device=token_ids.device) + _POSITION_OFFSET
        words = self.token(token_ids)
        if self.project_in is not None:
            words = self.project_in(words)
        return words + self.position(positions)


class OPTHead(nn.Module):
    """The final LayerNorm (pre-norm models), the projection back to the word-embedding size
    (where it is narrower), then the output tied to the word embedding."""

    def __init__(self, config: OPTConfig, word_embedding: nn.Embedding) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(config.hidden_size) if config.has_final_norm else None
        self.project_out = (
            nn.Linear(config.hidden_size, config.word_embed_size, bias=False)
            if config.projects
            else None
        )
        self.output = nn.Linear(config.word_embed_size, config.vocab_size, bias=False)
        self.output.weight = word_embedding.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.output(x)


class OPT(LayeredModel):
    """layers: ``embed``, ``block_0`` … ``block_{l-1}``, ``head``."""

    def __init__(self, config: OPTConfig) -> None:
        super().__init__()
        self.config = config
        embed = OPTEmbedding(config)
        layers: dict[str, nn.Module] = {"embed": embed}
        # Pre-norm blocks are GPT's with a ReLU MLP (biases everywhere, LayerNorm eps 1e-5).
        block_shape = GPTConfig(
            config.num_layers,
            config.hidden_size,
            config.num_heads,
            config.vocab_size,
            config.max_seq_len,
            ffn_hidden_size=config.ffn_hidden_size,
            activation="relu",
        )
        for index in range(config.num_layers):
            layers[f"block_{index}"] = (
                GPTBlock(block_shape)
                if config.pre_norm
                else PostNormBlock(
                    config.hidden_size,
                    config.num_heads,
                    config.ffn_hidden_size,
                    causal=True,
                    activation="relu",
                    norm_eps=1e-5,
                )
            )
        layers["head"] = OPTHead(config, embed.token)
        self.layers = nn.ModuleDict(layers)
