"""The memory levers of issue 12 on the Megatron configurations of Korthikanti et al. 2022.

Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models", Table 3:
GPT 22B (tp 8, pp 1, 8 GPUs, batch 4), 175B (tp 8, pp 8, 64 GPUs, batch 64), 530B (tp 8,
pp 35, 280 GPUs, batch 280) and 1T (tp 8, pp 64, 512 GPUs, batch 512), sequence 2048,
micro-batch 1, A100-80GB in DGX nodes (profiles/clusters/megatron-a100.yaml's links).

Table 1, at the published (tp, pp, dp 1, mbs 1, 1F1B): each lever pinned, the layer split and
the rest searched: full recompute without sequence parallelism (the paper's baseline), selective
recompute + SP (the paper's method), selective without SP, and activation offload (none +
offload, no SP) over the host link. Predicted iteration time, and memory of the fullest GPU
(first pipeline rank, where 1F1B holds the most micro-batches) with what fits.

Table 2, on the same GPUs and batch: the plan of round 1's space (uniform stages, recompute,
ZeRO-1, GPipe/1F1B/interleaved; no SP, offload, ZeRO-2/3 or zero bubble) beside autoplan's
free choice with every lever searched. The paper measured the 530B on 2240 GPUs at 42.1% MFU
with full recompute and 54.2% with its method (29% faster, its abstract); the ratio between
the first two columns of Table 1 is the cost model's figure for the same comparison.

Profiles are the shipped ``profiles/*.profile.json`` (bf16, flash attention).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cluster.schema import Cluster
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates

__all__ = ["main"]

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
# name, tp, pp, GPUs, global batch (Korthikanti et al. 2022, Table 3)
CONFIGS = [
    ("megatron-22b", 8, 1, 8, 4),
    ("megatron-175b", 8, 8, 64, 64),
    ("megatron-529.6b", 8, 35, 280, 280),
    ("megatron-1t", 8, 64, 512, 512),
]
LEVERS = [
    ("full, no SP", {"recompute": "full", "sequence_parallel": False, "offload": False}),
    ("selective + SP", {"recompute": "selective", "sequence_parallel": True, "offload": False}),
    ("selective, no SP", {"recompute": "selective", "sequence_parallel": False, "offload": False}),
    ("offload, no SP", {"recompute": "none", "sequence_parallel": False, "offload": True}),
]
ROUND1 = {
    "space": "uniform",
    "sequence_parallel": False,
    "offload": False,
    "zero_bubble": False,
    "zero_stage": 1,  # round 1 took ZeRO-1 wherever dp > 1 (it never costs time)
}
GB = 1e9


def _cluster(gpus: int) -> Cluster:
    """megatron-a100's DGX nodes, as many as ``gpus`` needs."""
    base = load_cluster(example_cluster_path("megatron-a100"))
    group = base.node_groups[0].model_copy(update={"count": gpus // 8})
    return base.model_copy(update={"node_groups": [group], "name": f"dgx-a100-{gpus}"})


def _best(profile: Profile, cluster: Cluster, batch: int, options: SolveOptions):
    model = cost_model(profile, cluster, options)
    found = solve_candidates(model, batch, options).candidates
    feasible = [c for c in found if c.cost.feasible]
    return (feasible or found or [None])[0]


def _memory(cost) -> str:
    fullest = max(cost.memory, key=lambda m: m.total_bytes + m.reserved_bytes)
    fits = "" if cost.feasible else " (over)"
    return f"{(fullest.total_bytes + fullest.reserved_bytes) / GB:.1f}{fits}"


def main() -> None:
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    console = Console(width=220)
    table = Table(title="issue-12 levers at the published Megatron shapes (predicted; s, GB)")
    table.add_column("model", justify="left")
    table.add_column("tp×pp, batch", justify="left")
    for label, _ in LEVERS:
        table.add_column(f"{label} s", justify="right")
        table.add_column(f"{label} GB", justify="right")
    table.add_column("full / sel+SP", justify="right")
    choice = Table(title="round 1's space vs every lever searched (same GPUs and batch)")
    for column in ["model", "GPUs", "round-1 plan", "round-1 s", "free plan", "free s", "gain"]:
        choice.add_column(column, justify="left" if "plan" in column else "right")
    choice.add_column("solve s", justify="right")
    for name, tp, pp, gpus, batch in CONFIGS:
        path = PROFILES / f"{name}.profile.json"
        if not path.exists():
            console.print(f"[yellow]{name}: no shipped profile ({path.name}); skipped[/]")
            continue
        profile = read_json_model(path, Profile)
        cluster = _cluster(gpus)
        pinned = dict(tp=tp, pp=pp, dp=1, micro_batch_size=1, schedule="1f1b", top_k=1)
        row = [name, f"{tp}×{pp}, {batch}"]
        times: dict[str, float] = {}
        for label, lever in LEVERS:
            options = SolveOptions(**pinned, **lever, zero_bubble=False, time_limit_s=30)
            best = _best(profile, cluster, batch, options)
            if best is None:
                row += ["—", "—"]
                continue
            times[label] = best.iteration_ms
            shown = f"{best.iteration_ms / 1e3:.2f}" if best.cost.feasible else "—"
            row += [shown, _memory(best.cost)]
        ratio = "—"
        if "full, no SP" in times and "selective + SP" in times:
            ratio = f"{times['full, no SP'] / times['selective + SP']:.2f}×"
        table.add_row(*row, ratio)

        started = time.perf_counter()
        round1 = _best(profile, cluster, batch, SolveOptions(top_k=1, time_limit_s=30, **ROUND1))
        free = _best(profile, cluster, batch, SolveOptions(top_k=1, time_limit_s=30))
        elapsed = time.perf_counter() - started
        names = [c.gpu.name for c in cost_model(profile, cluster, SolveOptions()).classes]

        def describe(candidate, names: list[str] = names) -> str:
            if candidate is None or not candidate.cost.feasible:
                return "none fits"
            return candidate.config.summary(lambda k: names[k])[:90]

        gain = "—"
        if round1 and free and round1.cost.feasible and free.cost.feasible:
            gain = f"{round1.iteration_ms / free.iteration_ms:.2f}×"
        choice.add_row(
            name,
            str(gpus),
            describe(round1),
            f"{round1.iteration_ms / 1e3:.2f}" if round1 and round1.cost.feasible else "—",
            describe(free),
            f"{free.iteration_ms / 1e3:.2f}" if free and free.cost.feasible else "—",
            gain,
            f"{elapsed:.0f}",
        )
    console.print(table)
    console.print(choice)


if __name__ == "__main__":
    main()
