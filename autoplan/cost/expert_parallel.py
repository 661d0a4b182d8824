"""What expert parallelism of degree ep does to a mixture-of-experts layer's cost.

ep sits inside a stage's data-parallel group (as Megatron-LM's and torchtitan's composition
does): each replica group of the stage is cut into ep-replica expert groups, and within one
the ep ranks each hold E/ep of every MoE layer's routed experts (``ep`` divides E and the
group's replicas). Per micro-batch and MoE layer:

- **Work.** Unchanged: each rank runs E/ep experts on the slots of all ep ranks, ep times
  fewer experts on ep times more slots, at capacity (``ExpertProfile``: the capacity factor's
  padding is the imbalance paid).
- **Communication.** Two all-to-alls forward (dispatch the slot buffer to the experts' ranks,
  combine the results back) and two backward (their gradients); a full recompute's forward
  repeats the forward two. One all-to-all of B bytes per GPU over ep GPUs: each sends
  (ep − 1)/ep · B in ep − 1 pairwise steps, ``(ep − 1) · α + (ep − 1)/ep · B / β``, on the link
  the ep · tp consecutive GPUs span (``DeviceClass.group_link``: NVLink inside a node, else the
  node's inter-node bandwidth shared by its GPUs, which all exchange at once). They sit on the
  critical path (the experts wait for their slots), so they are added to the layer's forward
  and backward time.
- **Memory.** The experts' weights, gradients and Adam states divide by ep. The gradient
  all-reduce of the stage then carries N + E/ep parameters over all the stage's replicas
  (exactly: the experts' over the r/ep replicas holding the same experts; a ring's
  2(n − 1)/n differs by at most a factor 2 on that part).

ZeRO-1 with ep shards the optimizer states of every parameter over the r/ep replicas of one
expert index (those holding the same experts: Megatron-LM's expert data-parallel group), so
one GPU keeps (N + E/ep) / (r/ep) parameters' states: ``CostModel`` divides its sharding ranks
by ep. ZeRO-2/3 are not composed with ep (the validator refuses them).

**Experts placed by speed** (``StageChoice.experts``, an ``ExpertSpan``). In a stage that
mixes GPU types, an expert group may span them: each of the stage's k = r/ep expert groups
takes ``count`` replicas of every group of the stage, and every rank of group g holds x_g
experts of each MoE layer (Σ count_g · x_g = E, each x_g >= 1), so a faster type can hold
more. With s_g the samples of each of g's replicas and S = Σ count_g · s_g those of one expert
group, per micro-batch and MoE layer:

- **Work.** Each rank of g runs its x_g experts on the slots of all S samples: the layer's
  expert FLOPs (E · ``expert_forward_flops``, a fraction φ of the layer's on one GPU of its tp
  group: tp leaves experts whole) become x_g · S / (E · s_g) of what its own share needs, so
  its compute time is t · (1 − φ + φ · x_g · S / (E · s_g)) (the same φ on every type: the
  time of a layer's part scales with its FLOPs). Balanced where x_g / E = s_g / S on the
  types, i.e. experts in proportion to the samples, which balanced shares put in proportion
  to speed; with even experts the slower type runs as many expert slots as the faster.
- **Communication.** With d the bytes of one expert's slots per sample (``dispatch_bytes`` /
  (E · profile samples)), a rank of g sends (E − x_g) · s_g · d (its tokens for the others'
  experts) and receives x_g · (S − s_g) · d (the others' tokens for its experts), in ep − 1
  pairwise steps: (ep − 1) · α + max(sent, received) / β, β the bandwidth one GPU gets on the
  inter-node link between the types' nodes (every GPU of a node exchanging at once). An
  all-to-all ends when its busiest rank does: every rank pays the largest. Even placement on
  equal shares gives (ep − 1)/ep · B / β, the formula above.
- **Memory.** A rank of g holds x_g / E of the routed experts' parameters (weights,
  gradients, Adam states; ZeRO-1 over the k replicas holding the same experts). Its saved
  activations are counted at its own share as with even ep: exact at the balanced split,
  where x_g · S = E · s_g.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from autoplan.cost.devices import DeviceClass
from autoplan.cost.layers import LayerCost
from autoplan.profile.schema import LayerProfile, Profile

__all__ = [
    "ALLTOALLS_PER_PASS",
    "ExpertMember",
    "ExpertSpan",
    "alltoall_ms",
    "expert_counts",
    "expert_fractions",
    "expert_layer_cost",
    "layer_alltoall_ms",
    "span_alltoall_ms",
    "span_layer_cost",
]

ALLTOALLS_PER_PASS = 2  # dispatch and combine, in the forward and again in the backward


def alltoall_ms(
    payload_bytes: float, ep: int, bandwidth_gb_per_s: float, latency_us: float
) -> float:
    """One all-to-all over ``ep`` GPUs each holding ``payload_bytes`` (module docstring)."""
    if ep <= 1 or payload_bytes <= 0:
        return 0.0
    return (ep - 1) * latency_us / 1e3 + (ep - 1) / ep * payload_bytes / (bandwidth_gb_per_s * 1e6)


def layer_alltoall_ms(
    layer: LayerProfile,
    device_class: DeviceClass,
    tp: int,
    ep: int,
    micro_batch_size: int,
    profile_micro_batch_size: int,
) -> float:
    """One pass's all-to-alls of ``layer`` (dispatch and combine) for a micro-batch of
    ``micro_batch_size`` samples on a GPU of an expert group of ep replicas of tp GPUs."""
    if layer.experts is None or ep <= 1:
        return 0.0
    payload = layer.experts.dispatch_bytes * micro_batch_size / profile_micro_batch_size
    bandwidth, latency = device_class.group_link(ep * tp, device_class.gpus_per_node)
    return ALLTOALLS_PER_PASS * alltoall_ms(payload, ep, bandwidth, latency)


def expert_layer_cost(
    cost: LayerCost,
    layer: LayerProfile,
    device_class: DeviceClass,
    tp: int,
    ep: int,
    micro_batch_size: int,
    profile_micro_batch_size: int,
) -> LayerCost:
    """``cost`` (the layer at ep 1) with expert parallelism of degree ``ep``: the all-to-alls
    added to both passes, the routed experts' parameters divided by ep."""
    if layer.experts is None or ep <= 1:
        return cost
    exchange = layer_alltoall_ms(
        layer, device_class, tp, ep, micro_batch_size, profile_micro_batch_size
    )
    return dataclasses.replace(
        cost,
        forward_compute_ms=cost.forward_compute_ms + exchange,
        backward_compute_ms=cost.backward_compute_ms + exchange,
        params_per_gpu=cost.params_per_gpu - layer.experts.expert_param_count * (1 - 1 / ep),
    )


def expert_counts(profile: Profile) -> set[int]:
    """The routed-expert counts of the profile's MoE layers (empty for a dense model)."""
    return {layer.experts.num_experts for layer in profile.layers if layer.experts is not None}


@dataclass(frozen=True, order=True)
class ExpertMember:
    """The ranks of one replica group of a stage inside each expert group that spans its
    groups: ``count`` replicas of class ``device_class``, each taking ``micro_batch_size``
    samples of every micro-batch and holding ``experts`` routed experts of each MoE layer."""

    device_class: int
    micro_batch_size: int
    experts: int
    count: int


@dataclass(frozen=True, order=True)
class ExpertSpan:
    """One expert group that spans a mixed stage's groups, member by member (module
    docstring: experts placed by speed)."""

    members: tuple[ExpertMember, ...]

    @property
    def ep(self) -> int:
        """Ranks (replicas) of the expert group."""
        return sum(m.count for m in self.members)

    @property
    def samples(self) -> int:
        """Samples of one micro-batch the expert group's replicas take together (S)."""
        return sum(m.count * m.micro_batch_size for m in self.members)

    @property
    def num_experts(self) -> int:
        """Routed experts the expert group holds together (E)."""
        return sum(m.count * m.experts for m in self.members)


def span_alltoall_ms(
    span: ExpertSpan,
    bytes_per_expert_sample: float,
    links: tuple[tuple[float, float], ...],
) -> float:
    """One all-to-all of ``span`` (module docstring): the busiest rank's pairwise steps;
    ``links[g]`` is (bandwidth GB/s, latency us) one GPU of member g gets."""
    if span.ep <= 1 or bytes_per_expert_sample <= 0:
        return 0.0
    experts, samples = span.num_experts, span.samples
    worst = 0.0
    for member, (bandwidth, latency) in zip(span.members, links, strict=True):
        sent = (experts - member.experts) * member.micro_batch_size * bytes_per_expert_sample
        received = member.experts * (samples - member.micro_batch_size) * bytes_per_expert_sample
        time = (span.ep - 1) * latency / 1e3 + max(sent, received) / (bandwidth * 1e6)
        worst = max(worst, time)
    return worst


def expert_fractions(layer: LayerProfile, tp: int) -> tuple[float, float]:
    """(forward, backward) share of ``layer``'s FLOPs on one GPU of a tp group that are its
    routed experts' (tp leaves experts whole: they sit in the layer's unsharded part, where
    the profile records the split)."""
    experts = layer.experts
    if experts is None:
        return 0.0, 0.0
    tpp = layer.tensor_parallel if tp > 1 else None

    def per_gpu(total: int, sharded: int | None) -> float:
        # A profile without the split treats the whole layer as sharded (``layer_cost``):
        # the experts then divide by tp with the rest, and their share is unchanged.
        if tpp is None or sharded is None:
            return float(total)
        part = min(sharded, total)
        return total - part + part / tp

    forward = per_gpu(layer.forward_flops, tpp.sharded_forward_flops if tpp else None)
    backward = per_gpu(layer.backward_flops, tpp.sharded_backward_flops if tpp else None)
    routed_forward = experts.num_experts * experts.expert_forward_flops
    routed_backward = experts.num_experts * experts.expert_backward_flops
    return (
        min(1.0, routed_forward / forward) if forward > 0 else 0.0,
        min(1.0, routed_backward / backward) if backward > 0 else 0.0,
    )


def span_layer_cost(
    cost: LayerCost,
    layer: LayerProfile,
    span: ExpertSpan,
    member: int,
    tp: int,
    links: tuple[tuple[float, float], ...],
    profile_micro_batch_size: int,
) -> LayerCost:
    """``cost`` (the layer at ep 1 for member ``member``'s share) with its experts placed by
    ``span`` (module docstring): expert work scaled to the rank's experts and the expert
    group's slots, the busiest rank's all-to-alls added to both passes, the routed experts'
    parameters cut to the rank's."""
    experts = layer.experts
    if experts is None:
        return cost
    own = span.members[member]
    if experts.num_experts != span.num_experts:
        raise ValueError(
            f"the expert group holds {span.num_experts} experts; the layer has "
            f"{experts.num_experts}"
        )
    ratio = own.experts * span.samples / (span.num_experts * own.micro_batch_size)
    forward_share, backward_share = expert_fractions(layer, tp)
    per_sample = experts.dispatch_bytes / (experts.num_experts * profile_micro_batch_size)
    exchange = ALLTOALLS_PER_PASS * span_alltoall_ms(span, per_sample, links)
    return dataclasses.replace(
        cost,
        forward_compute_ms=cost.forward_compute_ms * (1 + forward_share * (ratio - 1)) + exchange,
        backward_compute_ms=cost.backward_compute_ms * (1 + backward_share * (ratio - 1))
        + exchange,
        params_per_gpu=cost.params_per_gpu
        - experts.expert_param_count * (1 - own.experts / experts.num_experts),
    )
