"""Whole blocks at sub-block grain: a stage that holds both parts of a block runs the block.

At sub-block grain (``Profile.model.granularity == 'sub-block'``) each splittable block is
two units, its attention part a and its MLP part m. Most of a unit's cost adds over the two
(FLOPs, bytes, parameters, saved activations, the tp all-reduces), but three terms of a pass
are a max, not a sum, and so are not additive over the parts:

- the launch floor (``autoplan.cost.efficiency``): a pass takes max(GPU time, kernels ×
  launch time); with a block's parts in one stage the host issues both parts' kernels in one
  stream, so the block takes max(g_a + g_m, k_a·λ + k_m·λ), never more than
  max(g_a, k_a·λ) + max(g_m, k_m·λ) (a part alone may be launch-bound where its block is not);
- the matmuls' memory side, max(smooth time, bytes / bandwidth);
- activation offload's exposed copy, max(0, copy − compute) (``autoplan.cost.offload``).

So a stage holding both parts of block β is costed as the block, ``merge_parts(a, m)``, and a
stage holding one part as that part alone. Then a sub-block plan whose cuts fall on block
boundaries costs what the same plan costs at block grain, and the finer search (a superset of
the block search) is never slower.

Prefix sums, for the O(1) stage costs of the search: with F(u) a pass's time of unit u alone
and F(β) the block's, unit a carries F(a) and unit m carries F(β) − F(a) (>= 0). A stage
[i, j) that starts on a block boundary or on an a unit is then exactly P[j] − P[i] (a stage
ending after a carries it alone). One that starts at an m unit (the block's a is in the stage
before) holds m alone: it adds ``start_extra[i]`` = F(a) + F(m) − F(β) >= 0. Every unit's value
is at most its cost in any stage, so P[j] − P[i] stays a lower bound for the search's bounds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping

from autoplan.cost.layers import LayerCost
from autoplan.profile.schema import LayerProfile, Profile, TensorParallelProfile

__all__ = [
    "block_cost",
    "block_pairs",
    "block_profile",
    "merge_parts",
    "piece_spans",
    "stage_pieces",
    "unit_boundaries",
    "whole_block_passes",
]


def block_pairs(profile: Profile) -> list[int]:
    """Positions p whose unit is a block's attention part and p + 1 that block's MLP part."""
    layers = profile.layers
    return [
        p
        for p in range(len(layers) - 1)
        if layers[p].part == "attn"
        and layers[p + 1].part == "mlp"
        and layers[p].block_index is not None
        and layers[p].block_index == layers[p + 1].block_index
    ]


def _add(one: int | None, two: int | None) -> int | None:
    # A figure one part lacks (an older profile) is unknown for the block as well.
    return None if one is None or two is None else one + two


_SUMMED = (
    "forward_flops",
    "backward_flops",
    "forward_bytes_moved",
    "backward_bytes_moved",
    "param_count",
    "param_bytes",
    "saved_activation_bytes",
    "selective_recompute_saved_bytes",
    "selective_recompute_flops",
    "loss_saved_activation_bytes",
)
_OPTIONAL = (
    "forward_memory_bound_bytes",
    "backward_memory_bound_bytes",
    "forward_matmul_fixed_bytes",
    "backward_matmul_fixed_bytes",
    "forward_kernels",
    "backward_kernels",
)


def _merge_tp(
    attn: TensorParallelProfile | None, mlp: TensorParallelProfile | None
) -> TensorParallelProfile | None:
    if attn is None or mlp is None:
        return None
    update: dict[str, object] = {
        "sharded_param_count": attn.sharded_param_count + mlp.sharded_param_count,
        "sharded_saved_activation_bytes": attn.sharded_saved_activation_bytes
        + mlp.sharded_saved_activation_bytes,
        "forward_allreduce_count": attn.forward_allreduce_count + mlp.forward_allreduce_count,
        "backward_allreduce_count": attn.backward_allreduce_count + mlp.backward_allreduce_count,
        "degree_must_divide": math.gcd(attn.degree_must_divide, mlp.degree_must_divide),
    }
    for name in type(attn).model_fields:
        if name.startswith("sharded_") and name not in update:
            update[name] = _add(getattr(attn, name), getattr(mlp, name))
    # Both parts all-reduce the residual stream: one payload.
    update["allreduce_payload_bytes"] = max(
        attn.allreduce_payload_bytes, mlp.allreduce_payload_bytes
    )
    return attn.model_copy(update=update)


def merge_parts(attn: LayerProfile, mlp: LayerProfile, index: int) -> LayerProfile:
    """The block that the two parts make: figures summed, the attention part's input, the MLP
    part's output, the block's name (the units' name less ':attn'), no measurements."""
    update: dict[str, object] = {name: getattr(attn, name) + getattr(mlp, name) for name in _SUMMED}
    for name in _OPTIONAL:
        update[name] = _add(getattr(attn, name), getattr(mlp, name))
    update.update(
        index=index,
        name=attn.name.rsplit(":", 1)[0],
        kind="block",
        input_activation_bytes=attn.input_activation_bytes,
        output_activation_bytes=mlp.output_activation_bytes,
        tensor_parallel=_merge_tp(attn.tensor_parallel, mlp.tensor_parallel),
        block_index=None,
        part=None,
        replica_of=None,
        measured=[],
        experts=attn.experts or mlp.experts,
    )
    return attn.model_copy(update=update)


def block_profile(sub: Profile) -> Profile:
    """The block-grain profile of a sub-block profile: each block's two parts merged into one
    layer (``merge_parts``), every other unit as it is. Its layer l is the sub-block units
    ``[unit_of[l], unit_of[l + 1])`` (``unit_boundaries``)."""
    pairs = set(block_pairs(sub))
    layers: list[LayerProfile] = []
    position = 0
    while position < len(sub.layers):
        unit = sub.layers[position]
        if position in pairs:
            layers.append(merge_parts(unit, sub.layers[position + 1], len(layers)))
            position += 2
        else:
            layers.append(unit.model_copy(update={"index": len(layers), "replica_of": None}))
            position += 1
    model = sub.model.model_copy(
        update={"granularity": "block", "unit_names": None, "num_layers": len(layers)}
    )
    data = sub.model_dump()
    data.update(
        model=model.model_dump(),
        layers=[layer.model_dump() for layer in layers],
        profiled_layer_indices=list(range(len(layers))),
    )
    return Profile.model_validate(data)


def unit_boundaries(sub: Profile) -> list[int]:
    """``out[l]``: the sub-block unit where layer l of ``block_profile(sub)`` starts, and
    ``out[-1]`` the number of units."""
    pairs = set(block_pairs(sub))
    out = []
    position = 0
    while position < len(sub.layers):
        out.append(position)
        position += 2 if position in pairs else 1
    return [*out, len(sub.layers)]


def whole_block_passes(
    alone: list[LayerCost],
    blocks: dict[int, LayerCost],
    forward: dict[str, list[float]],
    backward: dict[str, list[float]],
    pass_ms: Callable[[LayerCost, str], tuple[float, float]],
) -> tuple[list[LayerCost], dict[str, list[float]], dict[str, list[float]]]:
    """Prefix values per unit (module docstring): ``forward``/``backward[mode][p + 1]`` become
    the block's pass less its attention part's, for each ``blocks`` position p (in place);
    returns the units' costs with the MLP parts' times made the same differences (what the
    search's per-layer bounds read) and, by mode, ``start_extra`` of work and of backward.

    ``pass_ms(cost, mode)`` is a unit's (forward, backward) in ``mode``; ``blocks[p]`` is the
    block's cost with its parts' saved bytes (so offload copies what the units copy)."""
    units = list(alone)
    start_work = {mode: [0.0] * (len(alone) + 1) for mode in forward}
    start_backward = {mode: [0.0] * (len(alone) + 1) for mode in forward}
    # (mlp forward, mlp backward, mlp start_work, mlp start_backward) per mode, per distinct
    # (block, attn, mlp) costs: a model's repeated blocks share them.
    done: dict[
        tuple[int, int, int], tuple[dict[str, tuple[float, float, float, float]], LayerCost]
    ] = {}
    for p, block in blocks.items():
        attn, mlp = alone[p], alone[p + 1]
        key = (id(block), id(attn), id(mlp))
        if key not in done:
            values: dict[str, tuple[float, float, float, float]] = {}
            for mode in forward:
                block_f, block_b = pass_ms(block, mode)
                attn_f, attn_b = pass_ms(attn, mode)
                mlp_f, mlp_b = pass_ms(mlp, mode)
                extra_b = attn_b + mlp_b - block_b
                values[mode] = (
                    block_f - attn_f,
                    block_b - attn_b,
                    attn_f + mlp_f - block_f + extra_b,
                    extra_b,
                )
            done[key] = (values, _marginal(block, attn, mlp))
        values, marginal = done[key]
        for mode, (f, b, extra_w, extra_b) in values.items():
            forward[mode][p + 1], backward[mode][p + 1] = f, b
            start_work[mode][p + 1], start_backward[mode][p + 1] = extra_w, extra_b
        units[p + 1] = marginal
    return units, start_work, start_backward


def _marginal(block: LayerCost, attn: LayerCost, mlp: LayerCost) -> LayerCost:
    """The MLP part's cost with its times the block's less the attention part's."""
    return dataclasses.replace(
        mlp,
        forward_compute_ms=block.forward_compute_ms - attn.forward_compute_ms,
        backward_compute_ms=block.backward_compute_ms - attn.backward_compute_ms,
        forward_tp_comm_ms=block.forward_tp_comm_ms - attn.forward_tp_comm_ms,
        backward_tp_comm_ms=block.backward_tp_comm_ms - attn.backward_tp_comm_ms,
        selective_extra_ms=block.selective_extra_ms - attn.selective_extra_ms,
        regather_ms=block.regather_ms - attn.regather_ms,
    )


def block_cost(block: LayerCost, attn: LayerCost, mlp: LayerCost) -> LayerCost:
    """The merged block's cost with the memory figures of its two units (the runtime keeps
    each unit's saved tensors, and offload copies them, unit by unit)."""
    return dataclasses.replace(
        block,
        params_per_gpu=attn.params_per_gpu + mlp.params_per_gpu,
        saved_bytes={m: attn.saved_bytes[m] + mlp.saved_bytes[m] for m in attn.saved_bytes},
        full_activation_bytes=attn.full_activation_bytes + mlp.full_activation_bytes,
        output_bytes=mlp.output_bytes,
    )


def stage_pieces(
    units: list[LayerCost], blocks: dict[int, LayerCost], start: int, end: int
) -> list[LayerCost]:
    """What runs in a stage on units [start, end): each block whose two parts are both in it
    as the block (``blocks``, keyed by the attention part's position), other units alone."""
    return [
        blocks[position] if span == 2 else units[position]
        for position, span in piece_spans(blocks, start, end)
    ]


def piece_spans(blocks: Mapping[int, object], start: int, end: int) -> list[tuple[int, int]]:
    """(position, units) of each piece of a stage on units [start, end): 2 for a block whose
    two parts are both in it (``blocks`` keyed by the attention part's position), else 1."""
    spans = []
    position = start
    while position < end:
        span = 2 if position in blocks and position + 1 < end else 1
        spans.append((position, span))
        position += span
    return spans
