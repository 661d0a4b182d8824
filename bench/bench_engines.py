"""Planning for the engine that runs the plan (``solve --engine``, ``autoplan.cost.engines``).

For two of bench_solve's heterogeneous scenarios, the plan the search picks for autoplan's
runtime (DDP hides the gradient all-reduce behind the last backward) and the one it picks for
Megatron-DeepSpeed (the all-reduce after the last backward), each priced as both engines run
it. The diagonal is what each search minimised; off it, what the other engine would pay for
that plan. Where the two searches pick different plans, each is the better one for its own
engine (the search is exact within its time limit): planning for one engine and running on
the other costs the difference.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.table import Table

from autoplan.cost.engines import ENGINES
from autoplan.plan.schema import Engine, Plan
from autoplan.plan.stage_spec import format_stage_specs, plan_stage_specs
from autoplan.price.configuration import price_configuration
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, solve
from bench.bench_solve import Case, _cluster, _profile

__all__ = ["main"]

CASES = [
    Case("opt-350m", 2048, "a100-v100-8x2", 256, dtype="fp32"),
    Case("gpt-neo-2.7b", 2048, "a100-v100-16x2", 1024, dtype="fp32"),
]
TIME_LIMIT_S = 60.0


def _stages(plan: Plan) -> str:
    """The plan as ``cost --stages`` reads it (what ``show`` prints beside it)."""
    par = plan.parallelism
    specs = format_stage_specs(plan_stage_specs(plan))
    return f"pp={par.pipeline_degree} m={par.num_micro_batches} | {specs}"


def _priced(profile: Profile, plan: Plan) -> dict[Engine, float]:
    """The plan's iteration as each engine runs it (ms)."""
    return price_configuration(profile, None, plan=plan).iteration_ms_by_engine


def main() -> None:
    """Print the table (module docstring)."""
    console = Console(width=200)
    for case in CASES:
        profile = _profile(case)
        cluster = _cluster(case.cluster)
        table = Table(
            title=f"{case.model} on {case.cluster}, batch {case.global_batch}, {case.dtype}: "
            "the plan searched for each engine, priced as each runs it"
        )
        for column in ("searched for", "plan", *(f"as {e} runs it" for e in ENGINES), "search"):
            table.add_column(column, overflow="fold")
        for engine in ENGINES:
            options = SolveOptions(time_limit_s=TIME_LIMIT_S, engine=engine)
            started = time.perf_counter()
            plan = solve(profile, cluster, case.global_batch, options)
            took = time.perf_counter() - started
            by_engine = _priced(profile, plan)
            status = plan.search.words() if plan.search is not None else "-"
            table.add_row(
                engine,
                _stages(plan),
                *(f"{by_engine[e] / 1e3:.3f} s" for e in ENGINES),
                f"{took:.1f} s, {status}",
            )
        console.print(table)


if __name__ == "__main__":
    main()
