"""Does this process belong to the launch the plan describes? Checked before any training.

torchrun tells each worker where it is through environment variables (``WORLD_SIZE``, ``RANK``,
``LOCAL_RANK``, ``GROUP_RANK`` = the node rank, ``LOCAL_WORLD_SIZE``). The plan fixes the same
facts in its rank map; a launch that disagrees would put stages on the wrong GPUs (or deadlock in
the first collective), so it is refused here with one line that names both sides.

Under a c10d rendezvous torchrun numbers nodes, and so global ranks, in arrival order. The
scripts of ``autoplan launch`` put each node's plan node rank and name in its environment
(``AUTOPLAN_NODE_RANK``, ``AUTOPLAN_NODE``); when they are present the worker's rank is the
plan's rank of (that node, LOCAL_RANK), whatever torchrun's RANK says, and the process group
is joined under that rank (``mesh.init_distributed``).

This module imports no torch: it runs first, and fast.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace

from autoplan.errors import LaunchMismatchError
from autoplan.plan.schema import Plan, RankEntry

__all__ = ["LaunchEnv", "check_launch"]

_VARIABLES = ("WORLD_SIZE", "RANK", "LOCAL_RANK", "GROUP_RANK", "LOCAL_WORLD_SIZE")
NODE_RANK_VARIABLE = "AUTOPLAN_NODE_RANK"
NODE_NAME_VARIABLE = "AUTOPLAN_NODE"


@dataclass(frozen=True)
class LaunchEnv:
    """Where torchrun says this worker is."""

    world_size: int
    rank: int
    local_rank: int
    node_rank: int
    local_world_size: int
    launcher_rank: int | None = None
    """torchrun's RANK when the plan's rank differs from it (see the module docstring)."""
    plan_node: str | None = None
    """The plan node name the launch script gave (``AUTOPLAN_NODE``), if any."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        """Read torchrun's variables; a process started without torchrun is rank 0 of 1."""
        environ = os.environ if environ is None else environ
        present = [name for name in _VARIABLES if name in environ]
        if not present:
            return cls(world_size=1, rank=0, local_rank=0, node_rank=0, local_world_size=1)
        values: dict[str, int] = {}
        for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
            if name not in environ:
                raise LaunchMismatchError(
                    f"{name} is not set but {', '.join(present)} are: launch with torchrun"
                )
            values[name] = _as_int(name, environ[name])
        node_rank = _as_int("GROUP_RANK", environ.get("GROUP_RANK", "0"))
        plan_node = None
        if NODE_RANK_VARIABLE in environ:
            node_rank = _as_int(NODE_RANK_VARIABLE, environ[NODE_RANK_VARIABLE])
            plan_node = environ.get(NODE_NAME_VARIABLE)
        local_world = _as_int(
            "LOCAL_WORLD_SIZE", environ.get("LOCAL_WORLD_SIZE", environ["WORLD_SIZE"])
        )
        return cls(
            world_size=values["WORLD_SIZE"],
            rank=values["RANK"],
            local_rank=values["LOCAL_RANK"],
            node_rank=node_rank,
            local_world_size=local_world,
            plan_node=plan_node,
        )

    def in_plan(self, plan: Plan) -> LaunchEnv:
        """This worker with its plan rank: the rank map's entry for (plan node rank, local
        rank) when the launch named the plan node, else itself (torchrun's numbering)."""
        if self.plan_node is None:
            return self
        node = next((n for n in plan.nodes if n.node_rank == self.node_rank), None)
        if node is None:
            raise LaunchMismatchError(
                f"{NODE_RANK_VARIABLE}={self.node_rank} is not a node rank of the plan "
                f"(0..{len(plan.nodes) - 1})"
            )
        if node.name != self.plan_node:
            raise LaunchMismatchError(
                f"{NODE_NAME_VARIABLE}={self.plan_node!r}, but the plan's node rank "
                f"{self.node_rank} is {node.name}"
            )
        entry = next(
            (
                e
                for e in plan.rank_map
                if e.node_rank == self.node_rank and e.local_rank == self.local_rank
            ),
            None,
        )
        if entry is None:
            raise LaunchMismatchError(
                f"the plan runs {node.nproc_per_node} processes on {node.name}; this one has "
                f"LOCAL_RANK={self.local_rank}"
            )
        if entry.rank == self.rank:
            return replace(self, plan_node=None)
        return replace(self, rank=entry.rank, launcher_rank=self.rank, plan_node=None)


def _as_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise LaunchMismatchError(f"{name}={text!r} is not an integer") from None


def _shape(plan: Plan) -> str:
    """How the plan's processes add up: 'pp 2 × dp 2 × tp 1' for a uniform plan, else the
    GPUs of each pipeline rank's replicas, e.g. 'pp 2: 1+1, 2'."""
    uniform = plan.uniform_shape()
    pp = plan.parallelism.pipeline_degree
    if uniform is not None:
        return f"pp {pp} × dp {uniform[0]} × tp {uniform[1]}"
    per_rank = [
        "+".join(str(r.tensor_parallel_degree) for r in plan.stages_of_rank(p)[0].replicas)
        for p in range(pp)
    ]
    return f"pp {pp}, GPUs per replica: {', '.join(per_rank)}"


def check_launch(plan: Plan, env: LaunchEnv) -> RankEntry:
    """This worker's entry of the plan's rank map; LaunchMismatchError when the launch differs.
    ``env`` is the worker with its plan rank (``LaunchEnv.in_plan``)."""
    if env.world_size != plan.world_size:
        layout = ", ".join(f"{node.name}×{node.nproc_per_node}" for node in plan.nodes)
        raise LaunchMismatchError(
            f"launched with WORLD_SIZE={env.world_size}, but the plan needs {plan.world_size} "
            f"processes ({_shape(plan)}) on {len(plan.nodes)} node(s): {layout}"
        )
    if not 0 <= env.rank < env.world_size:
        raise LaunchMismatchError(f"RANK={env.rank} is outside 0..{env.world_size - 1}")
    entry = plan.rank_map[env.rank]
    if entry.rank != env.rank:
        raise LaunchMismatchError(
            f"the plan's rank_map is out of order: entry {env.rank} is rank {entry.rank}"
        )
    node = next((n for n in plan.nodes if n.node_rank == entry.node_rank), None)
    if node is None:
        raise LaunchMismatchError(f"rank {env.rank}'s node rank {entry.node_rank} is not in nodes")
    if env.node_rank != entry.node_rank:
        raise LaunchMismatchError(
            f"rank {env.rank} started on node rank {env.node_rank} (GROUP_RANK), but the plan "
            f"puts it on node rank {entry.node_rank} ({entry.node}, {entry.gpu_type}): "
            f"start node {entry.node} with --node-rank {entry.node_rank}"
        )
    if env.local_world_size != node.nproc_per_node:
        raise LaunchMismatchError(
            f"node rank {env.node_rank} started {env.local_world_size} processes "
            f"(LOCAL_WORLD_SIZE), but the plan runs {node.nproc_per_node} on {node.name}"
        )
    if env.local_rank != entry.local_rank:
        raise LaunchMismatchError(
            f"rank {env.rank} has LOCAL_RANK={env.local_rank}, but the plan gives it local rank "
            f"{entry.local_rank} on {entry.node}"
        )
    return entry
