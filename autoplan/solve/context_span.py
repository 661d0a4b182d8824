"""Uneven context-parallel chunks across GPU types: the token split of a spanning cp group.

A cp group spanning two GPU types (``autoplan.cost.context_span``) has n1 cp ranks of device
class k1 and n2 of class k2, in ring order, each tp GPUs of its class; a rank of kind g holds
t_g tokens of every sample, n1·t1 + n2·t2 = s, each count even (two mirrored pieces:
``autoplan.runtime.context_parallel``) and, under sequence parallelism, divisible by tp (the tp
group splits the rank's chunk). ``token_splits`` lists every such split; ``best_split`` prices
every one at every recompute mode (``span_layer_costs``, ``span_pass_ms``) and keeps the fastest
whose every member fits its GPU. The search is exact by enumeration: the group's time is not
unimodal in t1 (a ring step of a rank of kind 1 attending a chunk of kind 2 costs its core,
which grows with t1, times t2 / s, so the step's time is a product that rises and falls), and no
rule is proven to find the best split without trying each.

The memory of a rank of kind g on layers [i, j): the layers' weights, gradients and optimizer
states (whole on every cp rank, no ZeRO), ``flight`` micro-batches of its saved activations (its
tokens' share) and the largest transient (the ring's chunk in flight included); it must stay
within its class's usable memory.

The heterogeneous search does not offer these groups as stages of its pipelines (module
``autoplan.solve.hetero``): that needs ``CostModel.evaluate``, the placement and the emitter to
hold a replica across two classes (``ReplicaGroup`` is one class), which they do not. The
search's spanning family (``autoplan.solve.context_span_family``) offers one such group running
the whole model, whose plan ``autoplan.solve.context_span_plan`` writes and the mesh executor
runs (``Replica.context_tokens``, ranks consecutive across the two nodes).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.context_span import ContextMember, ContextSpan, span_layer_costs, span_pass_ms
from autoplan.cost.model import CostModel

__all__ = ["SpanSplit", "best_split", "price_split", "split_prices", "token_splits"]

MODES = ("none", "selective", "full")


@dataclass(frozen=True)
class SpanSplit:
    """A priced split: the group, its recompute, one micro-batch's forward and backward on the
    layers (per layer its slowest member's, with the passes' fixed overheads) and each
    member's peak bytes per GPU and the parameters a GPU holds (every cp rank the same)."""

    span: ContextSpan
    recompute: str
    forward_ms: float
    backward_ms: float
    peak_bytes: tuple[float, ...]
    params_per_gpu: float

    @property
    def work_ms(self) -> float:
        return self.forward_ms + self.backward_ms


def token_splits(
    ranks: tuple[int, int], seq_len: int, tp: int = 1, sequence_parallel: bool = False
) -> list[tuple[int, int]]:
    """Every (t1, t2) of positive even counts with n1·t1 + n2·t2 = ``seq_len`` (``ranks`` =
    (n1, n2)), divisible by tp under sequence parallelism, t1 ascending."""
    n1, n2 = ranks
    step = math.lcm(2, tp) if sequence_parallel else 2
    out = []
    for t1 in range(step, seq_len // n1 + 1, step):
        rest = seq_len - n1 * t1
        if rest > 0 and rest % n2 == 0 and (rest // n2) % step == 0:
            out.append((t1, rest // n2))
    return out


def split_prices(
    model: CostModel,
    span: ContextSpan,
    micro_batch_size: int,
    layers: tuple[int, int],
    flight: int,
    modes: tuple[str, ...] = MODES,
    sequence_parallel: bool = False,
) -> list[SpanSplit]:
    """``span`` on layers [i, j) at every one of ``modes`` (in their order) that fits every
    member (module docstring); empty where none fits."""
    i, j = layers
    costs = span_layer_costs(model, span, micro_batch_size, sequence_parallel)
    overhead = max(model.pass_overhead_ms(m.device_class) for m in span.members)
    params = sum(c.params_per_gpu for c in costs[0][i:j])
    # DDP over the cp ranks: its gradient buckets count as the engine keeps them.
    static = sum(model.static_bytes(params, span.cp, 0))
    out: list[SpanSplit] = []
    for mode in modes:
        peaks = []
        for member_costs in costs:
            saved = flight * sum(c.saved_bytes[mode] for c in member_costs[i:j])
            transient = max(model.transient_bytes(c, mode) for c in member_costs[i:j])
            peaks.append(static + saved + transient)
        if any(
            peak > model.usable_bytes(m.device_class)
            for peak, m in zip(peaks, span.members, strict=True)
        ):
            continue
        forward, backward = span_pass_ms(costs, i, j, mode)
        out.append(
            SpanSplit(span, mode, forward + overhead, backward + overhead, tuple(peaks), params)
        )
    return out


def price_split(
    model: CostModel,
    span: ContextSpan,
    micro_batch_size: int,
    layers: tuple[int, int],
    flight: int,
    modes: tuple[str, ...] = MODES,
    sequence_parallel: bool = False,
) -> SpanSplit | None:
    """``span`` on layers [i, j) at the fastest of ``modes`` that fits every member (module
    docstring; ties: the earlier mode), or None where none fits."""
    found = split_prices(model, span, micro_batch_size, layers, flight, modes, sequence_parallel)
    return min(found, key=lambda s: s.work_ms, default=None)


def best_split(
    model: CostModel,
    kinds: tuple[tuple[int, int], tuple[int, int]],
    tp: int,
    micro_batch_size: int,
    layers: tuple[int, int],
    flight: int,
    modes: tuple[str, ...] = MODES,
    sequence_parallel: bool = False,
    objective: Callable[[SpanSplit], float] | None = None,
) -> SpanSplit | None:
    """The split and mode of least ``objective`` (default: one micro-batch's forward +
    backward; ties: the smaller t1, then the earlier mode) of a cp group of ``kinds``
    ((device class, cp ranks) in ring order) on layers [i, j) with ``flight`` micro-batches
    in flight, every split and mode tried (module docstring); None where none fits."""
    (k1, n1), (k2, n2) = kinds
    best: SpanSplit | None = None
    best_value = math.inf
    seq = model.profile.seq_len
    for t1, t2 in token_splits((n1, n2), seq, tp, sequence_parallel):
        span = ContextSpan((ContextMember(k1, n1, t1), ContextMember(k2, n2, t2)), tp)
        for found in split_prices(
            model, span, micro_batch_size, layers, flight, modes, sequence_parallel
        ):
            value = found.work_ms if objective is None else objective(found)
            if best is None or value < best_value:
                best, best_value = found, value
    return best
