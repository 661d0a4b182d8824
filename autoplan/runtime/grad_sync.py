"""Gradient sync of the groups executor: sum each parameter's gradient over every replica that
holds it, replicas of different tp degrees and weights tied across stages included.

Each replica's loss is weighted by its share of the global batch (see ``action_list``), so the
global-batch mean gradient is the plain *sum* of the replicas' gradients. With equal tp that
is DDP's all-reduce per tp index; with replicas of different tp degrees in one stage (one of
tp 1, one of tp 2), the same rows of a weight live on different ranks in pieces of different
sizes. DDP and FSDP2 take one mesh of one shape, so this is written by hand:

- A parameter split by tp along dimension d (DTensor ``Shard(d)``, uneven splits as
  ``torch.chunk``) is cut into the *finest common pieces* of the layouts present: the union
  of every tp degree's chunk boundaries along d. Each piece lies within one shard of every
  replica, so each replica holds it on exactly one rank; those ranks all-reduce it.
- A replicated parameter (norms, a row projection's bias, anything of a layer tp does not
  split) is held whole by every tp rank of a replica, the same values on each. With one tp
  degree across the replicas, tp rank t of each replica all-reduces with the others' tp rank t;
  with several, one rank per replica (its tp rank 0) all-reduces and then broadcasts over its
  tp group, so that each replica counts once.
- A weight tied across stages (embedding and head) is one parameter *family* held by the
  replicas of both stages: its pieces are summed over all of them at once, which is both the
  stages' own sum and the tie's (as Megatron-LM sums the embedding's and head's gradients).
  Copies on one rank (interleaved stages of one pipeline rank) are added locally first.

Every rank computes the same list of reductions from the plan (never from local state), in
one order; each runs the ones it is in. One total order of collectives means no rank can wait
on a group whose other members wait on it. Reductions of one group are packed into buckets
(flat buffers, up to ``BUCKET_ELEMENTS``), one collective each.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from autoplan.errors import InputError
from autoplan.plan.schema import Plan, Replica
from autoplan.runtime.model_stage import pipeline_layers
from autoplan.runtime.process_groups import ProcessGroups
from autoplan.runtime.tensor_parallel import parameter_shard_dims, vocabulary_shard_rows

__all__ = [
    "BUCKET_ELEMENTS",
    "Bucket",
    "GradientSync",
    "Holder",
    "ParameterFamily",
    "Reduction",
    "parameter_families",
    "plan_reductions",
]

BUCKET_ELEMENTS = 2**24
"""Most gradient elements one collective carries (64 MiB of fp32), as DDP caps its buckets."""


@dataclass(frozen=True)
class ParameterFamily:
    """One parameter of the model, by its name in each stage that holds a copy."""

    copies: tuple[tuple[int, str], ...]
    """(stage, parameter name in that stage's module), in stage order; several for a tie."""
    shape: tuple[int, ...]
    dim: int | None
    """The dimension tensor parallelism splits it along; None when replicated."""


def parameter_families(plan: Plan, model: nn.Module) -> list[ParameterFamily]:
    """Every parameter of ``model`` (the whole model, e.g. on the meta device) with its copies
    per the plan's stages, in the order the model lists them."""
    stage_of_layer = {
        layer: stage.index
        for stage in plan.stages
        for layer in range(stage.layer_start, stage.layer_end)
    }
    copies: dict[int, dict[int, str]] = {}
    dims: dict[int, int | None] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for index, (prefix, layer) in enumerate(pipeline_layers(model)):
        layer_dims = parameter_shard_dims(layer)
        for name, param in layer.named_parameters(remove_duplicate=False):
            key = id(param)
            stage = stage_of_layer[index]
            copies.setdefault(key, {}).setdefault(stage, f"{prefix}.{name}" if prefix else name)
            shapes[key] = tuple(param.shape)
            dim = layer_dims[name]
            if key in dims and dims[key] != dim:
                raise InputError(
                    f"parameter {prefix}.{name} is used by layers that tensor parallelism "
                    f"splits differently (dims {dims[key]} and {dim})"
                )
            dims[key] = dim
    return [
        ParameterFamily(tuple(sorted(by_stage.items())), shapes[key], dims[key])
        for key, by_stage in copies.items()
    ]


@dataclass(frozen=True)
class Holder:
    """One rank's copy of a piece: in stage ``stage``'s parameter ``name``, from ``offset``
    along the piece's dimension of its local tensor (0 when the piece is the whole tensor)."""

    rank: int
    stage: int
    name: str
    offset: int


@dataclass(frozen=True)
class Reduction:
    """One collective on one piece: 'sum' (all-reduce) or 'broadcast' from ``src``."""

    op: Literal["sum", "broadcast"]
    ranks: tuple[int, ...]
    src: int | None
    dim: int | None
    length: int
    numel: int
    holders: tuple[Holder, ...]
    """Every copy involved, at least one on each member."""


def _chunk_starts(size: int, degree: int) -> list[int]:
    rows = vocabulary_shard_rows(size, degree)  # torch.chunk's split, DTensor's Shard
    return [sum(rows[:t]) for t in range(degree)] + [size]


def _replica_holders(
    family: ParameterFamily, stage: int, name: str, replica: Replica, start: int
) -> list[Holder]:
    """The ranks of ``replica`` holding the piece of ``family`` that starts at ``start``."""
    tp = replica.tensor_parallel_degree
    if family.dim is None:
        return [Holder(rank, stage, name, 0) for rank in replica.ranks]
    if tp == 1:
        return [Holder(replica.ranks[0], stage, name, start)]
    starts = _chunk_starts(family.shape[family.dim], tp)
    t = max(index for index in range(tp) if starts[index] <= start < starts[index + 1])
    return [Holder(replica.ranks[t], stage, name, start - starts[t])]


def _pieces(plan: Plan, family: ParameterFamily) -> list[tuple[int, int]]:
    if family.dim is None:
        return [(0, 0)]
    size = family.shape[family.dim]
    cuts = {0, size}
    for stage, _ in family.copies:
        for replica in plan.stages[stage].replicas:
            if replica.tensor_parallel_degree > 1:
                cuts |= set(_chunk_starts(size, replica.tensor_parallel_degree))
    ordered = sorted(cuts)
    return [(a, b - a) for a, b in itertools.pairwise(ordered) if b > a]


def _ranks(holders: list[Holder]) -> tuple[int, ...]:
    return tuple(sorted({holder.rank for holder in holders}))


def _reduction(
    op: Literal["sum", "broadcast"],
    holders: list[Holder],
    src: int | None,
    piece: tuple[int | None, int, int],
) -> Reduction:
    dim, length, numel = piece
    return Reduction(op, _ranks(holders), src, dim, length, numel, tuple(holders))


def _family_reductions(plan: Plan, family: ParameterFamily) -> list[Reduction]:
    sums: list[Reduction] = []
    broadcasts: list[Reduction] = []
    whole = math.prod(family.shape)
    for start, length in _pieces(plan, family):
        numel = whole if family.dim is None else whole // family.shape[family.dim] * length
        contributions = [
            _replica_holders(family, stage, name, replica, start)
            for stage, name in family.copies
            for replica in plan.stages[stage].replicas
        ]
        if len(contributions) == 1:
            continue  # one replica of one stage: its gradient is the sum already

        piece = (family.dim, length, numel)
        counts = {len(holders) for holders in contributions}
        if len(counts) == 1:
            for position in range(counts.pop()):
                sums.append(_reduction("sum", [c[position] for c in contributions], None, piece))
        else:
            sums.append(_reduction("sum", [c[0] for c in contributions], None, piece))
            for holders in contributions:
                if len(holders) > 1:
                    broadcasts.append(_reduction("broadcast", holders, holders[0].rank, piece))
    return sums + broadcasts


@dataclass
class Bucket:
    """Reductions of one group (and source), run as one collective on a flat buffer."""

    op: Literal["sum", "broadcast"]
    ranks: tuple[int, ...]
    src: int | None
    reductions: list[Reduction] = field(default_factory=list)
    numel: int = 0


def plan_reductions(plan: Plan, families: list[ParameterFamily]) -> list[Bucket]:
    """Every rank's reductions, bucketed: all sums (in family order), then all broadcasts."""
    reductions = [r for family in families for r in _family_reductions(plan, family)]
    ordered = [r for r in reductions if r.op == "sum"] + [
        r for r in reductions if r.op == "broadcast"
    ]
    buckets: list[Bucket] = []
    open_buckets: dict[tuple[str, tuple[int, ...], int | None], Bucket] = {}
    for reduction in ordered:
        key = (reduction.op, reduction.ranks, reduction.src)
        bucket = open_buckets.get(key)
        if bucket is None or bucket.numel + reduction.numel > BUCKET_ELEMENTS:
            bucket = Bucket(reduction.op, reduction.ranks, reduction.src)
            open_buckets[key] = bucket
            buckets.append(bucket)
        bucket.reductions.append(reduction)
        bucket.numel += reduction.numel
    return buckets


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _sum_partial_gradients(modules: dict[int, nn.Module]) -> None:
    """Sum over its tp group every gradient DTensor left as a partial sum per rank.

    A weight every tp rank holds whole but applies to its own part of an activation (a
    per-head norm on its heads, a sequence-parallel norm on its tokens) gets, from DTensor, a
    ``Partial`` gradient: each rank's share of the sum. The reductions below read each rank's
    local gradient as the replica's whole one, so the partial sums are completed first, over
    the replica's tp group only (every rank of it holds the same stage modules, visited in one
    order: the collectives match)."""
    for stage in sorted(modules):
        for param in modules[stage].parameters():
            grad = param.grad
            if not isinstance(param, DTensor) or not isinstance(grad, DTensor):
                continue
            if any(placement.is_partial() for placement in grad.placements):
                param.grad = grad.redistribute(grad.device_mesh, param.placements)


class GradientSync:
    """Runs this rank's part of the plan's reductions on its stage modules' gradients."""

    def __init__(self, plan: Plan, families: list[ParameterFamily], rank: int) -> None:
        self.rank = rank
        self.families = families
        self.buckets = plan_reductions(plan, families)
        self.plan = plan

    def rank_sets(self) -> list[tuple[int, ...]]:
        """The groups the reductions need (for ``ProcessGroups``)."""
        return [bucket.ranks for bucket in self.buckets if len(bucket.ranks) > 1]

    def check_layout(self, modules: dict[int, nn.Module], replica_of: dict[int, Replica]) -> None:
        """Raise unless this rank's parameters are shaped as the reductions assume (the
        tensor-parallel split of ``parameter_shard_dims`` is the one applied)."""
        for family in self.families:
            for stage, name in family.copies:
                if stage not in modules:
                    continue
                replica = replica_of[stage]
                expected = list(family.shape)
                tp = replica.tensor_parallel_degree
                if family.dim is not None and tp > 1:
                    t = replica.ranks.index(self.rank)
                    starts = _chunk_starts(family.shape[family.dim], tp)
                    expected[family.dim] = starts[t + 1] - starts[t]
                local = _local(modules[stage].get_parameter(name))
                if list(local.shape) != expected:
                    raise RuntimeError(
                        f"stage {stage} {name}: local shape {list(local.shape)}, but the "
                        f"gradient sync expects {expected} (tp {tp}, dim {family.dim})"
                    )

    def _view(self, modules: dict[int, nn.Module], holder: Holder, reduction: Reduction):
        param = modules[holder.stage].get_parameter(holder.name)
        if param.grad is None:
            param.grad = torch.zeros_like(param)
        grad = _local(param.grad)
        if reduction.dim is None:
            return grad
        return grad.narrow(reduction.dim, holder.offset, reduction.length)

    @torch.no_grad()
    def synchronize(self, modules: dict[int, nn.Module], groups: ProcessGroups) -> None:
        """Replace every gradient piece this rank holds by its sum over all holders."""
        _sum_partial_gradients(modules)
        for bucket in self.buckets:
            if self.rank not in bucket.ranks:
                continue
            group = groups.get(bucket.ranks)
            entries: list[tuple[list[torch.Tensor], torch.Tensor]] = []
            for reduction in bucket.reductions:
                views = [
                    self._view(modules, holder, reduction)
                    for holder in reduction.holders
                    if holder.rank == self.rank
                ]
                value = views[0] if len(views) == 1 else torch.stack(views).sum(dim=0)
                entries.append((views, value))
            # One flat buffer per dtype (a model's parameters normally share one).
            for dtype in dict.fromkeys(value.dtype for _, value in entries):
                chosen = [(views, value) for views, value in entries if value.dtype == dtype]
                flat = torch.cat([value.reshape(-1) for _, value in chosen])
                if group is not None and bucket.op == "sum":
                    dist.all_reduce(flat, group=group)
                elif group is not None:
                    dist.broadcast(flat, src=bucket.src, group=group)
                offset = 0
                for views, value in chosen:
                    part = flat[offset : offset + value.numel()].view(value.shape)
                    offset += value.numel()
                    for view in views:
                        view.copy_(part)
