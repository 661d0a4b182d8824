"""Mixtral-8x7B on a mixed cluster: the plan with expert parallelism beside the plan without.

Mixtral-8x7B (46.7 B parameters, 12.9 B active; 8 experts, top 2, capacity factor 1.25) is
profiled on fake tensors at sequence 4096, micro-batch 1, bf16, and solved for a global batch
of 64 on the shipped ``h100-a100-l4`` cluster (16 H100, 16 A100-80GB, 16 L4): with ep searched
(1, 2, 4 or 8: per plan, ``autoplan.solve.expert_parallel``, and per stage in heterogeneous
pipelines, ``autoplan.solve.stage_degrees``), and with ep pinned to 1, 4 and 8 for every stage
(the best plan of each degree, whether or not the search prefers it).

For each plan: its knobs, the predicted iteration time, and the all-to-all share of it: the
iteration time the dispatch and combine all-to-alls add, T - T₀, where T₀ is the same
configuration costed with free all-to-alls (the profile's slot buffers of zero bytes), over
T. A plan without ep has no all-to-alls (share 0). Beside it, the pipeline bubble, the
data-parallel communication left exposed (the gradient all-reduce past the last backward,
ZeRO-2/3's per-micro-batch gathers) and the fullest GPU's memory.

Then why the searched plan's degree wins: its own shape (same stages, replicas, shares and
recompute) costed at every ep of ``expert_degrees`` below it, at ZeRO-1 and at ZeRO-3 (which
the cost model does not compose with ep > 1). Where the shape does not fit at ZeRO-1, the
experts' weights, gradients and optimizer states are what ep's sharding saves; where ZeRO-3
makes it fit, its exposed collectives are the price of getting the memory back that way.

Last, experts placed by GPU speed (``autoplan.solve.expert_span``, in the searched row unless
the even-experts row equals it): the searched plan's mixed stage (its H100 and A100 groups, their
shares and recompute kept) re-costed with expert groups that span the two types, one replica of
each per expert group where the counts allow, at every integer split of the 8 experts, beside
its own per-type expert groups; once on the shipped cluster and once on a copy whose H100 and
A100 racks are joined at 400 GB/s a node (the H100 rack's own InfiniBand) instead of the
cluster's 25 GB/s. Each row: the iteration, the all-to-all share (as above), each type's time
per micro-batch and the fullest GPU.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cluster.schema import Cluster, InterNodeLink
from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.model import CostModel, PlanCost
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve.expert_parallel import expert_degrees

__all__ = ["main"]

MODEL = "mixtral-8x7b"
CLUSTER = "h100-a100-l4"
SEQ_LEN = 4096
GLOBAL_BATCH = 64
TIME_LIMIT_S = 120.0


def _free_alltoalls(profile: Profile) -> Profile:
    """``profile`` with every MoE layer's all-to-all buffer of zero bytes."""
    layers = [
        layer.model_copy(update={"experts": layer.experts.model_copy(update={"dispatch_bytes": 0})})
        if layer.experts is not None
        else layer
        for layer in profile.layers
    ]
    return profile.model_copy(update={"layers": layers})


def _best(profile: Profile, options: SolveOptions) -> tuple[PlanConfig, str, PlanCost, bool, float]:
    """(config, its summary, its cost, timed out, solve seconds) of the best feasible plan."""
    cluster = load_cluster(example_cluster_path(CLUSTER))
    model = cost_model(profile, cluster, options)
    start = time.monotonic()
    result = solve_candidates(model, GLOBAL_BATCH, options)
    took = time.monotonic() - start
    best = next(c for c in result.candidates if c.cost.feasible)
    summary = best.config.summary(lambda k: model.classes[k].gpu.name)
    return best.config, summary, best.cost, result.timed_out, took


def _fullest(cost: PlanCost) -> str:
    """The fullest GPU: its type and (total + reserve) / capacity."""
    fullest = max(cost.memory, key=lambda m: (m.total_bytes + m.reserved_bytes) / m.capacity_bytes)
    used = (fullest.total_bytes + fullest.reserved_bytes) / fullest.capacity_bytes
    return f"{used:.0%} ({fullest.gpu_type})"


def _at(config: PlanConfig, ep: int, zero: int) -> PlanConfig:
    """``config`` with every stage at expert-parallel degree ``ep`` and ZeRO level ``zero``."""
    stages = tuple(dataclasses.replace(s, ep=ep, zero_stage=zero) for s in config.stages)
    return dataclasses.replace(config, stages=stages)


def _why(model: CostModel, config: PlanConfig) -> Table:
    """The searched plan's shape at lower ep degrees, ZeRO-1 and ZeRO-3 (module docstring)."""
    chosen = max(stage.ep for stage in config.stages)
    table = Table(
        title=f"why ep {chosen}: the searched plan's shape (stages, replicas, shares, recompute) "
        "at other ep degrees and ZeRO levels"
    )
    for column in ("ep", "ZeRO", "iteration", "fits", "fullest GPU", "its model states", "dp"):
        table.add_column(column)
    for ep in [e for e in expert_degrees(model, SolveOptions()) if e <= chosen]:
        for zero in (1,) if ep > 1 else (1, 3):
            cost = model.evaluate(_at(config, ep, zero))
            fullest = max(cost.memory, key=lambda m: m.total_bytes / m.capacity_bytes)
            states = fullest.weights_bytes + fullest.gradients_bytes + fullest.optimizer_bytes
            table.add_row(
                str(ep),
                str(zero),
                f"{cost.iteration_ms / 1e3:.3f} s",
                "yes" if cost.feasible else "no",
                _fullest(cost),
                f"{states / 1024**3:.1f} GiB",
                f"{cost.dp_comm_ms:.0f} ms",
            )
    return table


def _spanning(config: PlanConfig, stage: StageChoice, experts: tuple[int, ...]) -> PlanConfig:
    """``config`` with ``stage``'s expert groups spanning its two groups, one replica of each
    (gcd of the counts expert groups), holding ``experts`` (empty: the stage as it is)."""
    if not experts:
        return config
    n1, n2 = (g.replicas for g in stage.groups)
    k = math.gcd(n1, n2)
    placed = dataclasses.replace(stage, ep=(n1 + n2) // k, zero_stage=1, experts=experts)
    stages = tuple(placed if s is stage else s for s in config.stages)
    return dataclasses.replace(config, stages=stages)


def _fast_racks(cluster: Cluster) -> Cluster:
    """``cluster`` with its H100 and A100 racks joined at 400 GB/s a node."""
    link = InterNodeLink(groups=["h100", "a100"], bandwidth_gb_per_s=400.0)
    return cluster.model_copy(update={"inter_node_links": [*cluster.inter_node_links, link]})


def _by_speed(profile: Profile, cluster: Cluster, config: PlanConfig, title: str) -> Table:
    """The searched plan's mixed stage at every split of experts spanning its two types
    (module docstring)."""
    model = cost_model(profile, cluster, SolveOptions())
    free = cost_model(_free_alltoalls(profile), cluster, SolveOptions())
    table = Table(title=title)
    for column in ("experts", "ep", "iteration", "all-to-all", "share", "per micro-batch",
                   "fullest GPU"):  # fmt: skip
        table.add_column(column)
    mixed = [s for s in config.stages if len(s.classes) == 2 and len(s.groups) == 2]
    if not mixed or len({g.tp for g in mixed[0].groups}) != 1:
        table.add_row("the searched plan has no stage of one H100 and one A100 group", *[""] * 6)
        return table
    stage = mixed[0]
    n1, n2 = (g.replicas for g in stage.groups)
    a1, a2 = n1 // math.gcd(n1, n2), n2 // math.gcd(n1, n2)
    experts = next(x.experts.num_experts for x in profile.layers if x.experts is not None)
    splits = [()] + [
        (x, (experts - a1 * x) // a2)
        for x in range(1, experts)
        if experts - a1 * x >= a2 and (experts - a1 * x) % a2 == 0
    ]
    names = [model.classes[g.device_class].gpu.name for g in stage.groups]
    for split in splits:
        placed = _spanning(config, stage, split)
        cost = model.evaluate(placed)
        free_ms = free.evaluate(placed).iteration_ms
        index = config.stages.index(stage)
        times = " / ".join(
            f"{name} {group.work_ms:.0f} ms"
            for name, group in zip(names, cost.stages[index].groups, strict=True)
        )
        held = split or stage.experts
        label = f"even within each type (ep {stage.ep})"
        if held:
            label = " + ".join(f"{x} {name}" for x, name in zip(held, names, strict=True))
        if not split:
            label = f"searched: {label}"
        table.add_row(
            label,
            str(placed.stages[index].ep),
            f"{cost.iteration_ms / 1e3:.3f} s" + ("" if cost.feasible else " (does not fit)"),
            f"{cost.iteration_ms - free_ms:.0f} ms",
            f"{(cost.iteration_ms - free_ms) / cost.iteration_ms:.1%}",
            times,
            _fullest(cost),
        )
    return table


def main() -> None:
    """Print the tables (module docstring)."""
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    profile = profile_model(MODEL, SEQ_LEN, 1, "bf16")
    cluster = load_cluster(example_cluster_path(CLUSTER))
    free = _free_alltoalls(profile)
    table = Table(
        title=f"{MODEL} ({profile.model.parameter_count / 1e9:.1f} B) on {CLUSTER}, global "
        f"batch {GLOBAL_BATCH}, seq {SEQ_LEN}: with and without expert parallelism"
    )
    columns = ("ep", "plan", "iteration", "all-to-all", "share", "bubble", "dp", "fullest GPU")
    for column in (*columns, "search"):
        table.add_column(column, overflow="fold")
    base = SolveOptions(time_limit_s=TIME_LIMIT_S, top_k=1)
    runs = [
        ("searched", base),
        ("searched, even experts", base.model_copy(update={"experts_by_speed": False})),
    ] + [(f"pinned {ep}", base.model_copy(update={"expert_parallel": ep})) for ep in (1, 4, 8)]
    searched: PlanConfig | None = None
    for label, options in runs:
        config, summary, cost, timed_out, took = _best(profile, options)
        searched = searched or config
        free_ms = cost_model(free, cluster, options).evaluate(config).iteration_ms
        degrees = sorted({stage.ep for stage in config.stages})
        table.add_row(
            f"{label}: {','.join(map(str, degrees))}",
            summary,
            f"{cost.iteration_ms / 1e3:.3f} s",
            f"{(cost.iteration_ms - free_ms):.1f} ms",
            f"{(cost.iteration_ms - free_ms) / cost.iteration_ms:.1%}",
            f"{cost.bubble_ms:.0f} ms",
            f"{cost.dp_comm_ms:.0f} ms",
            _fullest(cost),
            f"{took:.0f} s{' (time limit)' if timed_out else ''}",
        )
    console = Console(width=180)
    console.print(table)
    assert searched is not None
    if max(stage.ep for stage in searched.stages) > 1:
        console.print(_why(cost_model(profile, cluster, base), searched))
    console.print(
        _by_speed(
            profile,
            cluster,
            searched,
            f"experts by GPU speed: the searched plan's mixed stage with expert groups spanning "
            f"H100 and A100, on {CLUSTER} (H100-A100 racks joined at 25 GB/s a node)",
        )
    )
    console.print(
        _by_speed(
            profile,
            _fast_racks(cluster),
            searched,
            "the same on a copy whose H100 and A100 racks are joined at 400 GB/s a node",
        )
    )


if __name__ == "__main__":
    main()
