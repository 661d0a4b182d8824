"""``autoplan run``: train a plan for a few steps on this machine and compare with its prediction.

``run --local`` starts the plan's processes here: one torchrun agent per plan node, all on
localhost, exactly as ``autoplan launch`` would start them on separate machines, so
heterogeneous plans (nodes with different process counts) run too. It then prints the measured
step time and memory beside the plan's prediction. A plan is checked first (as ``autoplan
validate`` does), and a plan whose model is a factory ('package.module:callable', code from
wherever the plan came from) runs only with ``--trust-factory`` or that factory named again.
When a worker fails, one line names its rank, node and last error line; the whole log stays
in a file. ``--data`` trains on a token file and ``--checkpoint-dir`` saves (and with
``--resume`` resumes) DCP checkpoints: the runtime's options of the same names.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoplan import limits
from autoplan.checks import check_factory_trust
from autoplan.cli.app import command
from autoplan.cli.launch_cmd import runtime_args
from autoplan.errors import InputError
from autoplan.files import check_outputs, read_json_model
from autoplan.inputs import read_plan
from autoplan.launch import node_launches
from autoplan.launch.local import agent_log_args, environment_for_local_run, run_agents
from autoplan.names import printable
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport

__all__ = [
    "MAX_LOCAL_PROCESSES",
    "measured_vs_predicted",
    "run_command",
    "run_local",
]

MAX_LOCAL_PROCESSES = 8
_MIB = 2**20


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def measured_vs_predicted(report: RunReport) -> Table:
    """The run's measured step time, throughput and peak memory beside the plan's prediction."""
    memory_note = (
        "CUDA max allocated"
        if report.memory_measure == "cuda_max_allocated"
        else "CPU peak RSS (Python + torch included)"
    )
    table = Table(
        title=f"{report.model}: {report.plan_summary} ({report.backend}, "
        f"{report.world_size} processes)"
    )
    table.add_column("")
    table.add_column("measured", justify="right")
    table.add_column("predicted", justify="right")
    table.add_column("note")
    table.add_row(
        "step time (ms)",
        f"{report.measured_step_time_ms:.1f}",
        f"{report.predicted_iteration_time_ms:.1f}",
        f"mean of {max(len(report.steps) - 1, 1)} step(s) after the first",
    )
    table.add_row(
        "  of which optimizer",
        f"{report.measured_optimizer_time_ms:.1f}",
        f"{report.predicted_optimizer_time_ms:.1f}",
        "slowest rank",
    )
    table.add_row(
        "tokens/s",
        f"{report.measured_tokens_per_s:,.0f}",
        f"{report.predicted_tokens_per_s:,.0f}",
        "",
    )
    table.add_row(
        "peak memory (MiB)",
        f"{report.measured_peak_memory_bytes / _MIB:.1f}",
        f"{report.predicted_peak_memory_bytes / _MIB:.1f}",
        f"largest rank; {memory_note}",
    )
    table.add_row(
        "model states (MiB)",
        f"{report.measured_model_state_bytes / _MIB:.3f}",
        f"{report.predicted_model_state_bytes / _MIB:.3f}",
        "largest rank; parameters + gradients + optimizer states",
    )
    table.add_row(
        "loss",
        f"{report.steps[0].loss:.4f} → {report.steps[-1].loss:.4f}",
        "",
        f"{len(report.steps)} step(s)",
    )
    return table


def run_local(
    plan: Plan,
    plan_path: Path,
    steps: int,
    report_path: Path,
    log_dir: Path,
    *,
    device: str = "cpu",
    extra_args: list[str] | None = None,
) -> None:
    """Start every plan node's torchrun on this machine and wait for all. Raises InputError
    (one line: the failed rank, its node, its last error line, where the log is) when a
    process fails; the agents' and workers' output is kept under ``log_dir``. ``extra_args``
    go to every process's ``python -m autoplan.runtime`` (data and checkpoint options)."""
    world = plan.world_size
    if world > MAX_LOCAL_PROCESSES:
        raise InputError(
            f"the plan needs {world} processes; run --local starts at most "
            f"{MAX_LOCAL_PROCESSES} on one machine (use `autoplan launch` for a cluster)"
        )
    # Checked here, before any process starts, so that a plan torch's pipelining would reject
    # or an unknown model fails as one line instead of an error from every rank.
    from autoplan.runtime.trainer import check_runnable

    check_runnable(plan)
    launches = node_launches(
        plan,
        str(plan_path.resolve()),
        "127.0.0.1",
        _free_port(),
        [
            *runtime_args(steps, str(report_path.resolve()), plan.inputs.model.name),
            *(extra_args or []),
        ],
        launcher=[sys.executable, "-m", "torch.distributed.run"],
        launcher_args={
            node.node_rank: agent_log_args(log_dir, node.node_rank) for node in plan.nodes
        },
    )
    result = run_agents(launches, environment_for_local_run(os.environ, device), log_dir)
    if result.failure is not None:
        raise InputError(f"{result.failure} (full log: {printable(str(result.log_path))})")


def _data_and_checkpoint_args(
    plan: Plan,
    data: Path | None,
    data_dtype: str | None,
    no_shuffle: bool,
    checkpoint_dir: Path | None,
    save_every: int | None,
    resume: bool,
) -> list[str]:
    """The runtime's data and checkpoint options, checked here first (the token file is
    opened, so a bad one is one line before any process starts)."""
    args: list[str] = []
    if data is None:
        if data_dtype is not None or no_shuffle:
            raise InputError("--data-dtype and --no-shuffle describe a --data file; give one")
    else:
        from autoplan.runtime.token_data import TokenSource, open_token_batches

        open_token_batches(plan, TokenSource(data, data_dtype, not no_shuffle), seed=1, rank=0)
        args += ["--data", str(data.resolve())]
        args += ["--data-dtype", data_dtype] if data_dtype else []
        args += ["--no-shuffle"] if no_shuffle else []
    if checkpoint_dir is None:
        if save_every is not None or resume:
            raise InputError("--save-every and --resume need --checkpoint-dir")
        return args
    if checkpoint_dir.exists() and not checkpoint_dir.is_dir():
        raise InputError(
            f"--checkpoint-dir {printable(str(checkpoint_dir))}: is a file; give a folder"
        )
    if not resume:
        from autoplan.runtime.checkpoint import latest_checkpoint

        # The runtime refuses this too, but only once every process has started.
        latest = latest_checkpoint(checkpoint_dir)
        if latest is not None:
            raise InputError(
                f"--checkpoint-dir {printable(str(checkpoint_dir))} holds checkpoints (the "
                f"latest after {latest[1].step} steps): pass --resume to continue from it, or "
                "give another folder"
            )
    args += ["--checkpoint-dir", str(checkpoint_dir.resolve())]
    args += ["--save-every", str(save_every)] if save_every is not None else []
    return args + (["--resume"] if resume else [])


@command("run")
def run_command(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON from `autoplan solve`.")],
    local: Annotated[
        bool, typer.Option("--local", help="Run every process of the plan on this machine.")
    ] = False,
    steps: Annotated[int, typer.Option(min=1, max=limits.MAX_STEPS, help="Training steps.")] = 5,
    report: Annotated[Path | None, typer.Option(help="Where to write the run report.")] = None,
    device: Annotated[
        str, typer.Option(help="'cpu' (gloo; the default) or 'auto' (CUDA when present).")
    ] = "cpu",
    trust_factory: Annotated[
        bool,
        typer.Option(
            "--trust-factory",
            help="Run a plan whose model is a factory: import and call the code it names.",
        ),
    ] = False,
    factory: Annotated[
        str | None,
        typer.Option(help="The factory ('package.module:callable') you expect the plan to name."),
    ] = None,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            help="Keep the processes' output here (default: a temporary folder, kept "
            "only when the run fails)."
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            help="Token file to train on: .npy, or raw .bin of token ids (default: synthetic)."
        ),
    ] = None,
    data_dtype: Annotated[
        str | None,
        typer.Option(
            help="Token dtype of a .bin (default: uint16 if the vocabulary fits, else uint32)."
        ),
    ] = None,
    no_shuffle: Annotated[
        bool, typer.Option("--no-shuffle", help="Read the samples in file order.")
    ] = False,
    checkpoint_dir: Annotated[
        Path | None,
        typer.Option(help="Save DCP checkpoints here (step-NNNNNNNN folders)."),
    ] = None,
    save_every: Annotated[
        int | None,
        typer.Option(min=1, help="Save every N steps (default: after the last step only)."),
    ] = None,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Start from the latest checkpoint in --checkpoint-dir (saved by any plan of "
            "the same model, dtype and batch); --steps counts from the start of training.",
        ),
    ] = False,
) -> None:
    """Train the plan for a few steps and print measured time and memory beside the prediction."""
    if not local:
        raise InputError(
            "autoplan run needs --local (this machine); for a cluster, write the per-node "
            "commands with `autoplan launch`"
        )
    if device not in ("cpu", "auto"):
        raise InputError(f"--device must be 'cpu' or 'auto'; got {device!r}")
    check_outputs({"--report": report}, [plan_path])
    if log_dir is not None and log_dir.exists() and not log_dir.is_dir():
        raise InputError(f"--log-dir {printable(str(log_dir))}: is a file; give a folder")
    plan = read_plan(plan_path)
    extra = _data_and_checkpoint_args(
        plan, data, data_dtype, no_shuffle, checkpoint_dir, save_every, resume
    )
    check_factory_trust(
        plan.inputs.model.name,
        trusted=trust_factory,
        named=factory,
        source=printable(str(plan_path)),
        action="run",
    )
    folder = log_dir or Path(tempfile.mkdtemp(prefix="autoplan-run-"))
    try:
        report_path = report or folder / "report.json"
        run_local(plan, plan_path, steps, report_path, folder, device=device, extra_args=extra)
        result = read_json_model(report_path, RunReport)
    except InputError:
        if log_dir is None and not (folder / "run.log").exists():
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if log_dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    console = Console()
    console.print(measured_vs_predicted(result))
    if result.executor == "async":  # it changes the optimisation: show how the loss went
        losses = ", ".join(f"{step.loss:.4f}" for step in result.steps)
        console.print(
            f"async_pb (asynchronous Pipelined Backpropagation, no flush, momentum SGD per "
            f"micro-batch): loss per step {losses}"
        )
    first = result.steps[0].step
    if first > 0:
        console.print(f"resumed after step {first} (steps {first + 1}-{result.steps[-1].step + 1})")
    if checkpoint_dir is not None:
        from autoplan.runtime.checkpoint import latest_checkpoint

        latest = latest_checkpoint(checkpoint_dir)
        if latest is not None:
            console.print(f"checkpoint: {printable(str(latest[0]))} (after step {latest[1].step})")
    if report is not None:
        console.print(f"report: {printable(str(report))}")
