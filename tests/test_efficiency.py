"""The work-dependent cost terms: the matmul efficiency curve, fixed weight bytes, the launch
floor and the backward factor (autoplan.cost.efficiency, autoplan.cost.layers)."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from autoplan.cluster.catalog import load_catalog, peak_tflops, spec_for_dtype
from autoplan.cost.efficiency import PassWork, matmul_efficiency, pass_time_ms
from tests.layer_time import layer_time_ms
from tests.synthetic_profiles import gpu, layer

CATALOG = load_catalog()
TYPES_AND_DTYPES = [
    (name, dtype) for name, spec in CATALOG.items() for dtype in ("bf16", "tf32", "fp32")
]


@pytest.mark.parametrize(("name", "dtype"), TYPES_AND_DTYPES)
def test_efficiency_curve_is_monotone_and_bounded_by_peak(name: str, dtype: str) -> None:
    spec = spec_for_dtype(CATALOG[name], dtype)
    peak = peak_tflops(spec, dtype)
    intensities = [0.5 * 1.3**i for i in range(60)]  # 0.5 … ~3e6 FLOP/byte
    values = [matmul_efficiency(i, spec, peak, spec.efficiency) for i in intensities]
    assert all(0 < v <= spec.efficiency <= 1 for v in values)
    assert all(b >= a for a, b in itertools.pairwise(values))
    # It saturates: far above the ridge a GEMM runs within 1% of the ceiling.
    assert values[-1] == pytest.approx(spec.efficiency, rel=0.01)


@given(
    flops=st.floats(1e6, 1e15),
    matmul_bytes=st.floats(0, 1e12),
    memory_bound=st.floats(0, 1e12),
    k=st.floats(0, 4),
    efficiency=st.floats(0.05, 1.0),
)
def test_a_pass_never_beats_the_roofline(
    flops: float, matmul_bytes: float, memory_bound: float, k: float, efficiency: float
) -> None:
    spec = gpu("G", tflops=100.0, memory_gib=80, bandwidth=2000.0).model_copy(
        update={"matmul_half_intensity_ridges": k}
    )
    gpu_ms, _ = pass_time_ms(PassWork(flops, matmul_bytes, memory_bound), spec, 100.0, efficiency)
    assert gpu_ms * 1e-3 >= flops / 100e12 * (1 - 1e-9)
    assert gpu_ms * 1e-3 >= (matmul_bytes + memory_bound) / 2000e9 * (1 - 1e-9)


def test_additive_roofline_and_flat_efficiency() -> None:
    spec = gpu("G", tflops=100.0, memory_gib=80, bandwidth=1000.0)
    work = PassWork(flops=1e12, matmul_bytes=1e9, memory_bound_bytes=0.0)
    # k = 0 (the default): flat efficiency, the old max(compute, bandwidth) roofline.
    assert pass_time_ms(work, spec, 100.0, 0.5)[0] == pytest.approx(1e12 / 50e12 * 1e3)
    # k = 1: (F/P + B/W) / e: 10 ms + 1 ms, over 0.5.
    additive = spec.model_copy(update={"matmul_half_intensity_ridges": 1.0})
    assert pass_time_ms(work, additive, 100.0, 0.5)[0] == pytest.approx((10.0 + 1.0) / 0.5)
    # At the ridge (intensity = P / W = 100 FLOP/byte) a GEMM runs at half its ceiling.
    assert matmul_efficiency(100.0, additive, 100.0, 0.8) == pytest.approx(0.4)


def test_small_micro_batches_run_slower_per_sample() -> None:
    # Weights (fixed bytes) do not grow with the batch: intensity, hence efficiency, rises.
    spec = gpu("G", tflops=100.0, memory_gib=80, bandwidth=1000.0).model_copy(
        update={"matmul_half_intensity_ridges": 1.0}
    )
    base = layer(0, flops=10**10, params=10**6, saved=10**6, output=10**6)
    weighted = base.model_copy(
        update={
            "forward_bytes_moved": 10**8,
            "forward_memory_bound_bytes": 0,
            "forward_matmul_fixed_bytes": 8 * 10**7,
        }
    )
    one, _ = layer_time_ms(weighted, spec, "bf16", 1, 1)
    many, _ = layer_time_ms(weighted, spec, "bf16", 1, 16)
    assert many / 16 < one
    # Exactly: (F·b + k·ridge·(activation bytes·b + weights)) / (P·e).
    ridge = 100e12 / 1000e9
    assert many == pytest.approx((16e10 + ridge * (16 * 2e7 + 8e7)) / (100e12 * 0.5) * 1e3)


def test_launch_floor_binds_small_work() -> None:
    spec = gpu("G", tflops=100.0, memory_gib=80).model_copy(update={"kernel_launch_us": 20.0})
    tiny = layer(0, flops=10**6, params=10, saved=10, output=10).model_copy(
        update={"forward_kernels": 30, "backward_kernels": 50}
    )
    forward, backward = layer_time_ms(tiny, spec, "bf16", 1, 1)
    assert forward == pytest.approx(30 * 20e-3)
    assert backward == pytest.approx(50 * 20e-3)
    # Profiles without kernel counts have no floor.
    plain = tiny.model_copy(update={"forward_kernels": None, "backward_kernels": None})
    assert layer_time_ms(plain, spec, "bf16", 1, 1)[0] < 0.01


def test_backward_matmuls_take_the_backward_factor() -> None:
    spec = gpu("G", tflops=100.0, memory_gib=80, bandwidth=1e9)
    big = layer(0, flops=10**12, params=10**3, saved=10**3, output=10**3)
    forward, backward = layer_time_ms(big, spec, "bf16", 1, 1)
    slower = spec.model_copy(update={"backward_matmul_efficiency": 0.8})
    forward2, backward2 = layer_time_ms(big, slower, "bf16", 1, 1)
    assert forward2 == pytest.approx(forward)
    assert backward2 == pytest.approx(backward / 0.8)


def test_tf32_is_costed_at_the_tf32_peak_where_there_is_one() -> None:
    a100, v100 = CATALOG["A100-80GB"], CATALOG["V100-16GB"]
    assert peak_tflops(a100, "tf32") == 156.0
    assert peak_tflops(v100, "tf32") == v100.peak_tflops["fp32"]  # no TF32 before Ampere
    big = layer(0, flops=10**13, params=10**3, saved=10**3, output=10**3)
    tf32, _ = layer_time_ms(big, a100, "tf32", 1, 1)
    fp32, _ = layer_time_ms(big, a100, "fp32", 1, 1)
    assert tf32 < fp32 / 4  # 156 vs 19.5 TFLOP/s peaks


def test_every_type_with_tf32_tensor_cores_lists_its_tf32_peak() -> None:
    # Ampere and later have TF32 tensor cores; Volta and Turing do not.
    with_tf32 = {"H100", "H200", "GH200", "A100-80GB", "A100-40GB", "L4", "A10"}
    with_tf32 |= {"RTX-3090", "RTX-4090"}
    for name in with_tf32:
        assert "tf32" in CATALOG[name].peak_tflops, name
    for name in ("V100-32GB", "V100-16GB", "T4", "RTX-2080", "Titan-RTX"):
        assert "tf32" not in CATALOG[name].peak_tflops, name
