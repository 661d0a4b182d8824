"""What Megatron-style tensor parallelism does to a layer, found by running a sharded copy.

The runtime splits the linears named ``q, k, v, up, gate`` by columns and ``out, down`` by rows
(DTensor ColwiseParallel / RowwiseParallel), and, as Megatron-LM does, splits the vocabulary:
the token embedding ``token`` by rows (RowwiseParallel on nn.Embedding: each rank looks up the
ids in its shard, zeros elsewhere, and the outputs are all-reduced forward) and the LM head's
``output`` linear by columns (each rank computes its slice of the logits, and the
cross-entropy runs vocab-parallel on it; the input gradient is all-reduced backward).

Every cost of a layer is then R + S/t for tp degree t: a replicated part R (norms, residuals,
the inputs of the column-split linears) and a sharded part S. Rather than classify ops by
hand, the layer is traced a second time with those modules swapped for the shapes one rank of
degree t holds (what DTensor leaves locally), and S = (cost₁ − cost_t) · t / (t − 1), at most
the whole cost (a vocabulary t does not divide leaves a rank a little more than 1/t). The attention
modules infer their local head count from the projections' widths, so the sharded copy runs
unchanged.

The sharded copy of the head computes the loss on its slice of the logits, which is what a
vocab-parallel cross-entropy does on each rank: the log-softmax and its gradient over V/t
columns. Megatron's vocab-parallel cross-entropy adds three all-reduces of b·s fp32 scalars
(the row max, the sum of exponentials, the target logit); they are not counted: at hidden
size h they carry h/2 times fewer bytes than the b·s·h input-gradient all-reduce the head
already counts, and the profile records one payload size per layer. Lookups are charged
their rows, not their table (``bytes_moved``), so a sharded embedding's forward costs as
much as a whole one (the masking Megatron adds is a few elementwise ops on the ids, not
counted); its backward writes a table gradient of V/t rows, which the re-trace captures.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from autoplan.profile.saved import storage_key
from autoplan.profile.tracer import LayerTrace, trace_layer

__all__ = [
    "COLWISE_NAMES",
    "ROWWISE_NAMES",
    "VOCAB_EMBEDDING_NAMES",
    "TensorParallelTrace",
    "sharded_parameters",
    "trace_tensor_parallel",
]

# ``output`` is the LM head's projection to the vocabulary: split by columns, i.e. by vocabulary.
COLWISE_NAMES = frozenset({"q", "k", "v", "up", "gate", "output"})
ROWWISE_NAMES = frozenset({"out", "down"})
VOCAB_EMBEDDING_NAMES = frozenset({"token"})


@dataclass(frozen=True)
class TensorParallelTrace:
    """The sharded parts S of a layer's costs and its tensor-parallel communication."""

    emulated_degree: int
    sharded_param_count: int
    sharded_forward_flops: int
    sharded_backward_flops: int
    sharded_forward_bytes_moved: int
    sharded_backward_bytes_moved: int
    sharded_forward_memory_bound_bytes: int
    sharded_backward_memory_bound_bytes: int
    sharded_forward_matmul_fixed_bytes: int
    sharded_backward_matmul_fixed_bytes: int
    sharded_saved_activation_bytes: int
    allreduce_payload_bytes: int
    forward_allreduce_count: int
    backward_allreduce_count: int


def _split_linears(layer: nn.Module) -> list[tuple[nn.Module, str, nn.Module, str]]:
    """The modules tensor parallelism splits: (parent, name, module, style) with style 'col'
    (linear, output columns), 'row' (linear, input rows) or 'vocab' (embedding table rows)."""
    found: list[tuple[nn.Module, str, nn.Module, str]] = []
    for parent in layer.modules():
        for name, child in parent.named_children():
            if isinstance(child, nn.Linear) and name in COLWISE_NAMES | ROWWISE_NAMES:
                found.append((parent, name, child, "col" if name in COLWISE_NAMES else "row"))
            elif isinstance(child, nn.Embedding) and name in VOCAB_EMBEDDING_NAMES:
                found.append((parent, name, child, "vocab"))
    return found


def sharded_parameters(layer: nn.Module) -> list[torch.Tensor]:
    """The parameters of ``layer`` that tensor parallelism splits (row-split biases are
    replicated, so they are not among them)."""
    found: list[torch.Tensor] = []
    for _parent, _name, module, style in _split_linears(layer):
        weight = module.weight
        if isinstance(weight, torch.Tensor):  # always: a split linear or table holds one
            found.append(weight)
        bias = getattr(module, "bias", None)
        if style == "col" and bias is not None:
            found.append(bias)
    return found


@contextmanager
def _sharded(layer: nn.Module, degree: int) -> Iterator[None]:
    """Swap the split linears for one rank's local shapes (built in the current fake mode)."""
    swapped = []
    for parent, name, module, style in _split_linears(layer):
        weight = module.weight
        local: nn.Module
        if style == "vocab":
            assert isinstance(module, nn.Embedding)
            local = nn.Embedding(
                module.num_embeddings // degree,
                module.embedding_dim,
                dtype=weight.dtype,
                device=weight.device,
            )
        else:
            assert isinstance(module, nn.Linear)
            in_features, out_features = module.in_features, module.out_features
            if style == "col":
                out_features //= degree
            else:
                in_features //= degree
            local = nn.Linear(
                in_features,
                out_features,
                bias=module.bias is not None,
                dtype=weight.dtype,
                device=weight.device,
            )
        setattr(parent, name, local)
        swapped.append((parent, name, module))
    try:
        yield
    finally:
        for parent, name, linear in swapped:
            setattr(parent, name, linear)


@dataclass
class _Communication:
    payload_bytes: int = 0
    rowwise_calls: int = 0
    colwise_input_keys: set[int] | None = None


def _trace_with_communication(
    layer: nn.Module, inputs: Sequence[torch.Tensor], loss: str | None
) -> tuple[LayerTrace, _Communication]:
    """Trace unsharded while noting what the row-split linears and the vocab-split
    embeddings output (all-reduced forward) and which distinct tensors feed the column-split
    linears (their input gradient is all-reduced backward)."""
    seen = _Communication(colwise_input_keys=set())
    handles = []
    for _parent, _name, linear, style in _split_linears(layer):
        if style in ("row", "vocab"):

            def after(_module: nn.Module, _args: object, output: torch.Tensor) -> None:
                seen.rowwise_calls += 1
                seen.payload_bytes = max(seen.payload_bytes, output.numel() * output.element_size())

            handles.append(linear.register_forward_hook(after))
        else:

            def before(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
                assert seen.colwise_input_keys is not None
                seen.colwise_input_keys.add(storage_key(args[0]))
                # Its gradient is what is all-reduced backward (the same size as a row-split
                # output in a block; the only payload of an LM head).
                seen.payload_bytes = max(
                    seen.payload_bytes, args[0].numel() * args[0].element_size()
                )

            handles.append(linear.register_forward_pre_hook(before))
    try:
        trace = trace_layer(layer, inputs, loss=loss)
    finally:
        for handle in handles:
            handle.remove()
    return trace, seen


def _smallest_prime_factor(value: int) -> int:
    factor = 2
    while value % factor:
        factor += 1
    return factor


def trace_tensor_parallel(
    layer: nn.Module, inputs: Sequence[torch.Tensor], divisor: int, *, loss: str | None = None
) -> tuple[LayerTrace, TensorParallelTrace | None]:
    """Trace ``layer`` whole and, if it has split linears and ``divisor`` > 1, sharded.

    ``divisor`` is what the tp degree must divide (gcd of heads, kv heads, MLP size); the
    sharded copy uses its smallest prime factor. Call under FakeTensorMode.
    """
    linears = _split_linears(layer)
    if not linears or divisor <= 1:
        return trace_layer(layer, inputs, loss=loss), None
    whole, communication = _trace_with_communication(layer, inputs, loss)
    degree = _smallest_prime_factor(divisor)
    fresh_inputs = [
        t.detach().requires_grad_(t.requires_grad) if t.is_floating_point() else t for t in inputs
    ]
    with _sharded(layer, degree):
        local = trace_layer(layer, fresh_inputs, loss=loss)

    def sharded_part(full: int, one_rank: int) -> int:
        return min(full, round((full - one_rank) * degree / (degree - 1)))

    # Of a parameter shared with an earlier layer (a tied head) only the owner's count is
    # kept; the profiler restricts this to the parameters the layer owns.
    sharded_params = sum(parameter.numel() for parameter in sharded_parameters(layer))
    return whole, TensorParallelTrace(
        emulated_degree=degree,
        sharded_param_count=sharded_params,
        sharded_forward_flops=sharded_part(whole.forward_flops, local.forward_flops),
        sharded_backward_flops=sharded_part(whole.backward_flops, local.backward_flops),
        sharded_forward_bytes_moved=sharded_part(
            whole.forward_bytes_moved, local.forward_bytes_moved
        ),
        sharded_backward_bytes_moved=sharded_part(
            whole.backward_bytes_moved, local.backward_bytes_moved
        ),
        sharded_forward_memory_bound_bytes=sharded_part(
            whole.forward_memory_bound_bytes, local.forward_memory_bound_bytes
        ),
        sharded_backward_memory_bound_bytes=sharded_part(
            whole.backward_memory_bound_bytes, local.backward_memory_bound_bytes
        ),
        sharded_forward_matmul_fixed_bytes=sharded_part(
            whole.forward_matmul_fixed_bytes, local.forward_matmul_fixed_bytes
        ),
        sharded_backward_matmul_fixed_bytes=sharded_part(
            whole.backward_matmul_fixed_bytes, local.backward_matmul_fixed_bytes
        ),
        sharded_saved_activation_bytes=sharded_part(
            whole.saved_activation_bytes, local.saved_activation_bytes
        ),
        allreduce_payload_bytes=communication.payload_bytes,
        forward_allreduce_count=communication.rowwise_calls,
        backward_allreduce_count=len(communication.colwise_input_keys or ()),
    )
