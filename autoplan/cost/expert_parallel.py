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
"""

from __future__ import annotations

import dataclasses

from autoplan.cost.devices import DeviceClass
from autoplan.cost.layers import LayerCost
from autoplan.profile.schema import LayerProfile, Profile

__all__ = [
    "ALLTOALLS_PER_PASS",
    "alltoall_ms",
    "expert_counts",
    "expert_layer_cost",
    "layer_alltoall_ms",
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
