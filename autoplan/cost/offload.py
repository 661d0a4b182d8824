"""Activation offload (DawnPiper's swap): saved activations kept in host memory.

A replica group's *mode* is (recompute, offload). The search and the cost tables name a mode by
one string: the recompute mode ("none", "selective", "full"), with ``OFFLOAD_SUFFIX`` appended
when the group offloads ("selective+offload"). ``mode_key``/``split_mode`` convert.

The model, per layer l of a stage and one micro-batch, on one GPU whose host link carries
``B`` GB/s in each direction (PCIe and NVLink-C2C are full duplex):

- what is offloaded is what the recompute mode keeps: ``S_l = saved_bytes[recompute]``;
- forward: the saved tensors are copied device→host as the layer produces them, on a copy
  engine, so the copy runs behind the layer's own forward compute: exposed forward time
  ``max(0, S_l / B − forward_l)``;
- backward: the layer's tensors are copied host→device (prefetched) while the layer's backward
  is running the previous one; exposed ``max(0, S_l / B − backward_l)`` with the backward the
  recompute mode makes (full recompute's backward includes its forward again);
- the directions never contend: D2H and H2D use the two directions of the duplex link, so in
  1F1B's steady state a forward's D2H and another micro-batch's H2D overlap each other too;
- device memory: no saved activations stay on the device across micro-batches but the
  loss's (``LayerCost.loss_saved_bytes``: saved outside the last layer's forward, where the
  hooks are); only those in transit do: the layer being copied out and the one being copied
  back, at most ``2 × max_l S_l``, counted with the transient of the layer's backward.
  Host memory holds
  what the device would have: the micro-batches in flight × Σ S_l (``parked_bytes``);
- host memory: the node's RAM is shared by its GPUs, each parking its own activations, so a
  GPU may park at most its even share of the node's RAM less ``HOST_MEMORY_HEADROOM``
  (``host_budget_bytes``); a mode that parks more does not fit.

Time and memory are additive per layer (the memory term as a per-layer maximum), so the
search's prefix sums and range maxima keep costing a stage in O(1).
"""

from __future__ import annotations

from autoplan.cost.config import ReplicaGroup
from autoplan.cost.layers import RECOMPUTE_MODES, LayerCost

__all__ = [
    "ALL_MODES",
    "HOST_MEMORY_HEADROOM",
    "OFFLOADABLE",
    "OFFLOAD_SUFFIX",
    "copy_ms",
    "group_of",
    "host_budget_bytes",
    "mode_backward_ms",
    "mode_forward_ms",
    "mode_key",
    "offload_exposed_ms",
    "parked_bytes",
    "resident_saved_bytes",
    "searched_modes",
    "split_mode",
    "transit_bytes",
]

OFFLOAD_SUFFIX = "+offload"
# Offload pairs with no recompute and with full recompute (which keeps only each block's input).
# Not with selective: PyTorch's selective checkpoint keeps the outputs its policy saves in a
# cache of its own, outside the saved-tensor hooks that offload works through, so they would
# stay on the device (autoplan.runtime.offload).
OFFLOADABLE = ("none", "full")
ALL_MODES = (*RECOMPUTE_MODES, *(r + OFFLOAD_SUFFIX for r in OFFLOADABLE))
# Host RAM offload leaves to everything else on the node: the OS and page cache, the trainer
# processes themselves (torch, CUDA and NCCL host state: a few GiB each), data-loader workers
# and their pinned batches, checkpoint staging. A fifth is an estimate, not a measurement.
HOST_MEMORY_HEADROOM = 0.2


def mode_key(recompute: str, offload: bool) -> str:
    """The mode's name in the cost tables and the search."""
    return recompute + OFFLOAD_SUFFIX if offload else recompute


def split_mode(mode: str) -> tuple[str, bool]:
    """(recompute, offload) of a mode name."""
    known = _SPLIT.get(mode)  # the search asks this some 400 k times a solve
    if known is not None:
        return known
    if mode.endswith(OFFLOAD_SUFFIX):
        return mode[: -len(OFFLOAD_SUFFIX)], True
    return mode, False


_SPLIT = {
    mode: (mode.removesuffix(OFFLOAD_SUFFIX), mode.endswith(OFFLOAD_SUFFIX)) for mode in ALL_MODES
}


def searched_modes(recompute: tuple[str, ...], offload: bool | None) -> tuple[str, ...]:
    """The modes a search tries: each recompute mode without offload (unless pinned on) and
    the offloadable ones with it (unless pinned off)."""
    plain = () if offload is True else recompute
    swapped = (
        () if offload is False else tuple(mode_key(r, True) for r in recompute if r in OFFLOADABLE)
    )
    return (*plain, *swapped)


def group_of(device_class: int, tp: int, replicas: int, samples: int, mode: str) -> ReplicaGroup:
    """The replica group that runs ``mode``."""
    recompute, offload = split_mode(mode)
    return ReplicaGroup(device_class, tp, replicas, samples, recompute, offload)


def copy_ms(nbytes: float, bandwidth_gb_per_s: float) -> float:
    """One direction's copy of ``nbytes`` over the host link."""
    return nbytes / (bandwidth_gb_per_s * 1e9) * 1e3


def offload_exposed_ms(
    layer: LayerCost, recompute: str, bandwidth_gb_per_s: float
) -> tuple[float, float]:
    """(forward, backward) time the layer's copies add beyond the compute they hide behind
    (module docstring)."""
    copy = copy_ms(layer.saved_bytes[recompute], bandwidth_gb_per_s)
    return (
        max(0.0, copy - layer.forward_ms()),
        max(0.0, copy - layer.backward_ms(recompute)),
    )


def mode_forward_ms(layer: LayerCost, mode: str, bandwidth_gb_per_s: float) -> float:
    """Forward of one micro-batch of ``layer`` in ``mode``, exposed copies included."""
    recompute, offload = split_mode(mode)
    extra = offload_exposed_ms(layer, recompute, bandwidth_gb_per_s)[0] if offload else 0.0
    return layer.forward_ms() + extra


def mode_backward_ms(layer: LayerCost, mode: str, bandwidth_gb_per_s: float) -> float:
    """Backward of one micro-batch of ``layer`` in ``mode``: what the recompute mode redoes,
    plus the exposed copies back."""
    recompute, offload = split_mode(mode)
    extra = offload_exposed_ms(layer, recompute, bandwidth_gb_per_s)[1] if offload else 0.0
    return layer.backward_ms(recompute) + extra


def resident_saved_bytes(layer: LayerCost, mode: str) -> float:
    """Saved bytes of one micro-batch that stay on the device until its backward: with
    offload, only what the loss saved outside the layer's forward (its hooks never see it)."""
    recompute, offload = split_mode(mode)
    return layer.loss_saved_bytes if offload else layer.saved_bytes[recompute]


def transit_bytes(layer: LayerCost, mode: str) -> float:
    """Device bytes an offloading layer holds in transit (one layer out, one back)."""
    recompute, offload = split_mode(mode)
    return 2 * layer.saved_bytes[recompute] if offload else 0.0


def parked_bytes(layer: LayerCost, mode: str) -> float:
    """Saved bytes of one micro-batch that an offloading layer keeps in host memory until
    its backward."""
    recompute, offload = split_mode(mode)
    return layer.saved_bytes[recompute] - layer.loss_saved_bytes if offload else 0.0


def host_budget_bytes(host_memory_bytes_per_gpu: float) -> float:
    """What one GPU may park in host memory: its share of the node's RAM less the headroom
    (module docstring)."""
    return host_memory_bytes_per_gpu * (1 - HOST_MEMORY_HEADROOM)
