"""``autoplan launch`` (per-node torchrun commands and a Slurm script) and ``autoplan run``.

``launch`` only writes files and imports no torch. ``run --local`` starts the plan's processes
on this machine: one torchrun agent per plan node, all on localhost, exactly as ``launch``
would start them on separate machines, so heterogeneous plans (nodes with different process
counts) run too. It then prints the measured step time and memory beside the plan's prediction.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import read_json_model
from autoplan.launch import node_launches, slurm_script
from autoplan.launch.torchrun import DEFAULT_MASTER_PORT
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport

__all__ = [
    "MAX_LOCAL_PROCESSES",
    "launch_command",
    "measured_vs_predicted",
    "run_command",
    "run_local",
]

MAX_LOCAL_PROCESSES = 8
_MIB = 2**20


def _runtime_args(steps: int, report: str | None) -> list[str]:
    return ["--steps", str(steps), *(["--report", report] if report else []), "--verbose"]


@command("launch")
def launch_command(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON from `autoplan solve`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the scripts.")],
    master_addr: Annotated[
        str | None,
        typer.Option(help="Address of node rank 0 (the rendezvous); default $MASTER_ADDR."),
    ] = None,
    master_port: Annotated[int, typer.Option(help="Rendezvous port.")] = DEFAULT_MASTER_PORT,
    steps: Annotated[int, typer.Option(help="Training steps.")] = 100,
    report: Annotated[str | None, typer.Option(help="Run report path (rank 0).")] = None,
) -> None:
    """Write one torchrun script per plan node (launch order) and a Slurm batch script."""
    plan = read_json_model(plan_path, Plan)
    output.mkdir(parents=True, exist_ok=True)
    runtime_args = _runtime_args(steps, report)
    address = master_addr or "MASTER"
    for launch in node_launches(plan, plan_path.name, address, master_port, runtime_args):
        command_line = launch.command
        header = ["#!/bin/bash", "set -euo pipefail"]
        if master_addr is None:
            first = min(plan.nodes, key=lambda node: node.node_rank).name
            command_line = command_line.replace(
                "--master-addr=MASTER", '--master-addr="$MASTER_ADDR"'
            )
            header.append(f': "${{MASTER_ADDR:?set MASTER_ADDR to the address of {first}}}"')
        node = launch.node
        script = output / f"node{node.node_rank}-{node.name}.sh"
        script.write_text(
            "\n".join(
                [
                    *header,
                    f"# Node rank {node.node_rank}: {node.name}, {node.nproc_per_node} × "
                    f"{node.gpu_type}. Run from the folder holding {plan_path.name}.",
                    command_line,
                    "",
                ]
            )
        )
        script.chmod(0o755)
        typer.echo(f"{script}: {command_line}")
    slurm = output / "launch.slurm"
    slurm.write_text(
        slurm_script(
            plan,
            plan_path.name,
            master_port,
            runtime_args,
            job_name=f"autoplan-{plan.inputs.model.name}",
        )
    )
    typer.echo(f"{slurm}: sbatch {slurm.name}")


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
    plan: Plan, plan_path: Path, steps: int, report_path: Path, *, device: str = "cpu"
) -> int:
    """Start every plan node's torchrun on this machine and wait for all; returns 0, or the
    exit code of the first agent that failed (the others are then stopped)."""
    world = plan.parallelism.world_size
    if world > MAX_LOCAL_PROCESSES:
        raise InputError(
            f"the plan needs {world} processes; run --local starts at most "
            f"{MAX_LOCAL_PROCESSES} on one machine (use `autoplan launch` for a cluster)"
        )
    # Checked here, before any process starts, so that a plan torch's pipelining would reject
    # or an unknown model fails as one line instead of an error from every rank.
    from autoplan.runtime.trainer import check_runnable

    check_runnable(plan)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    env.pop("MASTER_ADDR", None)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    launches = node_launches(
        plan,
        str(plan_path),
        "127.0.0.1",
        _free_port(),
        _runtime_args(steps, str(report_path)),
        launcher=[sys.executable, "-m", "torch.distributed.run"],
    )
    agents = [subprocess.Popen(launch.argv, env=env) for launch in launches]
    try:
        # Polled together: a failed node would leave the others waiting on it until a timeout.
        while True:
            codes = [agent.poll() for agent in agents]
            failed = next((code for code in codes if code not in (None, 0)), None)
            if failed is not None or all(code == 0 for code in codes):
                return failed or 0
            time.sleep(0.2)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()
                agent.wait()


@command("run")
def run_command(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON from `autoplan solve`.")],
    local: Annotated[
        bool, typer.Option("--local", help="Run every process of the plan on this machine.")
    ] = False,
    steps: Annotated[int, typer.Option(help="Training steps.")] = 5,
    report: Annotated[Path | None, typer.Option(help="Where to write the run report.")] = None,
    device: Annotated[
        str, typer.Option(help="'cpu' (gloo; the default) or 'auto' (CUDA when present).")
    ] = "cpu",
) -> None:
    """Train the plan for a few steps and print measured time and memory beside the prediction."""
    if not local:
        raise InputError(
            "autoplan run needs --local (this machine); for a cluster, write the per-node "
            "commands with `autoplan launch`"
        )
    if device not in ("cpu", "auto"):
        raise InputError(f"--device must be 'cpu' or 'auto'; got '{device}'")
    if steps < 1:
        raise InputError(f"--steps must be >= 1; got {steps}")
    plan = read_json_model(plan_path, Plan)
    with tempfile.TemporaryDirectory() as scratch:
        report_path = report or Path(scratch) / "report.json"
        code = run_local(plan, plan_path, steps, report_path, device=device)
        if code != 0:
            typer.echo(f"error: the run failed (torchrun exited with {code}; see above)", err=True)
            raise typer.Exit(1)
        result = read_json_model(report_path, RunReport)
    console = Console()
    console.print(measured_vs_predicted(result))
    if report is not None:
        console.print(f"report: {report}")
