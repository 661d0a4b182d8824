"""The search space, defined once for the solver and the brute-force oracle.

A plan is one of two families.

Pipeline plans: tp divides every splittable layer's ``degree_must_divide`` and the GPUs per
node of every class it uses; dp divides the global batch B; the micro-batch size divides
B / dp (at most ``max_micro_batch_size`` unless pinned) and fixes m; pp is in
``PIPELINE_DEGREES`` (and at most the layer count); each pipeline rank is dp × tp GPUs of one
device class, the ranks of one class are consecutive in the pipeline (classes in any order),
and no class gives more ranks than it has GPUs for. Schedules: 1F1B (m ≥ pp), GPipe, and
interleaved 1F1B with v ∈ ``CHUNKS`` chunks per rank (m a multiple of pp, pp ≥ 2,
pp · v ≤ layers, layers split by ``interleaved_split``).
Layer splits are free for 1F1B and GPipe. Recompute is chosen per stage (per rank when
interleaved). ZeRO-1 only with dp > 1.

Shared single-stage plans: pp = 1, replicas on two or more classes (every tp group of each
class used), each class with its own micro-batch size b_k ≤ ``MAX_SHARE_MICRO_BATCH``,
m · Σ n_k b_k = B, recompute per class, ZeRO-1.
"""

from __future__ import annotations

import itertools
import math

from autoplan.cost.model import CostModel
from autoplan.solve.options import SolveOptions

__all__ = [
    "CHUNKS",
    "MAX_SHARE_MICRO_BATCH",
    "PIPELINE_DEGREES",
    "class_caps",
    "divisors",
    "even_split",
    "interleaved_split",
    "micro_batch_choices",
    "pipeline_degrees",
    "recompute_modes",
    "schedules",
    "tp_choices",
    "zero1_choices",
]

PIPELINE_DEGREES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CHUNKS = (2, 4)
MAX_SHARE_MICRO_BATCH = 256
RECOMPUTE = ("none", "selective", "full")


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


def tp_choices(model: CostModel, options: SolveOptions) -> list[int]:
    """tp degrees that every splittable layer allows and at least one class fits."""
    limits = [
        layer.tensor_parallel.degree_must_divide
        for layer in model.profile.layers
        if layer.tensor_parallel is not None
    ]
    bound = math.gcd(*limits) if limits else 1
    gpn = [c.gpus_per_node for c in model.classes]
    found = [t for t in divisors(bound) if any(g % t == 0 for g in gpn)]
    return [t for t in found if options.tp is None or t == options.tp]


def class_caps(model: CostModel, tp: int, dp: int) -> list[int]:
    """Pipeline ranks of dp × tp GPUs each class can hold (0 if tp does not fit its nodes)."""
    return [(c.total_gpus // (dp * tp)) if c.gpus_per_node % tp == 0 else 0 for c in model.classes]


def micro_batch_choices(per_replica: int, options: SolveOptions) -> list[int]:
    """Micro-batch sizes dividing the per-replica batch (pinned ones, or up to the cap)."""
    sizes = divisors(per_replica)
    if options.micro_batch_size is not None:
        return [b for b in sizes if b == options.micro_batch_size]
    if options.num_micro_batches is not None:
        return [b for b in sizes if per_replica // b == options.num_micro_batches]
    return [b for b in sizes if b <= options.max_micro_batch_size]


def pipeline_degrees(num_layers: int, options: SolveOptions) -> list[int]:
    """pp values searched."""
    if options.layer_split is not None:
        return [len(options.layer_split)]
    if options.pp is not None:
        return [options.pp] if options.pp <= num_layers else []
    return [p for p in PIPELINE_DEGREES if p <= num_layers]


def schedules(pp: int, m: int, num_layers: int, options: SolveOptions) -> list[tuple[str, int]]:
    """(schedule, chunks) pairs allowed for pp and m (module docstring)."""
    if pp == 1:
        found = [("1f1b", 1)]
    else:
        found = [("gpipe", 1)]
        if m >= pp:
            found.append(("1f1b", 1))
        if m % pp == 0 and options.layer_split is None:
            found += [("interleaved_1f1b", v) for v in CHUNKS if pp * v <= num_layers]
    if options.schedule is not None:
        found = [(s, v) for s, v in found if s == options.schedule]
    return found


def recompute_modes(options: SolveOptions) -> tuple[str, ...]:
    """Recompute modes, fastest first."""
    return (options.recompute,) if options.recompute is not None else RECOMPUTE


def zero1_choices(dp: int, options: SolveOptions) -> list[bool]:
    """ZeRO-1 settings allowed at this dp."""
    found = [False, True] if dp > 1 else [False]
    if options.zero1 is not None:
        found = [z for z in found if z == options.zero1]
    return found


def interleaved_split(kinds: list[str], work_ms: list[float], ranks: int, chunks: int) -> list[int]:
    """Layers per chunk of an interleaved pipeline with ``ranks`` × ``chunks`` chunks (chunk c
    on rank c % ranks): of three deterministic splits (Megatron's: blocks even, embedding and
    head with the first and last chunk; all layers even; the min-max split by work), the one
    whose slowest rank (sum of its chunks' ``work_ms``) is fastest, earlier on ties."""
    parts = ranks * chunks
    options = [_megatron_split(kinds, parts), even_split(len(kinds), parts)]
    options.append(_min_max_split(work_ms, parts))

    def slowest_rank(sizes: list[int]) -> float:
        bounds = [0, *itertools.accumulate(sizes)]
        loads = [0.0] * ranks
        for c in range(parts):
            loads[c % ranks] += sum(work_ms[bounds[c] : bounds[c + 1]])
        return max(loads)

    return min(options, key=slowest_rank)


def _megatron_split(kinds: list[str], parts: int) -> list[int]:
    """Blocks as evenly as possible over the chunks (extra ones to the first chunks), the
    layers before the first block with the first chunk, those after the last with the last
    (Megatron-LM's convention); without enough contiguous blocks, an even split."""
    blocks = [i for i, kind in enumerate(kinds) if kind == "block"]
    if len(blocks) < parts or blocks != list(range(blocks[0], blocks[-1] + 1)):
        return even_split(len(kinds), parts)
    sizes = even_split(len(blocks), parts)
    sizes[0] += blocks[0]
    sizes[-1] += len(kinds) - 1 - blocks[-1]
    return sizes


def _min_max_split(work_ms: list[float], parts: int) -> list[int]:
    """Contiguous chunks minimising the largest chunk's work: bisection on the bound with a
    greedy fill (filling each chunk as far as the bound allows reaches furthest); if fewer
    chunks than ``parts`` come out, the chunk with most layers gives up its last layer until
    there are ``parts``."""
    if parts > len(work_ms):
        raise ValueError(f"{parts} chunks need at least {parts} layers; got {len(work_ms)}")

    def fill(bound: float) -> list[int] | None:
        sizes, current, count = [], 0.0, 0
        for work in work_ms:
            if count and current + work > bound:
                sizes.append(count)
                current, count = 0.0, 0
            if work > bound:
                return None
            current += work
            count += 1
        sizes.append(count)
        return sizes if len(sizes) <= parts else None

    low, high = max(work_ms), sum(work_ms)
    for _ in range(100):
        if high - low <= 1e-12 * max(1.0, high):
            break
        middle = (low + high) / 2
        if fill(middle) is not None:
            high = middle
        else:
            low = middle
    sizes = fill(high)
    assert sizes is not None
    while len(sizes) < parts:
        largest = max(range(len(sizes)), key=lambda i: (sizes[i], -i))
        sizes[largest] -= 1
        sizes.insert(largest + 1, 1)
    return sizes


def even_split(num_layers: int, parts: int) -> list[int]:
    """Layers per part, as even as possible, larger parts first."""
    base, extra = divmod(num_layers, parts)
    return [base + 1 if i < extra else base for i in range(parts)]
