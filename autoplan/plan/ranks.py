"""From "which GPUs each pipeline rank runs on" to the plan's node list and rank map.

torchrun numbers ranks node by node in ``--node-rank`` order, and the runtime's DeviceMesh
reads ranks row-major as (pp, dp, tp). So the rank map is fixed once we know, per pipeline
rank, the ordered slices of nodes its ``dp × tp`` GPUs come from: walking the slices in order
hands out consecutive ranks, and a node's ranks must come out contiguous for torchrun to be
able to launch it.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.schema import Node
from autoplan.plan.schema import PlanNode, RankEntry

__all__ = ["NodeSlice", "build_rank_map"]


@dataclass(frozen=True)
class NodeSlice:
    """``gpus`` GPUs of ``node`` given to one pipeline rank."""

    node: Node
    gpus: int


def build_rank_map(
    placement: list[list[NodeSlice]], data_parallel: int, tensor_parallel: int
) -> tuple[list[PlanNode], list[RankEntry]]:
    """Nodes in launch order and one RankEntry per rank, for ``placement[p]`` = the slices of
    pipeline rank ``p``.

    Raises ValueError when the placement cannot be launched: a stage's slices do not add up to
    dp × tp, a tp group would span two nodes, a node is over-subscribed, or a node's ranks would
    not be contiguous.
    """
    group_size = data_parallel * tensor_parallel
    next_local_rank: dict[str, int] = {}
    launch_order: list[Node] = []
    ranks_of_node: dict[str, list[int]] = {}
    entries: list[RankEntry] = []
    rank = 0
    for pipeline_rank, slices in enumerate(placement):
        total = sum(piece.gpus for piece in slices)
        if total != group_size:
            raise ValueError(
                f"pipeline rank {pipeline_rank} is placed on {total} GPUs; dp × tp = {group_size}"
            )
        for piece in slices:
            if piece.gpus % tensor_parallel:
                raise ValueError(
                    f"{piece.gpus} GPUs of node {piece.node.name} cannot hold whole tp groups "
                    f"of {tensor_parallel}"
                )
            name = piece.node.name
            if name not in next_local_rank:
                next_local_rank[name] = 0
                launch_order.append(piece.node)
                ranks_of_node[name] = []
            first_local = next_local_rank[name]
            if first_local + piece.gpus > piece.node.gpus:
                raise ValueError(
                    f"node {name} has {piece.node.gpus} GPUs; the placement uses "
                    f"{first_local + piece.gpus}"
                )
            for offset in range(piece.gpus):
                entries.append(
                    RankEntry(
                        rank=rank,
                        node=name,
                        node_rank=0,  # set below, once the launch order is known
                        local_rank=first_local + offset,
                        gpu_type=piece.node.gpu,
                        pipeline_rank=pipeline_rank,
                        dp_index=(rank % group_size) // tensor_parallel,
                        tp_index=rank % tensor_parallel,
                    )
                )
                ranks_of_node[name].append(rank)
                rank += 1
            next_local_rank[name] = first_local + piece.gpus

    expected_first = 0
    for node in launch_order:
        ranks = ranks_of_node[node.name]
        if ranks != list(range(expected_first, expected_first + len(ranks))):
            raise ValueError(
                f"node {node.name} would hold ranks {ranks[0]}..{ranks[-1]} non-contiguously; "
                "torchrun gives each node a contiguous block of ranks"
            )
        expected_first += len(ranks)

    node_rank_of = {node.name: index for index, node in enumerate(launch_order)}
    nodes = [
        PlanNode(
            node_rank=node_rank_of[node.name],
            name=node.name,
            gpu_type=node.gpu,
            nproc_per_node=next_local_rank[node.name],
        )
        for node in launch_order
    ]
    entries = [
        entry.model_copy(update={"node_rank": node_rank_of[entry.node]}) for entry in entries
    ]
    return nodes, entries
