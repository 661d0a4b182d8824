"""``autoplan export``: a plan as Megatron-LM's arguments, torchtitan's TOML or DeepSpeed's JSON.

A plan the target cannot run is refused in one line naming the part (exit 2, nothing
written); ``--best-expressible PROFILE`` re-solves within what the target runs, prints what
that costs, and exports that plan instead. Torch-free, like ``autoplan solve``.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import check_outputs, file_sha256, write_json_model, write_text_atomic
from autoplan.inputs import check_flags, read_plan, read_profile
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from autoplan.view.plan_tables import plan_precision_warnings

if TYPE_CHECKING:
    from autoplan.export.best import BestExpressible

__all__ = ["export_command"]


class Target(StrEnum):
    """The launchers a plan exports to."""

    megatron = "megatron"
    torchtitan = "torchtitan"
    deepspeed = "deepspeed"


def _profile_of(plan: Plan, path: Path, flag: str) -> tuple[Profile, str]:
    """The profile at ``path`` and its SHA-256, which must be the plan's."""
    profile = read_profile(path)
    sha = file_sha256(path)
    if sha != plan.inputs.profile_sha256:
        raise InputError(
            f"{flag} {printable(str(path))}: its SHA-256 {sha[:12]}... is not that of the profile "
            f"the plan was solved from ({printable(plan.inputs.profile_sha256[:12])}...)"
        )
    return profile, sha


def _shape_text(plan: Plan) -> str:
    par = plan.parallelism
    first = plan.stages[0]
    modes = ", ".join(dict.fromkeys(r.recompute for s in plan.stages for r in s.replicas))
    return (
        f"pp {par.pipeline_degree}, dp {first.data_parallel_degree}, tp "
        f"{first.replicas[0].tensor_parallel_degree}, {par.schedule}, recompute {modes}"
    )


def _cost_line(found: BestExpressible, launcher: str) -> str:
    """The cost of the target's restriction as the ratio of predicted iteration times."""
    if found.is_original:
        return (
            f"the plan itself is the best plan {launcher} runs: ratio 1.000 to the plan's "
            f"{found.original_ms:.1f} ms per iteration ({_shape_text(found.plan)})"
        )
    return (
        f"best plan {launcher} runs: {found.iteration_ms:.1f} ms per iteration, ratio "
        f"{found.ratio:.3f} to the plan's {found.original_ms:.1f} ms ({_shape_text(found.plan)})"
    )


@command("export")
def export_command(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON from `autoplan solve`.")],
    to: Annotated[Target, typer.Option("--to", help="The launcher to write for.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "--output", "-o", help="File to write (default: standard output, notes on stderr)."
        ),
    ] = None,
    profile: Annotated[
        Path | None,
        typer.Option(
            "--profile",
            help="The profile the plan was solved from: tells which layers are transformer "
            "blocks (needed for models outside the zoo).",
        ),
    ] = None,
    best: Annotated[
        Path | None,
        typer.Option(
            "--best-expressible",
            metavar="PROFILE",
            help="Re-solve within what the target runs (PROFILE: the profile the plan was "
            "solved from), print the cost of that restriction, and export that plan.",
        ),
    ] = None,
    plan_out: Annotated[
        Path | None,
        typer.Option("--plan-out", help="Also write the re-solved plan (with --best-expressible)."),
    ] = None,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds each re-solve may take.")
    ] = 60.0,
) -> None:
    """Write the launcher's own arguments or config for a plan (Megatron-LM: a bash array of
    arguments; torchtitan: TOML sections; DeepSpeed: config JSON)."""
    # PuLP and NumPy come with the solver: imported here, so that `autoplan --help` and the
    # small commands start without them.
    from autoplan.export import EXPORTERS, export_plan, layer_kinds
    from autoplan.export.best import best_expressible
    from autoplan.solve.options import SolveOptions

    check_flags(SolveOptions, {"--time-limit": ("time_limit_s", time_limit)})
    if plan_out is not None and best is None:
        raise InputError("--plan-out writes the re-solved plan: it needs --best-expressible")
    if profile is not None and best is not None:
        raise InputError("--best-expressible takes the profile itself: drop --profile")
    profile_path = best if best is not None else profile
    check_outputs({"--output": output, "--plan-out": plan_out}, [plan_path, profile_path])
    plan = read_plan(plan_path)
    target = to.value
    exporter = EXPORTERS[target]
    profile_model = None
    if profile_path is not None:
        flag = "--best-expressible" if best is not None else "--profile"
        profile_model, sha = _profile_of(plan, profile_path, flag)
    kinds = layer_kinds(plan, profile_model)
    messages: list[str] = []
    source = printable(str(plan_path))
    chosen = plan
    if best is not None and profile_model is not None:
        found = best_expressible(plan, profile_model, sha, target, time_limit)
        messages.append(_cost_line(found, exporter.launcher))
        chosen = found.plan
        if not found.is_original:
            source = f"the best {exporter.launcher} plan re-solved from {source}"
    result = export_plan(chosen, target, kinds, source)
    messages += [f"note: {note}" for note in result.notes]
    # A GPU type without tensor cores for the plan's dtype (V100 and bf16): the launcher
    # would run it as asked, slowly.
    messages += [f"note: {warning}" for warning in plan_precision_warnings(chosen)]
    # Everything is checked and built before the first byte is written.
    if plan_out is not None:
        write_json_model(plan_out, chosen)
        messages.append(f"wrote {printable(str(plan_out))}")
    if output is None:
        typer.echo(result.text, nl=False)
        for line in messages:
            typer.echo(line, err=True)
        return
    write_text_atomic(output, result.text)
    messages.append(f"wrote {printable(str(output))} ({exporter.launcher} {exporter.file_kind})")
    for line in messages:
        typer.echo(line)
