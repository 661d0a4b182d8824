"""Training batches: seeded synthetic data, and each replica's rows of a global batch."""

from __future__ import annotations

from collections.abc import Iterator

import torch

from autoplan.errors import InputError
from autoplan.plan.schema import Plan
from autoplan.zoo import get_model_spec
from autoplan.zoo.dtypes import torch_dtype

__all__ = ["Batch", "replica_rows", "synthetic_batches", "training_batches"]

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]
"""(model inputs, targets) of one global batch; every tensor's first dimension is the batch."""


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


def training_batches(plan: Plan, seed: int) -> Iterator[Batch]:
    """The synthetic data of the plan's model: token ids for the zoo; for a factory, its own
    example input at the global batch size (the same every step; targets unused)."""
    spec = get_model_spec(plan.inputs.model.name)
    batch, seq_len = plan.inputs.global_batch_size, plan.inputs.seq_len
    if spec.vocab_size is not None:
        for inputs, targets in synthetic_batches(spec.vocab_size, batch, seq_len, seed):
            yield (inputs,), targets
        return
    torch.manual_seed(seed)
    _, example = spec.build_with_input(batch, seq_len)
    tensors = (example,) if isinstance(example, torch.Tensor) else tuple(example)
    dtype = torch_dtype(plan.inputs.dtype)
    tensors = tuple(t.to(dtype) if t.is_floating_point() else t for t in tensors)
    cp = max(r.context_parallel_degree for stage in plan.stages for r in stage.replicas)
    for tensor in tensors:
        if tensor.dim() == 0 or tensor.shape[0] != batch:
            raise InputError(
                f"factory '{spec.name}' gave an input of shape {tuple(tensor.shape)}; the runtime "
                f"splits inputs along a first dimension of the global batch ({batch})"
            )
        if cp > 1 and (tensor.dim() < 2 or tensor.shape[1] != seq_len):
            # Context parallelism splits every input along the sequence (dimension 1).
            raise InputError(
                f"factory '{spec.name}' gave an input of shape {tuple(tensor.shape)}; context "
                f"parallelism (cp {cp}) splits inputs along a second dimension of the sequence "
                f"length ({seq_len})"
            )
    targets = torch.zeros(batch)
    while True:
        yield tensors, targets


def replica_rows(plan: Plan, dp_index: int) -> slice:
    """The rows of the global batch that data-parallel replica ``dp_index`` of a uniform plan
    trains on: a block of its share × micro-batches rows, after those of replicas before it
    (the schedule cuts it into the micro-batches)."""
    par = plan.parallelism
    shares = [size * par.num_micro_batches for size in plan.stages[0].shares]
    if sum(shares) != plan.inputs.global_batch_size:
        raise InputError(
            f"the plan's replicas take {' + '.join(map(str, shares))} = {sum(shares)} samples "
            f"(micro-batch sizes × {par.num_micro_batches} micro-batches), but its global batch "
            f"is {plan.inputs.global_batch_size}"
        )
    start = sum(shares[:dp_index])
    return slice(start, start + shares[dp_index])


def sample_rows(plan: Plan, micro_batch: int, start: int, end: int) -> torch.Tensor:
    """Global-batch rows of samples ``[start, end)`` of micro-batch ``micro_batch`` (positions
    within the micro-batch, as a stage's replica shares count them).

    Position j of a micro-batch is sample j - lo_r of the first stage's replica r that owns
    it (lo_r = the shares before r), which reads its micro-batches from its block of rows as
    ``replica_rows`` gives it: so a uniform plan trains on the same samples in the same
    micro-batches under either executor.
    """
    shares = plan.stages[0].shares
    m = plan.parallelism.num_micro_batches
    rows: list[int] = []
    low = 0
    for share in shares:
        high = low + share
        first, last = max(start, low), min(end, high)
        block = low * m + micro_batch * share  # this replica's rows of this micro-batch
        rows.extend(range(block + first - low, block + last - low))
        low = high
    return torch.tensor(rows, dtype=torch.long)
