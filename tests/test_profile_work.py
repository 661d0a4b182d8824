"""What the profiler records for the work-dependent cost terms: tf32, the matmuls' fixed
(weight) bytes, kernels launched, factory options; and the PyTorch flags tf32 sets."""

from __future__ import annotations

from typing import get_args

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from autoplan.profile import profile_model
from autoplan.profile.bytes_moved import BytesMovedMode
from autoplan.profile.schema import DTYPE_ELEMENT_BYTES, DType
from autoplan.zoo.dtypes import TORCH_DTYPES, set_matmul_precision, torch_dtype


def test_tf32_profiles_like_fp32_and_records_its_dtype() -> None:
    tf32 = profile_model("gpt-tiny", 16, 1, "tf32")
    fp32 = profile_model("gpt-tiny", 16, 1, "fp32")
    assert tf32.dtype == "tf32" and tf32.dtype_bytes == 4
    assert torch_dtype("tf32") is torch.float32
    assert tf32.layers == fp32.layers  # fp32 storage: the same FLOPs, bytes and activations


def test_the_schemas_element_sizes_are_torchs() -> None:
    # The profile schema (torch-free) checks dtype_bytes against its own table; the runtime
    # builds tensors in TORCH_DTYPES: the two must name the same sizes, and the same dtypes.
    assert set(DTYPE_ELEMENT_BYTES) == set(get_args(DType)) == set(TORCH_DTYPES)
    for name, size in DTYPE_ELEMENT_BYTES.items():
        assert TORCH_DTYPES[name].itemsize == size, name


def test_set_matmul_precision_sets_pytorchs_flags() -> None:
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    try:
        set_matmul_precision("tf32")
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        set_matmul_precision("fp32")
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cuda.matmul.allow_tf32
        assert not torch.backends.cudnn.allow_tf32
        set_matmul_precision("bf16")  # 16-bit: left as it was
        assert torch.get_float32_matmul_precision() == "highest"
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]


def test_matmul_fixed_bytes_are_weights_and_weight_gradients() -> None:
    """x (4×8) @ w (8×16): w's 128 values are fixed forward; backward, dX = dY·wᵀ reads w
    and dW = xᵀ·dY writes w's shape: 2 × 128 fixed values."""
    with FakeTensorMode():
        w = torch.nn.Parameter(torch.empty(8, 16))
        x = torch.empty(4, 8, requires_grad=True)
        moved = BytesMovedMode([w])
        with moved:
            y = torch.mm(x, w)
            moved.phase = "backward"
            y.backward(torch.ones_like(y))
    assert moved.matmul_fixed_bytes_by_phase["forward"] == 128 * 4
    assert moved.matmul_fixed_bytes_by_phase["backward"] == 2 * 128 * 4
    assert moved.kernels_by_phase["forward"] == 1


def test_blocks_record_fixed_bytes_kernels_and_their_tp_shares() -> None:
    profile = profile_model("gpt-tiny", 16, 2, "fp32")
    block = profile.layers[1]
    # Forward reads every matmul weight and bias (all block parameters but the norms');
    # backward reads the weights and writes their gradients (bias gradients are sums).
    weights = block.param_count * 4
    assert 0.9 * weights < block.forward_matmul_fixed_bytes <= weights
    assert 1.8 * weights < block.backward_matmul_fixed_bytes <= 2 * block.forward_matmul_fixed_bytes
    assert block.forward_kernels and block.backward_kernels > block.forward_kernels
    tp = block.tensor_parallel
    assert tp is not None and 0 < tp.sharded_forward_matmul_fixed_bytes <= (
        block.forward_matmul_fixed_bytes
    )
    # Scaling the profiled micro-batch scales the activations, not the fixed bytes.
    double = profile_model("gpt-tiny", 16, 4, "fp32").layers[1]
    assert double.forward_matmul_fixed_bytes == block.forward_matmul_fixed_bytes
    assert double.forward_flops == 2 * block.forward_flops


def test_factories_take_a_tensor_parallel_divisor_and_a_loss() -> None:
    name = "bench.calibration_data:plain_opt_350"
    plain = profile_model(name, 64, 1, "fp32")
    assert plain.layers[1].tensor_parallel is None  # a factory's tp divisor is not known
    split = profile_model(name, 64, 1, "fp32", tensor_parallel_divisor=16, loss="cross_entropy")
    assert split.layers[1].tensor_parallel is not None
    assert split.layers[1].tensor_parallel.degree_must_divide == 16
    # The loss traced with the head: its backward moves more than a seeded one's.
    assert split.layers[-1].forward_bytes_moved > plain.layers[-1].forward_bytes_moved
