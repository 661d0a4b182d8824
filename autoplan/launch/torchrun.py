"""One torchrun command per node of a plan, in the plan's launch order.

Two rendezvous:

- ``static`` (the default): each node's rank is ``--node-rank``, and torchrun numbers global
  ranks node by node in that order, summing each node's ``--nproc-per-node`` (nodes may run
  different numbers of processes): exactly the order of the plan's rank map.
- ``c10d``: the nodes meet at ``--rdzv-endpoint`` (node 0's address) under one
  ``--rdzv-id``; torchrun then numbers nodes in arrival order and ignores ``--node-rank``
  (which is still passed). So every node's command also carries its plan node rank and name
  in the environment (``AUTOPLAN_NODE_RANK``, ``AUTOPLAN_NODE``): the runtime maps plan
  nodes to processes by what it finds, never by arrival.

A command is a list of words. Plain strings are literal words (shell-quoted when written to a
script); an ``Expand`` is a word the shell must expand (``${MASTER_ADDR}``), made only from
parts autoplan chose, never from a plan's text.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import Literal

from autoplan.plan.schema import Plan, PlanNode

__all__ = [
    "DEFAULT_MASTER_PORT",
    "Expand",
    "NodeLaunch",
    "RendezvousBackend",
    "Word",
    "literal_argv",
    "node_environment",
    "node_launches",
    "shell_line",
    "torchrun_argv",
]

DEFAULT_MASTER_PORT = 29500

RendezvousBackend = Literal["static", "c10d"]

# What an Expand may hold: variable references and the separators autoplan puts around them.
_EXPANDABLE = re.compile(r"[A-Za-z0-9_=:.,/${}\[\]-]+")


@dataclass(frozen=True)
class Expand:
    """A shell word with ``${NAME}`` references, written inside double quotes."""

    template: str

    def __post_init__(self) -> None:
        if _EXPANDABLE.fullmatch(self.template) is None:
            raise ValueError(f"not a word autoplan writes for the shell: {self.template!r}")


Word = str | Expand


def shell_line(words: list[Word]) -> str:
    """The words as one shell line: literals quoted (inert, whatever they hold), expansions in
    double quotes."""
    return " ".join(
        f'"{word.template}"' if isinstance(word, Expand) else shlex.quote(word) for word in words
    )


def literal_argv(words: list[Word]) -> list[str]:
    """The words as an argv for a direct exec; every word must be literal."""
    if any(isinstance(word, Expand) for word in words):
        raise ValueError("this command needs a shell to expand it")
    return [str(word) for word in words]


def node_environment(node: PlanNode) -> dict[str, str]:
    """What every torchrun of ``node`` gets in its environment: its plan node rank and name."""
    return {"AUTOPLAN_NODE_RANK": str(node.node_rank), "AUTOPLAN_NODE": node.name}


@dataclass(frozen=True)
class NodeLaunch:
    """What to run on one node of the plan."""

    node: PlanNode
    argv: list[Word]

    @property
    def command(self) -> str:
        """The command as one shell line."""
        return shell_line(self.argv)


def torchrun_argv(
    plan: Plan,
    node: PlanNode,
    plan_path: str,
    master_addr: Word,
    master_port: int,
    runtime_args: list[str] | None = None,
    launcher: list[str] | None = None,
    *,
    rendezvous: RendezvousBackend = "static",
    run_id: Word = "autoplan",
    launcher_args: list[str] | None = None,
) -> list[Word]:
    """The torchrun command that starts ``node``'s share of the plan's processes.

    ``launcher`` replaces ``torchrun`` (e.g. ``[sys.executable, "-m", "torch.distributed.run"]``);
    ``launcher_args`` go to torchrun before the script (e.g. its ``--log-dir``).
    """
    if rendezvous == "static":
        meeting: list[Word] = [
            _joined("--master-addr=", master_addr),
            f"--master-port={master_port}",
        ]
    else:
        endpoint = (
            Expand(f"--rdzv-endpoint={master_addr.template}:{master_port}")
            if isinstance(master_addr, Expand)
            else f"--rdzv-endpoint={master_addr}:{master_port}"
        )
        meeting = ["--rdzv-backend=c10d", endpoint, _joined("--rdzv-id=", run_id)]
    return [
        *(launcher or ["torchrun"]),
        f"--nnodes={len(plan.nodes)}",
        f"--node-rank={node.node_rank}",
        f"--nproc-per-node={node.nproc_per_node}",
        *meeting,
        *(launcher_args or []),
        "-m",
        "autoplan.runtime",
        plan_path,
        *(runtime_args or []),
    ]


def _joined(prefix: str, value: Word) -> Word:
    return Expand(prefix + value.template) if isinstance(value, Expand) else prefix + value


def node_launches(
    plan: Plan,
    plan_path: str,
    master_addr: Word,
    master_port: int = DEFAULT_MASTER_PORT,
    runtime_args: list[str] | None = None,
    launcher: list[str] | None = None,
    *,
    rendezvous: RendezvousBackend = "static",
    run_id: Word = "autoplan",
    launcher_args: dict[int, list[str]] | None = None,
) -> list[NodeLaunch]:
    """A launch per node, sorted by node rank (node 0 hosts the rendezvous at master_addr).
    ``launcher_args[k]`` are extra torchrun options of node rank k."""
    nodes = sorted(plan.nodes, key=lambda node: node.node_rank)
    return [
        NodeLaunch(
            node=node,
            argv=torchrun_argv(
                plan,
                node,
                plan_path,
                master_addr,
                master_port,
                runtime_args,
                launcher,
                rendezvous=rendezvous,
                run_id=run_id,
                launcher_args=(launcher_args or {}).get(node.node_rank),
            ),
        )
        for node in nodes
    ]
