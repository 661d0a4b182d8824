"""``autoplan show``, ``autoplan simulate`` and ``autoplan compare``: read plans, never torch."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from autoplan.checks import simulation_size_problem
from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import atomic_output, check_outputs, write_json_model
from autoplan.inputs import read_plan
from autoplan.names import printable
from autoplan.plan.fingerprint import edited_since_costed, stale_timings_message
from autoplan.plan.schema import Plan
from autoplan.schedule import format_grid, schedule_order, unit_step_grid
from autoplan.simulate import SimulationResult, simulate_plan
from autoplan.simulate.chrome_trace import write_chrome_trace
from autoplan.view import Document, Section, compare_document, plan_document, print_document
from autoplan.view.units import bytes_text, duration_text, percent_text

__all__ = ["compare", "show", "simulate"]

PlanPath = Annotated[Path, typer.Argument(help="A plan JSON written by `autoplan solve`.")]


class Format(StrEnum):
    """How a view is printed."""

    text = "text"
    markdown = "markdown"
    json = "json"


FormatOption = Annotated[
    Format,
    typer.Option(
        "--format",
        help="text: tables that fit the terminal (stacked rows when narrow); markdown; json.",
    ),
]


def _title(path: Path, plan: Plan) -> str:
    return f"{path.name}: {plan.inputs.model.name} on {plan.inputs.cluster.name}"


@command("show")
def show(plan_path: PlanPath, output: FormatOption = Format.text) -> None:
    """Print a plan: stages and their replicas, memory per replica kind, time breakdown, idle
    GPUs, alternatives."""
    plan = read_plan(plan_path)
    print_document(Console(), plan_document(plan, _title(plan_path, plan)), output.value)


def _ranges(numbers: list[int]) -> str:
    """Replica indices as runs: [6] → '6', [0, 1, 2, 5] → '0-2, 5 (4 replicas)'."""
    runs: list[list[int]] = []
    for number in sorted(set(numbers)):
        if runs and number == runs[-1][1] + 1:
            runs[-1][1] = number
        else:
            runs.append([number, number])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return text if len(numbers) == 1 else f"{text} ({len(set(numbers))} replicas)"


def _simulation_document(plan: Plan, result: SimulationResult, title: str) -> Document:
    """The simulated iteration and one row per group of replicas that fared alike."""
    predicted = plan.prediction.iteration_time_ms
    simulated = result.iteration_time_ms
    summary = Section(title="Simulated iteration", columns=["what", "value"], key_value=True)
    summary.add("simulated", duration_text(simulated))
    summary.add("plan predicts", duration_text(predicted))
    summary.add("simulated / predicted", f"{simulated / predicted:.3f}")
    summary.add("replicas idle", f"{percent_text(result.bubble_fraction)} of the pipeline time")
    for number, note in enumerate(result.notes, start=1):
        summary.add(f"note {number}", note)
    table = Section(
        title="Per replica (replicas of one rank that fared alike share a row)",
        columns=["rank", "replicas", "GPU", "busy", "idle", "comm", "peak", "capacity"],
        right=frozenset({0, 1, 3, 4, 5, 6, 7}),
    )
    for rank in result.ranks:
        groups: dict[tuple, list[int]] = {}
        for replica in rank.replicas:
            key = (
                replica.label,
                round(replica.busy_ms, 9),
                round(replica.idle_ms, 9),
                round(replica.communication_ms, 9),
                replica.peak_bytes,
                replica.capacity_bytes,
            )
            groups.setdefault(key, []).append(replica.replica)
        for (label, busy, idle, comm, peak, capacity), members in groups.items():
            table.add(
                str(rank.pipeline_rank),
                _ranges(members),
                label,
                duration_text(busy),
                duration_text(idle),
                duration_text(comm),
                bytes_text(peak),
                bytes_text(capacity),
            )
    return Document(title=title, sections=[summary, table])


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
    output: FormatOption = Format.text,
    profile_path: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="Also check that the plan's recorded timings follow from this profile (the "
            "plan is priced again); refuse to play them if not.",
        ),
    ] = None,
) -> None:
    """Play the plan's schedule replica by replica; compare with the plan's closed-form
    prediction."""
    check_outputs({"--trace": trace, "--png": png, "--out": out}, [plan_path])
    plan = read_plan(plan_path)
    if edited_since_costed(plan):
        raise InputError(stale_timings_message(str(plan_path)))
    if profile_path is not None:
        # Pricing imports the cost model and solvers: only when asked.
        from autoplan.inputs import read_profile
        from autoplan.price.staleness import timing_mismatch

        mismatch = timing_mismatch(plan, read_profile(profile_path))
        if mismatch is not None:
            raise InputError(
                f"{printable(str(plan_path))}: its recorded timings do not follow from "
                f"{printable(str(profile_path))} ({mismatch}); price it first: autoplan cost "
                f"{printable(str(plan_path))} --profile {printable(str(profile_path))} -o "
                "PRICED.json"
            )
    too_big = simulation_size_problem(plan)
    if too_big is not None:
        raise InputError(too_big)
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
    print_document(console, _simulation_document(plan, result, title), output.value)
    if trace is not None:
        with atomic_output(trace) as temporary:
            write_chrome_trace(temporary, result, title)
        console.print(f"wrote {trace} (Chrome trace: open in ui.perfetto.dev or chrome://tracing)")
    if png is not None:
        with atomic_output(png) as temporary:
            from autoplan.simulate.gantt import write_gantt_png  # matplotlib: only when drawn

            write_gantt_png(temporary, result, title)
        console.print(f"wrote {png}")
    if out is not None:
        write_json_model(out, result)
        console.print(f"wrote {out}")


@command("compare")
def compare(
    first: Annotated[Path, typer.Argument(help="The plan to compare against (A).")],
    second: Annotated[Path, typer.Argument(help="The other plan (B).")],
    output: FormatOption = Format.text,
) -> None:
    """Two plans side by side, with the ratio of their predicted throughput (B / A)."""
    plan_a = read_plan(first)
    plan_b = read_plan(second)
    names = (first.name, second.name) if first.name != second.name else (str(first), str(second))
    print_document(Console(), compare_document(plan_a, plan_b, names), output.value)
