"""``autoplan solve``: profile + cluster → plan JSON, with a readable summary."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from autoplan.cli.app import command
from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.errors import InputError
from autoplan.files import file_sha256, read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, solve

__all__ = ["solve_command", "summary_tables"]

_GIB = 1024**3


def _console(stderr: bool = False) -> Console:
    console = Console(stderr=stderr)
    return console if console.is_terminal else Console(stderr=stderr, width=140)


def _cluster_path(value: str) -> Path:
    path = Path(value)
    if path.is_file() or path.suffix in (".yaml", ".yml") or "/" in value:
        return path
    return example_cluster_path(value)


def _layer_split(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        return [int(part) for part in value.split(",")]
    except ValueError:
        raise InputError(f"--layer-split must be comma-separated integers; got '{value}'") from None


def _efficiency(values: list[str]) -> dict[str, float]:
    out = {}
    for item in values:
        name, _, number = item.partition("=")
        try:
            out[name] = float(number)
        except ValueError:
            raise InputError(f"--efficiency takes GPU=FRACTION; got '{item}'") from None
    return out


def summary_tables(plan: Plan) -> list[Table]:
    """The plan's stages, prediction and memory as rich tables."""
    par = plan.parallelism
    pred = plan.prediction
    shares = par.replica_micro_batch_sizes
    mbs = str(shares[0]) if len(set(shares)) == 1 else ",".join(map(str, shares))
    stages = Table(
        title=f"{plan.inputs.model.name} on {plan.inputs.cluster.name} ({plan.inputs.strategy}): "
        f"pp={par.pipeline_degree} dp={par.data_parallel_degree} tp={par.tensor_parallel_degree} "
        f"{par.schedule}"
        + (f" v={par.virtual_stages_per_rank}" if par.virtual_stages_per_rank > 1 else "")
        + f" m={par.num_micro_batches} mbs={mbs} zero1={par.zero1}"
    )
    for column in ("stage", "rank", "layers", "GPU", "recompute", "fwd ms", "bwd ms", "send ms"):
        stages.add_column(column, justify="right" if "ms" in column else "left")
    for stage, timing in zip(plan.stages, pred.stage_timings, strict=False):
        stages.add_row(
            str(stage.index),
            str(stage.pipeline_rank),
            f"{stage.layer_start}-{stage.layer_end - 1}",
            ",".join(stage.gpu_types),
            stage.recompute,
            f"{timing.forward_ms:.2f}",
            f"{timing.backward_ms:.2f}",
            f"{timing.send_ms:.3f}",
        )
    summary = Table(title="prediction (one iteration)")
    summary.add_column("figure")
    summary.add_column("value", justify="right")
    summary.add_row("iteration", f"{pred.iteration_time_ms:.2f} ms")
    for name, value in pred.breakdown.model_dump().items():
        summary.add_row(f"  {name.removesuffix('_ms')}", f"{value:.2f} ms")
    summary.add_row("samples/s", f"{pred.samples_per_s:,.2f}")
    summary.add_row("tokens/s", f"{pred.tokens_per_s:,.0f}")
    summary.add_row("TFLOP/s per GPU", f"{pred.tflops_per_gpu:.1f}")
    summary.add_row("MFU", f"{pred.mfu:.1%}")
    memory = Table(title="memory per GPU (GiB)")
    for column in ("rank", "GPU", "weights", "grads", "optim", "activ", "transient", "total", "of"):
        memory.add_column(column, justify="left" if column in ("rank", "GPU") else "right")
    for mem in pred.memory:
        memory.add_row(
            str(mem.pipeline_rank),
            mem.gpu_type,
            *(
                f"{value / _GIB:.2f}"
                for value in (
                    mem.weights_bytes,
                    mem.gradients_bytes,
                    mem.optimizer_bytes,
                    mem.activations_bytes,
                    mem.transient_bytes,
                    mem.total_bytes,
                    mem.capacity_bytes,
                )
            ),
        )
    tables = [stages, summary, memory]
    if plan.alternatives:
        alternatives = Table(title="alternatives")
        for column in ("#", "configuration", "ms", "samples/s"):
            alternatives.add_column(
                column, justify="right" if column != "configuration" else "left"
            )
        for alt in plan.alternatives:
            alternatives.add_row(
                str(alt.rank),
                alt.summary,
                f"{alt.iteration_time_ms:.2f}",
                f"{alt.samples_per_s:.2f}",
            )
        tables.append(alternatives)
    return tables


@command("solve")
def solve_command(
    profile_path: Annotated[Path, typer.Argument(help="Profile JSON from `autoplan profile`.")],
    cluster: Annotated[
        str, typer.Option("--cluster", "-c", help="Cluster YAML, or a shipped example's name.")
    ],
    global_batch: Annotated[int, typer.Option("--global-batch", help="Samples per iteration.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Plan to write.")] = Path(
        "plan.json"
    ),
    tp: Annotated[int | None, typer.Option("--tp", help="Pin tensor parallelism.")] = None,
    pp: Annotated[int | None, typer.Option("--pp", help="Pin pipeline ranks.")] = None,
    dp: Annotated[int | None, typer.Option("--dp", help="Pin data-parallel replicas.")] = None,
    micro_batch_size: Annotated[
        int | None, typer.Option("--micro-batch-size", help="Pin samples per micro-batch.")
    ] = None,
    num_micro_batches: Annotated[
        int | None, typer.Option("--num-micro-batches", help="Pin micro-batches per iteration.")
    ] = None,
    schedule: Annotated[
        str | None, typer.Option("--schedule", help="gpipe, 1f1b or interleaved_1f1b.")
    ] = None,
    recompute: Annotated[
        str | None, typer.Option("--recompute", help="none, selective or full (every stage).")
    ] = None,
    zero1: Annotated[
        bool | None, typer.Option("--zero1/--no-zero1", help="Pin ZeRO-1 on or off.")
    ] = None,
    layer_split: Annotated[
        str | None, typer.Option("--layer-split", help="Layers per stage, e.g. '10,12,10'.")
    ] = None,
    strategy: Annotated[
        str, typer.Option("--strategy", help="optimal, megatron, even-split or data-parallel.")
    ] = "optimal",
    top_k: Annotated[int, typer.Option("--top-k", help="Alternatives to keep.")] = 3,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds the search may take.")
    ] = 60.0,
    efficiency: Annotated[
        list[str] | None,
        typer.Option("--efficiency", help="GPU=FRACTION, overriding the catalog (repeatable)."),
    ] = None,
) -> None:
    """Find the fastest executable plan for a profile on a cluster and write it as JSON."""
    profile = read_json_model(profile_path, Profile)
    cluster_model = load_cluster(_cluster_path(cluster))
    options = SolveOptions(
        tp=tp,
        pp=pp,
        dp=dp,
        micro_batch_size=micro_batch_size,
        num_micro_batches=num_micro_batches,
        schedule=schedule,  # type: ignore[arg-type]
        recompute=recompute,  # type: ignore[arg-type]
        zero1=zero1,
        layer_split=_layer_split(layer_split),
        strategy=strategy,  # type: ignore[arg-type]
        top_k=top_k,
        time_limit_s=time_limit,
        efficiency=_efficiency(efficiency or []),
    )
    with Progress(
        TextColumn("searching"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} candidates"),
        TimeElapsedColumn(),
        console=_console(stderr=True),
        transient=True,
    ) as progress:
        task = progress.add_task("search", total=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        plan = solve(
            profile,
            cluster_model,
            global_batch,
            options,
            profile_sha256=file_sha256(profile_path),
            progress=report,
        )
    write_json_model(output, plan)
    console = _console()
    for table in summary_tables(plan):
        console.print(table)
    over = [m for m in plan.prediction.memory if m.total_bytes > m.capacity_bytes]
    for mem in over:
        console.print(
            f"[bold red]warning:[/] pipeline rank {mem.pipeline_rank} needs "
            f"{mem.total_bytes / _GIB:.1f} GiB of {mem.capacity_bytes / _GIB:.1f} GiB on "
            f"{mem.gpu_type}"
        )
    console.print(f"wrote {output}")
