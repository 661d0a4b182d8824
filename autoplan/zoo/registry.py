"""Names → model specs: the zoo's presets and user factories."""

from __future__ import annotations

import difflib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from autoplan.errors import InputError
from autoplan.zoo.gpt import GPT, GPTConfig
from autoplan.zoo.layered import LayeredModel

__all__ = ["ModelSpec", "get_model_spec", "model_names"]


@dataclass(frozen=True)
class ModelSpec:
    """How to build one model and feed it."""

    name: str
    build: Callable[[], LayeredModel]
    vocab_size: int
    max_seq_len: int
    hidden_size: int | None = None
    num_attention_heads: int | None = None

    def example_input(self, batch: int, seq_len: int, device: str = "cpu") -> torch.Tensor:
        """Token ids of shape (batch, seq_len)."""
        return torch.randint(0, self.vocab_size, (batch, seq_len), device=device)


def _gpt(name: str, config: GPTConfig) -> ModelSpec:
    return ModelSpec(
        name=name,
        build=lambda: GPT(config),
        vocab_size=config.vocab_size,
        max_seq_len=config.max_seq_len,
        hidden_size=config.hidden_size,
        num_attention_heads=config.num_heads,
    )


_PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in [
        _gpt("gpt2-small", GPTConfig(12, 768, 12, 50257, 1024)),
        # Tiny models for tests and the demo: fast on a CPU, float64-exact comparisons.
        _gpt("gpt-tiny", GPTConfig(4, 32, 4, 128, 64, tie_embeddings=False)),
    ]
}


def model_names() -> list[str]:
    """All zoo names, sorted."""
    return sorted(_PRESETS)


def get_model_spec(name: str) -> ModelSpec:
    """The spec of a zoo name; unknown names raise with the nearest names offered."""
    if name in _PRESETS:
        return _PRESETS[name]
    close = difflib.get_close_matches(name, model_names(), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {', '.join(model_names())}"
    raise InputError(f"unknown model '{name}'{hint}")
