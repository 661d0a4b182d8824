"""Per-layer cost on one GPU type: forward/backward time, memory, tensor-parallel traffic.

Every profile figure is for one micro-batch of ``profile.micro_batch_size`` samples on one
device; figures that scale with the batch (FLOPs, activation bytes, all-reduce payloads)
scale linearly to the micro-batch size considered; parameters, and the matmuls' weight bytes
(``*_matmul_fixed_bytes``), do not.

Time of a pass: measured times where the profile has them for this GPU type
(``autoplan.cost.measured``: the same tp, else tp 1 divided by the share of the work one rank
keeps; interpolated between measured micro-batch sizes); else modelled
(``autoplan.cost.efficiency``): the matmuls' FLOPs at an efficiency that rises with their
arithmetic intensity, plus the memory-bound ops' bytes at 80% of the memory bandwidth, and
never less than the host's time to launch the pass's kernels. Profiles made before the
memory-bound bytes were recorded treat all bytes as the matmuls'. ``LayerCost.measured``
says which source was used.

Tensor parallelism of degree t divides a splittable layer's FLOPs, bytes and sharded
parameters/activations by t and adds its all-reduces (alpha-beta ring on the intra-node link,
``autoplan.cost.comm``); a layer with no tensor-parallel profile is replicated on every tp
rank. With sequence parallelism (``sequence_parallel=True``, tp > 1) the replicated part
divides by t as well and the all-reduces become reduce-scatters and all-gathers
(``autoplan.cost.sequence_parallel``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cluster.schema import GpuSpec
from autoplan.cost.comm import ring_allreduce_ms
from autoplan.cost.context_parallel import core_backward_share, kv_bytes, ring_attention_comm
from autoplan.cost.efficiency import (
    MEMORY_BANDWIDTH_EFFICIENCY,
    PassWork,
    pass_time_ms,
)
from autoplan.cost.measured import matches_device, measured_pass
from autoplan.cost.sequence_parallel import sequence_parallel_comm
from autoplan.profile.schema import LayerProfile

__all__ = [
    "MEMORY_BANDWIDTH_EFFICIENCY",
    "RECOMPUTE_MODES",
    "LayerCost",
    "layer_cost",
    "matches_device",
    "optimizer_bytes_per_param",
]

RECOMPUTE_MODES = ("none", "selective", "full")
# Layer kinds full recompute leaves alone (their saved bytes stay those of "none"). Their
# recompute time is still charged: the backward of "full" adds the forward for every layer.
NOT_RECOMPUTED = ("embedding", "head")


def optimizer_bytes_per_param(dtype: str) -> int:
    """Adam's state per parameter: fp32 master copy + two moments (12 bytes) when training in
    16-bit (so 2 + 2 + 12 = 16 bytes with weights and gradients), the two moments alone in
    fp32/fp64 (8 or 16 bytes)."""
    if dtype in ("fp16", "bf16"):
        return 12
    if dtype == "fp64":
        return 16
    return 8


@dataclass(frozen=True)
class LayerCost:
    """One layer at one (GPU type, tp, micro-batch size), per tp rank."""

    forward_compute_ms: float
    backward_compute_ms: float
    forward_tp_comm_ms: float
    backward_tp_comm_ms: float
    selective_extra_ms: float  # forward work redone in backward under selective recompute
    params_per_gpu: float
    saved_bytes: dict[str, float]  # by recompute mode, per micro-batch per GPU
    full_activation_bytes: float  # everything one pass materialises (tp-sharded)
    output_bytes: float
    measured: bool = False  # times from the profile's measurements, not the model
    # Part of backward_tp_comm_ms that re-gathers sequence-sharded inputs (SP); under full
    # recompute the recomputed forward's all-gathers do it instead.
    regather_ms: float = 0.0
    # Of saved_bytes (every mode: the loss is never recomputed), what the loss keeps outside
    # the layer's forward: activation offload leaves it on the device.
    loss_saved_bytes: float = 0.0
    # Context parallelism: the K, V chunk the ring holds in flight (a transient).
    ring_buffer_bytes: float = 0.0
    # A head's logits (its vocabulary shard), in bytes of the loss's fp32: what the loss's
    # temporaries are the size of (``CostModel.transient_bytes``); 0 for other layers.
    logits_bytes: float = 0.0
    # A head's logits are [sequence, samples, vocabulary] in Megatron's layout: their
    # [samples, sequence, vocabulary] view is contiguous only for one sample (else a copy).
    logits_one_sample: bool = True

    def forward_ms(self) -> float:
        return self.forward_compute_ms + self.forward_tp_comm_ms

    def backward_ms(self, recompute: str) -> float:
        """Backward of one micro-batch, with what ``recompute`` redoes."""
        base = self.backward_compute_ms + self.backward_tp_comm_ms
        if recompute == "selective":
            return base + self.selective_extra_ms
        if recompute == "full":
            return base - self.regather_ms + self.forward_ms()
        return base


def layer_cost(
    layer: LayerProfile,
    gpu: GpuSpec,
    peak_tflops: float,
    *,
    tp: int,
    micro_batch_size: int,
    profile_micro_batch_size: int,
    efficiency: float | None = None,
    intra_node_bandwidth_gb_per_s: float | None = None,
    intra_node_latency_us: float = 0.0,
    sequence_parallel: bool = False,
    context_parallel: int = 1,
    cp_bandwidth_gb_per_s: float | None = None,
    cp_latency_us: float = 0.0,
    token_share: float = 1.0,
) -> LayerCost:
    """The cost of ``layer`` on one GPU of a tp group (module docstring for the model), of a
    cp group of ``context_parallel`` ranks whose ring uses the ``cp_*`` link. ``token_share``
    (< 1 for a rank of an uneven cp group, with ``context_parallel`` 1): the rank's fraction
    of every sample's tokens; the caller prices that group's ring
    (``autoplan.cost.context_span``)."""
    # A cp rank runs 1/c of every sample's tokens: its figures are a c times smaller batch's.
    scale = micro_batch_size * token_share / (profile_micro_batch_size * context_parallel)
    tp_profile = layer.tensor_parallel
    split = tp if (tp_profile is not None and tp > 1) else 1
    eff = gpu.efficiency if efficiency is None else efficiency
    # The runtime shards the sequence in blocks only (``autoplan.runtime.sequence_parallel``).
    sp = sequence_parallel and split > 1 and layer.kind == "block"

    def per_gpu(total: int, sharded: int | None) -> float:
        # The sharded part divides by tp; the rest (norms, residuals) runs on every tp rank.
        # Profiles without the split treat the whole layer as sharded.
        if split == 1:
            return float(total)
        if sp:  # the replicated part is sharded along the sequence
            return total / split
        part = total if sharded is None else min(sharded, total)
        return total - part + part / split

    tpp = tp_profile
    forward_flops = per_gpu(layer.forward_flops, tpp.sharded_forward_flops if tpp else None)
    backward_flops = per_gpu(layer.backward_flops, tpp.sharded_backward_flops if tpp else None)
    allreduces = (0, 0)
    sp_comm = None
    if split > 1 and tpp is not None:
        allreduces = (tpp.forward_allreduce_count, tpp.backward_allreduce_count)
        if sp:
            sp_comm = sequence_parallel_comm(
                tpp.allreduce_payload_bytes * scale,
                tp,
                tpp.forward_allreduce_count,
                tpp.backward_allreduce_count,
                intra_node_bandwidth_gb_per_s,
                intra_node_latency_us,
            )
            allreduces = (sp_comm.forward_collectives, sp_comm.backward_collectives)
    measured = measured_pass(layer, gpu.name, tp, micro_batch_size, profile_micro_batch_size)
    includes_comm = measured is not None and measured.tensor_parallel_degree == tp
    if measured is not None:
        # Measured at this tp: as measured (communication included). Measured on one device:
        # the share of the work one tp rank keeps.
        forward_share = backward_share = 1.0
        if not includes_comm:
            forward_share = (
                forward_flops / layer.forward_flops if layer.forward_flops else 1 / split
            )
            backward_share = (
                backward_flops / layer.backward_flops if layer.backward_flops else 1 / split
            )
        forward = measured.forward_ms * forward_share * token_share / context_parallel
        backward = measured.backward_ms * backward_share * token_share / context_parallel
    else:
        forward = _modelled_ms(
            layer, "forward", per_gpu, scale, gpu, peak_tflops, eff, allreduces[0]
        )
        backward = _modelled_ms(
            layer, "backward", per_gpu, scale, gpu, peak_tflops, eff, allreduces[1]
        )
    selective = (
        forward * layer.selective_recompute_flops / layer.forward_flops
        if (layer.forward_flops)
        else 0.0
    )
    fwd_comm = bwd_comm = regather = 0.0
    params = float(layer.param_count)
    saved_none = float(layer.saved_activation_bytes)
    saved_selective = float(layer.selective_recompute_saved_bytes)
    if split > 1 and tp_profile is not None:
        if intra_node_bandwidth_gb_per_s is not None and not includes_comm:
            one = ring_allreduce_ms(
                tp_profile.allreduce_payload_bytes * scale,
                tp,
                intra_node_bandwidth_gb_per_s,
                intra_node_latency_us,
            )
            fwd_comm = tp_profile.forward_allreduce_count * one
            bwd_comm = tp_profile.backward_allreduce_count * one
            if sp_comm is not None:
                fwd_comm, bwd_comm = sp_comm.forward_ms, sp_comm.backward_ms
                regather = sp_comm.regather_ms
        params -= tp_profile.sharded_param_count * (1 - 1 / tp)
        sharded = min(tp_profile.sharded_saved_activation_bytes, saved_none)
        # What selective recompute drops (the attention core) is tp-sharded: the replicated
        # part (norms, residuals, the column-split inputs) stays whole under selective too,
        # so only the rest divides by tp (Korthikanti et al.: sbh(10 + 24/t)).
        replicated = min(saved_none - sharded, saved_selective)
        saved_none -= sharded * (1 - 1 / tp)
        saved_selective = (saved_selective - replicated) / tp + replicated
    full_saved = float(layer.input_activation_bytes)
    output = float(layer.output_activation_bytes)
    if sp:  # every saved tensor is sequence-sharded, the layer's input and output too
        saved_none = layer.saved_activation_bytes / tp
        saved_selective = layer.selective_recompute_saved_bytes / tp
        full_saved /= tp
        output /= tp
    elif layer.kind == "head" and split > 1:
        # A vocabulary-split head's output is its logits' vocabulary shard (the loss runs
        # under loss_parallel, Megatron's on its vocab-parallel logits): never gathered whole.
        output /= split
    # A vocabulary-split head's loss keeps its vocabulary shard (loss_parallel).
    loss_saved = min(layer.loss_saved_activation_bytes / split, saved_none)
    ring = ring_attention_comm(0.0, 1, 0.0, 0.0, None, 0.0)
    if context_parallel > 1 and layer.selective_recompute_flops and layer.forward_flops:
        # The core's share of the pass's time is its share of the FLOPs (as selective's).
        core_forward = forward * layer.selective_recompute_flops / layer.forward_flops
        core_backward = backward * core_backward_share(
            layer.selective_recompute_flops, layer.backward_flops
        )
        chunk = kv_bytes(layer.attention_kv_bytes, layer.output_activation_bytes) * scale / split
        ring = ring_attention_comm(
            chunk,
            context_parallel,
            core_forward,
            core_backward,
            cp_bandwidth_gb_per_s,
            cp_latency_us,
        )
        fwd_comm += ring.forward_ms
        bwd_comm += ring.backward_ms
    # The loss's temporaries are the size of the logits' shard in fp32: what the loss keeps
    # (its log-softmax or softmax) where the profile records it, else what the head saves
    # beyond its input (which also holds a final norm's saved tensors).
    logits = 0.0
    if layer.kind == "head":
        logits = loss_saved or max(0.0, saved_none - layer.input_activation_bytes)
    if layer.kind in NOT_RECOMPUTED:
        # The runtime checkpoints blocks only (``autoplan.runtime.recompute``): under full
        # recompute the embedding and the head keep what they keep without it.
        full_saved = saved_none
    return LayerCost(
        forward_compute_ms=forward,
        backward_compute_ms=backward,
        forward_tp_comm_ms=fwd_comm,
        backward_tp_comm_ms=bwd_comm,
        selective_extra_ms=selective,
        params_per_gpu=params,
        saved_bytes={
            "none": saved_none * scale,
            "selective": saved_selective * scale,
            "full": full_saved * scale,
        },
        full_activation_bytes=saved_none * scale,
        output_bytes=output * scale,
        measured=measured is not None,
        regather_ms=regather,
        loss_saved_bytes=loss_saved * scale,
        ring_buffer_bytes=ring.buffer_bytes,
        logits_bytes=logits * scale,
        logits_one_sample=micro_batch_size <= 1,
    )


_PASS_FIELDS = {
    phase: (
        f"{phase}_flops",
        f"{phase}_bytes_moved",
        f"{phase}_memory_bound_bytes",
        f"{phase}_matmul_fixed_bytes",
        f"{phase}_kernels",
    )
    for phase in ("forward", "backward")
}
"""A pass's ``LayerProfile`` fields ``_modelled_ms`` reads (named once: it runs per layer
cost, thousands of times a solve)."""

_SHARDED = {name: f"sharded_{name}" for names in _PASS_FIELDS.values() for name in names[:4]}
"""Each of those fields' tp-split part in ``TensorParallelProfile``."""


def _modelled_ms(
    layer: LayerProfile,
    phase: str,
    per_gpu: Callable[[int, int | None], float],
    scale: float,
    gpu: GpuSpec,
    peak_tflops: float,
    efficiency: float,
    allreduces: int,
) -> float:
    """One pass of one tp rank, modelled (``autoplan.cost.efficiency``): the larger of the GPU
    time and the launch floor of its kernels (the tp all-reduces are kernels too)."""
    tpp = layer.tensor_parallel
    names = _PASS_FIELDS[phase]

    def figure(x: int) -> float | None:
        total = getattr(layer, names[x])
        if total is None:
            return None
        return per_gpu(total, getattr(tpp, _SHARDED[names[x]]) if tpp is not None else None)

    flops = figure(0) or 0.0
    moved = figure(1) or 0.0
    memory_bound = figure(2)
    fixed = figure(3) or 0.0
    # Profiles without the memory-bound split: every byte is charged to the matmuls.
    matmul = moved - (memory_bound or 0.0)
    fixed = min(fixed, matmul)
    kernels = getattr(layer, names[4])
    work = PassWork(
        flops=flops * scale,
        matmul_bytes=(matmul - fixed) * scale + fixed,
        memory_bound_bytes=(memory_bound or 0.0) * scale,
        kernels=None if kernels is None else kernels + allreduces,
    )
    if phase == "backward":
        efficiency *= gpu.backward_matmul_efficiency
    gpu_ms, floor_ms = pass_time_ms(work, gpu, peak_tflops, efficiency)
    return max(gpu_ms, floor_ms)
