"""A cp group across GPU types (uneven chunks): the per-layer costs of its ranks.

A spanning cp group (``ContextSpan``) is ``ranks`` cp ranks of each member kind (a device class),
in ring order member by member, each rank tp GPUs of its class holding ``tokens`` of every
sample's s tokens (two mirrored pieces: ``autoplan.runtime.context_parallel``); the counts sum
to s. Under a causal mask a rank's query-key work, like the rest of its layer, is its tokens'
share of the whole, so a rank's layer is ``layer_cost`` at ``token_share`` t / s, without its
ring; the ring is the group's (``lockstep_ring``: each step as slow as its slowest rank's
max(send, attend)) and every rank waits for it, so a rank's exposed ring time is the ring's
phase less its own core. Per layer the group then takes max over its ranks of (the layer outside
the core + the ring's phase): the ranks meet at every layer's ring.

Links: rank r sends to rank r + 1 on the intra-node link where both are of one member whose
ranks fit in one node, else between nodes (the cluster's link joining the members' node groups,
shared by the tp rings that leave a node together), as ``CostModel._ring_link`` places a cp
group of one class. With one member of equal counts the costs are ``CostModel.tables`` at cp c
(to rounding: the ring's steps are summed, not multiplied).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autoplan.cost.context_parallel import core_backward_share, kv_bytes, lockstep_ring
from autoplan.cost.layers import LayerCost, layer_cost
from autoplan.profile.schema import Profile

if TYPE_CHECKING:
    from autoplan.cost.model import CostModel

__all__ = [
    "ContextMember",
    "ContextSpan",
    "RingCore",
    "WholeSequence",
    "crossing_link",
    "span_layer_costs",
    "span_pass_ms",
    "whole_sequence",
]


@dataclass(frozen=True, order=True)
class ContextMember:
    """One kind of a spanning cp group: ``ranks`` cp ranks of device class ``device_class``
    holding ``tokens`` tokens of every sample each."""

    device_class: int
    ranks: int
    tokens: int


@dataclass(frozen=True, order=True)
class ContextSpan:
    """A cp group of tp × Σ ranks GPUs, its members' ranks in ring order (module docstring)."""

    members: tuple[ContextMember, ...]
    tp: int

    @property
    def cp(self) -> int:
        return sum(m.ranks for m in self.members)

    @property
    def seq_len(self) -> int:
        return sum(m.ranks * m.tokens for m in self.members)

    def rank_tokens(self) -> tuple[int, ...]:
        """Tokens of each cp rank, in ring order (``Replica.context_tokens``)."""
        return tuple(m.tokens for m in self.members for _ in range(m.ranks))

    def rank_members(self) -> tuple[int, ...]:
        """The member index of each cp rank, in ring order."""
        return tuple(index for index, m in enumerate(self.members) for _ in range(m.ranks))


def crossing_link(model: CostModel, classes: tuple[int, ...], tp: int) -> tuple[float, float]:
    """(bandwidth GB/s, latency us) of one tp rank's ring send between the nodes of a group
    of ``classes`` (module docstring: the tp rings that leave a node share the link)."""
    names = {n for k in classes for n in model.classes[k].groups}
    return model.cluster.inter_node_bandwidth(names) / tp, model.cluster.inter_node_latency(names)


def _hops(model: CostModel, span: ContextSpan) -> list[tuple[float | None, float]]:
    """(bandwidth, latency) of each rank's send to the next (module docstring)."""
    owners = span.rank_members()
    between, between_latency = crossing_link(
        model, tuple(m.device_class for m in span.members), span.tp
    )
    hops: list[tuple[float | None, float]] = []
    for r, owner in enumerate(owners):
        member = span.members[owner]
        dc = model.classes[member.device_class]
        inside = owners[(r + 1) % len(owners)] == owner and (
            member.ranks * span.tp <= dc.gpus_per_node
        )
        if inside:
            hops.append((dc.intra_node_bandwidth_gb_per_s, dc.intra_node_latency_us))
        else:
            hops.append((between, between_latency))
    return hops


# Identical layers (a model's repeated blocks) cost the same: each is costed once. Keyed by the
# profile's id, the profile kept with it (so that the id is not reused while it is cached).
_DISTINCT: dict[int, tuple[Profile, list[int]]] = {}


def _same_as(profile: Profile) -> list[int]:
    """For each layer, the first layer identical to it (itself where none before is)."""
    found = _DISTINCT.get(id(profile))
    if found is None or found[0] is not profile:
        first: dict[str, int] = {}
        same = [
            first.setdefault(
                layer.model_dump_json(exclude={"index", "name", "replica_of", "block_index"}),
                position,
            )
            for position, layer in enumerate(profile.layers)
        ]
        if len(_DISTINCT) > 16:
            _DISTINCT.clear()
        found = _DISTINCT[id(profile)] = (profile, same)
    return found[1]


def _rank_cost(
    model: CostModel,
    position: int,
    device_class: int,
    tp: int,
    micro_batch_size: int,
    sequence_parallel: bool,
    token_share: float,
) -> LayerCost:
    """Layer ``position`` on one GPU of a cp rank of ``device_class`` holding ``token_share``
    of every sample's tokens, without the ring (module docstring)."""
    dc = model.classes[device_class]
    return layer_cost(
        model.profile.layers[position],
        dc.gpu,
        model.peak_tflops_of(dc.gpu.name),
        tp=tp,
        micro_batch_size=micro_batch_size,
        profile_micro_batch_size=model.profile.micro_batch_size,
        intra_node_bandwidth_gb_per_s=dc.collective_bandwidth_gb_per_s(tp),
        intra_node_latency_us=dc.intra_node_latency_us,
        sequence_parallel=sequence_parallel,
        token_share=token_share,
    )


@dataclass(frozen=True)
class RingCore:
    """A distinct attention layer of the profile on one cp rank holding the whole sequence:
    its core's share of each pass and the K, V bytes of one token the ring sends."""

    layers: int  # how many layers of the profile are identical to it
    forward_ms: float  # the core's part of the forward (its share of the FLOPs)
    backward_ms: float  # the core's part of the backward
    kv_bytes_per_token: float  # one token's K and V of every sample of the micro-batch, a tp rank


@dataclass(frozen=True)
class WholeSequence:
    """One cp rank of a device class holding the whole sequence: the figures a spanning
    group is bounded from below by (``autoplan.solve.context_span_family``)."""

    compute_ms: float  # forward + backward compute of every layer
    outside_core_ms: float  # compute_ms less the attention cores
    params_per_gpu: float
    cores: tuple[RingCore, ...]  # the distinct attention layers, in the profile's order
    # Per recompute mode: every layer's saved activations (bytes, one micro-batch) and the
    # compute the mode's backward redoes (selective: the cores' forward; full: the forward).
    saved_bytes: dict[str, float]
    recompute_ms: dict[str, float]


def whole_sequence(
    model: CostModel, device_class: int, tp: int, micro_batch_size: int, sequence_parallel: bool
) -> WholeSequence:
    """One cp rank of ``device_class`` holding the whole sequence (``WholeSequence``). A rank
    holding a share x of it computes at least x times each of these times, its core and
    what is outside its core alike (``layer_cost`` scales its work by x, less only its fixed
    parts: the weights read, the kernels launched; ``span_layer_costs`` takes the core as the
    same fraction of the pass at every share), so they bound a spanning group from below;
    its saved activations are x times these exactly (``layer_cost`` scales them by x)."""
    profile = model.profile
    same_as = _same_as(profile)
    compute = params = 0.0
    firsts: dict[int, LayerCost] = {}
    cores: dict[int, RingCore] = {}
    saved = {"none": 0.0, "selective": 0.0, "full": 0.0}
    redone = {"none": 0.0, "selective": 0.0, "full": 0.0}
    for position, layer in enumerate(profile.layers):
        first = same_as[position]
        if first not in firsts:
            firsts[first] = _rank_cost(
                model, first, device_class, tp, micro_batch_size, sequence_parallel, 1.0
            )
        cost = firsts[first]
        compute += cost.forward_compute_ms + cost.backward_compute_ms
        params += cost.params_per_gpu
        for mode in saved:
            saved[mode] += cost.saved_bytes[mode]
        redone["selective"] += cost.selective_extra_ms
        redone["full"] += cost.forward_compute_ms
        if not (layer.selective_recompute_flops and layer.forward_flops):
            continue
        found = cores.get(first)
        if found is None:  # as ``span_layer_costs`` takes the core and the ring's bytes
            split = tp if (layer.tensor_parallel is not None and tp > 1) else 1
            found = RingCore(
                0,
                cost.forward_compute_ms * layer.selective_recompute_flops / layer.forward_flops,
                cost.backward_compute_ms
                * core_backward_share(layer.selective_recompute_flops, layer.backward_flops),
                kv_bytes(layer.attention_kv_bytes, layer.output_activation_bytes)
                * micro_batch_size
                / (profile.micro_batch_size * profile.seq_len * split),
            )
        cores[first] = dataclasses.replace(found, layers=found.layers + 1)
    outside = compute - sum(c.layers * (c.forward_ms + c.backward_ms) for c in cores.values())
    return WholeSequence(compute, max(0.0, outside), params, tuple(cores.values()), saved, redone)


def span_layer_costs(
    model: CostModel, span: ContextSpan, micro_batch_size: int, sequence_parallel: bool = False
) -> tuple[tuple[LayerCost, ...], ...]:
    """Per member, one of its ranks' cost of every layer of ``model``'s profile at
    ``micro_batch_size`` samples (module docstring), the lockstep ring in its tp comm."""
    profile, tp = model.profile, span.tp
    seq = span.seq_len
    if seq != profile.seq_len:
        raise ValueError(f"span tokens sum to {seq}, not the profile's sequence {profile.seq_len}")
    hops = _hops(model, span)
    owners = span.rank_members()
    out: list[list[LayerCost]] = [[] for _ in span.members]
    same_as = _same_as(profile)
    for position, layer in enumerate(profile.layers):
        if same_as[position] != position:  # a repeated layer costs as its first
            for costs in out:
                costs.append(costs[same_as[position]])
            continue
        own = [
            _rank_cost(
                model,
                position,
                member.device_class,
                tp,
                micro_batch_size,
                sequence_parallel,
                member.tokens / seq,
            )
            for member in span.members
        ]
        if not (layer.selective_recompute_flops and layer.forward_flops):
            for index, cost in enumerate(own):
                out[index].append(cost)
            continue
        # The core's share of a pass is its share of the FLOPs (as ``layer_cost`` takes it).
        core_forward = [c.forward_compute_ms * layer.selective_recompute_flops / layer.forward_flops
                        for c in own]  # fmt: skip
        share = core_backward_share(layer.selective_recompute_flops, layer.backward_flops)
        core_backward = [c.backward_compute_ms * share for c in own]
        split = tp if (layer.tensor_parallel is not None and tp > 1) else 1
        per_token = (
            kv_bytes(layer.attention_kv_bytes, layer.output_activation_bytes)
            * micro_batch_size
            / (profile.micro_batch_size * seq * split)
        )
        ring = lockstep_ring(
            span.rank_tokens(),
            [core_forward[o] for o in owners],
            [core_backward[o] for o in owners],
            per_token,
            hops,
        )
        for index, cost in enumerate(own):
            out[index].append(
                dataclasses.replace(
                    cost,
                    forward_tp_comm_ms=cost.forward_tp_comm_ms
                    + ring.forward_ms
                    - core_forward[index],
                    backward_tp_comm_ms=cost.backward_tp_comm_ms
                    + ring.backward_ms
                    - core_backward[index],
                    ring_buffer_bytes=ring.buffer_bytes,
                )
            )
    return tuple(tuple(costs) for costs in out)


def span_pass_ms(
    costs: tuple[tuple[LayerCost, ...], ...], i: int, j: int, recompute: str
) -> tuple[float, float]:
    """(forward, backward) of one micro-batch of the group over layers [i, j): per layer its
    slowest member's (the ranks meet at every layer's ring)."""
    forward = sum(max(c[layer].forward_ms() for c in costs) for layer in range(i, j))
    backward = sum(max(c[layer].backward_ms(recompute) for c in costs) for layer in range(i, j))
    return forward, backward
