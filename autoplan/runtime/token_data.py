"""Training data from a token file, read by each rank for the samples of its own replicas.

A token file is how language-model data is usually kept: one long 1-D array of token ids,
either NumPy's ``.npy`` (the dtype is in its header) or a raw ``.bin`` (nanoGPT, Megatron's
``.bin`` without its index; the dtype given, or inferred: ``uint16`` when the model's
vocabulary fits in 16 bits, else ``uint32``). Both are memory-mapped: a rank reads only the
windows it trains on, however large the file.

Samples: sample ``i`` is the window of ``seq_len + 1`` tokens starting at ``i × seq_len``;
its first ``seq_len`` tokens are the inputs, its last ``seq_len`` the targets (next tokens).

Order (``SampleOrder``): epoch ``e`` visits every sample once, in a permutation drawn from
``seed + e`` (or in file order, unshuffled). The global batch of step ``k`` is positions
``[k·B, (k+1)·B)`` of that stream, an epoch's last partial batch dropped: the batch of a step
is a function of the step alone, the same on every rank, so a resumed run reads exactly the
batches an uninterrupted one would.

Ranks (``rank_rows``): the executors give replica ``r`` of a stage the rows of the global
batch that hold its share of every micro-batch (``data.sample_rows``). A rank reads the rows of
its replica of the first stage (inputs) and of the last stage (targets) only, so each replica
group reads the samples of its share, uneven shares included. The other rows of the global
batch tensors it builds stay zero; no executor reads them on that rank.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from autoplan.errors import InputError
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.runtime.data import Batch, sample_rows
from autoplan.runtime.placement import rank_place, share_ranges

__all__ = [
    "TOKEN_DTYPES",
    "SampleOrder",
    "TokenFile",
    "TokenSource",
    "open_token_batches",
    "rank_rows",
    "token_batches",
]

TOKEN_DTYPES = ("uint8", "uint16", "int16", "uint32", "int32", "int64")
"""The integer dtypes a token file may hold."""


@dataclass(frozen=True)
class TokenSource:
    """A token file to train on, as the command line names it."""

    path: Path
    dtype: str | None = None
    """The ids' dtype (one of ``TOKEN_DTYPES``); None: the ``.npy`` header's, or inferred for
    a ``.bin`` from the vocabulary."""
    shuffle: bool = True
    """Visit each epoch's samples in a seeded random order (else in file order)."""


@dataclass(frozen=True)
class TokenFile:
    """A memory-mapped 1-D array of token ids, cut into samples of ``seq_len + 1`` tokens."""

    path: Path
    tokens: np.ndarray
    seq_len: int

    @classmethod
    def open(cls, path: Path, seq_len: int, vocab_size: int, dtype: str | None = None) -> TokenFile:
        """Map ``path`` (``.npy`` or ``.bin``); ``dtype`` is required to agree with a ``.npy``
        header and is inferred for a ``.bin`` from ``vocab_size`` when not given."""
        shown = printable(str(path))
        if dtype is not None and dtype not in TOKEN_DTYPES:
            raise InputError(
                f"--data-dtype {printable(dtype)}: not a token dtype (one of "
                f"{', '.join(TOKEN_DTYPES)})"
            )
        if not path.is_file():
            raise InputError(f"--data {shown}: no such file")
        suffix = path.suffix.lower()
        if suffix == ".npy":
            try:
                tokens = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as error:
                raise InputError(f"--data {shown}: not a NumPy array file ({error})") from None
            if tokens.ndim != 1 or tokens.dtype.name not in TOKEN_DTYPES:
                raise InputError(
                    f"--data {shown}: holds a {tokens.ndim}-D {tokens.dtype.name} array; a "
                    f"token file is 1-D of {', '.join(TOKEN_DTYPES)}"
                )
            if dtype is not None and dtype != tokens.dtype.name:
                raise InputError(
                    f"--data {shown}: its header says {tokens.dtype.name}, not --data-dtype {dtype}"
                )
        elif suffix == ".bin":
            chosen = dtype or ("uint16" if vocab_size <= 2**16 else "uint32")
            itemsize = np.dtype(chosen).itemsize
            size = path.stat().st_size
            if size % itemsize:
                raise InputError(
                    f"--data {shown}: {size} bytes is not a whole number of {chosen} tokens "
                    f"({itemsize} bytes each); give --data-dtype"
                )
            tokens = np.memmap(path, dtype=chosen, mode="r") if size else np.zeros(0, chosen)
        else:
            raise InputError(
                f"--data {shown}: a token file ends in .npy (NumPy) or .bin (raw token ids)"
            )
        return cls(path, tokens, seq_len)

    @property
    def num_samples(self) -> int:
        """Whole windows of ``seq_len + 1`` tokens (consecutive windows share one token)."""
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def sample(self, index: int) -> np.ndarray:
        """The ``seq_len + 1`` token ids of sample ``index``, as int64."""
        start = index * self.seq_len
        return np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)


@dataclass(frozen=True)
class SampleOrder:
    """Which samples make the global batch of each step (see the module docstring)."""

    num_samples: int
    global_batch_size: int
    seed: int
    shuffle: bool = True

    @property
    def batches_per_epoch(self) -> int:
        """Global batches in one pass over the samples (the last partial one dropped)."""
        return self.num_samples // self.global_batch_size

    def _epoch(self, epoch: int) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)
        generator = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.num_samples, generator=generator)

    def batch(self, step: int) -> list[int]:
        """The sample indices of step ``step``'s global batch, in row order."""
        epoch, index = divmod(step, self.batches_per_epoch)
        start = index * self.global_batch_size
        return self._epoch(epoch)[start : start + self.global_batch_size].tolist()


def rank_rows(plan: Plan, rank: int) -> list[int]:
    """The rows of every global batch that ``rank`` trains on: its replica's share of each
    micro-batch of the first stage (inputs) and of the last stage (targets), where it holds
    them; empty for a rank of middle stages only."""
    place = rank_place(plan, rank)
    ends = {0, len(plan.stages) - 1} & set(place.stages)
    rows: set[int] = set()
    for stage in ends:
        start, end = share_ranges(plan.stages[stage])[place.replica]
        for micro_batch in range(plan.parallelism.num_micro_batches):
            rows.update(sample_rows(plan, micro_batch, start, end).tolist())
    return sorted(rows)


def token_batches(
    plan: Plan,
    data: TokenFile,
    order: SampleOrder,
    rank: int,
    start_step: int = 0,
    vocab_size: int | None = None,
) -> Iterator[Batch]:
    """Endless global batches from step ``start_step`` on, with only ``rank``'s rows read
    from the file (``rank_rows``); token ids at or above ``vocab_size`` are refused."""
    if order.batches_per_epoch < 1:
        raise InputError(
            f"--data {printable(str(data.path))}: {len(data.tokens)} tokens make "
            f"{data.num_samples} samples of {data.seq_len} (+1) tokens; the plan's global "
            f"batch is {order.global_batch_size} samples"
        )
    return _batches(plan, data, order, rank_rows(plan, rank), start_step, vocab_size)


def _batches(
    plan: Plan,
    data: TokenFile,
    order: SampleOrder,
    rows: list[int],
    step: int,
    vocab_size: int | None,
) -> Iterator[Batch]:
    shape = (plan.inputs.global_batch_size, plan.inputs.seq_len)
    while True:
        inputs = torch.zeros(shape, dtype=torch.long)
        targets = torch.zeros(shape, dtype=torch.long)
        samples = order.batch(step)
        for row in rows:
            window = torch.from_numpy(data.sample(samples[row]))
            low, high = int(window.min()), int(window.max())
            if low < 0 or (vocab_size is not None and high >= vocab_size):
                raise InputError(
                    f"--data {printable(str(data.path))}: sample {samples[row]} has token id "
                    f"{low if low < 0 else high}, outside the model's vocabulary "
                    f"[0, {vocab_size})"
                )
            inputs[row], targets[row] = window[:-1], window[1:]
        yield (inputs,), targets
        step += 1


def open_token_batches(
    plan: Plan, source: TokenSource, seed: int, rank: int, start_step: int = 0
) -> Iterator[Batch]:
    """``token_batches`` of ``source`` for ``rank`` of ``plan`` from ``start_step``; the
    order is drawn from ``seed``. The file is opened and checked here, before any batch."""
    from autoplan.zoo import get_model_spec

    vocab_size = get_model_spec(plan.inputs.model.name).vocab_size
    if vocab_size is None:
        raise InputError(
            f"--data: model '{printable(plan.inputs.model.name)}' takes no token ids (a token "
            "file feeds models with a vocabulary; pass a factory model its data through "
            "autoplan.runtime.train(batches=...))"
        )
    data = TokenFile.open(source.path, plan.inputs.seq_len, vocab_size, source.dtype)
    order = SampleOrder(data.num_samples, plan.inputs.global_batch_size, seed, source.shuffle)
    return token_batches(plan, data, order, rank, start_step, vocab_size)
