"""Per-layer cost on one GPU type: forward/backward time, memory, tensor-parallel traffic.

Every profile figure is for one micro-batch of ``profile.micro_batch_size`` samples on one
device; figures that scale with the batch (FLOPs, bytes moved, activations, all-reduce
payloads) scale linearly to the micro-batch size considered; parameters do not.

Time of a pass: the profile's measured time on this GPU type when it has one (matched by name,
scaled to the micro-batch and divided by tp), else the matmul-class ops' roofline
max(FLOPs / (peak × efficiency), their bytes / memory bandwidth) PLUS the memory-bound ops'
bytes / (memory bandwidth × ``MEMORY_BANDWIDTH_EFFICIENCY``): elementwise, normalisation,
softmax and loss kernels run one after another with the matmuls, not under them, and their
traffic grows with h while the matmuls' work grows with h², so at small hidden sizes they are
a visible share of a layer's time. Profiles made before the memory-bound bytes were recorded
get the old whole-layer roofline max(FLOPs / (peak × efficiency), bytes / bandwidth).
Tensor parallelism of degree
t divides a splittable layer's FLOPs, bytes and sharded parameters/activations by t and adds
its all-reduces (ring, on the intra-node link); a layer with no tensor-parallel profile is
replicated on every tp rank.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from autoplan.cluster.schema import GpuSpec
from autoplan.cost.comm import ring_allreduce_ms
from autoplan.profile.schema import LayerProfile, MeasuredTimes

__all__ = [
    "MEMORY_BANDWIDTH_EFFICIENCY",
    "RECOMPUTE_MODES",
    "LayerCost",
    "layer_cost",
    "layer_time_ms",
    "matches_device",
    "optimizer_bytes_per_param",
]

RECOMPUTE_MODES = ("none", "selective", "full")

# The fraction of the datasheet memory bandwidth that memory-bound kernels (elementwise, norms,
# softmax, copies) reach: streaming kernels on A100/H100 HBM measure about 80-90% of the
# datasheet figure (NVIDIA's BabelStream/STREAM-style results); 0.8 takes the low end, since
# PyTorch's unfused kernels are shorter and less regular than a stream benchmark's.
MEMORY_BANDWIDTH_EFFICIENCY = 0.8


def _tokens(name: str) -> list[str]:
    return [token for token in re.split(r"[^a-z0-9]+", name.lower()) if token]


def matches_device(gpu_type: str, device_name: str) -> bool:
    """Whether torch's device name (e.g. 'NVIDIA A100-SXM4-80GB') is this catalog GPU type
    (e.g. 'A100-80GB'): every token of the type appears among the device name's tokens."""
    wanted = _tokens(gpu_type)
    have = set(_tokens(device_name))
    return bool(wanted) and all(token in have for token in wanted)


def _measured(layer: LayerProfile, gpu: GpuSpec) -> MeasuredTimes | None:
    for entry in layer.measured:
        if matches_device(gpu.name, entry.device_name):
            return entry
    return None


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

    def forward_ms(self) -> float:
        return self.forward_compute_ms + self.forward_tp_comm_ms

    def backward_ms(self, recompute: str) -> float:
        """Backward of one micro-batch, with what ``recompute`` redoes."""
        base = self.backward_compute_ms + self.backward_tp_comm_ms
        if recompute == "selective":
            return base + self.selective_extra_ms
        if recompute == "full":
            return base + self.forward_ms()
        return base


def _pass_ms(
    flops: float,
    bytes_moved: float,
    memory_bound_bytes: float | None,
    gpu: GpuSpec,
    peak_tflops: float,
    eff: float,
) -> float:
    """One pass: the matmuls' roofline plus the memory-bound ops' traffic time (module
    docstring); without a memory-bound split, the whole layer's roofline."""
    bandwidth = gpu.memory_bandwidth_gb_per_s * 1e9
    compute_s = flops / (peak_tflops * 1e12 * eff) if flops else 0.0
    if memory_bound_bytes is None:
        return max(compute_s, bytes_moved / bandwidth) * 1e3
    matmul_bytes = max(0.0, bytes_moved - memory_bound_bytes)
    matmul_s = max(compute_s, matmul_bytes / bandwidth)
    memory_bound_s = memory_bound_bytes / (bandwidth * MEMORY_BANDWIDTH_EFFICIENCY)
    return (matmul_s + memory_bound_s) * 1e3


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
) -> LayerCost:
    """The cost of ``layer`` on one GPU of a tp group (module docstring for the model)."""
    scale = micro_batch_size / profile_micro_batch_size
    tp_profile = layer.tensor_parallel
    split = tp if (tp_profile is not None and tp > 1) else 1
    eff = gpu.efficiency if efficiency is None else efficiency

    def per_gpu(total: int, sharded: int | None) -> float:
        # The sharded part divides by tp; the rest (norms, residuals) runs on every tp rank.
        # Profiles without the split treat the whole layer as sharded.
        if split == 1:
            return float(total)
        part = total if sharded is None else min(sharded, total)
        return total - part + part / split

    tpp = tp_profile
    forward_flops = per_gpu(layer.forward_flops, tpp.sharded_forward_flops if tpp else None)
    backward_flops = per_gpu(layer.backward_flops, tpp.sharded_backward_flops if tpp else None)
    forward_bytes = per_gpu(
        layer.forward_bytes_moved, tpp.sharded_forward_bytes_moved if tpp else None
    )
    backward_bytes = per_gpu(
        layer.backward_bytes_moved, tpp.sharded_backward_bytes_moved if tpp else None
    )

    def memory_bound(total: int | None, sharded: int | None) -> float | None:
        return None if total is None else per_gpu(total, sharded)

    forward_memory_bound = memory_bound(
        layer.forward_memory_bound_bytes, tpp.sharded_forward_memory_bound_bytes if tpp else None
    )
    backward_memory_bound = memory_bound(
        layer.backward_memory_bound_bytes,
        tpp.sharded_backward_memory_bound_bytes if tpp else None,
    )
    measured = _measured(layer, gpu)
    if measured is not None:
        # Measured on one device: scale by the share of the work one tp rank keeps.
        forward_share = forward_flops / layer.forward_flops if layer.forward_flops else 1 / split
        backward_share = (
            backward_flops / layer.backward_flops if layer.backward_flops else 1 / split
        )
        forward = measured.forward_ms * scale * forward_share
        backward = measured.backward_ms * scale * backward_share
    else:
        forward = _pass_ms(
            forward_flops * scale,
            forward_bytes * scale,
            None if forward_memory_bound is None else forward_memory_bound * scale,
            gpu,
            peak_tflops,
            eff,
        )
        backward = _pass_ms(
            backward_flops * scale,
            backward_bytes * scale,
            None if backward_memory_bound is None else backward_memory_bound * scale,
            gpu,
            peak_tflops,
            eff,
        )
    selective = (
        forward * layer.selective_recompute_flops / layer.forward_flops
        if (layer.forward_flops)
        else 0.0
    )
    fwd_comm = bwd_comm = 0.0
    params = float(layer.param_count)
    saved_none = float(layer.saved_activation_bytes)
    saved_selective = float(layer.selective_recompute_saved_bytes)
    if split > 1 and tp_profile is not None:
        if intra_node_bandwidth_gb_per_s is not None:
            one = ring_allreduce_ms(
                tp_profile.allreduce_payload_bytes * scale,
                tp,
                intra_node_bandwidth_gb_per_s,
                intra_node_latency_us,
            )
            fwd_comm = tp_profile.forward_allreduce_count * one
            bwd_comm = tp_profile.backward_allreduce_count * one
        params -= tp_profile.sharded_param_count * (1 - 1 / tp)
        sharded = tp_profile.sharded_saved_activation_bytes
        kept_fraction = 1 - sharded / saved_none * (1 - 1 / tp) if saved_none else 1.0
        saved_none -= sharded * (1 - 1 / tp)
        saved_selective *= kept_fraction
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
            "full": layer.input_activation_bytes * scale,
        },
        full_activation_bytes=saved_none * scale,
        output_bytes=layer.output_activation_bytes * scale,
    )


def layer_time_ms(
    layer: LayerProfile,
    gpu: GpuSpec,
    dtype: str,
    tp: int,
    micro_batch_size: int,
    *,
    profile_micro_batch_size: int = 1,
    efficiency: float | None = None,
    intra_node_bandwidth_gb_per_s: float | None = None,
    intra_node_latency_us: float = 0.0,
    recompute: str = "none",
) -> tuple[float, float]:
    """(forward_ms, backward_ms) of one micro-batch of ``layer`` on one GPU of a tp group.

    ``profile_micro_batch_size`` is the micro-batch the layer's figures were profiled at
    (``Profile.micro_batch_size``). The tp all-reduces are included only when the intra-node
    bandwidth is given. This is the function the calibration bench compares with measurements.
    """
    from autoplan.cluster.catalog import efficiency_for, peak_tflops

    cost = layer_cost(
        layer,
        gpu,
        peak_tflops(gpu, dtype),
        tp=tp,
        micro_batch_size=micro_batch_size,
        profile_micro_batch_size=profile_micro_batch_size,
        efficiency=efficiency_for(gpu, dtype) if efficiency is None else efficiency,
        intra_node_bandwidth_gb_per_s=intra_node_bandwidth_gb_per_s,
        intra_node_latency_us=intra_node_latency_us,
    )
    return cost.forward_ms(), cost.backward_ms(recompute)
