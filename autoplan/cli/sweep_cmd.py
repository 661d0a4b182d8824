"""``autoplan sweep``: one profile solved on a cluster scaled to several sizes, each run priced.

Prints one row per configuration (nodes × global batch); optionally writes them as CSV and
draws throughput and cost against cluster size as a PNG. How a cluster is scaled:
``autoplan.sweep.scale``; what a run costs: ``autoplan.sweep.runner``.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from autoplan import limits
from autoplan.cli.app import command, exit_fast_when_done
from autoplan.cli.view_cmd import Format, FormatOption
from autoplan.errors import InputError
from autoplan.files import atomic_output, check_outputs, file_sha256
from autoplan.inputs import (
    catalog_path,
    check_flags,
    cluster_path,
    engine_choice,
    read_cluster,
    read_profile,
)
from autoplan.names import shown

__all__ = ["sweep"]

DEFAULT_TIME_LIMIT_S = 20.0


def _int_list(flag: str, value: str) -> list[int]:
    """'4,8,16' → [4, 8, 16]; one InputError line naming the flag otherwise."""
    try:
        numbers = [int(part) for part in value.split(",")]
    except ValueError:
        raise InputError(
            f"{flag} takes comma-separated whole numbers, e.g. 4,8,16; got {shown(value)}"
        ) from None
    if len(numbers) > limits.MAX_SWEEP_CONFIGURATIONS:
        raise InputError(f"{flag} takes at most {limits.MAX_SWEEP_CONFIGURATIONS} values")
    return numbers


def _assignments(flag: str, values: list[str], unit: str) -> dict[str, float]:
    """'H100=2.5,L4=0.6' (also given as repeated flags) → {'H100': 2.5, 'L4': 0.6}."""
    out: dict[str, float] = {}
    for item in (part for value in values for part in value.split(",")):
        name, sep, number = item.partition("=")
        try:
            if not sep or not name:
                raise ValueError
            parsed = float(number)
        except ValueError:
            raise InputError(f"{flag} takes TYPE={unit}; got {shown(item)}") from None
        if name in out:
            raise InputError(f"{flag} gives {name} twice")
        out[name] = parsed
    return out


@contextlib.contextmanager
def _log_above_progress() -> Iterator[None]:
    """Log records (a solve's time-limit warning) go to ``sys.stderr`` as it is now: entered
    while a progress bar is live on a terminal, that is rich's proxy, which prints them above
    the bar instead of through it."""
    handlers = [
        handler
        for handler in logging.getLogger().handlers
        if type(handler) is logging.StreamHandler
    ]
    previous = [(handler, handler.setStream(sys.stderr)) for handler in handlers]
    try:
        yield
    finally:
        for handler, stream in previous:
            if stream is not None:
                handler.setStream(stream)


def _title(model: str, seq: int, cluster: str, mix: dict[str, float] | None, how: str) -> str:
    scaled = (
        "scaled proportionally"
        if mix is None
        else "scaled by GPU mix " + ", ".join(f"{gpu} {f:.0%}" for gpu, f in mix.items())
    )
    return f"{model} (seq {seq}) on {cluster}, {scaled}; {how}"


@command("sweep")
def sweep(
    profile_path: Annotated[Path, typer.Argument(help="Profile JSON from `autoplan profile`.")],
    cluster: Annotated[
        str,
        typer.Option(
            "--cluster", "-c", help="Cluster YAML, or a shipped example's name, to scale."
        ),
    ],
    nodes: Annotated[
        str,
        typer.Option(
            "--nodes",
            help="Cluster sizes in nodes, e.g. 4,8,16: each node group of the file scaled in "
            "proportion (largest remainder), or by --gpu-mix.",
        ),
    ],
    gpu_mix: Annotated[
        str | None,
        typer.Option(
            "--gpu-mix",
            help="TYPE=FRACTION,...: the fraction of the nodes of each GPU type (adding up to "
            "1; types left out get none) instead of the file's proportions.",
        ),
    ] = None,
    global_batch: Annotated[
        str | None,
        typer.Option(
            "--global-batch",
            help="Samples per iteration, e.g. 256 or 256,512 (each one with each size); "
            "default one sample per GPU of each configuration.",
        ),
    ] = None,
    tokens: Annotated[
        float | None,
        typer.Option("--tokens", help="Tokens the run trains on, e.g. 2e12; default 1e12."),
    ] = None,
    price: Annotated[
        list[str] | None,
        typer.Option(
            "--price",
            help="TYPE=USD_PER_HOUR per GPU (repeatable or comma-separated); give every type, "
            "idle GPUs are paid for too.",
        ),
    ] = None,
    csv: Annotated[Path | None, typer.Option("--csv", help="Write the rows as CSV.")] = None,
    png: Annotated[
        Path | None,
        typer.Option("--png", help="Draw throughput and cost against cluster size."),
    ] = None,
    space: Annotated[
        str, typer.Option("--space", help="heterogeneous or uniform (as for solve).")
    ] = "heterogeneous",
    strategy: Annotated[
        str, typer.Option("--strategy", help="optimal, megatron, even-split or data-parallel.")
    ] = "optimal",
    time_limit: Annotated[
        float, typer.Option("--time-limit", help="Seconds each configuration's search may take.")
    ] = DEFAULT_TIME_LIMIT_S,
    gap: Annotated[
        float,
        typer.Option(
            "--gap",
            help="Stop each search once its plan is proven within this fraction of optimal.",
        ),
    ] = 0.0,
    engine: Annotated[
        str,
        typer.Option(
            "--engine",
            help="The engine that will run the plans, whose costs each search minimises: "
            "autoplan or megatron-deepspeed (as for solve).",
        ),
    ] = "autoplan",
    output: FormatOption = Format.text,
) -> None:
    """Solve a profile on a cluster scaled to several sizes; print throughput, MFU, time to
    train and cost per configuration."""
    # Solving, sweeping and plotting pull in PuLP, NumPy and matplotlib: imported here, so
    # that `autoplan --help` and the small commands start without them.
    from autoplan.solve import SolveOptions
    from autoplan.sweep import DEFAULT_TRAIN_TOKENS, configurations, run_sweep
    from autoplan.sweep.csv_file import write_sweep_csv
    from autoplan.sweep.plot import write_sweep_png
    from autoplan.view import print_document
    from autoplan.view.sweep_table import sweep_document
    from autoplan.view.units import count_text

    tokens = DEFAULT_TRAIN_TOKENS if tokens is None else tokens
    check_flags(SolveOptions, {"--time-limit": ("time_limit_s", time_limit)})
    if not 0 <= gap < 1:
        raise InputError(f"--gap must be in [0, 1) (a fraction: 0.01 is 1%); got {gap:g}")
    node_counts = _int_list("--nodes", nodes)
    batches = None if global_batch is None else _int_list("--global-batch", global_batch)
    pairs = configurations(node_counts, batches)
    mix = None if gpu_mix is None else _assignments("--gpu-mix", [gpu_mix], "FRACTION")
    prices = _assignments("--price", price or [], "USD_PER_HOUR")
    cluster_file = cluster_path(cluster)
    check_outputs({"--csv": csv, "--png": png}, [profile_path, cluster_file, catalog_path()])
    profile = read_profile(profile_path)
    base = read_cluster(cluster_file)
    # The flags as typer gives them (the named choices as strings): the schema checks them.
    options = SolveOptions.model_validate(
        {
            "strategy": strategy,
            "space": space,
            "time_limit_s": time_limit,
            "gap": gap,
            "engine": engine_choice(engine),
            "top_k": 1,  # a sweep shows only each configuration's best
        }
    )
    sizes = ", ".join(str(n) for n in sorted(set(node_counts)))
    title = _title(
        profile.model.name,
        profile.seq_len,
        base.name,
        mix,
        f"{sizes} nodes; {strategy}, {time_limit:g} s per solve; {count_text(tokens)} tokens",
    )
    progress = Progress(
        TextColumn("sweep"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    # Added before the display starts, with its total: the first frame reads '0/N', never
    # '0/None' (nor an empty line).
    task = progress.add_task("", total=len(pairs))
    with progress, _log_above_progress():

        def report(done: int, total: int, label: str) -> None:
            progress.update(task, completed=done, description=label)

        rows = run_sweep(
            profile,
            base,
            node_counts,
            batches,
            gpu_mix=mix,
            train_tokens=tokens,
            prices=prices,
            options=options,
            profile_sha256=file_sha256(profile_path),
            progress=report,
        )
    console = Console()
    print_document(console, sweep_document(rows, title, prices), output.value)
    if csv is not None:
        write_sweep_csv(csv, rows)
        console.print(f"wrote {csv}")
    if png is not None:
        with atomic_output(png) as temporary:
            write_sweep_png(temporary, rows, title)
        console.print(f"wrote {png}")
    exit_fast_when_done()
