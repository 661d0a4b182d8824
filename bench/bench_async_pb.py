"""Synchronous plans beside asynchronous Pipelined Backpropagation (issue 13).

For Llama-2-7B and the 175B GPT on the shipped heterogeneous clusters: the best synchronous
plan of the default search, and the same search's candidates re-costed as ``async_pb``
(``autoplan.solve.async_pb``: no flush, so no bubble; one optimizer step and, with dp, one
gradient all-reduce per micro-batch; one stashed weight version per micro-batch in flight):
predicted throughput, bubble share of the iteration, memory per stage (the largest rank's
peak, GB). The finer-grain plan is the same search over the model's sub-block units (each
block's attention and MLP parts: ``profiles/*.sub-block.profile.json``), seeded with the
block plan (``autoplan.solve.granularity``), so it is never slower; "cuts in blocks" counts
its stage boundaries that fall between a block's attention and MLP parts (0: the block plan
itself is best, or the units were not searched) and the wall time of each search is shown,
"(limit)" where the 60 s limit stopped it (the block search may take all of it, and then the
units are not searched: the finer column is the block plan). Async plans the executor cannot
run yet (dp or tp > 1 on a stage) are marked: the figure is the cost model's; where none fits,
the cell says what the best synchronous plan would need with its stashed weight versions.

Shipped profiles (``profiles/*.profile.json``) are read, not re-profiled.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cost.async_pb import async_pb_cost
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


def _finer(name: str, cluster, batch: int, options: SolveOptions, sync: float) -> list[str]:
    """The finer-grain columns: the seeded search over the sub-block profile's units."""
    profile = read_json_model(PROFILES / f"{name}.sub-block.profile.json", Profile)
    model = cost_model(profile, cluster, options)
    started = time.monotonic()
    result = solve_candidates(model, batch, options)
    elapsed = time.monotonic() - started
    feasible = [c for c in result.candidates if c.cost.feasible]
    if not feasible:
        return ["n/a", "", "", "", f"{elapsed:.1f}", "none fits"]
    best = feasible[0]
    cost = best.cost
    # Cuts inside a block: a stage boundary between a block's attention and MLP parts.
    inside = sum(
        1 for stage in best.config.stages[1:] if profile.layers[stage.layer_start].part == "mlp"
    )
    samples = batch / cost.iteration_ms * 1e3
    return [
        f"{samples:.1f}",
        f"{samples / sync:.3f}",
        f"{cost.bubble_ms / cost.iteration_ms:.1%}",
        f"{max(m.total_bytes for m in cost.memory) / GB:.1f}",
        f"{elapsed:.1f}" + (" (limit)" if result.timed_out else ""),
        f"{inside} of {len(best.config.stages) - 1}",
    ]


def main() -> None:
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    console = Console(width=320)
    table = Table(title="synchronous vs finer-grain vs async_pb (predicted)")
    columns = ["model", "cluster", "batch", "sync samples/s", "sync bubble", "sync GB/stage"]
    columns += ["sync solve s", "finer samples/s", "finer ×", "finer bubble", "finer GB/stage"]
    columns += ["finer solve s", "finer cuts in blocks", "async samples/s", "async ×"]
    columns += ["async bubble", "async GB/stage", "async plan"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "cluster") else "right")
    for name, cluster_name, batch in CASES:
        profile = read_json_model(PROFILES / f"{name}.profile.json", Profile)
        cluster = load_cluster(example_cluster_path(cluster_name))
        options = SolveOptions(top_k=8)
        model = cost_model(profile, cluster, options)
        started = time.monotonic()
        found = solve_candidates(model, batch, options).candidates
        sync_s = time.monotonic() - started
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
            f"{sync_s:.1f}",
            *_finer(name, cluster, batch, options, sync_samples_per_s),
        ]
        if choice is None:
            # What the best synchronous plan would need with its stashed weight versions.
            need = async_pb_cost(model, feasible[0].config)
            row += ["n/a", "", "", "", "none fits: " + (need.violations or ["?"])[0]]
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
