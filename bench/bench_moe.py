"""Mixtral-8x7B on a mixed cluster: the plan with expert parallelism beside the plan without.

Mixtral-8x7B (46.7 B parameters, 12.9 B active; 8 experts, top 2, capacity factor 1.25) is
profiled on fake tensors at sequence 4096, micro-batch 1, bf16, and solved for a global batch
of 64 on the shipped ``h100-a100-l4`` cluster (16 H100, 16 A100-80GB, 16 L4): with ep searched
(1, 2, 4 or 8 per plan, ``autoplan.solve.expert_parallel``), and with ep pinned to 1, 4 and 8
(the best plan of each degree, whether or not the search prefers it).

For each plan: its knobs, the predicted iteration time, and the all-to-all share of it: the
iteration time the dispatch and combine all-to-alls add, T - T₀, where T₀ is the same
configuration costed with free all-to-alls (the profile's slot buffers of zero bytes), over
T. A plan without ep has no all-to-alls (share 0).
"""

from __future__ import annotations

import logging
import time

from rich.console import Console
from rich.table import Table

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cost.config import PlanConfig
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates

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


def _best(profile: Profile, options: SolveOptions) -> tuple[PlanConfig, str, float, bool, float]:
    """(config, its summary, iteration ms, timed out, solve seconds) of the best feasible
    plan."""
    cluster = load_cluster(example_cluster_path(CLUSTER))
    model = cost_model(profile, cluster, options)
    start = time.monotonic()
    result = solve_candidates(model, GLOBAL_BATCH, options)
    took = time.monotonic() - start
    best = next(c for c in result.candidates if c.cost.feasible)
    summary = best.config.summary(lambda k: model.classes[k].gpu.name)
    return best.config, summary, best.iteration_ms, result.timed_out, took


def main() -> None:
    """Print the table (module docstring)."""
    logging.getLogger("autoplan").setLevel(logging.ERROR)
    profile = profile_model(MODEL, SEQ_LEN, 1, "bf16")
    cluster = load_cluster(example_cluster_path(CLUSTER))
    free = _free_alltoalls(profile)
    table = Table(
        title=f"{MODEL} ({profile.model.parameter_count / 1e9:.1f} B) on {CLUSTER}, global "
        f"batch {GLOBAL_BATCH}, seq {SEQ_LEN}: with and without expert parallelism"
    )
    for column in ("ep", "plan", "iteration", "all-to-all", "share", "search"):
        table.add_column(column, overflow="fold")
    base = SolveOptions(time_limit_s=TIME_LIMIT_S, top_k=1)
    runs = [("searched", base)] + [
        (f"pinned {ep}", base.model_copy(update={"expert_parallel": ep})) for ep in (1, 4, 8)
    ]
    for label, options in runs:
        config, summary, iteration_ms, timed_out, took = _best(profile, options)
        free_ms = cost_model(free, cluster, options).evaluate(config).iteration_ms
        degrees = sorted({stage.ep for stage in config.stages})
        table.add_row(
            f"{label}: {','.join(map(str, degrees))}",
            summary,
            f"{iteration_ms / 1e3:.3f} s",
            f"{(iteration_ms - free_ms):.1f} ms",
            f"{(iteration_ms - free_ms) / iteration_ms:.1%}",
            f"{took:.0f} s{' (time limit)' if timed_out else ''}",
        )
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
