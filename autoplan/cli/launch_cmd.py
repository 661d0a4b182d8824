"""``autoplan launch``: per-node torchrun scripts and a Slurm batch script for a plan.

It only writes files and imports no torch. The plan is checked first (as ``autoplan validate``
does), so every name a script holds is a node or GPU type of a checked cluster; all the rest
(paths, addresses) is shell-quoted. The scripts name the plan by its absolute path.
"""

from __future__ import annotations

import hashlib
import os
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer

from autoplan import limits
from autoplan.checks import check_factory_trust, check_runtime_engine, is_factory_name
from autoplan.cli.app import command
from autoplan.errors import InputError
from autoplan.files import check_output_path, write_text_atomic
from autoplan.inputs import read_plan, safe_host
from autoplan.launch.slurm import slurm_script
from autoplan.launch.torchrun import (
    DEFAULT_MASTER_PORT,
    Expand,
    RendezvousBackend,
    node_environment,
    node_launches,
)
from autoplan.names import check_name, is_safe_name, job_label, printable, shown

__all__ = ["launch_command", "runtime_args"]


class Rendezvous(StrEnum):
    static = "static"
    c10d = "c10d"


def runtime_args(steps: int, report: str | None, model: str = "") -> list[str]:
    """The arguments of ``python -m autoplan.runtime`` after the plan path; a factory ``model``
    (trusted already: ``check_factory_trust``) is named again, which the runtime requires."""
    factory = ["--factory", model] if is_factory_name(model) else []
    return ["--steps", str(steps), *(["--report", report] if report else []), *factory, "--verbose"]


def _data_and_checkpoint_args(
    data: str | None,
    data_dtype: str | None,
    no_shuffle: bool,
    checkpoint_dir: str | None,
    save_every: int | None,
    resume: bool,
) -> list[str]:
    """The runtime's data and checkpoint options for the scripts. The paths are the nodes'
    (not checked here, where they may not exist); the scripts quote them."""
    from autoplan.runtime.__main__ import TOKEN_DTYPES  # torch-free

    for flag, path in (("--data", data), ("--checkpoint-dir", checkpoint_dir)):
        if path is not None and (not path or not path.isprintable()):
            raise InputError(f"{flag} {shown(path)} is not a usable path")
    if data_dtype is not None and data_dtype not in TOKEN_DTYPES:
        raise InputError(
            f"--data-dtype {shown(data_dtype)}: not a token dtype (one of "
            f"{', '.join(TOKEN_DTYPES)})"
        )
    if data is None and (data_dtype is not None or no_shuffle):
        raise InputError("--data-dtype and --no-shuffle describe a --data file; give one")
    if checkpoint_dir is None and (save_every is not None or resume):
        raise InputError("--save-every and --resume need --checkpoint-dir")
    args: list[str] = []
    if data is not None:
        args += ["--data", data, *(["--data-dtype", data_dtype] if data_dtype else [])]
        args += ["--no-shuffle"] if no_shuffle else []
    if checkpoint_dir is not None:
        args += ["--checkpoint-dir", checkpoint_dir]
        args += ["--save-every", str(save_every)] if save_every is not None else []
        args += ["--resume"] if resume else []
    return args


def _by_gpu_type(values: list[str], flag: str, gpu_types: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        gpu_type, sep, name = item.partition("=")
        if not sep or not is_safe_name(name):
            raise InputError(
                f"{flag} takes GPU_TYPE=NAME (NAME: letters, digits, '-', '_', '.'); "
                f"got {shown(item)}"
            )
        if gpu_type not in gpu_types:
            raise InputError(
                f"{flag} {shown(item)}: the plan uses no GPU type {shown(gpu_type)} "
                f"(it uses {', '.join(sorted(gpu_types))})"
            )
        out[gpu_type] = name
    return out


def _plan_id(path: Path) -> str:
    """A rendezvous id all nodes derive alike from the plan file's bytes."""
    return "autoplan-" + hashlib.sha256(path.read_bytes()).hexdigest()[:12]


def _script_name(node_rank: int, name: str) -> str:
    # Node names are checked names (no '/'); checked again here because it becomes a path.
    return f"node{node_rank}-{check_name(name, 'node name')}.sh"


@command("launch")
def launch_command(
    plan_path: Annotated[Path, typer.Argument(help="Plan JSON from `autoplan solve`.")],
    output: Annotated[Path, typer.Option("--output", "-o", help="Folder for the scripts.")],
    master_addr: Annotated[
        str | None,
        typer.Option(help="Address of node rank 0 (the rendezvous); default $MASTER_ADDR."),
    ] = None,
    master_port: Annotated[
        int, typer.Option(min=1, max=65535, help="Rendezvous port.")
    ] = DEFAULT_MASTER_PORT,
    rdzv_backend: Annotated[
        Rendezvous,
        typer.Option(
            "--rdzv-backend",
            help="static (node ranks from --node-rank) or c10d (nodes meet at node 0; the "
            "runtime maps plan nodes by AUTOPLAN_NODE_RANK, not by arrival).",
        ),
    ] = Rendezvous.static,
    steps: Annotated[int, typer.Option(min=1, max=limits.MAX_STEPS, help="Training steps.")] = 100,
    report: Annotated[str | None, typer.Option(help="Run report path (rank 0).")] = None,
    cpus_per_task: Annotated[
        int | None,
        typer.Option(
            "--cpus-per-task",
            min=1,
            max=limits.MAX_CPUS_PER_TASK,
            help="CPUs of one node's torchrun under Slurm (default 4 per GPU process).",
        ),
    ] = None,
    gres: Annotated[
        list[str] | None,
        typer.Option(help="GPU_TYPE=NAME: the site's GRES type name of a GPU type (repeatable)."),
    ] = None,
    no_gres: Annotated[
        bool, typer.Option("--no-gres", help="Request no GRES (select nodes by --constraint).")
    ] = False,
    constraint: Annotated[
        list[str] | None,
        typer.Option(help="GPU_TYPE=FEATURE: a Slurm node feature for that type (repeatable)."),
    ] = None,
    trust_factory: Annotated[
        bool,
        typer.Option(
            "--trust-factory", help="Allow a plan whose model is a factory (code it names)."
        ),
    ] = False,
    factory: Annotated[
        str | None, typer.Option(help="The factory you expect the plan to name (trusts it).")
    ] = None,
    data: Annotated[
        str | None,
        typer.Option(help="Token file (.npy or .bin) as the nodes see it (default: synthetic)."),
    ] = None,
    data_dtype: Annotated[
        str | None, typer.Option(help="Token dtype of a .bin (default: from the vocabulary).")
    ] = None,
    no_shuffle: Annotated[
        bool, typer.Option("--no-shuffle", help="Read the samples in file order.")
    ] = False,
    checkpoint_dir: Annotated[
        str | None,
        typer.Option(help="Checkpoint folder as the nodes see it (a shared file system)."),
    ] = None,
    save_every: Annotated[
        int | None, typer.Option(min=1, help="Save every N steps (default: after the last).")
    ] = None,
    resume: Annotated[
        bool,
        typer.Option("--resume", help="Start from the latest checkpoint in --checkpoint-dir."),
    ] = False,
) -> None:
    """Write one torchrun script per plan node (launch order) and a Slurm batch script."""
    if master_addr is not None:
        safe_host(master_addr)
    if report is not None and (not report or not report.isprintable()):
        raise InputError(f"--report {shown(report)} is not a usable path")
    plan = read_plan(plan_path)
    check_runtime_engine(plan)
    check_factory_trust(
        plan.inputs.model.name,
        trusted=trust_factory,
        named=factory,
        source=printable(str(plan_path)),
        action="the launched scripts",
    )
    gpu_types = {node.gpu_type for node in plan.nodes}
    gres_names = _by_gpu_type(gres or [], "--gres", gpu_types)
    features = _by_gpu_type(constraint or [], "--constraint", gpu_types)
    if os.path.lexists(output) and not output.is_dir():
        raise InputError(f"--output {printable(str(output))}: is a file; give a folder")
    absolute_plan = str(plan_path.resolve())
    report_path = str(Path(report).resolve()) if report else None
    args = runtime_args(steps, report_path, plan.inputs.model.name)
    args += _data_and_checkpoint_args(
        data, data_dtype, no_shuffle, checkpoint_dir, save_every, resume
    )
    scripts: dict[Path, tuple[str, int]] = {}
    backend: RendezvousBackend = "c10d" if rdzv_backend is Rendezvous.c10d else "static"
    address = master_addr if master_addr is not None else Expand("${MASTER_ADDR}")
    run_id = _plan_id(plan_path)
    first = min(plan.nodes, key=lambda node: node.node_rank)
    for launch in node_launches(
        plan, absolute_plan, address, master_port, args, rendezvous=backend, run_id=run_id
    ):
        node = launch.node
        env = " ".join(f"{key}={value}" for key, value in node_environment(node).items())
        lines = [
            "#!/bin/bash",
            f"# autoplan launch: plan node {node.node_rank} of {len(plan.nodes)}: {node.name}, "
            f"{node.nproc_per_node} x {node.gpu_type}. Run it on that node.",
            "set -euo pipefail",
        ]
        if master_addr is None:
            lines.append(
                f': "${{MASTER_ADDR:?set MASTER_ADDR to the address of plan node 0 '
                f'({first.name})}}"'
            )
        lines += [f"export {env}", f"exec {launch.command}", ""]
        scripts[output / _script_name(node.node_rank, node.name)] = ("\n".join(lines), 0o755)
    slurm = slurm_script(
        plan,
        absolute_plan,
        master_port,
        args,
        job_name=f"autoplan-{job_label(plan.inputs.model.name)}",
        rendezvous=backend,
        gres=gres_names,
        use_gres=not no_gres,
        constraints=features,
        cpus_per_task=cpus_per_task,
    )
    scripts[output / "launch.slurm"] = (slurm, 0o644)
    # Every target checked before the first is written: a refusal leaves the folder as it was.
    for path in scripts:
        check_output_path(path, [plan_path], "--output")
    for path, (text, mode) in scripts.items():
        write_text_atomic(path, text, mode=mode)
        typer.echo(f"wrote {printable(str(path))}")
    typer.echo(f"submit with: sbatch {printable(str(output / 'launch.slurm'))}")
