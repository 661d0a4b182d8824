"""``autoplan show``, ``autoplan simulate`` and ``autoplan compare``: read plans, never torch."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoplan.cli.app import command
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.schedule import format_grid, schedule_order, unit_step_grid
from autoplan.simulate import SimulationResult, simulate_plan
from autoplan.simulate.chrome_trace import write_chrome_trace
from autoplan.simulate.gantt import write_gantt_png
from autoplan.view import compare_table, plan_renderables

__all__ = ["compare", "show", "simulate"]

PlanPath = Annotated[Path, typer.Argument(help="A plan JSON written by `autoplan solve`.")]


def _title(path: Path, plan: Plan) -> str:
    return f"{path.name}: {plan.inputs.model.name} on {plan.inputs.cluster.name}"


@command("show")
def show(plan_path: PlanPath) -> None:
    """Print a plan: stages and layers, memory per GPU, time breakdown, alternatives."""
    plan = read_json_model(plan_path, Plan)
    console = Console()
    for renderable in plan_renderables(plan, _title(plan_path, plan)):
        console.print(renderable)
        console.print()


def _rank_table(result: SimulationResult) -> Table:
    table = Table(title="Simulated iteration per pipeline rank", title_justify="left")
    table.add_column("rank", justify="right")
    table.add_column("GPU")
    table.add_column("stages")
    for column in ("busy ms", "idle ms", "comm ms", "peak GiB", "capacity GiB"):
        table.add_column(column, justify="right")
    for rank in result.ranks:
        table.add_row(
            str(rank.pipeline_rank),
            rank.gpu_type,
            ",".join(str(stage) for stage in rank.stages),
            f"{rank.busy_ms:,.2f}",
            f"{rank.idle_ms:,.2f}",
            f"{rank.communication_ms:,.2f}",
            f"{rank.peak_bytes / 2**30:.2f}",
            f"{rank.capacity_bytes / 2**30:.2f}",
        )
    return table


@command("simulate")
def simulate(
    plan_path: PlanPath,
    trace: Annotated[
        Path | None,
        typer.Option("--trace", help="Write a Chrome trace JSON (open in ui.perfetto.dev)."),
    ] = None,
    png: Annotated[
        Path | None, typer.Option("--png", help="Write a Gantt chart with memory curves.")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="Write the full simulation result as JSON.")
    ] = None,
    grid: Annotated[
        bool,
        typer.Option(
            "--grid", help="Also print the schedule as a step × rank grid (one step per action)."
        ),
    ] = False,
) -> None:
    """Play the plan's schedule event by event; compare with the plan's closed-form prediction."""
    plan = read_json_model(plan_path, Plan)
    result = simulate_plan(plan)
    if grid:
        par = plan.parallelism
        order = schedule_order(
            par.schedule, par.pipeline_degree, par.num_micro_batches, par.virtual_stages_per_rank
        )
        steps, _ = unit_step_grid(order, par.num_stages)
        typer.echo(format_grid(steps))
    title = _title(plan_path, plan)
    console = Console()
    console.print(_rank_table(result))
    predicted = plan.prediction.iteration_time_ms
    simulated = result.iteration_time_ms
    console.print(
        f"iteration time: simulated {simulated:,.3f} ms, plan predicts {predicted:,.3f} ms "
        f"(simulated / predicted = {simulated / predicted:.3f}); "
        f"ranks idle (no forward/backward) {result.bubble_fraction:.1%} of the pipeline time"
    )
    for note in result.notes:
        console.print(f"note: {note}", style="dim")
    if trace is not None:
        write_chrome_trace(trace, result, title)
        console.print(f"wrote {trace} (Chrome trace: open in ui.perfetto.dev or chrome://tracing)")
    if png is not None:
        write_gantt_png(png, result, title)
        console.print(f"wrote {png}")
    if out is not None:
        write_json_model(out, result)
        console.print(f"wrote {out}")


@command("compare")
def compare(
    first: Annotated[Path, typer.Argument(help="The plan to compare against (A).")],
    second: Annotated[Path, typer.Argument(help="The other plan (B).")],
) -> None:
    """Two plans side by side, with the ratio of their predicted throughput (B / A)."""
    plan_a = read_json_model(first, Plan)
    plan_b = read_json_model(second, Plan)
    names = (first.name, second.name) if first.name != second.name else (str(first), str(second))
    Console().print(compare_table(plan_a, plan_b, names))
