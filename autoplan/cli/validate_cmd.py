"""``autoplan validate``: check a plan file against the rules every executable plan obeys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoplan.cli.app import command
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan
from autoplan.plan.validate import validate_plan
from autoplan.profile.schema import Profile

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
    """Check a plan independently of the solver: stages, rank layout, nodes, batch, memory."""
    plan = read_json_model(plan_path, Plan)
    profile = read_json_model(profile_path, Profile) if profile_path is not None else None
    validate_plan(plan, profile)
    checks = "with profile" if profile is not None else "without profile"
    typer.echo(
        f"{plan_path}: valid ({checks}): pp={plan.parallelism.pipeline_degree} "
        f"dp={plan.parallelism.data_parallel_degree} tp={plan.parallelism.tensor_parallel_degree}"
        f", {len(plan.rank_map)} ranks on {len(plan.nodes)} nodes"
    )
