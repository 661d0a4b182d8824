"""``autoplan solve``: profile + cluster → plan JSON, with a readable summary."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated

import typer
from rich.progress import (
    BarColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
)
from rich.text import Text

from autoplan import limits
from autoplan.cli.app import command, exit_fast_when_done, output_console
from autoplan.errors import InputError
from autoplan.files import check_outputs, file_sha256, write_json_model
from autoplan.inputs import (
    catalog_path,
    check_bounds,
    check_flags,
    cluster_path,
    engine_choice,
    read_cluster,
    read_profile,
)
from autoplan.limits import GIB
from autoplan.plan.schema import PlanInputs
from autoplan.view import print_document, solve_summary
from autoplan.view.units import duration_text

__all__ = ["solve_command"]


class _SearchColumn(ProgressColumn):
    """Incumbent, bound and gap of a search running longer than a second (``solve.progress``:
    the families' own figures; the plan records the certificate once the search ends)."""

    def render(self, task: Task) -> Text:
        state = task.fields.get("state")
        if state is None or state.elapsed_s < 1.0:
            return Text("")
        parts = []
        if math.isfinite(state.incumbent_ms):
            parts.append(f"best {duration_text(state.incumbent_ms)}")
        if state.bound_ms > 0:
            parts.append(f"bound {duration_text(state.bound_ms)}")
        if state.gap is not None:
            parts.append(f"gap {state.gap:.1%}")
        return Text("  ".join(parts))


def _layer_split(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        split = [int(part) for part in value.split(",")]
    except ValueError:
        raise InputError(f"--layer-split must be comma-separated integers; got {value!r}") from None
    if len(split) > limits.MAX_LAYERS or not all(1 <= n <= limits.MAX_LAYERS for n in split):
        raise InputError(f"--layer-split takes 1 to {limits.MAX_LAYERS} layers per stage")
    return split


def _efficiency(values: list[str]) -> dict[str, float]:
    out = {}
    for item in values:
        name, _, number = item.partition("=")
        try:
            out[name] = float(number)
            check_bounds({f"--efficiency {name}": (out[name], 1e-6, 1.0)})
        except ValueError:
            raise InputError(f"--efficiency takes GPU=FRACTION; got '{item}'") from None
    return out


def _check_sizes(
    global_batch: int,
    tp: int | None,
    pp: int | None,
    dp: int | None,
    micro_batch_size: int | None,
    num_micro_batches: int | None,
    top_k: int,
    time_limit: float,
) -> None:
    """Every number the user gives within the bounds its schema field declares (one line
    naming the flag), before any file is read."""
    from autoplan.solve.options import SolveOptions

    check_flags(PlanInputs, {"--global-batch": ("global_batch_size", global_batch)})
    check_flags(
        SolveOptions,
        {
            "--tp": ("tp", tp),
            "--pp": ("pp", pp),
            "--dp": ("dp", dp),
            "--micro-batch-size": ("micro_batch_size", micro_batch_size),
            "--num-micro-batches": ("num_micro_batches", num_micro_batches),
            "--top-k": ("top_k", top_k),
            "--time-limit": ("time_limit_s", time_limit),
        },
    )


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
        int | None,
        typer.Option(
            "--micro-batch-size",
            help="Pin the micro-batch size per replica (samples each replica runs per "
            "micro-batch, as Megatron-LM's --micro-batch-size).",
        ),
    ] = None,
    num_micro_batches: Annotated[
        int | None, typer.Option("--num-micro-batches", help="Pin micro-batches per iteration.")
    ] = None,
    schedule: Annotated[
        str | None,
        typer.Option(
            "--schedule",
            help="gpipe, 1f1b, interleaved_1f1b, interleaved_zero_bubble, zbv or dualpipev.",
        ),
    ] = None,
    recompute: Annotated[
        str | None, typer.Option("--recompute", help="none, selective or full (every stage).")
    ] = None,
    zero1: Annotated[
        bool | None, typer.Option("--zero1/--no-zero1", help="Pin ZeRO-1 on or off.")
    ] = None,
    zero: Annotated[
        int | None,
        typer.Option(
            "--zero",
            min=0,
            max=3,
            help="Pin the ZeRO level of stages with several replicas: 0, 1 (optimizer "
            "states), 2 (+ gradients) or 3 (+ parameters). Default: searched per stage.",
        ),
    ] = None,
    offload: Annotated[
        bool | None,
        typer.Option("--offload/--no-offload", help="Pin activation offload on or off."),
    ] = None,
    sequence_parallel: Annotated[
        bool | None,
        typer.Option("--sp/--no-sp", help="Pin sequence parallelism (with tp) on or off."),
    ] = None,
    expert_parallel: Annotated[
        int | None,
        typer.Option(
            "--ep",
            min=1,
            help="Pin the expert-parallel degree of every stage (mixture-of-experts models; "
            "1: none). Default: searched over the divisors of the experts.",
        ),
    ] = None,
    experts_by_speed: Annotated[
        bool,
        typer.Option(
            "--experts-by-speed/--even-experts",
            help="Search expert groups spanning a mixed stage's GPU types with experts placed "
            "by speed (the default), or keep every expert group one type with experts even "
            "(what the Megatron-LM export can write).",
        ),
    ] = True,
    context_parallel: Annotated[
        int | None,
        typer.Option(
            "--cp",
            min=1,
            help="Pin the context-parallel degree of every stage (ring attention over cp GPUs "
            "of a node; 1: none). Default: searched for sequences of 8192 tokens or more.",
        ),
    ] = None,
    layer_split: Annotated[
        str | None, typer.Option("--layer-split", help="Layers per stage, e.g. '10,12,10'.")
    ] = None,
    strategy: Annotated[
        str, typer.Option("--strategy", help="optimal, megatron, even-split or data-parallel.")
    ] = "optimal",
    space: Annotated[
        str,
        typer.Option(
            "--space",
            help="heterogeneous (each stage its own GPU types, tp, replicas and shares) or "
            "uniform (one (dp, tp) for every stage, one GPU type per stage).",
        ),
    ] = "heterogeneous",
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="The engine that will run the plan, whose costs the search minimises: "
            "autoplan (torchrun of the plan; DDP hides the gradient all-reduce behind the last "
            "backward) or megatron-deepspeed (its all-reduce after the last backward).",
        ),
    ] = "autoplan",
    top_k: Annotated[int, typer.Option("--top-k", help="Alternatives to keep.")] = 3,
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds the search may take.")
    ] = 60.0,
    zero_bubble: Annotated[
        bool,
        typer.Option(
            "--zero-bubble/--no-zero-bubble",
            help="Also try the zero-bubble schedules at the best pipelines found. They are "
            "not searched over partitions, so with them the proven bound is only the work "
            "bound; without them the bound covers the whole space searched.",
        ),
    ] = True,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress line on stderr.")
    ] = False,
    gap: Annotated[
        float,
        typer.Option(
            "--gap",
            help="Stop once the plan is proven within this fraction of optimal (0.01: 1%%); "
            "0 searches until proven optimal or the time limit.",
        ),
    ] = 0.0,
    efficiency: Annotated[
        list[str] | None,
        typer.Option("--efficiency", help="GPU=FRACTION, overriding the catalog (repeatable)."),
    ] = None,
    reserve_gb: Annotated[
        float | None,
        typer.Option(
            "--reserve-gb", help="GB kept free on every GPU (CUDA context, NCCL, fragmentation)."
        ),
    ] = None,
    catalog: Annotated[
        list[Path] | None,
        typer.Option(
            "--catalog",
            help="Catalog overlay YAML (e.g. from `autoplan calibrate`) whose GPU types replace "
            "the catalog's (repeatable; later files win).",
        ),
    ] = None,
    allow_async: Annotated[
        bool,
        typer.Option(
            "--allow-async",
            help="Also cost async_pb (asynchronous Pipelined Backpropagation, which changes "
            "the optimisation) and report it beside the best synchronous plan.",
        ),
    ] = False,
    async_output: Annotated[
        Path | None,
        typer.Option(
            "--async-output",
            help="With --allow-async: also write the async alternative as a plan (schedule "
            "async_pb) that `autoplan run` trains.",
        ),
    ] = None,
) -> None:
    """Find the fastest executable plan for a profile on a cluster and write it as JSON."""
    # PuLP and NumPy come with the solver: imported here, so that `autoplan --help` and the
    # small commands start without them.
    from autoplan.solve import SolveOptions, solve_outcome
    from autoplan.solve.async_pb import async_line
    from autoplan.solve.progress import SearchProgress, watching

    _check_sizes(global_batch, tp, pp, dp, micro_batch_size, num_micro_batches, top_k, time_limit)
    if not 0 <= gap < 1:
        raise InputError(f"--gap must be in [0, 1) (a fraction: 0.01 is 1%); got {gap:g}")
    cluster_file = cluster_path(cluster)
    inputs = [profile_path, cluster_file, catalog_path(), *(catalog or [])]
    if async_output is not None and not allow_async:
        raise InputError("--async-output needs --allow-async")
    check_outputs({"--output": output, "--async-output": async_output}, inputs)
    profile = read_profile(profile_path)
    cluster_model = read_cluster(cluster_file, catalog or [])
    # The flags as typer gives them (the named choices as strings): the schema checks them.
    options = SolveOptions.model_validate(
        {
            "tp": tp,
            "pp": pp,
            "dp": dp,
            "micro_batch_size": micro_batch_size,
            "num_micro_batches": num_micro_batches,
            "schedule": schedule,
            "recompute": recompute,
            "zero1": zero1,
            "zero_stage": zero,
            "offload": offload,
            "sequence_parallel": sequence_parallel,
            "expert_parallel": expert_parallel,
            "experts_by_speed": experts_by_speed,
            "cp": context_parallel,
            "layer_split": _layer_split(layer_split),
            "strategy": strategy,
            "space": space,
            "engine": engine_choice(engine),
            "top_k": top_k,
            "time_limit_s": time_limit,
            "gap": gap,
            "zero_bubble": zero_bubble,
            "efficiency": _efficiency(efficiency or []),
            "reserve_gb": reserve_gb,
            "allow_async": allow_async,
        }
    )
    errors = output_console(stderr=True)
    with Progress(
        TextColumn("searching"),
        BarColumn(bar_width=20),
        TextColumn("{task.fields[where]}"),
        _SearchColumn(),
        TimeElapsedColumn(),
        console=errors,
        transient=True,
        # Quiet where nobody watches (a pipe, a file, CI) and under --quiet.
        disable=quiet or not errors.is_terminal,
    ) as progress:
        # No count until the search knows its total (a first frame of '0/None' says nothing).
        task = progress.add_task("search", total=None, where="", state=None)

        def report(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, where=f"{done}/{total}")

        def changed(state: SearchProgress) -> None:
            progress.update(task, state=state)

        with watching(changed):
            outcome = solve_outcome(
                profile,
                cluster_model,
                global_batch,
                options,
                profile_sha256=file_sha256(profile_path),
                progress=report,
            )
    plan = outcome.plan
    write_json_model(output, plan)
    console = output_console()
    print_document(console, solve_summary(plan))
    over = [
        m for m in plan.prediction.memory if m.total_bytes + m.reserved_bytes > m.capacity_bytes
    ]
    for mem in over:
        console.print(
            f"[bold red]warning:[/] pipeline rank {mem.pipeline_rank} needs "
            f"{mem.total_bytes / GIB:.1f} GiB of {mem.capacity_bytes / GIB:.1f} GiB on "
            f"{mem.gpu_type}"
        )
    if allow_async:
        console.print(async_line(plan))
    if async_output is not None and outcome.async_plan is not None:
        write_json_model(async_output, outcome.async_plan)
        console.print(f"wrote {async_output} (async_pb)")
    console.print(f"wrote {output} (solved in {outcome.elapsed_s:.2f} s)")
    exit_fast_when_done()
