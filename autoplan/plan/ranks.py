"""A placement's nodes and rank map: which global rank, node and local rank every GPU gets.

The placement itself (which GPUs each replica runs on) is the solver's choice and lives in
``autoplan.solve.placement``; this module turns one into the plan's node list and rank map.

torchrun numbers ranks node by node in ``--node-rank`` order, and local ranks 0.. on a node.
Nodes are launched in the order pipeline ranks first use them; on a node, the GPUs used get
local ranks in slot order. A uniform plan of one class is thus laid out row-major as (pp, dp,
tp), the layout a DeviceMesh reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.schema import Node
from autoplan.plan.schema import PlanNode, RankEntry

__all__ = ["ReplicaSlots", "build_rank_map"]


@dataclass(frozen=True)
class ReplicaSlots:
    """One replica's GPUs: node and slots (GPU indices on it), by tp index."""

    node: Node
    slots: tuple[int, ...]
    tp: int = 0  # its tp degree: slot i is cp index i // tp, tp index i % tp (0: all tp)


def build_rank_map(
    placement: list[list[list[ReplicaSlots]]],
) -> tuple[list[PlanNode], list[RankEntry], list[list[list[list[int]]]]]:
    """Nodes in launch order, one RankEntry per GPU, and the global ranks of every replica
    (``ranks[p][g][r]``, by tp index), for a placement (``autoplan.solve.placement.place``)."""
    launch: list[Node] = []
    used: dict[str, set[int]] = {}
    for rank_groups in placement:
        for group in rank_groups:
            for replica in group:
                if replica.node.name not in used:
                    used[replica.node.name] = set()
                    launch.append(replica.node)
                if used[replica.node.name] & set(replica.slots):
                    raise ValueError(f"GPUs {replica.slots} of {replica.node.name} used twice")
                used[replica.node.name] |= set(replica.slots)
    offset: dict[str, int] = {}
    local: dict[tuple[str, int], int] = {}
    total = 0
    for node in launch:
        offset[node.name] = total
        for index, slot in enumerate(sorted(used[node.name])):
            local[(node.name, slot)] = index
        total += len(used[node.name])
    node_rank = {node.name: index for index, node in enumerate(launch)}
    entries: list[RankEntry] = []
    ranks: list[list[list[list[int]]]] = []
    for p, rank_groups in enumerate(placement):
        ranks.append([])
        dp_index = 0
        for group in rank_groups:
            ranks[p].append([])
            for replica in group:
                replica_ranks = []
                for index, slot in enumerate(replica.slots):
                    cp_index, tp_index = divmod(index, replica.tp or len(replica.slots))
                    name = replica.node.name
                    rank = offset[name] + local[(name, slot)]
                    replica_ranks.append(rank)
                    entries.append(
                        RankEntry(
                            rank=rank,
                            node=name,
                            node_rank=node_rank[name],
                            local_rank=local[(name, slot)],
                            gpu_type=replica.node.gpu,
                            pipeline_rank=p,
                            dp_index=dp_index,
                            tp_index=tp_index,
                            cp_index=cp_index,
                        )
                    )
                ranks[p][-1].append(replica_ranks)
                dp_index += 1
    entries.sort(key=lambda entry: entry.rank)
    nodes = [
        PlanNode(
            node_rank=node_rank[node.name],
            name=node.name,
            gpu_type=node.gpu,
            nproc_per_node=len(used[node.name]),
        )
        for node in launch
    ]
    return nodes, entries, ranks
