"""The search space, defined once for the solver and the brute-force oracle.

A plan is a pipeline of stages over the model's layers, run with m micro-batches of b = B / m
samples each (B the global batch). Each stage holds a contiguous range of layers and one or
more replica groups; a group is n replicas of t GPUs of one device class (t divides every
splittable layer's ``degree_must_divide`` and is one of the class's node block sizes,
``devices.block_sizes``: the powers of two dividing its GPUs per node, and the whole node).
Each replica takes a share of every micro-batch; the shares of a stage add up to b.

Heterogeneous pipelines (``hetero``, the general case), schedules 1F1B (pp <= m) and GPipe:
- a stage uses one device class, or two (``MAX_CLASSES_PER_STAGE``), with one tp per class;
  at most b replicas in all (every replica takes at least one sample);
- the classes of the stages come in any order (a class may appear in stages that are not
  consecutive), and each class gives at most all of its GPUs: per stage, a class gives any
  block of a node (a power of two dividing its GPUs per node, at least tp) or any number of
  whole nodes when it has at most ``FINE_NODES`` nodes; on larger classes the
  counts are multiples of ``unit_gpus`` (whole nodes, in steps that keep at most
  ``FINE_NODES`` choices per class), and stages of two classes are left out when the cluster
  has more than ``MIXED_STAGE_NODES`` nodes;
- the shares are the balanced ones: the least stage time T such that the groups' replicas,
  each taking as many samples as it can run within T and fit in memory, cover b (then shares
  are trimmed to add up to b: one sample at a time from the slowest replicas first);
- recompute per group: the fastest mode with which the group fits in memory;
- ZeRO-1 on every stage with more than one replica whose groups share one tp (it never costs
  time and saves memory), unless pinned off.

Uniform pipelines (``uniform``: one (dp, tp) for every stage; the baselines and interleaving
live here):
tp divides every splittable layer's ``degree_must_divide`` and is a block size of every class
it uses; dp divides B; the micro-batch size per replica divides B / dp (at most
``max_micro_batch_size`` unless pinned) and fixes m; pp is in ``PIPELINE_DEGREES`` (and at
most the layer count); each pipeline rank is dp × tp GPUs of one class, the ranks of one
class are consecutive (classes in any order). Schedules: 1F1B (m >= pp), GPipe, and
interleaved 1F1B with v in ``CHUNKS`` chunks per rank (m a multiple of pp, pp >= 2,
pp · v <= layers, layers split by ``interleaved_split``).

Shared single-stage plans (``shares``): pp = 1, replicas on two or more classes (every tp
group of each class used), each class with its own micro-batch size b_k <=
``MAX_SHARE_MICRO_BATCH``, m · Σ n_k b_k = B, recompute per class, the ZeRO level as for any
stage (``zero_levels``: 1 to 3 unpinned).

The plan is the best of the three families. GPUs may be left idle: a plan that leaves GPUs
unused is in the space, and is chosen only when it is fastest.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from autoplan.cost.devices import block_sizes
from autoplan.cost.model import CostModel
from autoplan.cost.offload import searched_modes
from autoplan.solve.options import SolveOptions

__all__ = [
    "CHUNKS",
    "FINE_NODES",
    "MAX_CLASSES_PER_STAGE",
    "MAX_SHARE_MICRO_BATCH",
    "MIXED_STAGE_NODES",
    "PIPELINE_DEGREES",
    "class_caps",
    "class_gpu_counts",
    "class_tp_choices",
    "divisors",
    "even_split",
    "interleaved_split",
    "micro_batch_choices",
    "micro_batch_counts",
    "pipeline_degrees",
    "recompute_modes",
    "schedules",
    "tp_choices",
    "tp_limit",
    "unit_gpus",
    "zero_levels",
]

PIPELINE_DEGREES = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128)
CHUNKS = (2, 4)
MAX_SHARE_MICRO_BATCH = 256
MAX_CLASSES_PER_STAGE = 2
FINE_NODES = 16
MIXED_STAGE_NODES = 64
RECOMPUTE = ("none", "selective", "full")


def divisors(n: int) -> list[int]:
    """Positive divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small) | {n // d for d in small})


def tp_limit(model: CostModel) -> int:
    """The gcd of every splittable layer's ``degree_must_divide`` (tp must divide it)."""
    limits = [
        layer.tensor_parallel.degree_must_divide
        for layer in model.profile.layers
        if layer.tensor_parallel is not None
    ]
    return math.gcd(*limits) if limits else 1


def class_tp_choices(model: CostModel, device_class: int, options: SolveOptions) -> list[int]:
    """tp degrees class ``device_class`` can run: block sizes of its nodes dividing the
    layers' limit (and the pinned tp)."""
    bound = tp_limit(model)
    sizes = block_sizes(model.classes[device_class].gpus_per_node)
    found = [t for t in sizes if bound % t == 0]
    return [t for t in found if options.tp is None or t == options.tp]


def tp_choices(model: CostModel, options: SolveOptions) -> list[int]:
    """tp degrees some class can run."""
    return sorted({t for c in model.classes for t in class_tp_choices(model, c.index, options)})


def unit_gpus(model: CostModel, device_class: int) -> int | None:
    """The step of GPU counts a stage takes from a large class (None: any whole tp groups)."""
    dc = model.classes[device_class]
    if dc.num_nodes <= FINE_NODES:
        return None
    return dc.gpus_per_node * math.ceil(dc.num_nodes / FINE_NODES)


def class_gpu_counts(model: CostModel, device_class: int, tp: int) -> list[int]:
    """GPU counts a stage may take from a class at tp ``tp``, ascending: a block of a node
    (``block_sizes``: a power of two dividing its GPUs, at least tp) or whole nodes. Counts in
    between (3 or 5 GPUs of a node of 8) would split nodes into blocks no placement keeps
    aligned, and they multiply the search's options about threefold."""
    dc = model.classes[device_class]
    unit = unit_gpus(model, device_class)
    if unit is None:
        inside = [g for g in block_sizes(dc.gpus_per_node) if g >= tp and g % tp == 0]
        nodes = range(dc.gpus_per_node, dc.total_gpus + 1, dc.gpus_per_node)
        return sorted({g for g in inside if g <= dc.total_gpus} | set(nodes))
    return list(range(unit, dc.total_gpus + 1, unit))


def class_caps(model: CostModel, tp: int, dp: int) -> list[int]:
    """Uniform space: pipeline ranks of dp × tp GPUs each class can hold (0 if tp is not one
    of its block sizes)."""
    return [
        (c.total_gpus // (dp * tp)) if tp in block_sizes(c.gpus_per_node) else 0
        for c in model.classes
    ]


def micro_batch_choices(per_replica: int, options: SolveOptions) -> list[int]:
    """Uniform space: micro-batch sizes dividing the per-replica batch (pinned, or capped)."""
    sizes = divisors(per_replica)
    if options.micro_batch_size is not None:
        return [b for b in sizes if b == options.micro_batch_size]
    if options.num_micro_batches is not None:
        return [b for b in sizes if per_replica // b == options.num_micro_batches]
    return [b for b in sizes if b <= options.max_micro_batch_size]


def micro_batch_counts(batch: int, options: SolveOptions) -> list[int]:
    """Heterogeneous space: micro-batch counts m (b = B / m samples per micro-batch)."""
    counts = divisors(batch)
    if options.num_micro_batches is not None:
        counts = [m for m in counts if m == options.num_micro_batches]
    if options.micro_batch_size is not None:
        counts = [m for m in counts if (batch // m) % options.micro_batch_size == 0]
    if options.dp is not None:
        counts = [m for m in counts if (batch // m) % options.dp == 0]
    return counts


def pipeline_degrees(num_layers: int, options: SolveOptions) -> list[int]:
    """Uniform space: pp values searched."""
    if options.layer_split is not None:
        return [len(options.layer_split)]
    if options.pp is not None:
        return [options.pp] if options.pp <= num_layers else []
    return [p for p in PIPELINE_DEGREES if p <= num_layers]


def schedules(pp: int, m: int, num_layers: int, options: SolveOptions) -> list[tuple[str, int]]:
    """Uniform space: (schedule, chunks) pairs allowed for pp and m (module docstring)."""
    if pp == 1:
        found = [("1f1b", 1)]
    else:
        found = [("gpipe", 1)]
        if m >= pp:
            found.append(("1f1b", 1))
        if m % pp == 0 and options.layer_split is None:
            found += [("interleaved_1f1b", v) for v in CHUNKS if pp * v <= num_layers]
    if options.schedule is not None:
        found = [(s, v) for s, v in found if _searched_for(s, v, options.schedule)]
    return found


def _searched_for(schedule: str, chunks: int, pinned: str) -> bool:
    """Whether (schedule, chunks) is searched when ``pinned`` is: itself, or the 1F1B-family
    layout a zero-bubble schedule is tried at (``solve.zero_bubble``)."""
    if pinned == "interleaved_zero_bubble":
        return schedule in ("1f1b", "interleaved_1f1b")
    if pinned in ("zbv", "dualpipev"):
        return schedule == "interleaved_1f1b" and chunks == 2
    return schedule == pinned


def recompute_modes(options: SolveOptions) -> tuple[str, ...]:
    """The modes (recompute, with or without offload: ``autoplan.cost.offload``) searched.
    Without offload they run fastest first; with it the order depends on the hardware, so
    the search takes the fastest that fits, by its time."""
    base = (options.recompute,) if options.recompute is not None else RECOMPUTE
    return searched_modes(base, options.offload)


def zero_levels(replicas: int, uniform_tp: bool, options: SolveOptions) -> tuple[int, ...]:
    """ZeRO levels a stage of ``replicas`` replicas may take, lowest first: one replica has
    nothing to shard (0); levels 1-3 need every replica of one tp (0 otherwise, none when a
    level is pinned); unpinned, 1 (free) to 3 (2 and 3 trade collectives for memory, see
    ``autoplan.cost.sharding``). ``--no-zero1`` pins 0, ``--zero1`` 1."""
    pinned = options.zero_stage
    if pinned is None and options.zero1 is not None:
        pinned = int(options.zero1)
    if replicas <= 1:
        return (0,)
    if not uniform_tp:
        return () if pinned else (0,)
    if pinned is not None:
        return (pinned,)
    return (1, 2, 3)


def interleaved_split(
    kinds: Sequence[str], work_ms: list[float], ranks: int, chunks: int
) -> list[int]:
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


def _megatron_split(kinds: Sequence[str], parts: int) -> list[int]:
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
        sizes: list[int] = []
        current, count = 0.0, 0
        for work in work_ms:
            if count and current + work > bound:
                if len(sizes) == parts - 1:
                    return None  # a chunk past ``parts`` follows: the end says None too
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
