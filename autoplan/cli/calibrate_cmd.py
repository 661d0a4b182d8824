"""``autoplan calibrate``: run reports + the plans they ran → a catalog overlay of fitted GPU
types, for ``autoplan solve --catalog``."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
import yaml
from rich.table import Table

from autoplan.cli.app import command, output_console
from autoplan.errors import InputError
from autoplan.files import read_json_model

if TYPE_CHECKING:
    from autoplan.calibrate.fidelity import FidelityReport
    from autoplan.profile.schema import Profile

__all__ = ["RunEngine", "calibrate_command", "fidelity_command"]


class RunEngine(StrEnum):
    """The engines ``autoplan.cost.engines`` knows (typer needs an enum for a choice)."""

    autoplan = "autoplan"
    megatron_deepspeed = "megatron-deepspeed"


@command("calibrate")
def calibrate_command(
    reports: Annotated[list[Path], typer.Argument(help="Run reports (autoplan run --report).")],
    plan: Annotated[
        list[Path],
        typer.Option(
            "--plan",
            help="The plan each report ran: once for all reports, or once per report in order.",
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Overlay YAML to write.")],
) -> None:
    """Fit per-GPU-type efficiency and step overhead to measured runs; write an overlay."""
    from autoplan.calibrate import calibrate
    from autoplan.cluster.catalog import CatalogOverlay
    from autoplan.plan.schema import Plan
    from autoplan.runtime.report import RunReport

    if len(plan) not in (1, len(reports)):
        raise InputError(
            f"give one --plan for all reports or one per report; got {len(plan)} plans for "
            f"{len(reports)} reports"
        )
    plans = [read_json_model(p, Plan) for p in plan]
    runs = [
        (plans[0] if len(plans) == 1 else plans[i], read_json_model(r, RunReport), str(r))
        for i, r in enumerate(reports)
    ]
    result = calibrate(runs)
    overlay = CatalogOverlay(
        source="autoplan calibrate from " + ", ".join(str(r) for r in reports),
        gpu_types=result.gpu_types,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(
        "# Fitted by autoplan calibrate; use with autoplan solve --catalog "
        + output.name
        + "\n"
        + yaml.safe_dump(overlay.model_dump(mode="json"), sort_keys=False)
    )
    table = Table(title="measured vs predicted, ms per step")
    for column in ("report", "GPU types", "schedule meas", "pred", "factor", "optim meas", "pred"):
        table.add_column(column, justify="left" if column in ("report", "GPU types") else "right")
    for c in result.comparisons:
        table.add_row(
            c.source,
            ",".join(c.gpu_types),
            f"{c.measured_schedule_ms:.2f}",
            f"{c.predicted_schedule_ms:.2f}",
            f"{c.compute_factor:.2f}",
            f"{c.measured_optimizer_ms:.2f}",
            f"{c.predicted_optimizer_ms:.2f}",
        )
    console = output_console()
    console.print(table)
    for spec in result.gpu_types:
        console.print(
            f"{spec.name}: efficiency {spec.efficiency}, by dtype {spec.efficiency_by_dtype}, "
            f"step overhead {spec.step_overhead_ms} ms"
        )
    for name in result.capped:
        console.print(
            f"note: {name} ran faster than its peak allows; its efficiency is capped at 1"
        )
    console.print(f"wrote {output}")


def _profiles(given: list[str]) -> dict[str, Profile]:
    """``--profile MODEL=PATH`` (or one ``PATH`` for every run) → {model: Profile}."""
    from autoplan.profile.schema import Profile

    out: dict[str, Profile] = {}
    for item in given:
        name, sep, path = item.rpartition("=")
        if not sep:
            name, path = "", item
        out[name] = read_json_model(path, Profile)
    return out


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _memory_table(report: FidelityReport) -> Table | None:
    """Peak memory per GPU, measured against predicted, for the runs that record it (None
    when none does)."""
    rows = [r for r in report.runs if r.measured_memory_gib is not None]
    if not rows:
        return None
    table = Table(
        title="peak memory per GPU, measured vs predicted (error: with reserve / measured - 1)"
    )
    for column in ("run", "plan", "measured GiB", "model GiB", "+ reserve GiB", "error"):
        table.add_column(column, justify="left" if column in ("run", "plan") else "right")
    for run in rows:
        table.add_row(
            run.run,
            run.stages,
            f"{run.measured_memory_gib:.2f}",
            f"{run.predicted_memory_gib:.2f}",
            f"{run.predicted_memory_with_reserve_gib:.2f}",
            _percent(run.memory_error),
        )
    return table


def _allreduce_table(report: FidelityReport) -> Table | None:
    """The gradient all-reduce alone, measured against the model's, for the runs that record
    it (None when none does): one term of the iteration checked by itself."""
    rows = [r for r in report.runs if r.measured_grad_allreduce_s is not None]
    if not rows:
        return None
    table = Table(title="gradient all-reduce, measured vs the model's (longest stage's, catalog)")
    for column in ("run", "plan", "measured ms", "model ms"):
        table.add_column(column, justify="left" if column in ("run", "plan") else "right")
    for run in rows:
        table.add_row(
            run.run,
            run.stages,
            f"{(run.measured_grad_allreduce_s or 0.0) * 1e3:.1f}",
            f"{run.predicted_grad_allreduce_s * 1e3:.1f}",
        )
    return table


@command("fidelity")
def fidelity_command(
    runs: Annotated[Path, typer.Argument(help="Measured runs (CSV: run, cluster_file, stages…).")],
    profile: Annotated[
        list[str] | None,
        typer.Option(
            "--profile",
            help="MODEL=PATH for each model of the table, or one PATH for every run "
            "(default: the shipped profiles/calibration/ ones of OPT-350, OPT-30, GPT-Neo-2.7B).",
        ),
    ] = None,
    layer_times: Annotated[
        Path | None,
        typer.Option(
            "--layer-times",
            help="Measured per-layer times (CSV/JSON) to attach for a second prediction.",
        ),
    ] = None,
    output: Annotated[
        Path | None, typer.Option("--output", "-o", help="Also write the report as JSON.")
    ] = None,
    engine: Annotated[
        RunEngine,
        typer.Option(
            "--engine",
            help="The engine that ran the runs: megatron-deepspeed (the published runs) or "
            "autoplan (runs of `autoplan run`).",
        ),
    ] = RunEngine.megatron_deepspeed,
) -> None:
    """Cost every measured run with its plan pinned; print predicted against measured."""
    from autoplan.calibrate.fidelity import fidelity_report
    from autoplan.calibrate.measured_runs import read_measured_runs
    from autoplan.files import write_json_model

    report = fidelity_report(
        read_measured_runs(runs),
        _profiles(profile or []),
        layer_times,
        engine.value,
    )
    if output is not None:
        write_json_model(output, report)
    table = Table(title="iteration time, measured vs predicted (error: predicted / measured - 1)")
    columns = ["run", "site", "plan", "m", "measured s", "catalog s", "error"]
    if layer_times is not None:
        columns += ["with layers s", "error"]
    # The runs' own simulator, from the same per-layer table: how close composition gets.
    reference = any(run.reference_simulator_s is not None for run in report.runs)
    if reference:
        columns += ["reference s", "error"]
    for column in columns:
        table.add_column(column, justify="left" if column in ("run", "site", "plan") else "right")
    for run in report.runs:
        cells = [
            run.run,
            run.site,
            run.stages,
            str(run.num_micro_batches),
            f"{run.measured_s:.3f}",
            f"{run.catalog_s:.3f}",
            _percent(run.catalog_error),
        ]
        if layer_times is not None:
            cells += [
                "-" if run.measured_layers_s is None else f"{run.measured_layers_s:.3f}",
                _percent(run.measured_layers_error),
            ]
        if reference:
            cells += [
                "-" if run.reference_simulator_s is None else f"{run.reference_simulator_s:.3f}",
                _percent(run.reference_simulator_error),
            ]
        table.add_row(*cells)
    memory = _memory_table(report)
    allreduce = _allreduce_table(report)
    summary = Table(title="median |error| and worst error")
    columns = ["group", "runs", "catalog median", "worst", "with layers median", "worst"]
    if reference:
        columns += ["reference median", "worst"]
    if memory is not None:
        columns += ["memory median", "worst"]
    for column in columns:
        summary.add_column(column, justify="left" if column == "group" else "right")
    for s in report.summaries:
        cells = [
            s.group,
            str(s.runs),
            f"{s.catalog_median_abs_error:.1%}",
            _percent(s.catalog_worst_error),
            "-"
            if s.measured_layers_median_abs_error is None
            else f"{s.measured_layers_median_abs_error:.1%}",
            _percent(s.measured_layers_worst_error),
        ]
        if reference:
            cells += [
                "-"
                if s.reference_median_abs_error is None
                else f"{s.reference_median_abs_error:.1%}",
                _percent(s.reference_worst_error),
            ]
        if memory is not None:
            cells += [
                "-" if s.memory_median_abs_error is None else f"{s.memory_median_abs_error:.1%}",
                _percent(s.memory_worst_error),
            ]
        summary.add_row(*cells)
    console = output_console()
    console.print(table)
    if memory is not None:
        console.print(memory)
    if allreduce is not None:
        console.print(allreduce)
    console.print(summary)
    if output is not None:
        console.print(f"wrote {output}")
