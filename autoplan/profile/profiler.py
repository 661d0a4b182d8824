"""``profile_model``: a model name → a :class:`~autoplan.profile.schema.Profile`.

The model is built under ``FakeTensorMode`` (parameters carry shapes and dtypes, no memory), so
a 70B model profiles on a laptop. Fake tensors live on the CPU device, so attention takes the
CPU flash kernel: what is saved for backward matches a fused kernel, not the s×s math path
(``attention='math'`` traces that instead: :mod:`autoplan.profile.attention`).
Each distinct layer (same structure, parameter shapes and input) is traced once; identical
repeats point at it with ``replica_of``.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

from autoplan.errors import InputError
from autoplan.profile.attention import ATTENTION_KERNELS, AttentionKernel, UnfusedAttentionMode
from autoplan.profile.experts import active_parameter_count, expert_profile
from autoplan.profile.layers import PipelineLayer, as_layer_chain, pipeline_layers
from autoplan.profile.measure import check_trusted, measure_device, measure_layers
from autoplan.profile.schema import (
    DType,
    Granularity,
    LayerProfile,
    MeasuredTimes,
    ModelRef,
    Profile,
    ProfileTotals,
    TensorParallelProfile,
)
from autoplan.profile.tensor_parallel import (
    TensorParallelTrace,
    sharded_parameters,
    trace_tensor_parallel,
)
from autoplan.profile.tracer import LayerTrace, TensorMeta
from autoplan.zoo.decoder import LayerChain
from autoplan.zoo.dtypes import default_dtype, torch_dtype
from autoplan.zoo.registry import LossKind, ModelSpec, get_model_spec
from autoplan.zoo.sub_blocks import set_granularity

__all__ = ["profile_model"]

logger = logging.getLogger(__name__)

METHOD = (
    "FakeTensorMode on CPU (flash-attention kernel); FLOPs: FlopCounterMode with the CPU "
    "flash-attention formulas, backward = (forward+backward) - forward; bytes moved: input+output "
    "bytes of every non-view aten op (lookups: indices + 2x rows), those of non-matmul ops "
    "also apart (memory-bound); saved activations: unique "
    "storages packed by saved_tensors_hooks, parameters excluded; selective recompute drops "
    "what only scaled_dot_product_attention saved; tensor parallel: layer re-traced with "
    "q/k/v/up/gate/output column- and out/down row-sharded and the token embedding "
    "vocab-sharded, S = (cost1 - cost_t) t/(t-1)"
)

METHOD_MATH_ATTENTION = METHOD.replace(
    "(flash-attention kernel)",
    "(attention unfused: QKᵀ baddbmm, softmax over s×s in the training dtype, ·V bmm)",
)


def _check_sizes(spec: ModelSpec, seq_len: int, micro_batch_size: int) -> None:
    if micro_batch_size < 1:
        raise InputError(f"micro-batch size must be at least 1, got {micro_batch_size}")
    if seq_len < 1:
        raise InputError(f"sequence length must be at least 1, got {seq_len}")
    if spec.max_seq_len is not None and seq_len > spec.max_seq_len:
        raise InputError(
            f"sequence length {seq_len} exceeds {spec.name}'s maximum of {spec.max_seq_len} "
            "positions"
        )


def _cast_floating_parameters(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast float parameters to ``dtype`` keeping tied parameters tied (``Module.to`` cannot
    swap fake parameters in place)."""
    replaced: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, parameter in list(module._parameters.items()):
            if parameter is None or not parameter.is_floating_point() or parameter.dtype == dtype:
                continue
            if id(parameter) not in replaced:
                replaced[id(parameter)] = nn.Parameter(
                    parameter.detach().to(dtype), requires_grad=parameter.requires_grad
                )
            module._parameters[name] = replaced[id(parameter)]


def _as_fake_inputs(example: Any, mode: FakeTensorMode, dtype: torch.dtype) -> list[torch.Tensor]:
    items = list(example) if isinstance(example, tuple | list) else [example]
    inputs = []
    for item in items:
        if not isinstance(item, torch.Tensor):
            raise InputError(f"example input must be tensors, got {type(item).__name__}")
        tensor = item if isinstance(item, FakeTensor) else mode.from_tensor(item)
        inputs.append(tensor.to(dtype) if tensor.is_floating_point() else tensor)
    return inputs


def _check_factory_input(name: str, inputs: list[torch.Tensor], micro_batch_size: int) -> str:
    """A factory's input must hold ``micro_batch_size`` samples; returns a note of its shapes."""
    shapes = ", ".join(str(tuple(t.shape)) for t in inputs)
    first = inputs[0]
    if first.dim() == 0 or first.shape[0] != micro_batch_size:
        raise InputError(
            f"factory '{name}' returned an input of shape {tuple(first.shape)}, not "
            f"{micro_batch_size} samples: give the factory a batch_size parameter or pass "
            f"--micro-batch {first.shape[0] if first.dim() else 1}"
        )
    return f"factory input shape(s): {shapes}; seq_len is recorded as given"


def _signature(layer: PipelineLayer, inputs: list[TensorMeta], loss: str | None) -> tuple:
    """Layers with equal signatures compute the same thing on the same shapes."""
    parameters = tuple(
        (name, tuple(p.shape), p.dtype) for name, p in layer.module.named_parameters()
    )
    return repr(layer.module), parameters, tuple(inputs), loss


def _tensor_parallel_profile(tp: TensorParallelTrace, divisor: int) -> TensorParallelProfile:
    return TensorParallelProfile(
        sharded_param_count=tp.sharded_param_count,
        sharded_saved_activation_bytes=tp.sharded_saved_activation_bytes,
        allreduce_payload_bytes=tp.allreduce_payload_bytes,
        forward_allreduce_count=tp.forward_allreduce_count,
        backward_allreduce_count=tp.backward_allreduce_count,
        degree_must_divide=divisor,
        sharded_forward_flops=tp.sharded_forward_flops,
        sharded_backward_flops=tp.sharded_backward_flops,
        sharded_forward_bytes_moved=tp.sharded_forward_bytes_moved,
        sharded_backward_bytes_moved=tp.sharded_backward_bytes_moved,
        sharded_forward_memory_bound_bytes=tp.sharded_forward_memory_bound_bytes,
        sharded_backward_memory_bound_bytes=tp.sharded_backward_memory_bound_bytes,
        sharded_forward_matmul_fixed_bytes=tp.sharded_forward_matmul_fixed_bytes,
        sharded_backward_matmul_fixed_bytes=tp.sharded_backward_matmul_fixed_bytes,
    )


def profile_model(
    model_name: str,
    seq_len: int,
    micro_batch_size: int,
    dtype: DType = "bf16",
    *,
    measure: bool = False,
    replicate: bool = True,
    measure_repeats: int = 5,
    measure_warmup: int = 2,
    attention: AttentionKernel = "flash",
    tensor_parallel_divisor: int | None = None,
    loss: LossKind | None = None,
    granularity: Granularity = "block",
    layer_modules: list[str] | None = None,
) -> Profile:
    """Profile ``model_name`` (zoo name or 'package.module:factory') per layer.

    ``attention='math'`` traces attention unfused (QKᵀ, softmax over s×s, ·V in the training
    dtype, as Megatron-LM 2021 ran it; see :mod:`autoplan.profile.attention`) instead of the
    flash kernel; ``measure`` times the real model with its own kernel either way.

    ``tensor_parallel_divisor`` gives a factory model what the zoo knows of its own models:
    what the tp degree must divide (gcd of heads, kv heads and MLP size); with it the layers'
    tensor-parallel behaviour is traced (a zoo model's own figure is used when None).

    ``loss`` overrides the loss the last layer's output feeds: 'cross_entropy' tells the
    profiler that a factory model's output is token logits (a zoo model's default), so the
    fp32 token cross-entropy is traced with it; 'sum' seeds its backward with ones.

    ``granularity='sub-block'`` lists each block of a zoo model as its two residual parts
    (:mod:`autoplan.zoo.sub_blocks`), each with its own figures, so that a stage may start or
    end mid-block.

    A factory model that is neither a LayeredModel nor an ``nn.Sequential`` is split into
    the layers of its decoder shape (embedding, each block of its largest ModuleList of one
    type, norm, head: :mod:`autoplan.zoo.decoder`), or of the modules ``layer_modules`` names;
    the profile records their module paths for the runtime.

    ``replicate=False`` traces every layer even when identical to an earlier one.
    ``measure=True`` also times the real model on the local device (CUDA if present).
    """
    if attention not in ATTENTION_KERNELS:
        raise InputError(
            f"attention kernel must be one of {', '.join(ATTENTION_KERNELS)}, got {attention!r}"
        )
    spec = get_model_spec(model_name)
    if granularity == "sub-block" and measure:
        raise InputError("--measure times whole layers: profile at --granularity block")
    if tensor_parallel_divisor is not None and tensor_parallel_divisor < 1:
        raise InputError(
            f"tensor-parallel divisor must be at least 1, got {tensor_parallel_divisor}"
        )
    divisor = tensor_parallel_divisor or spec.tensor_parallel_divisor or 1
    if loss is not None:
        if loss not in ("cross_entropy", "sum"):
            raise InputError(f"loss must be 'cross_entropy' or 'sum', got {loss!r}")
        spec = dataclasses.replace(spec, loss=loss)
    _check_sizes(spec, seq_len, micro_batch_size)
    torch_type = torch_dtype(dtype)
    if measure:  # before tracing, the slow part: an untrusted measurement is refused at once
        check_trusted(measure_device(), torch_type, dtype)
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    with default_dtype(torch_type), fake_mode:
        model, example = spec.build_with_input(micro_batch_size, seq_len)
        _cast_floating_parameters(model, torch_type)
        set_granularity(model, granularity)
        inputs = _as_fake_inputs(example, fake_mode, torch_type)
        # Checked before tracing, which is the slow part for a big factory model.
        input_note = (
            _check_factory_input(spec.name, inputs, micro_batch_size)
            if spec.vocab_size is None
            else None
        )
        model, chain_note = as_layer_chain(model, inputs, layer_modules)
        layers, layering_note = pipeline_layers(model)
        layering_note = chain_note or layering_note
        found_modules = list(model.layer_paths) if isinstance(model, LayerChain) else None
        if attention == "math":
            with UnfusedAttentionMode():
                results = _trace_layers(spec, layers, inputs, replicate, divisor)
        else:
            results = _trace_layers(spec, layers, inputs, replicate, divisor)
        tokens = micro_batch_size * seq_len
        experts = {
            index: expert_profile(layers[index].module, tokens, torch_type)
            for index, (_, _, replica_of, _) in enumerate(results)
            if replica_of is None
        }
    notes = [layering_note] if input_note is None else [layering_note, input_note]
    profiled = [index for index, (_, _, replica_of, _) in enumerate(results) if replica_of is None]
    replicas = len(layers) - len(profiled)
    if replicas:
        notes.append(
            f"{len(profiled)} of {len(layers)} layers traced; the other {replicas} are identical "
            "(structure, parameter shapes, input) to a traced one and copy its figures "
            "(replica_of)"
        )
    if spec.loss == "cross_entropy":
        notes.append("the last layer's figures include the fp32 token cross-entropy loss")
    else:
        notes.append("the last layer's backward is seeded with ones (the loss is not known)")
    measured: dict[int, MeasuredTimes] = {}
    if measure:
        measured = measure_layers(
            spec,
            seq_len,
            micro_batch_size,
            torch_type,
            profiled_indices=profiled,
            needed_bytes=_measure_memory_estimate(results, torch_type),
            repeats=measure_repeats,
            warmup=measure_warmup,
            dtype_name=dtype,
            layer_modules=found_modules,
        )
    layer_profiles = []
    for index, (layer, (trace, tp, replica_of, param_count)) in enumerate(
        zip(layers, results, strict=True)
    ):
        source = index if replica_of is None else replica_of
        layer_profiles.append(
            LayerProfile(
                index=index,
                name=layer.name or "model",
                kind=layer.kind,
                block_index=layer.block_index,
                part=layer.part,  # type: ignore[arg-type]  # 'attn' | 'mlp' from the zoo
                forward_flops=trace.forward_flops,
                backward_flops=trace.backward_flops,
                forward_bytes_moved=trace.forward_bytes_moved,
                backward_bytes_moved=trace.backward_bytes_moved,
                forward_memory_bound_bytes=trace.forward_memory_bound_bytes,
                backward_memory_bound_bytes=trace.backward_memory_bound_bytes,
                forward_matmul_fixed_bytes=trace.forward_matmul_fixed_bytes,
                backward_matmul_fixed_bytes=trace.backward_matmul_fixed_bytes,
                forward_kernels=trace.forward_kernels,
                backward_kernels=trace.backward_kernels,
                param_count=param_count,
                param_bytes=param_count * torch_type.itemsize,
                saved_activation_bytes=trace.saved_activation_bytes,
                selective_recompute_saved_bytes=trace.selective_recompute_saved_bytes,
                selective_recompute_flops=trace.selective_recompute_flops,
                input_activation_bytes=trace.input_activation_bytes,
                loss_saved_activation_bytes=trace.loss_saved_bytes,
                output_activation_bytes=trace.output.nbytes,
                # Layers without attention leave it unset (nothing for a ring to send).
                attention_kv_bytes=trace.attention_kv_bytes or None,
                tensor_parallel=(_tensor_parallel_profile(tp, divisor) if tp is not None else None),
                replica_of=replica_of,
                experts=experts[source],
                measured=[measured[source]] if source in measured else [],
            )
        )
    return Profile(
        model=ModelRef(
            name=spec.name,
            parameter_count=sum(layer.param_count for layer in layer_profiles),
            active_parameter_count=active_parameter_count(layer_profiles),
            num_layers=len(layer_profiles),
            hidden_size=spec.hidden_size,
            num_attention_heads=spec.num_attention_heads,
            vocab_size=spec.vocab_size,
            granularity=granularity,
            unit_names=(
                [layer.name for layer in layer_profiles] if granularity == "sub-block" else None
            ),
            layer_modules=found_modules,
        ),
        seq_len=seq_len,
        micro_batch_size=micro_batch_size,
        dtype=dtype,
        dtype_bytes=torch_type.itemsize,
        layers=layer_profiles,
        totals=_totals(layer_profiles),
        profiled_layer_indices=profiled,
        method=METHOD if attention == "flash" else METHOD_MATH_ATTENTION,
        attention_kernel=attention,
        notes=notes,
    )


_LayerResult = tuple[LayerTrace, TensorParallelTrace | None, int | None, int]


def _trace_layers(
    spec: ModelSpec,
    layers: list[PipelineLayer],
    inputs: list[torch.Tensor],
    replicate: bool,
    divisor: int,
) -> list[_LayerResult]:
    """Trace each distinct layer (call under FakeTensorMode); count each layer's own params."""
    first_seen: dict[tuple, int] = {}
    traces: dict[int, tuple[LayerTrace, TensorParallelTrace | None]] = {}
    counted_parameters: set[int] = set()
    results: list[_LayerResult] = []
    for index, layer in enumerate(layers):
        loss = spec.loss if index == len(layers) - 1 else None
        metas = [TensorMeta(tuple(t.shape), t.dtype) for t in inputs]
        signature = _signature(layer, metas, loss)
        replica_of = first_seen.get(signature) if replicate else None
        if replica_of is None:
            logger.info("tracing layer %d (%s)", index, layer.name)
            traces[index] = trace_tensor_parallel(layer.module, inputs, divisor, loss=loss)
            first_seen.setdefault(signature, index)
        trace, tp = traces[index if replica_of is None else replica_of]
        param_count = 0
        owned: set[int] = set()
        # A parameter shared with an earlier layer (a tied head) is counted where it first is.
        for parameter in layer.module.parameters():
            if id(parameter) not in counted_parameters:
                counted_parameters.add(id(parameter))
                owned.add(id(parameter))
                param_count += parameter.numel()
        if tp is not None:
            # Likewise its shard: a tied head's vocab-split weight belongs to the embedding.
            sharded = sum(p.numel() for p in sharded_parameters(layer.module) if id(p) in owned)
            tp = dataclasses.replace(tp, sharded_param_count=sharded)
        results.append((trace, tp, replica_of, param_count))
        inputs = [trace.output.make()]
    return results


def _measure_memory_estimate(results: list[_LayerResult], dtype: torch.dtype) -> int:
    """Bytes a layer-by-layer measurement needs: weights, one layer's gradients, and the
    largest layer's saved activations, input and output (with its gradients)."""
    weights = sum(param_count for _, _, _, param_count in results) * dtype.itemsize
    largest = max(
        param_count * dtype.itemsize
        + trace.saved_activation_bytes
        + 2 * (trace.input_activation_bytes + trace.output.nbytes)
        for trace, _, _, param_count in results
    )
    return weights + largest


def _totals(layers: list[LayerProfile]) -> ProfileTotals:
    return ProfileTotals(
        forward_flops=sum(layer.forward_flops for layer in layers),
        backward_flops=sum(layer.backward_flops for layer in layers),
        param_count=sum(layer.param_count for layer in layers),
        param_bytes=sum(layer.param_bytes for layer in layers),
        saved_activation_bytes=sum(layer.saved_activation_bytes for layer in layers),
        forward_bytes_moved=sum(layer.forward_bytes_moved for layer in layers),
        backward_bytes_moved=sum(layer.backward_bytes_moved for layer in layers),
        selective_recompute_saved_bytes=sum(
            layer.selective_recompute_saved_bytes for layer in layers
        ),
    )
