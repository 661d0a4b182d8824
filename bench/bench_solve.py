"""Speed and quality of ``autoplan solve``.

Speed: wall-clock time of one solve (search + plan emission) against model depth, GPU count and
number of GPU types. Targets: Llama-2-70B on 64 mixed GPUs under 2 s; GPT-3 175B on the
1024-GPU three-type cluster (``mixed-1024``) under 10 s.

Quality: on heterogeneous clusters, autoplan's predicted throughput beside each baseline
strategy's (``megatron``: blind to heterogeneity, even split, ranks in file order;
``even-split``; ``data-parallel``), all costed with the same heterogeneous cost model, and
beside the physical bound: total FLOPs / Σ every GPU's peak × efficiency (no communication,
no memory limit, no bubble).

Profiles come from the real profiler (``autoplan.profile.profile_model``: FakeTensorMode, no
memory), bf16, one sample per micro-batch profiled.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import (
    efficiency_for,
    example_cluster_path,
    gpu_specs,
    load_cluster,
    peak_tflops,
)
from autoplan.cluster.schema import Cluster, InterNodeLink, NodeGroup
from autoplan.errors import AutoplanError
from autoplan.plan.validate import plan_problems
from autoplan.profile import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, solve

__all__ = ["main"]

# 64 GPUs of two types: 4 × 8 H100 and 4 × 8 A100-80GB, each pool on its own InfiniBand.
MIXED_64 = Cluster(
    name="mixed-64",
    node_groups=[
        NodeGroup(
            name="h100", gpu="H100", gpus_per_node=8, count=4, intra_node_bandwidth_gb_per_s=450
        ),
        NodeGroup(
            name="a100",
            gpu="A100-80GB",
            gpus_per_node=8,
            count=4,
            intra_node_bandwidth_gb_per_s=300,
        ),
    ],
    inter_node_bandwidth_gb_per_s=25,
    inter_node_links=[
        InterNodeLink(groups=["h100"], bandwidth_gb_per_s=400),
        InterNodeLink(groups=["a100"], bandwidth_gb_per_s=200),
    ],
)


@dataclass(frozen=True)
class Case:
    model: str
    seq_len: int
    cluster: str
    global_batch: int
    target_s: float | None = None


SPEED_CASES = [
    Case("gpt2-xl", 1024, "a100-v100", 64),
    Case("llama2-7b", 4096, "a100-v100", 128),
    Case("llama2-13b", 4096, "h100-a100-l4", 256),
    Case("llama2-70b", 4096, "h100-a100-l4", 256),
    Case("llama2-70b", 4096, "mixed-64", 512, target_s=2.0),
    Case("gpt3-175b", 2048, "mixed-64", 512),
    Case("llama2-70b", 4096, "mixed-1024", 1536),
    Case("gpt3-175b", 2048, "mixed-1024", 1536, target_s=10.0),
]

QUALITY_CASES = [
    Case("llama2-7b", 4096, "a100-v100", 128),
    Case("llama2-13b", 4096, "h100-a100-l4", 256),
    Case("llama2-70b", 4096, "mixed-64", 512),
    Case("gpt3-175b", 2048, "mixed-1024", 1536),
]

STRATEGIES = ("optimal", "megatron", "even-split", "data-parallel")

_profiles: dict[tuple[str, int], Profile] = {}


def _profile(model: str, seq_len: int) -> Profile:
    key = (model, seq_len)
    if key not in _profiles:
        _profiles[key] = profile_model(model, seq_len, 1, "bf16")
    return _profiles[key]


def _cluster(name: str) -> Cluster:
    return MIXED_64 if name == "mixed-64" else load_cluster(example_cluster_path(name))


def _types(cluster: Cluster) -> int:
    return len({group.gpu for group in cluster.node_groups})


def _speed_table(console: Console) -> None:
    table = Table(title="solve time (search + plan), optimal strategy")
    for column in (
        "model",
        "layers",
        "cluster",
        "GPUs",
        "types",
        "batch",
        "solve s",
        "target s",
        "plan",
        "samples/s",
    ):
        table.add_column(
            column, justify="left" if column in ("model", "cluster", "plan") else "right"
        )
    for case in SPEED_CASES:
        profile = _profile(case.model, case.seq_len)
        cluster = _cluster(case.cluster)
        start = time.perf_counter()
        try:
            plan = solve(profile, cluster, case.global_batch, SolveOptions())
            elapsed = time.perf_counter() - start
            par = plan.parallelism
            shape = (
                f"pp={par.pipeline_degree} dp={par.data_parallel_degree} "
                f"tp={par.tensor_parallel_degree} m={par.num_micro_batches} {par.schedule}"
            )
            rate = f"{plan.prediction.samples_per_s:.2f}"
            problems = plan_problems(plan, profile)
            if problems:
                shape += f" (INVALID: {problems[0]})"
        except AutoplanError as error:
            elapsed = time.perf_counter() - start
            shape, rate = f"infeasible: {error}", "-"
        target = "" if case.target_s is None else f"{case.target_s:g}"
        if case.target_s is not None:
            target += " ok" if elapsed < case.target_s else " MISSED"
        table.add_row(
            case.model,
            str(len(profile.layers)),
            case.cluster,
            str(cluster.total_gpus()),
            str(_types(cluster)),
            str(case.global_batch),
            f"{elapsed:.2f}",
            target,
            shape,
            rate,
        )
    console.print(table)


def _physical_bound_samples_per_s(profile: Profile, cluster: Cluster) -> float:
    specs = gpu_specs(cluster)
    flops_per_sample = sum(x.forward_flops + x.backward_flops for x in profile.layers) / (
        profile.micro_batch_size
    )
    total = sum(
        peak_tflops(specs[g.gpu], profile.dtype)
        * 1e12
        * efficiency_for(specs[g.gpu], profile.dtype)
        * g.gpus_per_node
        * g.count
        for g in cluster.node_groups
    )
    return total / flops_per_sample


def _quality_table(console: Console) -> None:
    table = Table(title="predicted samples/s by strategy (same heterogeneous cost model)")
    for column in (
        "model",
        "cluster",
        "batch",
        *STRATEGIES,
        "bound",
        "optimal / bound",
        "optimal / megatron",
    ):
        table.add_column(column, justify="left" if column in ("model", "cluster") else "right")
    for case in QUALITY_CASES:
        profile = _profile(case.model, case.seq_len)
        cluster = _cluster(case.cluster)
        rates: dict[str, float | None] = {}
        for strategy in STRATEGIES:
            try:
                plan = solve(profile, cluster, case.global_batch, SolveOptions(strategy=strategy))
                over = any(m.total_bytes > m.capacity_bytes for m in plan.prediction.memory)
                rates[strategy] = None if over else plan.prediction.samples_per_s
            except AutoplanError:
                rates[strategy] = None
        bound = _physical_bound_samples_per_s(profile, cluster)
        best = rates["optimal"]
        blind = rates["megatron"]
        table.add_row(
            case.model,
            case.cluster,
            str(case.global_batch),
            *(f"{rates[s]:.2f}" if rates[s] is not None else "OOM/none" for s in STRATEGIES),
            f"{bound:.2f}",
            f"{best / bound:.0%}" if best else "-",
            f"{best / blind:.2f}×" if best and blind else "-",
        )
    console.print(table)
    console.print(
        "OOM/none: the strategy's plan does not fit in memory on the real cluster, or it "
        "finds no plan. bound = total model FLOPs / Σ peak × efficiency of every GPU."
    )


def main() -> None:
    """Print the speed and quality tables."""
    console = Console(width=200)
    _speed_table(console)
    _quality_table(console)


if __name__ == "__main__":
    main()
