"""Training dtypes by name, building a model directly in one (no fp32 copy first), and the
matmul precision each one asks of PyTorch.

``tf32`` is fp32 training with matmuls on TF32 tensor cores (10-bit mantissa inputs, fp32
accumulate): tensors are float32, so it maps to ``torch.float32``; what differs is the matmul
precision, which :func:`set_matmul_precision` sets (the runtime calls it before building the
model, so the run matches what the cost model assumed).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from autoplan.errors import InputError

__all__ = ["TORCH_DTYPES", "default_dtype", "set_matmul_precision", "torch_dtype"]

# The names the profile schema allows (autoplan.profile.schema.DType).
TORCH_DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32,
    "tf32": torch.float32,
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


def set_matmul_precision(name: str) -> None:
    """Set PyTorch's fp32 matmul precision for the training dtype ``name``.

    ``tf32`` allows TF32 tensor cores for fp32 matmuls and convolutions
    (``torch.set_float32_matmul_precision('high')``, which sets
    ``torch.backends.cuda.matmul.allow_tf32``, and ``torch.backends.cudnn.allow_tf32``);
    ``fp32`` asks for full-precision fp32 matmuls ('highest', cuDNN TF32 off), which is what the
    cost model's fp32 peak assumes. 16-bit and fp64 training leave the settings as they are
    (their matmuls do not read them). Process-wide, so call it once, before training.
    """
    torch_dtype(name)  # an unknown name is an InputError
    if name == "tf32":
        torch.set_float32_matmul_precision("high")
        torch.backends.cudnn.allow_tf32 = True
    elif name == "fp32":
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
