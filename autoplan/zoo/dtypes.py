"""Training dtypes by name, and building a model directly in one (no fp32 copy first)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from autoplan.errors import InputError

__all__ = ["TORCH_DTYPES", "default_dtype", "torch_dtype"]

# The names the profile schema allows (autoplan.profile.schema.DType).
TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
    "fp64": torch.float64,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a profile's or plan's dtype name; others are an InputError."""
    try:
        return TORCH_DTYPES[name]
    except KeyError:
        raise InputError(f"dtype '{name}' is not one of {', '.join(TORCH_DTYPES)}") from None


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create floating tensors in ``dtype`` inside the block (``torch.set_default_dtype``)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)
