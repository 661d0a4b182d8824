"""Sub-block partition units (DawnPiper's finer grain): a block as its two residual parts.

A pre-norm transformer block is two residual steps on the residual stream ``x``::

    x = x + attn(attn_norm(x))      # the 'attn' part
    x = x + mlp(mlp_norm(x))        # the 'mlp' part

(with sandwich norms a post-norm sits between the body and the add). Each part reads and
writes only ``x``, so a pipeline stage may end after the 'attn' part and the next one start at
the 'mlp' part: what crosses is the residual stream, the same tensor as between blocks.

A :class:`SplittableBlock` holds a :class:`ResidualPart` view per part. The views share the
block's own submodules (they are not registered as the block's children, so parameter names
stay ``layers.block_3.attn.q.weight``), and the block's forward runs them in order: at either
grain the same operations run in the same order, so the numerics are the same bits.

At ``granularity='sub-block'`` a :class:`~autoplan.zoo.layered.LayeredModel` lists the parts
of every splittable block as separate units (:func:`model_units`); a stage that starts or ends
mid-block keeps the block with only its stage's parts (:func:`keep_units`). A block whose
parts do not compose in sequence (GPT-NeoX's parallel residual x + attn(ln1 x) + mlp(ln2 x))
stays one unit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.zoo.layered import LayeredModel

__all__ = [
    "GRANULARITIES",
    "PartName",
    "ResidualPart",
    "SplittableBlock",
    "Unit",
    "keep_units",
    "model_units",
    "set_granularity",
]

GRANULARITIES = ("block", "sub-block")
PartName = Literal["attn", "mlp"]


class ResidualPart(nn.Module):
    """One residual step ``x + post(body(norm(x)))`` of a block, over the block's own modules.

    Its children carry the block's attribute names (``attn_norm``, ``attn``, ...), so a
    parameter's name under the block's prefix is the same through the part as through the
    block.
    """

    def __init__(self, part: PartName, modules: list[tuple[str, nn.Module]]) -> None:
        super().__init__()
        self.part = part
        for name, module in modules:
            self.add_module(name, module)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = x
        for module in self._modules.values():
            assert module is not None
            hidden = module(hidden)
        return x + hidden

    def extra_repr(self) -> str:
        return f"part={self.part}"


class SplittableBlock(nn.Module):
    """A block that is residual parts in sequence; subclasses call :meth:`_init_parts`."""

    def _init_parts(self, parts: dict[PartName, tuple[str, ...]]) -> None:
        """Build the part views: each part's module attribute names (norm, body, post-norm) in
        the order they apply; attributes that are None are skipped."""
        views = {
            part: ResidualPart(
                part,
                [(name, getattr(self, name)) for name in names if getattr(self, name) is not None],
            )
            for part, names in parts.items()
        }
        # A plain dict: the views are not registered, so parameter names are the block's own.
        self._part_views: dict[PartName, ResidualPart] = views
        self.kept_parts: tuple[PartName, ...] = tuple(views)

    @property
    def splittable(self) -> bool:
        """Whether the block can be cut between its parts."""
        return bool(getattr(self, "_part_views", None))

    def parts(self) -> list[tuple[PartName, ResidualPart]]:
        """The parts this (possibly cut) block still holds, in order."""
        return [(part, self._part_views[part]) for part in self.kept_parts]

    def keep_parts(self, parts: tuple[PartName, ...]) -> None:
        """Keep only ``parts`` (a contiguous run of the block's parts): delete the others'
        modules, in place, so that the stage holds only its parameters."""
        if not parts or any(part not in self.kept_parts for part in parts):
            raise ValueError(f"cannot keep parts {parts} of a block holding {self.kept_parts}")
        for part, view in self.parts():
            if part not in parts:
                for name in list(view._modules):
                    delattr(self, name)
                del self._part_views[part]
        self.kept_parts = tuple(part for part in self.kept_parts if part in parts)

    def forward_parts(self, x: torch.Tensor) -> torch.Tensor:
        """Run the kept parts in order (the block's forward when it is splittable)."""
        for _, view in self.parts():
            x = view(x)
        return x


@dataclass(frozen=True)
class Unit:
    """One unit of partition: a ``layers`` entry, or one part of a splittable block."""

    layer_name: str
    """The ``layers`` key (parameter names start ``layers.<layer_name>.``)."""
    block_index: int
    """Position of that entry in ``layers`` (the unit's index at block grain)."""
    part: PartName | None
    """The part at sub-block grain; None for a whole entry."""
    module: nn.Module

    @property
    def name(self) -> str:
        """Readable unit name: ``layers.block_3`` or ``layers.block_3:attn``."""
        base = f"layers.{self.layer_name}"
        return base if self.part is None else f"{base}:{self.part}"


def set_granularity(model: nn.Module, granularity: str) -> nn.Module:
    """Mark ``model``'s unit of partition, in place; sub-block grain needs a LayeredModel."""
    if granularity not in GRANULARITIES:
        raise InputError(
            f"granularity must be one of {', '.join(GRANULARITIES)}, got {granularity!r}"
        )
    if granularity == "block":
        if isinstance(model, LayeredModel):
            model.granularity = "block"
        return model
    if not isinstance(model, LayeredModel):
        raise InputError(
            f"sub-block granularity needs a zoo model (a LayeredModel); {type(model).__name__} "
            "is profiled at block grain only"
        )
    model.granularity = "sub-block"
    return model


def model_units(model: LayeredModel) -> list[Unit]:
    """The units of ``model`` at its granularity, in order (a cut block lists its kept parts)."""
    sub_block = getattr(model, "granularity", "block") == "sub-block"
    units: list[Unit] = []
    for position, (name, layer) in enumerate(model.layers.items()):
        if sub_block and isinstance(layer, SplittableBlock) and layer.splittable:
            units.extend(Unit(name, position, part, view) for part, view in layer.parts())
        else:
            units.append(Unit(name, position, None, layer))
    return units


def keep_units(model: LayeredModel, start: int, end: int) -> LayeredModel:
    """Delete, in place, every unit outside ``[start, end)``: whole entries, or the parts of a
    block that the range cuts; parameter names of what is kept are unchanged."""
    units = model_units(model)
    if not 0 <= start < end <= len(units):
        raise ValueError(f"unit range [{start}, {end}) is outside 0..{len(units)}")
    kept: dict[str, list[PartName | None]] = {}
    for unit in units[start:end]:
        kept.setdefault(unit.layer_name, []).append(unit.part)
    for name in list(model.layers.keys()):
        if name not in kept:
            del model.layers[name]
            continue
        parts = kept[name]
        layer = model.layers[name]
        cut = isinstance(layer, SplittableBlock) and len(parts) < len(layer.kept_parts)
        if cut and None not in parts:
            assert isinstance(layer, SplittableBlock)
            layer.keep_parts(tuple(part for part in parts if part is not None))
    return model
