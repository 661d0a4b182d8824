"""``--measure``: time the real layers on the local device (CUDA when present, else CPU).

Only the traced layers are timed (replicas share their times). Each layer is fed an input of
the shape it sees in the model, run ``warmup`` times untimed, then ``repeats`` times timed; the
median forward and backward times are kept. Before anything is allocated, the memory the run
needs is compared with what the device has free, and an InputError refuses a model that does
not fit.

Half precision (bf16, fp16) on the CPU is refused too: PyTorch's CPU kernels for it are not
what a GPU runs and their times are not even stable (issue 26: one block of the same model took
~100 ms in three runs and 0.55 ms in a fourth, and a plan built from them was 52x off the real
run). On the CPU, fp32, tf32 (fp32 there) and fp64 are timed.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from autoplan.errors import InputError
from autoplan.limits import GIB
from autoplan.profile.layers import pipeline_layers
from autoplan.profile.schema import MeasuredTimes
from autoplan.profile.tracer import loss_of
from autoplan.zoo.decoder import LayerChain
from autoplan.zoo.dtypes import default_dtype, set_matmul_precision
from autoplan.zoo.registry import ModelSpec

__all__ = [
    "UNTRUSTED_CPU_DTYPES",
    "check_trusted",
    "device_name",
    "free_memory_bytes",
    "measure_layers",
]

logger = logging.getLogger(__name__)


UNTRUSTED_CPU_DTYPES = frozenset({torch.bfloat16, torch.float16})
"""Training dtypes whose CPU times ``--measure`` refuses (module docstring)."""


def measure_device() -> torch.device:
    """The device ``--measure`` times on: CUDA when present, else the CPU."""
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def device_name(device: torch.device) -> str:
    """torch's name for a CUDA device; for the CPU its model name from /proc/cpuinfo."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"cpu: {line.split(':', 1)[1].strip()}"
    except OSError:
        pass
    return "cpu"


def free_memory_bytes(device: torch.device) -> int:
    """Free memory of the device: CUDA's free bytes, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise InputError("cannot tell how much memory is free (no MemAvailable in /proc/meminfo)")


@contextlib.contextmanager
def _matmul_precision(dtype_name: str | None) -> Iterator[None]:
    """PyTorch's fp32 matmul precision for ``dtype_name`` inside the block, restored after."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    if dtype_name is not None:
        set_matmul_precision(dtype_name)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved[0])
        torch.backends.cudnn.allow_tf32 = saved[1]


def check_trusted(device: torch.device, dtype: torch.dtype, dtype_name: str | None) -> None:
    """Refuse (InputError) a measurement whose times cannot be trusted: half precision on CPU."""
    if device.type == "cpu" and dtype in UNTRUSTED_CPU_DTYPES:
        shown = dtype_name or str(dtype).removeprefix("torch.")
        raise InputError(
            f"--measure in {shown} on the CPU is not trusted: PyTorch's CPU half-precision "
            "kernels are not what a GPU runs and their times vary ~100x between runs; "
            "measure on a GPU, or on the CPU with --dtype fp32"
        )


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_layer(
    layer: nn.Module,
    layer_input: torch.Tensor,
    loss: str | None,
    device: torch.device,
    warmup: int,
    repeats: int,
) -> tuple[float, float]:
    forward_ms, backward_ms = [], []
    for run in range(warmup + repeats):
        leaf = layer_input.detach().requires_grad_(layer_input.is_floating_point())
        _synchronize(device)
        start = time.perf_counter()
        output = layer(leaf)
        scalar = loss_of(output, loss) if loss else None
        _synchronize(device)
        middle = time.perf_counter()
        if scalar is not None:
            scalar.backward()
        else:
            output.backward(torch.ones_like(output))
        _synchronize(device)
        end = time.perf_counter()
        layer.zero_grad(set_to_none=True)
        if run >= warmup:
            forward_ms.append((middle - start) * 1e3)
            backward_ms.append((end - middle) * 1e3)
    return statistics.median(forward_ms), statistics.median(backward_ms)


def measure_layers(
    spec: ModelSpec,
    seq_len: int,
    micro_batch_size: int,
    dtype: torch.dtype,
    *,
    profiled_indices: list[int],
    needed_bytes: int,
    repeats: int = 5,
    warmup: int = 2,
    dtype_name: str | None = None,
    layer_modules: list[str] | None = None,
) -> dict[int, MeasuredTimes]:
    """Median forward/backward times of the layers at ``profiled_indices`` on the local device.

    ``needed_bytes`` is the profile's estimate of what the run needs; more than 90% of the
    device's free memory is refused. ``dtype_name`` (the profile's dtype, e.g. 'tf32') sets
    PyTorch's matmul precision for the run (``set_matmul_precision``), restored afterwards.
    Half precision on the CPU is refused (:func:`check_trusted`). ``layer_modules``: the
    layers' module paths of a decoder-shaped factory model (the profile's).
    """
    device = measure_device()
    check_trusted(device, dtype, dtype_name)
    free = free_memory_bytes(device)
    if needed_bytes > 0.9 * free:
        raise InputError(
            f"--measure: {spec.name} needs about {needed_bytes / GIB:.1f} GiB on {device.type} "
            f"(weights + one layer's gradients and activations) but only {free / GIB:.1f} GiB "
            "is free; profile without --measure"
        )
    # Built directly on the device in the training dtype: no full-precision host copy first.
    with default_dtype(dtype), torch.device(device):
        model, example = spec.build_with_input(micro_batch_size, seq_len)
    model = model.to(device=device, dtype=dtype)
    if layer_modules is not None:
        model = LayerChain(model, layer_modules)
    layers, _ = pipeline_layers(model)
    items = list(example) if isinstance(example, tuple | list) else [example]
    hidden = [
        (t.to(device=device, dtype=dtype) if t.is_floating_point() else t.to(device)) for t in items
    ]
    name = device_name(device)
    measured: dict[int, MeasuredTimes] = {}
    with torch.no_grad():
        layer_inputs = []
        for layer in layers:
            layer_inputs.append(hidden)
            hidden = [layer.module(*hidden)]
    for index in profiled_indices:
        loss = spec.loss if index == len(layers) - 1 else None
        (layer_input,) = layer_inputs[index][:1]
        logger.info("timing layer %d on %s", index, name)
        with _matmul_precision(dtype_name):
            forward_ms, backward_ms = _time_layer(
                layers[index].module, layer_input, loss, device, warmup, repeats
            )
        measured[index] = MeasuredTimes(
            device_name=name,
            forward_ms=forward_ms,
            backward_ms=backward_ms,
            repeats=repeats,
            tensor_parallel_degree=1,
            micro_batch_size=micro_batch_size,
            source="autoplan profile --measure",
        )
    return measured
