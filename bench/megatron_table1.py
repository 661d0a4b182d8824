"""Megatron-LM SC'21 Table 1 (Narayanan et al., "Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM", Table 1): the rows, the paper's FLOP count, and the cost
model's prediction of each row's configuration.

Each GPT is profiled at sequence 2048 in bf16 with attention as Megatron-LM (2021) ran it,
unfused (``attention='math'``: QKᵀ, softmax over the s×s scores, ·V; it had no flash
attention), on the paper's cluster (``megatron-a100``: DGX A100 nodes) cut to the row's GPUs.
The configuration is the paper's tp, pp, dp, global batch and full recompute; what the table
does not state (micro-batch size, schedule, layer split) is the best the cost model finds
among micro-batch sizes 1, 2, 4 and 1F1B or interleaved 1F1B with 2, 3, 4, 6 or 8 chunks per rank,
with layers split so that the largest stage's work is smallest (``autoplan solve`` with those
knobs pinned searches the same and more, exactly). Megatron-LM
(2021) all-reduced gradients after the backward, not overlapped with it, took Megatron's
vocab-parallel loss, kept its gradients in its own contiguous buffer rather than DDP's buckets
and received each pipeline transfer into a tensor freed once used: the three terms where
Megatron-DeepSpeed differs from autoplan's runtime (``autoplan.cost.engines``), so the rows
are costed as that engine runs them. TFLOP/s per GPU follow the paper's own count,
96·B·s·l·h²(1 + s/6h + V/16lh) FLOPs per iteration (which includes the recompute forward).

This evaluates configurations with ``CostModel.evaluate`` directly, so it needs no solver.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoplan.cluster.catalog import example_cluster_path, gpu_specs, load_cluster
from autoplan.cluster.schema import Cluster, GpuSpec
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel, PlanCost
from autoplan.cost.schedule import interleaved_ok
from autoplan.profile.schema import Profile

__all__ = [
    "MEGATRON_ATTENTION",
    "MEGATRON_TABLE1",
    "MegatronPrediction",
    "MegatronRow",
    "balanced_bounds",
    "megatron_cluster",
    "megatron_flops_per_iteration",
    "megatron_profiles",
    "predict_row",
]

SEQ_LEN = 2048
MEGATRON_VOCAB = 51200
# Megatron-LM (2021) materialised the s×s attention scores (no flash attention).
MEGATRON_ATTENTION = "math"


@dataclass(frozen=True)
class MegatronRow:
    """One row of Megatron-LM SC'21 Table 1."""

    model: str  # zoo name
    parameters_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    published_tflops_per_gpu: float

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


# Narayanan et al., SC'21, Table 1 (weak scaling, A100-80GB, Selene).
MEGATRON_TABLE1 = [
    MegatronRow("megatron-1.7b", 1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    MegatronRow("megatron-3.6b", 3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    MegatronRow("megatron-7.5b", 7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    MegatronRow("megatron-18.4b", 18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    MegatronRow("megatron-39.1b", 39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    MegatronRow("megatron-76.1b", 76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    MegatronRow("megatron-145.6b", 145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    MegatronRow("megatron-310.1b", 310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    MegatronRow("megatron-529.6b", 529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    MegatronRow("megatron-1t", 1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]


def megatron_flops_per_iteration(row: MegatronRow) -> float:
    """FLOPs of one iteration as Megatron-LM counts them (forward, backward, recompute)."""
    b, s, layers, h, v = row.batch, SEQ_LEN, row.layers, row.hidden, MEGATRON_VOCAB
    return 96 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (16 * layers * h))


def megatron_profiles() -> dict[str, Profile]:
    """Each row's model profiled as the paper ran it (module docstring)."""
    from autoplan.profile import profile_model

    return {
        row.model: profile_model(row.model, SEQ_LEN, 1, "bf16", attention=MEGATRON_ATTENTION)
        for row in MEGATRON_TABLE1
    }


def megatron_cluster(gpus: int) -> Cluster:
    """The paper's cluster cut to ``gpus`` GPUs (whole DGX nodes)."""
    cluster = load_cluster(example_cluster_path("megatron-a100"))
    group = cluster.node_groups[0]
    nodes = math.ceil(gpus / group.gpus_per_node)
    return cluster.model_copy(update={"node_groups": [group.model_copy(update={"count": nodes})]})


@dataclass(frozen=True)
class MegatronPrediction:
    """The cost model's best configuration of one row and what it predicts."""

    row: MegatronRow
    summary: str
    cost: PlanCost

    @property
    def tflops_per_gpu(self) -> float:
        seconds = self.cost.iteration_ms / 1000
        return megatron_flops_per_iteration(self.row) / seconds / self.row.gpus / 1e12

    @property
    def error(self) -> float:
        """Predicted / published − 1."""
        return self.tflops_per_gpu / self.row.published_tflops_per_gpu - 1


def balanced_bounds(work: list[float], stages: int) -> list[int]:
    """Boundaries of ``stages`` contiguous non-empty groups of ``work`` whose largest sum is
    (within 1e-9 relative) smallest: bisection on that sum, greedy packing for each guess."""

    def pack(limit: float) -> list[int] | None:
        bounds, total = [0], 0.0
        for index, value in enumerate(work):
            if total + value > limit and index > bounds[-1]:
                bounds.append(index)
                total = 0.0
            total += value
        bounds.append(len(work))
        return bounds if len(bounds) - 1 <= stages else None

    lo, hi = max(work), sum(work)
    for _ in range(100):
        middle = (lo + hi) / 2
        lo, hi = (lo, middle) if pack(middle) is not None else (middle, hi)
    bounds = pack(hi)
    assert bounds is not None
    # Fewer groups than stages: split the longest groups (the largest sum does not grow).
    while len(bounds) - 1 < stages:
        widest = max(range(len(bounds) - 1), key=lambda i: bounds[i + 1] - bounds[i])
        bounds.insert(widest + 1, (bounds[widest] + bounds[widest + 1]) // 2)
    return bounds


def _configs(row: MegatronRow, model: CostModel) -> list[PlanConfig]:
    per_replica = row.batch // row.dp
    layers = model.num_layers
    configs = []
    for mbs in (1, 2, 4):
        if per_replica % mbs:
            continue
        m = per_replica // mbs
        group = (ReplicaGroup(0, row.tp, row.dp, mbs, "full"),)
        schedules = [("1f1b", 1)]
        if row.pp > 1 and interleaved_ok(m, row.pp):
            schedules += [("interleaved_1f1b", v) for v in (2, 3, 4, 6, 8) if layers >= row.pp * v]
        tables = model.tables(0, row.tp, mbs)
        work = [b - a for a, b in zip(tables.work["full"], tables.work["full"][1:], strict=False)]
        for schedule, chunks in schedules:
            bounds = balanced_bounds(work, row.pp * chunks)
            stages = tuple(
                StageChoice(bounds[i], bounds[i + 1], group) for i in range(row.pp * chunks)
            )
            configs.append(PlanConfig(m, schedule, chunks, stages))
    return configs


def predict_row(
    row: MegatronRow, profile: Profile, a100: GpuSpec | None = None
) -> MegatronPrediction:
    """The best (shortest, memory-feasible where any is) configuration of ``row``; ``a100``
    replaces the catalog's A100-80GB (e.g. a candidate of a fit)."""
    cluster = megatron_cluster(row.gpus)
    specs = gpu_specs(cluster)
    if a100 is not None:
        specs["A100-80GB"] = a100
    model = CostModel(profile, cluster, specs).with_engine("megatron-deepspeed")
    costed = [(config, model.evaluate(config)) for config in _configs(row, model)]
    feasible = [pair for pair in costed if pair[1].feasible] or costed
    config, cost = min(feasible, key=lambda pair: pair[1].iteration_ms)
    summary = (
        f"t{row.tp} p{row.pp} d{row.dp} mbs{config.micro_batch_size // row.dp} "
        f"m{config.num_micro_batches} {config.schedule}"
        + (f" v{config.chunks}" if config.chunks > 1 else "")
        + ("" if cost.feasible else " (does not fit)")
    )
    return MegatronPrediction(row, summary, cost)
