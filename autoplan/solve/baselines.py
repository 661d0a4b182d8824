"""Baseline strategies, costed with the true (heterogeneous) cost model.

- ``megatron``: a grid search that sees every GPU as the slowest type (least compute, least
  memory, slowest links) on one homogeneous pool, with even layer splits; its ranks are then
  placed on the real nodes in file order, as a heterogeneity-blind launcher would.
- ``even-split`` and ``data-parallel`` are restrictions of the main search (``search``).
- ``data-parallel`` also tries plain DDP over every GPU of every class with equal shares.
"""

from __future__ import annotations

from autoplan.cluster.catalog import peak_tflops
from autoplan.cluster.schema import Cluster, GpuSpec, NodeGroup
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel
from autoplan.cost.offload import group_of
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, SearchResult
from autoplan.solve.shares import share_sizes
from autoplan.solve.space import divisors, recompute_modes
from autoplan.solve.uniform import uniform_search

__all__ = ["blind_model", "equal_share_candidates", "megatron_search"]


def blind_model(model: CostModel, efficiency: dict[str, float]) -> CostModel:
    """The cluster as a heterogeneity-blind planner sees it: one pool of the slowest GPU."""
    dtype = model.profile.dtype
    gpus = [c.gpu for c in model.classes]
    slowest = min(gpus, key=lambda g: (peak_tflops(g, dtype) * g.efficiency, g.name))
    blind = GpuSpec(
        name=f"blind-{slowest.name}",
        memory_gib=min(g.memory_gib for g in gpus),
        memory_bandwidth_gb_per_s=min(g.memory_bandwidth_gb_per_s for g in gpus),
        peak_tflops={dtype: peak_tflops(slowest, dtype)},
        efficiency=slowest.efficiency,
        datasheet_url="derived: the slowest GPU type of the cluster",
    )
    gpn = min(c.gpus_per_node for c in model.classes)
    total = model.cluster.total_gpus()
    cluster = Cluster(
        name=f"{model.cluster.name}-blind",
        gpu_types=[blind],
        node_groups=[
            NodeGroup(
                name="pool",
                gpu=blind.name,
                gpus_per_node=gpn,
                count=max(1, total // gpn),
                intra_node_bandwidth_gb_per_s=min(
                    c.intra_node_bandwidth_gb_per_s for c in model.classes
                ),
                intra_node_latency_us=max(c.intra_node_latency_us for c in model.classes),
            )
        ],
        inter_node_bandwidth_gb_per_s=min(c.inter_node_bandwidth_gb_per_s for c in model.classes),
        inter_node_latency_us=model.cluster.inter_node_latency_us,
    )
    return CostModel(model.profile, cluster, {blind.name: blind}, efficiency=None)


def megatron_search(model: CostModel, batch: int, options: SolveOptions) -> SearchResult:
    """Search as if homogeneous, then place in file order and cost on the real cluster.
    Megatron-LM's own recipe has no activation offload: the baseline searches it only when
    the user pins it on."""
    blind = blind_model(model, options.efficiency)
    update: dict[str, object] = {"strategy": "even-split", "space": "uniform"}
    if options.offload is None:
        update["offload"] = False
    blind_options = options.model_copy(update=update)
    found = uniform_search(blind, batch, blind_options)
    real = []
    for candidate in found.candidates:
        config = _on_real_nodes(model, candidate.config)
        if config is None:
            continue
        cost = model.evaluate(config)
        real.append(Candidate(cost.iteration_ms, config, cost))
    real.sort(key=lambda c: (not c.cost.feasible, c.iteration_ms))
    return SearchResult(real, found.configs_considered, found.partitions_solved, found.timed_out)


def _on_real_nodes(model: CostModel, config: PlanConfig) -> PlanConfig | None:
    """The blind config with its replicas on the real nodes, handed out in file order: each
    pipeline rank takes its dp replicas of tp GPUs from the next nodes with room (a replica
    within one node), whatever their GPU type; the shares stay equal."""
    class_of = {name: c.index for c in model.classes for name in c.groups}
    nodes = model.cluster.nodes()
    free = [node.gpus for node in nodes]
    cursor = 0
    pp = config.pipeline_degree
    rank_groups = []
    for stage in config.stages[:pp]:
        (blind_group,) = stage.groups
        tp, need = blind_group.tp, blind_group.replicas
        counts: dict[int, int] = {}
        while need:
            if cursor == len(nodes):
                return None
            take = min(need, free[cursor] // tp)
            if take == 0:
                cursor += 1
                continue
            k = class_of[nodes[cursor].group]
            counts[k] = counts.get(k, 0) + take
            free[cursor] -= take * tp
            need -= take
        rank_groups.append(
            tuple(
                sorted(
                    ReplicaGroup(
                        k,
                        tp,
                        n,
                        blind_group.micro_batch_size,
                        blind_group.recompute,
                        blind_group.offload,
                    )
                    for k, n in counts.items()
                )
            )
        )
    stages = tuple(
        StageChoice(s.layer_start, s.layer_end, rank_groups[i % pp], s.zero_stage)
        for i, s in enumerate(config.stages)
    )
    return PlanConfig(config.num_micro_batches, config.schedule, config.chunks, stages)


def equal_share_candidates(model: CostModel, batch: int, options: SolveOptions) -> list[Candidate]:
    """Plain DDP over every GPU of every class (tp = 1), equal micro-batches."""
    total = sum(c.total_gpus for c in model.classes)
    if len(model.classes) < 2 or batch % total:
        return []
    modes = recompute_modes(options)
    zero1 = total > 1 and options.zero1 is not False
    out = []
    for m in divisors(batch // total):
        b = batch // (m * total)
        groups = []
        for c in model.classes:
            sizes = share_sizes(model, 1, total, zero1, c.index, b, modes)
            if b not in sizes:
                break
            groups.append(group_of(c.index, 1, c.total_gpus, b, sizes[b][2]))
        else:
            config = PlanConfig(
                m, "1f1b", 1, (StageChoice(0, model.num_layers, tuple(sorted(groups)), int(zero1)),)
            )
            cost = model.evaluate(config)
            if cost.feasible:
                out.append(Candidate(cost.iteration_ms, config, cost))
    out.sort(key=lambda c: (c.iteration_ms, c.config.num_micro_batches))
    return out[:1] if out else []
