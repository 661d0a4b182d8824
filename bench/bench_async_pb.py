"""Synchronous plans beside asynchronous Pipelined Backpropagation (issue 13).

For Llama-2-7B and the 175B GPT on the shipped heterogeneous clusters: the best synchronous
plan of the default search, and the same search's candidates re-costed as ``async_pb``
(``autoplan.solve.async_pb``: no flush, so no bubble; one optimizer step and, with dp, one
gradient all-reduce per micro-batch; one stashed weight version per micro-batch in flight):
predicted throughput, bubble share of the iteration, memory per stage (the largest rank's
peak, GB). The finer-grain (sub-block) plan's column is filled by the sub-block partitioning
lever; until it lands it reads "—". Async plans the executor cannot run yet (dp or tp > 1 on a
stage) are marked: the figure is the cost model's.

Shipped profiles (``profiles/*.profile.json``) are read, not re-profiled.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve.async_pb import best_async

__all__ = ["main"]

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
CASES = [
    ("llama2-7b", "a100-v100", 128),
    ("llama2-7b", "h100-a100-l4", 256),
    ("gpt3-175b", "h100-a100-l4", 256),
    ("gpt3-175b", "mixed-1024", 1536),
]
GB = 1e9


def main() -> None:
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    console = Console(width=200)
    table = Table(title="synchronous vs finer-grain vs async_pb (predicted)")
    columns = ["model", "cluster", "batch", "sync samples/s", "sync bubble", "sync GB/stage"]
    columns += ["finer-grain samples/s", "async samples/s", "async ×", "async bubble"]
    columns += ["async GB/stage", "async plan"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "cluster") else "right")
    for name, cluster_name, batch in CASES:
        profile = read_json_model(PROFILES / f"{name}.profile.json", Profile)
        cluster = load_cluster(example_cluster_path(cluster_name))
        options = SolveOptions(top_k=8)
        model = cost_model(profile, cluster, options)
        found = solve_candidates(model, batch, options).candidates
        feasible = [c for c in found if c.cost.feasible]
        best = feasible[0].cost  # the plan ``autoplan solve`` emits reports these figures
        sync_samples_per_s = batch / best.iteration_ms * 1e3
        sync_mem = max(m.total_bytes for m in best.memory) / GB
        choice = best_async(model, feasible)
        row = [
            name,
            cluster_name,
            str(batch),
            f"{sync_samples_per_s:.1f}",
            f"{best.bubble_ms / best.iteration_ms:.1%}",
            f"{sync_mem:.1f}",
            "—",
        ]
        if choice is None:
            row += ["n/a", "", "", "", "none fits with its stashed weights"]
        else:
            cost = choice.cost
            row += [
                f"{cost.samples_per_s:.1f}",
                f"{cost.samples_per_s / sync_samples_per_s:.2f}",
                f"{cost.bubble_ms / cost.iteration_ms:.1%}",
                f"{max(m.total_bytes for m in cost.memory) / GB:.1f}",
                f"pp={choice.config.pipeline_degree} m={choice.config.num_micro_batches} "
                + "stages=["
                + " | ".join(
                    "+".join(f"{g.replicas}×tp{g.tp}" for g in stage.groups)
                    for stage in choice.config.stages
                )
                + "]",
            ]
        table.add_row(*row)
    console.print(table)
    console.print(
        "async_pb changes the optimisation (stale weights, momentum SGD per micro-batch, weight "
        "prediction and spike compensation): its throughput is not comparable loss-for-loss."
    )


if __name__ == "__main__":
    main()
