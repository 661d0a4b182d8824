"""How a module splits into the pipeline layers the profile lists."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.profile.schema import LayerKind
from autoplan.zoo.decoder import LayerChain, find_layer_modules
from autoplan.zoo.layered import LayeredModel
from autoplan.zoo.sub_blocks import model_units

__all__ = ["PipelineLayer", "as_layer_chain", "pipeline_layers"]

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


def as_layer_chain(
    model: nn.Module, inputs: list[torch.Tensor], layer_modules: list[str] | None = None
) -> tuple[nn.Module, str | None]:
    """``model`` as a :class:`~autoplan.zoo.decoder.LayerChain` of its decoder-shaped layers
    (call under FakeTensorMode), and a note when it stays one layer and why.

    A LayeredModel or an ``nn.Sequential`` is returned as it is (its layers are known).
    ``layer_modules`` names the layers' modules (``--layer-modules``); without it the largest
    ModuleList of one type is looked for, and a model that cannot be run as a chain stays one
    layer (the note says why) instead of failing.
    """
    if isinstance(model, LayeredModel | nn.Sequential):
        if layer_modules:
            known = "children" if isinstance(model, nn.Sequential) else "`layers` entries"
            raise InputError(
                "--layer-modules is for models whose layers are not already known; "
                f"{type(model).__name__}'s are its {known}"
            )
        return model, None
    try:
        found = find_layer_modules(model, inputs, layer_modules)
    except InputError as error:
        if layer_modules:
            raise
        return model, f"{error}; profiled as one layer (name its layers with --layer-modules)"
    return LayerChain(model, found.paths, found), None


def _chain_kind(chain: LayerChain, position: int, path: str, module: nn.Module) -> LayerKind:
    """A chain layer's kind: its blocks; an embedding first; a linear head last."""
    if chain.found is not None and path in chain.found.block_paths:
        return "block"
    if position == 0 and any(isinstance(m, nn.Embedding) for m in module.modules()):
        return "embedding"
    if position == len(chain.layer_paths) - 1 and isinstance(module, nn.Linear):
        return "head"
    return "other"


def pipeline_layers(model: nn.Module) -> tuple[list[PipelineLayer], str]:
    """The model's layers in order and a sentence saying how they were found.

    A LayeredModel gives its ``layers``; an ``nn.Sequential`` its children; a LayerChain
    (:func:`as_layer_chain`) its layer modules; any other module is one layer (a pipeline
    cannot split it).
    """
    if isinstance(model, LayerChain):
        layers = [
            PipelineLayer(path, _chain_kind(model, position, path, module), module)
            for position, (path, module) in enumerate(model.layers())
        ]
        note = model.found.note if model.found else "layers are the recorded layer modules"
        return layers, note
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
