"""Training batches: seeded synthetic token ids, and each replica's rows of a global batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from autoplan.errors import InputError
from autoplan.plan.schema import Plan

__all__ = ["replica_rows", "synthetic_batches"]


def synthetic_batches(
    vocab_size: int, global_batch_size: int, seq_len: int, seed: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets) global batches: random token ids, targets the next tokens.

    The same seed gives the same batches on every rank and in single-process training.
    """
    generator = torch.Generator().manual_seed(seed)
    while True:
        tokens = torch.randint(0, vocab_size, (global_batch_size, seq_len + 1), generator=generator)
        yield tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def replica_rows(plan: Plan, dp_index: int) -> slice:
    """The rows of the global batch that data-parallel replica ``dp_index`` trains on."""
    par = plan.parallelism
    shares = [size * par.num_micro_batches for size in par.replica_micro_batch_sizes]
    if sum(shares) != plan.inputs.global_batch_size:
        raise InputError(
            f"the plan's replicas take {' + '.join(map(str, shares))} = {sum(shares)} samples "
            f"(micro-batch sizes × {par.num_micro_batches} micro-batches), but its global batch "
            f"is {plan.inputs.global_batch_size}"
        )
    start = sum(shares[:dp_index])
    return slice(start, start + shares[dp_index])
