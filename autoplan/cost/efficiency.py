"""How fast one pass of one layer runs on one GPU type, given the work the profile counted.

Matmuls. A GEMM of F FLOPs whose operands and result take B bytes has arithmetic intensity
I = F / B. Its efficiency (fraction of the dtype's dense peak P) is a saturating function of I:

    efficiency(I) = e · I / (I + I½),    I½ = k · P / W

with e the GPU type's ``efficiency`` (its ceiling, at most 1: never above peak), W its memory
bandwidth and k its ``matmul_half_intensity_ridges``: the intensity at which a GEMM reaches
half its ceiling, in units of the ridge point P / W. The curve rises monotonically from 0 to e.
With k = 1 it is the additive roofline: time = (F / P + B / W) / e, compute and operand
traffic not overlapping; a GEMM far above the ridge (a large hidden size, many tokens) runs
near e, one near it (small or skinny, attention's s×s×d products) at about half. Because the
time F / (P · efficiency(I)) = (F + I½ · B) / (P · e) is linear in F and B, a layer's matmuls
can be summed first: only their total FLOPs and total bytes matter, not each GEMM's shape.
The matmuls never run faster than their bytes at full bandwidth either (the roofline's memory
side, B / W), which binds where k is 0 (the flat efficiency of earlier versions: a GPU type
without a fitted k keeps it).

The bytes of weights (read forward, read and their gradients written backward) do not grow
with the micro-batch while the FLOPs and activations do (the profile records them apart,
``*_matmul_fixed_bytes``), so small micro-batches have lower intensity and run slower per
sample than large ones.

Backward matmuls run at the type's ``backward_matmul_efficiency`` times that (weight-gradient
GEMMs reduce over the tokens into a weight-sized output; fitted, 0.88-1.0; the caller applies
it, ``autoplan.cost.layers``). e and k resolve per dtype (``catalog.spec_for_dtype``).

Memory-bound ops (elementwise, norms, softmax, copies) take their bytes / (W × 0.8), after the
matmuls (``MEMORY_BANDWIDTH_EFFICIENCY``).

Launch floor. The host issues a pass's kernels one after another; when the GPU's work is
shorter, the pass takes the launch time instead: time = max(GPU time, kernels × the type's
``kernel_launch_us``). This is what makes tiny layers, small micro-batches and high tp degrees
slower than their FLOPs and bytes say.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.schema import GpuSpec

__all__ = [
    "MEMORY_BANDWIDTH_EFFICIENCY",
    "PassWork",
    "half_intensity",
    "matmul_efficiency",
    "pass_time_ms",
]

# The fraction of the datasheet memory bandwidth that memory-bound kernels (elementwise, norms,
# softmax, copies) reach: streaming kernels on A100/H100 HBM measure about 80-90% of the
# datasheet figure (NVIDIA's BabelStream/STREAM-style results); 0.8 takes the low end, since
# PyTorch's unfused kernels are shorter and less regular than a stream benchmark's.
MEMORY_BANDWIDTH_EFFICIENCY = 0.8


@dataclass(frozen=True)
class PassWork:
    """What one forward or backward pass of a layer does on one GPU (already scaled to the
    micro-batch and divided by tp): matmul FLOPs, the matmuls' operand bytes, the memory-bound
    ops' bytes and the kernels launched (None where the profile does not record it)."""

    flops: float
    matmul_bytes: float
    memory_bound_bytes: float
    kernels: float | None = None


def half_intensity(gpu: GpuSpec, peak_tflops: float) -> float:
    """I½ (FLOP/byte): ``matmul_half_intensity_ridges`` × the ridge point peak / bandwidth."""
    ridge = peak_tflops * 1e12 / (gpu.memory_bandwidth_gb_per_s * 1e9)
    return gpu.matmul_half_intensity_ridges * ridge


def matmul_efficiency(
    intensity: float, gpu: GpuSpec, peak_tflops: float, efficiency: float
) -> float:
    """Fraction of ``peak_tflops`` a GEMM of arithmetic ``intensity`` (FLOP/byte) achieves:
    ``efficiency`` · I / (I + I½) (module docstring); monotone in I, never above
    ``efficiency``."""
    if intensity <= 0:
        return 0.0
    half = half_intensity(gpu, peak_tflops)
    return efficiency * intensity / (intensity + half)


def pass_time_ms(
    work: PassWork, gpu: GpuSpec, peak_tflops: float, efficiency: float
) -> tuple[float, float]:
    """(GPU time, launch floor) of one pass in ms; the pass takes the larger (module
    docstring)."""
    bandwidth = gpu.memory_bandwidth_gb_per_s * 1e9
    matmul_s = work.matmul_bytes / bandwidth
    if work.flops > 0:
        half = half_intensity(gpu, peak_tflops)
        smooth = (work.flops + half * work.matmul_bytes) / (peak_tflops * 1e12 * efficiency)
        matmul_s = max(matmul_s, smooth)
    memory_s = work.memory_bound_bytes / (bandwidth * MEMORY_BANDWIDTH_EFFICIENCY)
    floor_ms = (work.kernels or 0.0) * gpu.kernel_launch_us * 1e-3
    return (matmul_s + memory_s) * 1e3, floor_ms
