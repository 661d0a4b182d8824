"""``autoplan validate``: check a plan file against the rules every executable plan obeys."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autoplan.checks import check_plan
from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.inputs import read_profile
from autoplan.names import printable
from autoplan.plan.fingerprint import edited_since_costed, stale_timings_message
from autoplan.plan.schema import Plan
from autoplan.view.units import counted

__all__ = ["validate"]


@command("validate")
def validate(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON written by `autoplan solve`.")],
    profile_path: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="The profile JSON the plan was solved on: adds the tp-divisibility and "
            "memory-floor checks, and prices the plan again to check its recorded timings.",
        ),
    ] = None,
) -> None:
    """Check a plan independently of the solver: stages, replicas, ranks, nodes, batch, memory."""
    # Pricing the plan again needs the cost model (NumPy): imported only here.
    from autoplan.price.staleness import timing_mismatch

    plan = read_json_model(plan_path, Plan)
    profile = read_profile(profile_path) if profile_path is not None else None
    check_plan(plan, profile)
    if edited_since_costed(plan):
        raise InputError(stale_timings_message(str(plan_path)))
    if profile is not None:
        mismatch = timing_mismatch(plan, profile)
        if mismatch is not None:
            raise InputError(
                f"{printable(str(plan_path))}: its timings do not follow from "
                f"{printable(str(profile_path))} ({mismatch}; an --efficiency given to solve "
                f"is not recorded); price it again: autoplan cost {printable(str(plan_path))} "
                f"--profile {printable(str(profile_path))} -o PRICED.json"
            )
    checks = "with profile, timings recomputed" if profile is not None else "without profile"
    par = plan.parallelism
    typer.echo(
        f"{plan_path}: valid ({checks}): {counted(len(plan.stages), 'stage')} on "
        f"{counted(plan.world_size, 'GPU')} (pp={par.pipeline_degree}, {par.schedule}), "
        f"{counted(len(plan.nodes), 'node')}"
    )
