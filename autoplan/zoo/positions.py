"""Token positions of the sequence a model sees: 0 … s − 1, unless context parallelism says.

Under context parallelism a rank holds a chunk of every sample's tokens, not a prefix
(load-balanced causal chunks: ``autoplan.runtime.context_parallel``), so the learned position
table and RoPE must use the tokens' global positions. The runtime sets them for the forward
with ``token_positions``; the zoo's layers read them with ``positions_of``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

__all__ = ["positions_of", "token_positions"]

_POSITIONS: ContextVar[torch.Tensor | None] = ContextVar("token_positions", default=None)


@contextmanager
def token_positions(positions: torch.Tensor) -> Iterator[None]:
    """Within the block, a sequence of ``len(positions)`` tokens sits at ``positions``."""
    token = _POSITIONS.set(positions)
    try:
        yield
    finally:
        _POSITIONS.reset(token)


def positions_of(seq_len: int, device: torch.device) -> torch.Tensor:
    """Global positions (int64) of a sequence of ``seq_len`` tokens: those set by
    ``token_positions``, else 0 … seq_len − 1."""
    positions = _POSITIONS.get()
    if positions is None:
        return torch.arange(seq_len, device=device)
    if positions.numel() != seq_len:
        raise ValueError(
            f"token positions are set for {positions.numel()} tokens; the layer sees {seq_len}"
        )
    return positions.to(device)
