"""The model a plan names, built identically on every rank and cut down to one stage.

Every rank builds the whole model from the same seed, so the weights of layer i are the same
bits on the rank that keeps layer i as in single-process training; then it keeps only its
stage's layers (``keep_layers``), which leaves parameter names unchanged
(``layers.block_3.attn.q.weight``). Building the whole model first costs host memory for big
models; it is the simple way to guarantee identical initial weights without a checkpoint.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import torch

from autoplan.errors import InputError
from autoplan.plan.schema import Plan, Stage
from autoplan.zoo import LayeredModel, get_model_spec, keep_layers

__all__ = [
    "DTYPES",
    "build_full_model",
    "build_stage_models",
    "check_tied_parameters",
    "torch_dtype",
]

DTYPES: dict[str, torch.dtype] = {
    "fp64": torch.float64,
    "float64": torch.float64,
    "fp32": torch.float32,
    "float32": torch.float32,
    "tf32": torch.float32,
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a plan's dtype string ('fp64', 'bf16', ...)."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise InputError(f"dtype '{name}' is not one of {', '.join(sorted(DTYPES))}") from None


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_full_model(model_name: str, dtype: str, seed: int) -> LayeredModel:
    """The whole model, initialised from ``seed`` in ``dtype``: the same on every call."""
    spec = get_model_spec(model_name)
    torch_type = torch_dtype(dtype)
    torch.manual_seed(seed)
    # Building under the default dtype allocates the weights once, in the training dtype.
    with _default_dtype(torch_type if torch_type.is_floating_point else torch.float32):
        model = spec.build()
    return model.to(torch_type)


def check_tied_parameters(model: LayeredModel, plan: Plan) -> None:
    """Refuse plans that put two layers sharing a parameter (tied embeddings) in different stages.

    Each stage is its own module, so a weight shared across stages would become two independent
    copies with diverging gradients. (Megatron keeps two copies and all-reduces their gradients
    between the first and last stage; autoplan's runtime does not do that yet.)
    """
    stage_of_layer = {
        layer: stage.index
        for stage in plan.stages
        for layer in range(stage.layer_start, stage.layer_end)
    }
    users: dict[int, list[tuple[int, str]]] = {}
    for index, (layer_name, layer) in enumerate(model.layers.items()):
        for param_name, param in layer.named_parameters(remove_duplicate=False):
            users.setdefault(id(param), []).append((index, f"layers.{layer_name}.{param_name}"))
    for uses in users.values():
        stages = sorted({stage_of_layer.get(index, -1) for index, _ in uses})
        if len(stages) > 1:
            names = " and ".join(name for _, name in uses)
            raise InputError(
                f"model '{plan.inputs.model.name}' ties {names} (layers "
                f"{', '.join(str(index) for index, _ in uses)}), which the plan puts in stages "
                f"{', '.join(map(str, stages))}; the runtime needs tied layers in one stage "
                "(untie the weights or plan those layers together)"
            )


def build_stage_models(plan: Plan, stages: list[Stage], seed: int) -> list[LayeredModel]:
    """One module per stage in ``stages``, each holding that stage's layers with their weights."""
    full = build_full_model(plan.inputs.model.name, plan.inputs.dtype, seed)
    num_layers = len(full.layer_names())
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
    check_tied_parameters(full, plan)
    models = []
    for position, stage in enumerate(stages):
        source = full if position == len(stages) - 1 else copy.deepcopy(full)
        models.append(keep_layers(source, stage.layer_start, stage.layer_end))
    return models
