"""Megatron-style tensor parallelism with DTensor: column-split in, row-split out, and the
vocabulary split across the group.

In each block, the projections that fan out (q, k, v, the MLP's up and gate) are split by
output columns (``ColwiseParallel``) and the ones that fan back in (attention out, MLP down) by
input rows (``RowwiseParallel``), so each attention or MLP sub-layer costs one all-reduce forward
and one backward. The zoo's attention reshapes with ``view(..., -1, head_dim)``, so it works on
the tp-local heads unchanged; per-head norms (``HEAD_NORMS``) hold their weight whole and sum
its gradient over the group.

The token embedding and the output head are split by vocabulary, as Megatron-LM does: the
embedding table by rows (``RowwiseParallel`` on ``nn.Embedding``: each rank looks up the ids in
its rows, zeros elsewhere, and one all-reduce gives every rank the whole embedding), the head by
output columns (``ColwiseParallel``), its logits left sharded by vocabulary for the cross-entropy
under ``loss_parallel`` (see :mod:`autoplan.runtime.loss`): the full logits, the largest
activation of a language model, are never gathered. A head tied to the embedding holds the same
rows (both are (vocab, hidden) split on dim 0), so one sharded parameter serves both.

The vocabulary is split at every tp degree, whether or not tp divides it: DTensor shards a
dimension tp does not divide unevenly, as ``torch.chunk`` does (ceil(V / tp) rows on the first
ranks, fewer on the last), which holds what Megatron's padding of the vocabulary to a multiple
of tp holds, without changing the model. So GPT-2's 50,257 tokens split over tp 2 as 25,129 and
25,128 rows, and the vocabulary never limits the tp degree. Norms and position embeddings stay
replicated.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from autoplan.errors import InputError
from autoplan.runtime import sequence_parallel as sp
from autoplan.runtime.model_stage import pipeline_layers

__all__ = [
    "COLUMN_PROJECTIONS",
    "HEAD_NORMS",
    "REPLICATED_LINEARS",
    "ROW_PROJECTIONS",
    "VOCAB_EMBEDDINGS",
    "VOCAB_HEADS",
    "apply_tensor_parallel",
    "parameter_shard_dims",
    "vocabulary_shard_rows",
    "vocabulary_sizes",
]

# Leaf names of the projections, as the zoo's GPT and Llama blocks (and Hugging Face) name them.
COLUMN_PROJECTIONS = frozenset(
    {"q", "k", "v", "up", "gate", "q_proj", "k_proj", "v_proj", "up_proj", "gate_proj", "w1", "w3"}
)
ROW_PROJECTIONS = frozenset({"out", "down", "o", "o_proj", "down_proj", "w2"})
# Linears every tp rank holds whole: a mixture-of-experts router and shared-expert gate
# (hidden × experts, too small to split; the routed experts are split by expert parallelism).
REPLICATED_LINEARS = frozenset({"router", "shared_gate"})
# Norms over one head's width, applied to each head of a column-split projection's output
# (Qwen3's query and key norms, as the zoo and Hugging Face name them): every tp rank holds the
# weight whole but sees only its own heads, so the weight's gradient is a partial sum per rank.
# They run as a norm sequence-parallel over the heads' dimension (``SequenceParallel`` with
# sequence_dim 2 of (batch, seq, heads, head width)): DTensor sums that gradient over tp.
HEAD_NORMS = frozenset({"q_norm", "k_norm"})
# Leaf names of the token embedding (nn.Embedding) and of the output head (nn.Linear over the
# vocabulary), as the zoo (``token``, ``output``) and Hugging Face name them. Position and
# token-type embeddings have other names and stay replicated.
VOCAB_EMBEDDINGS = frozenset({"token", "embed_tokens", "wte", "word_embeddings"})
VOCAB_HEADS = frozenset({"output", "lm_head"})


def _vocab_modules(layer: nn.Module) -> dict[str, nn.Embedding | nn.Linear]:
    """The token embeddings and vocabulary heads among ``layer``'s modules, by name."""
    found: dict[str, nn.Embedding | nn.Linear] = {}
    for name, module in layer.named_modules():
        leaf = name.rsplit(".", 1)[-1]
        is_embedding = isinstance(module, nn.Embedding) and leaf in VOCAB_EMBEDDINGS
        if is_embedding or (isinstance(module, nn.Linear) and leaf in VOCAB_HEADS):
            found[name] = module
    return found


def vocabulary_sizes(model: nn.Module) -> set[int]:
    """The vocabulary sizes of ``model``'s token embeddings and heads (empty if it has none)."""
    sizes: set[int] = set()
    for _, layer in pipeline_layers(model):
        for module in _vocab_modules(layer).values():
            sizes.add(
                module.num_embeddings if isinstance(module, nn.Embedding) else module.out_features
            )
    return sizes


def vocabulary_shard_rows(vocab_size: int, degree: int) -> list[int]:
    """Rows of a ``vocab_size`` table each of ``degree`` tp ranks holds (``torch.chunk``'s
    split, DTensor's ``Shard(0)``): ceil(V / tp) on the first ranks, the rest on the last."""
    rows = -(-vocab_size // degree)
    return [max(0, min(rows, vocab_size - rank * rows)) for rank in range(degree)]


def parameter_shard_dims(layer: nn.Module) -> dict[str, int | None]:
    """The dimension tensor parallelism splits each of ``layer``'s parameters along (None:
    replicated on every tp rank), by name within the layer (tied names listed each), as
    :func:`apply_tensor_parallel` splits them: column projections and the vocabulary head by
    output rows (weight and bias dim 0), row projections by input columns (weight dim 1, bias
    replicated), the token embedding by vocabulary rows (dim 0). A layer with none of the known
    projections is replicated whole. The gradient sync of replicas of different tp degrees
    needs this for replicas it does not hold (where no DTensor says it).
    """
    vocab = _vocab_modules(layer)
    split = any(
        isinstance(module, nn.Linear)
        and name not in vocab
        and name.rsplit(".", 1)[-1] in COLUMN_PROJECTIONS | ROW_PROJECTIONS
        for name, module in layer.named_modules()
    )
    dims: dict[str, int | None] = {}
    for module_name, module in layer.named_modules():
        leaf = module_name.rsplit(".", 1)[-1]
        for param_name, _ in module.named_parameters(recurse=False, remove_duplicate=False):
            if module_name in vocab:
                dim: int | None = 0
            elif isinstance(module, nn.Linear) and split and leaf in COLUMN_PROJECTIONS:
                dim = 0
            elif isinstance(module, nn.Linear) and split and leaf in ROW_PROJECTIONS:
                dim = 1 if param_name == "weight" else None
            else:
                dim = None
            full = f"{module_name}.{param_name}" if module_name else param_name
            # A tied weight is split by the first module that uses it (they split alike).
            dims.setdefault(full, dim)
    return dims


class _GradientAsWeight(torch.autograd.Function):
    """Identity on a DTensor weight whose backward gives the gradient the weight's placements.

    DTensor has no row-sharded rule for the embedding's backward: it computes the whole
    (vocab, hidden) table gradient, replicated, on every tp rank. Left so, that replicated
    gradient would be what the parameter keeps (tp times the memory Megatron keeps, and FSDP2
    would reduce-scatter a tensor of the wrong shape). Redistributing Replicate to Shard(0)
    takes each rank's rows locally, no communication; the whole table gradient is only a
    transient of the backward.
    """

    @staticmethod
    def forward(ctx: Any, weight: DTensor) -> torch.Tensor:
        ctx.placements = weight.placements
        return weight.view_as(weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        if isinstance(grad, DTensor) and grad.placements != ctx.placements:
            grad = grad.redistribute(grad.device_mesh, ctx.placements)
        return grad


def _embedding_forward(module: nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    weight = module.weight
    if isinstance(weight, DTensor):
        weight = _GradientAsWeight.apply(weight)
    return F.embedding(
        ids,
        weight,
        module.padding_idx,
        module.max_norm,
        module.norm_type,
        module.scale_grad_by_freq,
        module.sparse,
    )


def _tp_plan(
    layer_name: str, layer: nn.Module, degree: int, vocab: dict[str, nn.Embedding | nn.Linear]
) -> dict[str, ParallelStyle]:
    plan: dict[str, ParallelStyle] = {}
    unknown: list[str] = []
    for name, module in layer.named_modules():
        if not isinstance(module, nn.Linear) or name in vocab:
            continue
        leaf = name.rsplit(".", 1)[-1]
        if leaf in COLUMN_PROJECTIONS:
            if module.out_features % degree:
                raise InputError(
                    f"{layer_name}.{name} has {module.out_features} output features, not "
                    f"divisible by tensor parallel degree {degree}"
                )
            plan[name] = ColwiseParallel()
        elif leaf in ROW_PROJECTIONS:
            if module.in_features % degree:
                raise InputError(
                    f"{layer_name}.{name} has {module.in_features} input features, not "
                    f"divisible by tensor parallel degree {degree}"
                )
            plan[name] = RowwiseParallel()
        elif leaf not in REPLICATED_LINEARS:
            unknown.append(name)
    if plan:
        for name, module in layer.named_modules():
            if name.rsplit(".", 1)[-1] in HEAD_NORMS and sp.is_norm(module):
                plan[name] = SequenceParallel(sequence_dim=2, use_local_output=True)
    if plan and unknown:
        raise InputError(
            f"{layer_name}: cannot tell how to split linear layer(s) {', '.join(unknown)} for "
            f"tensor parallelism (known: column {sorted(COLUMN_PROJECTIONS)}, "
            f"row {sorted(ROW_PROJECTIONS)})"
        )
    for name, module in vocab.items():
        if isinstance(module, nn.Embedding):
            # Token ids come replicated; the partial lookups are summed into a replicated output.
            plan[name] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        else:
            # Logits stay a DTensor sharded by vocabulary, for loss_parallel's cross-entropy.
            plan[name] = ColwiseParallel(output_layouts=Shard(-1), use_local_output=False)
    return plan


def _parameter_slots(model: nn.Module) -> dict[int, list[tuple[nn.Module, str]]]:
    slots: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, param in module._parameters.items():
            if param is not None:
                slots.setdefault(id(param), []).append((module, name))
    return slots


def _retie(slots: dict[int, list[tuple[nn.Module, str]]]) -> None:
    """Make the modules that shared a parameter before sharding share one again.

    ``parallelize_module`` gives each module a new (DTensor) parameter, so a weight two modules
    share (the tied embedding and head) would become two parameters with two gradients. Both
    are split alike, so the first module's sharded parameter is put back in every slot.
    """
    for shared in slots.values():
        if len(shared) < 2:
            continue
        params = [getattr(module, name) for module, name in shared]
        keep = params[0]
        for (module, name), param in zip(shared[1:], params[1:], strict=True):
            if param is keep:
                continue
            same_layout = (
                isinstance(keep, DTensor)
                and isinstance(param, DTensor)
                and keep.placements == param.placements
                and keep.shape == param.shape
            )
            if not same_layout:
                raise InputError(
                    f"a weight shared by {type(shared[0][0]).__name__}.{shared[0][1]} and "
                    f"{type(module).__name__}.{name} would be split differently by tensor "
                    f"parallelism ({getattr(keep, 'placements', 'replicated')} vs "
                    f"{getattr(param, 'placements', 'replicated')})"
                )
            setattr(module, name, keep)


def apply_tensor_parallel(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    divisor: int | None,
    *,
    sequence_parallel: bool = False,
    recompute: str = "none",
) -> None:
    """Split, in place, every block among ``model``'s pipeline layers over the 1-D ``tp_mesh``,
    and its token embedding and output head by vocabulary; with ``sequence_parallel``, shard
    the blocks' sequence too (``autoplan.runtime.sequence_parallel``; ``recompute`` is the
    stage's, which decides whether the saved inputs need the re-gather hook).

    ``divisor`` is what the degree must divide (the zoo's gcd of attention heads, kv heads and
    MLP width; None when unknown): a kv head cannot be split, even where its width could be.
    """
    degree = tp_mesh.size()
    if divisor is not None and divisor % degree:
        raise InputError(
            f"tensor parallel degree {degree} does not divide the model's heads, kv heads and "
            f"MLP width (their gcd is {divisor})"
        )
    slots = _parameter_slots(model)
    sharded_layers = []
    for layer_name, layer in pipeline_layers(model):
        vocab = _vocab_modules(layer)
        plan = _tp_plan(layer_name or type(layer).__name__, layer, degree, vocab)
        block = sequence_parallel and bool(plan) and not vocab
        if block:
            plan = sp.sequence_parallel_plan(layer, plan, COLUMN_PROJECTIONS)
        sharded_layers.append((layer, block))
        if plan:
            parallelize_module(layer, tp_mesh, plan)
        if block and recompute == "none":
            sp.keep_saved_inputs_sharded(layer, COLUMN_PROJECTIONS)
        for module in vocab.values():
            if isinstance(module, nn.Embedding):
                # Set on the instance (as recompute does), so parameter names stay unchanged.
                module.forward = functools.partial(_embedding_forward, module)  # type: ignore[method-assign]
    _retie(slots)
    if sequence_parallel:
        sp.shard_sequence_between_layers(sharded_layers, tp_mesh)
