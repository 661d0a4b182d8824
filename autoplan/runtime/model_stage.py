"""The model a plan names, built identically on every rank and cut down to one stage.

Every rank builds the whole model from the same seed, so the weights of layer i are the same
bits on the rank that keeps layer i as in single-process training; then it keeps only its
stage's layers, which leaves parameter names unchanged (``layers.block_3.attn.q.weight``).
Building the whole model first costs host memory for big models; it is the simple way to
guarantee identical initial weights without a checkpoint.

Pipeline layers are what the profiler measured: the ``layers`` entries of a zoo
``LayeredModel``, the children of a factory's ``nn.Sequential``, the layer modules the profile
recorded for a decoder-shaped factory model (run as a :class:`~autoplan.zoo.decoder.LayerChain`,
parameter names unchanged), or a factory's whole module.
Weights shared by layers of different stages (tied embeddings) become one copy per stage:
:func:`find_tied_weights` lists them so that the runtime can sum their gradients.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.plan.schema import Plan, Stage
from autoplan.zoo import LayeredModel, get_model_spec, keep_layers
from autoplan.zoo.decoder import LayerChain
from autoplan.zoo.dtypes import default_dtype, torch_dtype
from autoplan.zoo.sub_blocks import keep_units, model_units, set_granularity

__all__ = [
    "TiedWeight",
    "build_full_model",
    "build_stage_models",
    "find_tied_weights",
    "keep_stage_layers",
    "meta_model",
    "pipeline_layers",
]


def build_full_model(
    model_name: str,
    dtype: str,
    seed: int,
    granularity: str = "block",
    layer_modules: list[str] | None = None,
) -> nn.Module:
    """The whole model, initialised from ``seed`` in ``dtype``: the same on every call; its
    pipeline layers are the units of ``granularity`` (the weights are the same at either), or
    the modules ``layer_modules`` names (a LayerChain of the same weights and names)."""
    spec = get_model_spec(model_name)
    torch_type = torch_dtype(dtype)
    torch.manual_seed(seed)
    # Building under the default dtype allocates the weights once, in the training dtype.
    with default_dtype(torch_type if torch_type.is_floating_point else torch.float32):
        model = spec.build()
    model = set_granularity(model.to(torch_type), granularity)
    return LayerChain(model, layer_modules) if layer_modules is not None else model


def pipeline_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(parameter-name prefix, module) of each pipeline layer, in order. At sub-block grain a
    block's part is a view whose parameters are named as in the block, under its prefix."""
    if isinstance(model, LayeredModel):
        return [(f"layers.{unit.layer_name}", unit.module) for unit in model_units(model)]
    if isinstance(model, nn.Sequential):
        return list(model.named_children())
    if isinstance(model, LayerChain):
        return model.layers()
    return [("", model)]


def keep_stage_layers(model: nn.Module, start: int, end: int) -> nn.Module:
    """The module of layers ``[start, end)``, parameter names as in the whole model."""
    if isinstance(model, LayeredModel):
        if model.granularity == "sub-block":
            return keep_units(model, start, end)
        return keep_layers(model, start, end)
    if isinstance(model, nn.Sequential):
        return model[start:end]  # a slice keeps the children's original names
    if isinstance(model, LayerChain):
        return model.keep(start, end)
    if (start, end) != (0, 1):
        raise InputError(
            f"{type(model).__name__} is one pipeline layer; cannot keep layers [{start}, {end})"
        )
    return model


@dataclass(frozen=True)
class TiedWeight:
    """One weight shared by layers that the plan puts in different stages."""

    names: tuple[str, ...]
    """Its parameter name in each stage that uses it (e.g. the embedding's and the head's)."""
    stages: tuple[int, ...]
    """The stage of each name."""


def find_tied_weights(model: nn.Module, plan: Plan) -> list[TiedWeight]:
    """The weights that layers of different stages share (tied embeddings), per the plan."""
    stage_of_layer = {
        layer: stage.index
        for stage in plan.stages
        for layer in range(stage.layer_start, stage.layer_end)
    }
    users: dict[int, dict[int, str]] = {}
    for index, (prefix, layer) in enumerate(pipeline_layers(model)):
        for name, param in layer.named_parameters(remove_duplicate=False):
            full_name = f"{prefix}.{name}" if prefix else name
            # Per stage, the first name is the one named_parameters() reports there.
            users.setdefault(id(param), {}).setdefault(stage_of_layer[index], full_name)
    return [
        TiedWeight(names=tuple(names.values()), stages=tuple(names))
        for names in users.values()
        if len(names) > 1
    ]


def build_stage_models(
    plan: Plan, stages: list[Stage], seed: int
) -> tuple[list[nn.Module], list[TiedWeight]]:
    """One module per stage in ``stages``, each holding that stage's layers with their weights,
    and the weights tied across the plan's stages."""
    full = build_full_model(
        plan.inputs.model.name,
        plan.inputs.dtype,
        seed,
        plan.inputs.model.granularity,
        plan.inputs.model.layer_modules,
    )
    num_layers = len(pipeline_layers(full))
    if num_layers != plan.inputs.model.num_layers:
        raise InputError(
            f"model '{plan.inputs.model.name}' has {num_layers} layers; the plan was made for "
            f"{plan.inputs.model.num_layers}"
        )
    if plan.stages[-1].layer_end != num_layers or plan.stages[0].layer_start != 0:
        raise InputError(
            f"the plan's stages cover layers [{plan.stages[0].layer_start}, "
            f"{plan.stages[-1].layer_end}); the model has {num_layers}"
        )
    tied = find_tied_weights(full, plan)
    models = []
    for position, stage in enumerate(stages):
        # Each stage slices its own copy, so a weight shared with another stage is a copy too.
        source = full if position == len(stages) - 1 else copy.deepcopy(full)
        models.append(keep_stage_layers(source, stage.layer_start, stage.layer_end))
    return models, tied


def meta_model(plan: Plan) -> nn.Module:
    """The plan's whole model on the meta device: shapes only, nothing allocated."""
    with torch.device("meta"):
        model = get_model_spec(plan.inputs.model.name).build()
    model = set_granularity(model, plan.inputs.model.granularity)
    # A decoder-shaped factory model is run as the layer modules its profile recorded.
    layer_modules = plan.inputs.model.layer_modules
    return LayerChain(model, layer_modules) if layer_modules is not None else model
