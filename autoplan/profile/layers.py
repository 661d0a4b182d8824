"""How a module splits into the pipeline layers the profile lists."""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from autoplan.profile.schema import LayerKind
from autoplan.zoo.layered import LayeredModel

__all__ = ["PipelineLayer", "pipeline_layers"]

_KIND_BY_ZOO_NAME: dict[str, LayerKind] = {"embed": "embedding", "head": "head"}


@dataclass(frozen=True)
class PipelineLayer:
    """One unit of the profile: its name (module path) and kind."""

    name: str
    kind: LayerKind
    module: nn.Module


def pipeline_layers(model: nn.Module) -> tuple[list[PipelineLayer], str]:
    """The model's layers in order and a sentence saying how they were found.

    A LayeredModel gives its ``layers``; an ``nn.Sequential`` its children; any other module
    is one layer (a pipeline cannot split it).
    """
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
