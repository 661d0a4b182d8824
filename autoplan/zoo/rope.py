"""Rotary position embedding (RoPE) as the zoo's attention applies it: on all of a head's
dimensions (Llama) or on its first ones only (GPT-NeoX, Phi-4-mini), with the frequency scalings
of Hugging Face's ``rope_scaling`` that change the frequencies themselves ('linear', 'llama3').

Pairs are (i, i + d/2) of the rotated dimensions, as in the Hugging Face layout of LLaMA and
GPT-NeoX weights. The angles are computed on each call rather than kept in a buffer, so that a
model has no non-persistent state to re-initialise after meta-device construction or stage
slicing; a scaling's per-frequency factors are plain Python numbers, computed once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Literal

import torch

from autoplan.zoo.positions import positions_of

__all__ = ["RopeScaling", "ScalingKind", "apply_rotary"]

ScalingKind = Literal["linear", "llama3"]


@dataclass(frozen=True)
class RopeScaling:
    """A frequency scaling of RoPE for contexts longer than the model was pre-trained on.

    ``linear`` divides every frequency by ``factor`` (position interpolation). ``llama3``
    (Llama 3.1, 3.2) divides the low frequencies, those whose wavelength exceeds
    ``original_max_position / low_freq_factor``, by ``factor``, keeps the high ones (wavelength
    below ``original_max_position / high_freq_factor``) and blends in between.
    """

    kind: ScalingKind
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self) -> None:
        if self.factor <= 0:
            raise ValueError(f"rope scaling factor must be positive, got {self.factor}")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor ({self.high_freq_factor}) > "
                f"low_freq_factor ({self.low_freq_factor})"
            )

    def frequency_factor(self, inverse_frequency: float) -> float:
        """What this scaling multiplies a frequency (radians per position) by."""
        if self.kind == "linear":
            return 1.0 / self.factor
        wavelength = 2 * math.pi / inverse_frequency
        if wavelength < self.original_max_position / self.high_freq_factor:
            return 1.0
        if wavelength > self.original_max_position / self.low_freq_factor:
            return 1.0 / self.factor
        smooth = (self.original_max_position / wavelength - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        return (1 - smooth) / self.factor + smooth


@functools.cache
def _frequency_factors(half: int, theta: float, scaling: RopeScaling) -> tuple[float, ...]:
    return tuple(scaling.frequency_factor(theta ** (-index / half)) for index in range(half))


def _rotate(x: torch.Tensor, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    """RoPE on every dimension of ``x`` (…, seq, d): pairs (i, i + d/2)."""
    seq, dims = x.shape[-2], x.shape[-1]
    half = dims // 2
    inv_freq = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    if scaling is not None:
        factors = _frequency_factors(half, theta, scaling)
        inv_freq = inv_freq * torch.tensor(factors, device=x.device, dtype=torch.float32)
    # Global positions (a context-parallel chunk is not a prefix: autoplan.zoo.positions).
    positions = positions_of(seq, x.device).to(torch.float32)
    angles = torch.outer(positions, inv_freq)
    cos = torch.cat([angles.cos(), angles.cos()], dim=-1).to(x.dtype)
    sin = torch.cat([angles.sin(), angles.sin()], dim=-1).to(x.dtype)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def apply_rotary(
    x: torch.Tensor,
    theta: float,
    *,
    rotary_dims: int | None = None,
    scaling: RopeScaling | None = None,
) -> torch.Tensor:
    """``x`` of shape (batch, heads, seq, head_dim) with RoPE applied to its first
    ``rotary_dims`` dimensions (all when None); the others pass through unchanged."""
    if rotary_dims is None or rotary_dims >= x.shape[-1]:
        return _rotate(x, theta, scaling)
    rotated = _rotate(x[..., :rotary_dims], theta, scaling)
    return torch.cat([rotated, x[..., rotary_dims:]], dim=-1)
