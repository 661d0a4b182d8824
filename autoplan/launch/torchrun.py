"""One torchrun command per node of a plan, in the plan's launch order.

torchrun's default (static) rendezvous takes each node's rank from ``--node-rank`` and numbers
global ranks node by node in that order, summing each node's ``--nproc-per-node`` (nodes may
run different numbers of processes). That is the order the plan's rank map assumes; c10d
rendezvous would number nodes in arrival order instead, so it is not used.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from autoplan.plan.schema import Plan, PlanNode

__all__ = ["DEFAULT_MASTER_PORT", "NodeLaunch", "node_launches", "torchrun_argv"]

DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class NodeLaunch:
    """What to run on one node of the plan."""

    node: PlanNode
    argv: list[str]

    @property
    def command(self) -> str:
        """The command as one shell line."""
        return shlex.join(self.argv)


def torchrun_argv(
    plan: Plan,
    node: PlanNode,
    plan_path: str,
    master_addr: str,
    master_port: int,
    runtime_args: list[str] | None = None,
    launcher: list[str] | None = None,
) -> list[str]:
    """The torchrun argv that starts ``node``'s share of the plan's processes.

    ``launcher`` replaces ``torchrun`` (e.g. ``[sys.executable, "-m", "torch.distributed.run"]``).
    """
    return [
        *(launcher or ["torchrun"]),
        f"--nnodes={len(plan.nodes)}",
        f"--node-rank={node.node_rank}",
        f"--nproc-per-node={node.nproc_per_node}",
        f"--master-addr={master_addr}",
        f"--master-port={master_port}",
        "-m",
        "autoplan.runtime",
        plan_path,
        *(runtime_args or []),
    ]


def node_launches(
    plan: Plan,
    plan_path: str,
    master_addr: str,
    master_port: int = DEFAULT_MASTER_PORT,
    runtime_args: list[str] | None = None,
    launcher: list[str] | None = None,
) -> list[NodeLaunch]:
    """A launch per node, sorted by node rank (node 0 hosts the rendezvous at master_addr)."""
    nodes = sorted(plan.nodes, key=lambda node: node.node_rank)
    return [
        NodeLaunch(
            node=node,
            argv=torchrun_argv(
                plan, node, plan_path, master_addr, master_port, runtime_args, launcher
            ),
        )
        for node in nodes
    ]
