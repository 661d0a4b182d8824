"""The one structure every model autoplan plans for has: an ordered dict of pipeline layers.

A ``LayeredModel`` keeps its pipeline units (embedding, each block, the final norm and head) in
``self.layers``, an ``nn.ModuleDict`` applied in order. A pipeline stage is the same model with
the keys outside its range deleted, so parameter names (``layers.block_3.attn.q.weight``) are
identical on every rank and in single-process training.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["LayeredModel", "keep_layers"]


class LayeredModel(nn.Module):
    """A model whose forward is ``x = layer(x)`` for each entry of ``self.layers`` in order.

    The first layer takes the model input (token ids for the zoo's language models), the last
    returns the output the loss reads (logits). Subclasses fill ``self.layers``.
    """

    layers: nn.ModuleDict
    granularity: str = "block"
    """The unit of partition: 'block' (each ``layers`` entry) or 'sub-block' (each part of a
    splittable block apart: :mod:`autoplan.zoo.sub_blocks`)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        hidden = inputs
        for layer in self.layers.values():
            hidden = layer(hidden)
        return hidden

    def layer_names(self) -> list[str]:
        """Names of the pipeline layers in order; index i is layer i of the profile."""
        return list(self.layers.keys())


def keep_layers(model: LayeredModel, start: int, end: int) -> LayeredModel:
    """Delete, in place, every pipeline layer outside ``[start, end)`` and return the model."""
    names = model.layer_names()
    if not 0 <= start < end <= len(names):
        raise ValueError(f"layer range [{start}, {end}) is outside 0..{len(names)}")
    for name in names[:start] + names[end:]:
        del model.layers[name]
    return model
