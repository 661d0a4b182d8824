"""Names of a stage's units for ``autoplan show``: 'block_3 attn .. block_5 mlp'.

At sub-block grain a stage may start or end inside a block; its row then says which part of
which block it starts and ends at, from the unit names the profile recorded in the plan's
model record (``ModelRef.unit_names``). At block grain (no names recorded) nothing is added.
"""

from __future__ import annotations

from autoplan.profile.schema import ModelRef

__all__ = ["stage_units_text", "unit_text"]


def unit_text(name: str) -> str:
    """A unit's name as people read it: 'layers.block_3:attn' → 'block_3 attn'."""
    base, _, part = name.removeprefix("layers.").partition(":")
    return f"{base} {part}" if part else base


def stage_units_text(model: ModelRef, start: int, end: int) -> str:
    """'first .. last' unit of the range ``[start, end)`` at sub-block grain, else ''."""
    names = model.unit_names
    if model.granularity != "sub-block" or names is None or not 0 <= start < end <= len(names):
        return ""
    first, last = unit_text(names[start]), unit_text(names[end - 1])
    return first if start == end - 1 else f"{first} .. {last}"
