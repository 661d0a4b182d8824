"""Pipeline layers of a model that is neither a LayeredModel nor an ``nn.Sequential``: the
decoder shape of Hugging Face and torchtitan models (an embedding, an ``nn.ModuleList`` of
blocks, a norm, a head, and a ``forward`` that loops over the list).

Finding them (:func:`find_layer_modules`). The anchors are the entries of the largest
``nn.ModuleList`` whose entries are all of one type, or the modules named by the user (as
``torch.distributed.pipelining`` names split points; a ModuleList stands for its entries). The
candidates are the anchors and every other child of the modules that hold an anchor (the model
itself included): ``model.embed_tokens``, ``model.norm``, ``lm_head``. One forward of the model
on fake tensors records which candidates run, in which order, with what. The layers are the
candidates that run, in call order, and they must be a chain: the first takes the model's
input, each next one exactly the previous one's output and nothing else, the model returns the
last one's output, and every parameter is in a layer. Anything else (blocks given an attention
mask or rotary tables computed outside them, an op between two layers that is no module) is
refused, saying what was found: running the layers one after another would not be the model.

Running them (:class:`LayerChain`). The model's children move into a module whose forward
applies the layers in order. Parameter names stay the model's own (``model.layers.3.mlp.up.
weight``), so a stage (:meth:`LayerChain.keep`) is the chain with the other layers deleted; a
ModuleList that holds layers becomes a ModuleDict of the same keys, so that deleting entries
does not renumber the others.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from autoplan.errors import InputError

__all__ = ["LayerChain", "LayerModules", "find_layer_modules", "largest_block_list"]


@dataclass(frozen=True)
class LayerModules:
    """What :func:`find_layer_modules` found: each layer's module path, in order, and how."""

    paths: tuple[str, ...]
    """Each pipeline layer's module path in the model, in call order."""
    block_paths: frozenset[str]
    """The paths that are anchors (the repeated blocks, or the modules the user named)."""
    note: str
    """One sentence saying how the layers were found."""


def largest_block_list(model: nn.Module) -> str | None:
    """Path of the largest ``nn.ModuleList`` (two entries or more, all of one type); the first
    in module order among equals. None when the model has none."""
    best: tuple[int, str] | None = None
    for path, module in model.named_modules():
        if not isinstance(module, nn.ModuleList) or len(module) < 2:
            continue
        if len({type(child) for child in module}) != 1:
            continue
        if best is None or len(module) > best[0]:
            best = (len(module), path)
    return None if best is None else best[1]


def _anchors(model: nn.Module, names: Sequence[str]) -> list[str]:
    """The anchor paths of ``names``: a ModuleList stands for its entries."""
    anchors: list[str] = []
    for name in names:
        try:
            module = model.get_submodule(name)
        except AttributeError:
            raise InputError(
                f"{type(model).__name__} has no module '{name}' (layer modules are paths as in "
                "named_modules(), e.g. 'model.layers')"
            ) from None
        if module is model:
            raise InputError("a layer module must be a submodule of the model, not the model")
        if isinstance(module, nn.ModuleList):
            anchors.extend(f"{name}.{key}" for key in module._modules)
        else:
            anchors.append(name)
    for first in anchors:
        for second in anchors:
            if first != second and second.startswith(f"{first}."):
                raise InputError(f"layer modules '{first}' and '{second}' nest")
    return anchors


def _candidates(model: nn.Module, anchors: list[str]) -> list[str]:
    """The anchors, and every other child of a module that holds an anchor (module order)."""
    holders = {""}
    for anchor in anchors:
        parts = anchor.split(".")
        holders.update(".".join(parts[:end]) for end in range(1, len(parts)))
    anchor_set = set(anchors)
    found: list[str] = []
    for path, module in model.named_modules():
        if path not in holders:
            continue
        for key in module._modules:
            child = f"{path}.{key}" if path else key
            if child in anchor_set or child not in holders:
                found.append(child)
    return found


@dataclass
class _Call:
    path: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    output: Any = None


def _record_calls(
    model: nn.Module, candidates: list[str], inputs: list[torch.Tensor]
) -> tuple[list[_Call], Any]:
    """Run ``model(*inputs)`` once (call under FakeTensorMode) noting each candidate's call."""
    calls: list[_Call] = []
    handles = []

    def hooks(path: str) -> tuple[Any, Any]:
        def before(_: nn.Module, args: tuple, kwargs: dict) -> None:
            calls.append(_Call(path, args, kwargs))

        def after(_: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            for call in reversed(calls):
                if call.path == path and call.output is None:
                    call.output = output
                    break

        return before, after

    for path in candidates:
        module = model.get_submodule(path)
        before, after = hooks(path)
        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        with torch.no_grad():
            output = model(*inputs)
    except Exception as error:  # the model is user code: its failure is its input
        raise InputError(
            f"{type(model).__name__}'s forward failed on the example input: "
            f"{type(error).__name__}: {' '.join(str(error).split())}"
        ) from None
    finally:
        for handle in handles:
            handle.remove()
    return calls, output


def _chain_problem(calls: list[_Call], inputs: list[torch.Tensor], output: Any) -> str | None:
    """Why the recorded calls are not a chain of one-tensor layers, or None."""
    seen: set[str] = set()
    for call in calls:
        if call.path in seen:
            return f"'{call.path}' runs more than once in a forward"
        seen.add(call.path)
    previous: tuple[Any, ...] = tuple(inputs)
    for position, call in enumerate(calls):
        where = "the model's input" if position == 0 else f"'{calls[position - 1].path}'"
        if call.kwargs:
            return (
                f"'{call.path}' is called with {', '.join(sorted(call.kwargs))} besides the "
                "hidden state; autoplan pipelines layers that take one tensor"
            )
        if len(call.args) != len(previous) or any(
            a is not b for a, b in zip(call.args, previous, strict=False)
        ):
            return f"'{call.path}' does not take exactly what {where} gives"
        if not isinstance(call.output, torch.Tensor):
            return (
                f"'{call.path}' returns {type(call.output).__name__}; autoplan pipelines layers "
                "that return one tensor"
            )
        previous = (call.output,)
    if not calls:
        return "none of its modules runs in its forward"
    if output is not calls[-1].output:
        return f"its forward does not return what '{calls[-1].path}', the last layer, returns"
    return None


def find_layer_modules(
    model: nn.Module, inputs: list[torch.Tensor], names: Sequence[str] | None = None
) -> LayerModules:
    """The pipeline layers of ``model`` (module docstring); call under FakeTensorMode, with
    ``inputs`` the model's example input. ``names``: the modules the user named as layers;
    None: the entries of the largest ModuleList of one type. Raises InputError, saying why,
    when the model cannot be run as its layers one after another."""
    if names:
        anchors = _anchors(model, names)
        how = f"the modules named ({', '.join(names)})"
    else:
        blocks = largest_block_list(model)
        if blocks is None:
            raise InputError(
                f"{type(model).__name__} has no nn.ModuleList of two or more modules of one type"
            )
        anchors = _anchors(model, [blocks])
        kind = type(model.get_submodule(anchors[0])).__name__
        how = f"the {len(anchors)} {kind} entries of '{blocks}' (its largest ModuleList)"
    candidates = _candidates(model, anchors)
    calls, output = _record_calls(model, candidates, inputs)
    problem = _chain_problem(calls, inputs, output)
    if problem is not None:
        raise InputError(f"{type(model).__name__} cannot run as a chain of layers: {problem}")
    paths = tuple(call.path for call in calls)
    missing = [anchor for anchor in anchors if anchor not in paths]
    if missing:
        raise InputError(f"'{missing[0]}' does not run in {type(model).__name__}'s forward")
    covered = {
        id(parameter) for path in paths for parameter in model.get_submodule(path).parameters()
    }
    for name, parameter in model.named_parameters():
        if id(parameter) not in covered:
            raise InputError(
                f"{type(model).__name__}'s parameter '{name}' is in none of its layers "
                f"({', '.join(paths[:3])}, ...): pipeline stages could not hold it"
            )
    extra = [path for path in paths if path not in set(anchors)]
    note = (
        f"layers are {how} and the modules the forward runs around them "
        f"({', '.join(extra) or 'none'}), in call order"
    )
    return LayerModules(paths=paths, block_paths=frozenset(anchors), note=note)


class LayerChain(nn.Module):
    """A model run as its pipeline layers one after another, under its own parameter names.

    Built from the model's children (moved, not copied) and the layers' module paths; the
    model's own forward is not used again: :func:`find_layer_modules` checked that applying
    the layers in order computes it.
    """

    def __init__(
        self, model: nn.Module, paths: Sequence[str], found: LayerModules | None = None
    ) -> None:
        super().__init__()
        # How the layers were found (kinds, the note), where the chain is made from a search.
        self.found = found
        for name, child in model.named_children():
            self.add_module(name, child)
        for name, buffer in model.named_buffers(recurse=False):
            self.register_buffer(name, buffer)
        if next(model.parameters(recurse=False), None) is not None:
            raise InputError(
                f"{type(model).__name__} holds parameters of its own, outside its layers"
            )
        self.layer_paths = list(paths)
        for path in self.layer_paths:
            try:
                self.get_submodule(path)
            except AttributeError:
                raise InputError(
                    f"{type(model).__name__} has no module '{path}' (the layer modules the "
                    "profile recorded)"
                ) from None
        self._lists_to_dicts()

    def _lists_to_dicts(self) -> None:
        """Each ModuleList that holds a layer becomes a ModuleDict of the same keys."""
        for path in self.layer_paths:
            holder_path, _, _ = path.rpartition(".")
            if not holder_path:
                continue
            holder = self.get_submodule(holder_path)
            if isinstance(holder, nn.ModuleList):
                parent_path, _, key = holder_path.rpartition(".")
                parent = self.get_submodule(parent_path) if parent_path else self
                parent._modules[key] = nn.ModuleDict(holder._modules)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        hidden: tuple[torch.Tensor, ...] = inputs
        for path in self.layer_paths:
            hidden = (self.get_submodule(path)(*hidden),)
        return hidden[0]

    def layers(self) -> list[tuple[str, nn.Module]]:
        """(module path, module) of each layer this chain holds, in order."""
        return [(path, self.get_submodule(path)) for path in self.layer_paths]

    def keep(self, start: int, end: int) -> LayerChain:
        """Delete, in place, every layer outside ``[start, end)`` and return the chain."""
        if not 0 <= start < end <= len(self.layer_paths):
            raise ValueError(f"layer range [{start}, {end}) is outside 0..{len(self.layer_paths)}")
        for path in self.layer_paths[:start] + self.layer_paths[end:]:
            holder_path, _, key = path.rpartition(".")
            holder = self.get_submodule(holder_path) if holder_path else self
            del holder._modules[key]
        self.layer_paths = self.layer_paths[start:end]
        return self
