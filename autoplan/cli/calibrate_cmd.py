"""``autoplan calibrate``: run reports + the plans they ran → a catalog overlay of fitted GPU
types, for ``autoplan solve --catalog``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
import yaml
from rich.console import Console
from rich.table import Table

from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import read_json_model

__all__ = ["calibrate_command"]


def _console() -> Console:
    console = Console()
    return console if console.is_terminal else Console(width=140)


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
    console = _console()
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
