"""Factory models ('tests.runtime_models:...') for the runtime's tests."""

from __future__ import annotations

import torch

from autoplan.zoo.gpt import GPT, GPTConfig

__all__ = ["mlp_stack", "tied_gpt"]

TIED_GPT = GPTConfig(2, 16, 2, 33, 16, tie_embeddings=True)


def tied_gpt(batch_size: int = 2, seq_len: int = 8) -> tuple[GPT, torch.Tensor]:
    """A 4-layer GPT (embed, 2 blocks, head) whose head shares the token embedding's weight."""
    return GPT(TIED_GPT), torch.randint(0, TIED_GPT.vocab_size, (batch_size, seq_len))


def mlp_stack(batch_size: int = 2) -> tuple[torch.nn.Sequential, torch.Tensor]:
    """A Sequential of 4 layers (3 with weights) taking float features: pipeline layer = child."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Linear(16, 4)
    )
    return model, torch.randn(batch_size, 8)
