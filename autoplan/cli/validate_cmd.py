"""``autoplan validate``: check a plan file against the rules every executable plan obeys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoplan.checks import check_plan
from autoplan.cli.app import command
from autoplan.cli.inputs import read_profile
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan

__all__ = ["validate"]


@command("validate")
def validate(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON written by `autoplan solve`.")],
    profile_path: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="The profile JSON the plan was solved on: adds the tp-divisibility and "
            "memory-floor checks.",
        ),
    ] = None,
) -> None:
    """Check a plan independently of the solver: stages, replicas, ranks, nodes, batch, memory."""
    plan = read_json_model(plan_path, Plan)
    profile = read_profile(profile_path) if profile_path is not None else None
    check_plan(plan, profile)
    checks = "with profile" if profile is not None else "without profile"
    par = plan.parallelism
    typer.echo(
        f"{plan_path}: valid ({checks}): {len(plan.stages)} stages on {plan.world_size} GPUs "
        f"(pp={par.pipeline_degree}, {par.schedule}), {len(plan.nodes)} nodes"
    )
