"""A Slurm batch script that runs a plan on the GPUs it was made for.

Mixed clusters are the point: Slurm's host list says nothing of GPU types, so the script asks
for one job component per node group of the plan (a heterogeneous job, ``#SBATCH hetjob``
between components; one ordinary job when the plan uses one group), each requesting its
group's GPU type by GRES (``--gres=gpu:TYPE:N``) and, where given, a node feature
(``--constraint``). Plan node k, the j-th plan node of its group, then runs on the j-th host
of its own group's component (``SLURM_JOB_NODELIST_HET_GROUP_<c>``, one ``srun --het-group=c``
step bound to that host), so a node's rank always goes with the GPU type the plan gave it; the
nodes of one group are alike, so the order inside a group does not matter. One srun per node,
because nodes may run different numbers of processes and each needs its plan node rank.

GRES type names are the site's (``scontrol show node | grep Gres``); by default the plan's GPU
type in lower case, renamed per type with ``autoplan launch --gres TYPE=NAME``.

Everything the script holds from a plan is a checked name (``autoplan.names``) or quoted.
See: https://slurm.schedmd.com/heterogeneous_jobs.html
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autoplan.launch.torchrun import (
    DEFAULT_MASTER_PORT,
    Expand,
    RendezvousBackend,
    node_environment,
    shell_line,
    torchrun_argv,
)
from autoplan.names import printable
from autoplan.plan.schema import Plan, PlanNode

__all__ = ["CPUS_PER_PROCESS", "SlurmComponent", "slurm_components", "slurm_script"]

CPUS_PER_PROCESS = 4
"""CPUs requested per GPU process when ``--cpus-per-task`` is not given: the worker's Python
thread, its data loading and NCCL's proxy threads. Slurm's default of 1 per task would pin a
node's whole torchrun (agent and workers) to one core."""


@dataclass(frozen=True)
class SlurmComponent:
    """One component of the job: the plan's nodes of one node group."""

    index: int
    group: str
    gpu_type: str
    gpus_per_node: int
    nodes: list[PlanNode]


def slurm_components(plan: Plan) -> list[SlurmComponent]:
    """The plan's nodes grouped by node group, groups in order of their first plan node."""
    group_of = {node.name: node for node in plan.inputs.cluster.nodes()}
    members: dict[str, list[PlanNode]] = {}
    for node in sorted(plan.nodes, key=lambda n: n.node_rank):
        members.setdefault(group_of[node.name].group, []).append(node)
    return [
        SlurmComponent(
            index=index,
            group=group,
            gpu_type=nodes[0].gpu_type,
            gpus_per_node=max(node.nproc_per_node for node in nodes),
            nodes=nodes,
        )
        for index, (group, nodes) in enumerate(members.items())
    ]


def _cpus(node_nproc: int, cpus_per_task: int | None) -> int:
    return cpus_per_task if cpus_per_task is not None else CPUS_PER_PROCESS * node_nproc


def slurm_script(
    plan: Plan,
    plan_path: str,
    master_port: int = DEFAULT_MASTER_PORT,
    runtime_args: list[str] | None = None,
    job_name: str = "autoplan",
    *,
    rendezvous: RendezvousBackend = "static",
    gres: Mapping[str, str] | None = None,
    use_gres: bool = True,
    constraints: Mapping[str, str] | None = None,
    cpus_per_task: int | None = None,
) -> str:
    """The text of an sbatch script for ``plan`` (plan file at ``plan_path`` on every node).

    ``gres`` renames GPU types to the site's GRES type names (default: lower case);
    ``use_gres=False`` requests no GRES (then ``constraints``, GPU type → node feature, are
    what selects the nodes); ``cpus_per_task`` is one node's torchrun's CPUs (default
    ``CPUS_PER_PROCESS`` per process)."""
    components = slurm_components(plan)
    heterogeneous = len(components) > 1
    header = [
        "#!/bin/bash",
        f"# autoplan launch: {printable(plan.inputs.model.name)} on "
        f"{printable(plan.inputs.cluster.name)}, {len(plan.nodes)} node(s) in "
        f"{len(components)} node group(s)"
        + (", one job component per group" if heterogeneous else ""),
    ]
    for component in components:
        if component.index > 0:
            header.append("#SBATCH hetjob")
        if component.index == 0:
            header.append(f"#SBATCH --job-name={printable(job_name).replace(' ', '_')}")
        header += [
            f"#SBATCH --nodes={len(component.nodes)}",
            "#SBATCH --ntasks-per-node=1",
            f"#SBATCH --cpus-per-task={_cpus(component.gpus_per_node, cpus_per_task)}",
        ]
        if use_gres:
            name = (gres or {}).get(component.gpu_type, component.gpu_type.lower())
            header.append(f"#SBATCH --gres=gpu:{name}:{component.gpus_per_node}")
        feature = (constraints or {}).get(component.gpu_type)
        if feature is not None:
            header.append(f"#SBATCH --constraint={feature}")
        header.append("#SBATCH --exclusive")
    header.append("# Components (index: node group, GPU type x GPUs, plan node ranks):")
    for component in components:
        ranks = " ".join(str(node.node_rank) for node in component.nodes)
        header.append(
            f"#   {component.index}: {component.group}, {component.gpu_type} x "
            f"{component.gpus_per_node}, plan nodes {ranks}"
        )
    body = ["set -euo pipefail"]
    host_of: dict[int, str] = {}
    for component in components:
        variable = (
            f"SLURM_JOB_NODELIST_HET_GROUP_{component.index}"
            if heterogeneous
            else "SLURM_JOB_NODELIST"
        )
        hosts = f"HOSTS_{component.index}"
        count = len(component.nodes)
        body += [
            f'mapfile -t {hosts} < <(scontrol show hostnames "${{{variable}:?run this script '
            f'with sbatch}}")',
            f'if [ "${{#{hosts}[@]}}" -ne {count} ]; then',
            f'  echo "error: job component {component.index} (node group {component.group}) '
            f'has ${{#{hosts}[@]}} hosts; the plan needs {count}" >&2',
            "  exit 2",
            "fi",
        ]
        for position, node in enumerate(component.nodes):
            host_of[node.node_rank] = f"${{{hosts}[{position}]}}"
    first = min(plan.nodes, key=lambda node: node.node_rank)
    body += [
        f'MASTER_ADDR="{host_of[first.node_rank]}"',
        "# If one node fails, stop the others.",
        "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT",
    ]
    run_id = Expand("autoplan-${SLURM_JOB_ID}")
    for component in components:
        for node in component.nodes:
            srun: list[str | Expand] = ["srun"]
            if heterogeneous:
                srun.append(f"--het-group={component.index}")
            srun += [
                "--nodes=1",
                "--ntasks=1",
                f"--cpus-per-task={_cpus(node.nproc_per_node, cpus_per_task)}",
                Expand(f"--nodelist={host_of[node.node_rank]}"),
                "env",
                *(f"{key}={value}" for key, value in node_environment(node).items()),
            ]
            argv = torchrun_argv(
                plan,
                node,
                plan_path,
                Expand("${MASTER_ADDR}"),
                master_port,
                runtime_args,
                rendezvous=rendezvous,
                run_id=run_id,
            )
            body.append(f"{shell_line([*srun, *argv])} &")
    body += [f"for _ in $(seq {len(plan.nodes)}); do wait -n; done", ""]
    return "\n".join(header + body)
