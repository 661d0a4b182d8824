"""How a module splits into the pipeline layers the profile lists."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoplan.profile.schema import LayerKind
from autoplan.zoo.layered import LayeredModel
from autoplan.zoo.sub_blocks import model_units

__all__ = ["PipelineLayer", "pipeline_layers"]

_KIND_BY_ZOO_NAME: dict[str, LayerKind] = {"embed": "embedding", "head": "head"}


@dataclass(frozen=True)
class PipelineLayer:
    """One unit of the profile: its name (module path) and kind."""

    name: str
    kind: LayerKind
    module: nn.Module
    block_index: int | None = None
    """At sub-block grain: the block-grain layer this unit is part of."""
    part: str | None = None
    """At sub-block grain: 'attn' or 'mlp' for a block's part, None for a whole layer."""


def pipeline_layers(model: nn.Module) -> tuple[list[PipelineLayer], str]:
    """The model's layers in order and a sentence saying how they were found.

    A LayeredModel gives its ``layers``; an ``nn.Sequential`` its children; any other module
    is one layer (a pipeline cannot split it).
    """
    if isinstance(model, LayeredModel) and model.granularity == "sub-block":
        # A block's parts keep the kind 'block': the cost model and the search treat them as
        # the blocks' share of the work they are.
        layers = [
            PipelineLayer(
                unit.name,
                _KIND_BY_ZOO_NAME.get(
                    unit.layer_name, "block" if unit.layer_name.startswith("block_") else "other"
                ),
                unit.module,
                block_index=unit.block_index if unit.part is not None else None,
                part=unit.part,
            )
            for unit in model_units(model)
        ]
        return layers, (
            "sub-block grain: each block of the LayeredModel's `layers` is two units, "
            "'attn' (norm, attention, residual add) and 'mlp' (norm, MLP, residual add), the "
            "residual stream between them; other entries (and blocks that cannot be cut) whole"
        )
    if isinstance(model, LayeredModel):
        layers = [
            PipelineLayer(
                f"layers.{name}",
                _KIND_BY_ZOO_NAME.get(name, "block" if name.startswith("block_") else "other"),
                module,
            )
            for name, module in model.layers.items()
        ]
        return layers, "layers are the entries of the LayeredModel's `layers`"
    if isinstance(model, nn.Sequential):
        layers = [PipelineLayer(name, "other", module) for name, module in model.named_children()]
        return layers, "layers are the children of the nn.Sequential"
    return (
        [PipelineLayer("", "other", model)],
        f"{type(model).__name__} is neither a LayeredModel nor an nn.Sequential: "
        "profiled as one layer",
    )
