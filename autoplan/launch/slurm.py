"""A Slurm batch script that runs a plan: one ``srun`` per plan node, each its own torchrun.

One srun per node (rather than one srun over all nodes) because plan nodes may run different
numbers of processes (``--nproc-per-node``) and must get their plan node rank. Plan node k runs
on the k-th host of ``AUTOPLAN_HOSTS`` (space-separated) when set, else on the k-th host of the
allocation; set it when the allocation's host order does not match the plan's GPU types.
"""

from __future__ import annotations

import shlex

from autoplan.launch.torchrun import DEFAULT_MASTER_PORT, torchrun_argv
from autoplan.plan.schema import Plan

__all__ = ["slurm_script"]


def slurm_script(
    plan: Plan,
    plan_path: str,
    master_port: int = DEFAULT_MASTER_PORT,
    runtime_args: list[str] | None = None,
    job_name: str = "autoplan",
) -> str:
    """The text of an sbatch script for ``plan`` (plan file at ``plan_path`` on every node)."""
    nodes = sorted(plan.nodes, key=lambda node: node.node_rank)
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={len(nodes)}",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --exclusive",
        "# Where GPUs are handed out as GRES, add the site's request, e.g. #SBATCH --gres=gpu:8.",
        "# Plan nodes in launch order (node rank: name, GPU type, processes):",
        *(
            f"#   {node.node_rank}: {node.name}, {node.gpu_type}, {node.nproc_per_node}"
            for node in nodes
        ),
        "set -euo pipefail",
        'read -r -a HOSTS <<< "${AUTOPLAN_HOSTS:-$(scontrol show hostnames '
        '"$SLURM_JOB_NODELIST" | tr "\\n" " ")}"',
        f"if [ ${{#HOSTS[@]}} -lt {len(nodes)} ]; then",
        f'  echo "error: the plan needs {len(nodes)} hosts, got ${{#HOSTS[@]}}" >&2; exit 2',
        "fi",
        'MASTER_ADDR="${HOSTS[0]}"',
        "",
    ]
    for node in nodes:
        argv = torchrun_argv(plan, node, plan_path, "MASTER", master_port, runtime_args)
        command = shlex.join(argv).replace("--master-addr=MASTER", '--master-addr="$MASTER_ADDR"')
        lines.append(
            f'srun --nodes=1 --ntasks=1 --nodelist="${{HOSTS[{node.node_rank}]}}" {command} &'
        )
    lines += ["", "# Fail if any node fails.", 'for job in $(jobs -p); do wait "$job"; done', ""]
    return "\n".join(lines)
