"""Which GPUs each replica runs on, and the plan's node list and rank map that follow.

Placement (``place``) hands out each device class's GPUs in blocks: a stage that fits one
block of a node (``CostModel.in_one_node``: one class, a block size of its nodes) takes one
block for all its replicas, so that its all-reduce stays on the intra-node link as the cost
model assumes; otherwise each replica (tp GPUs) is a block. Block sizes divide one another
and the node (``devices.block_sizes``), so taking the largest blocks first, each at the first
aligned free place in the class's nodes (file order), fits every block whenever their total
fits, as a buddy allocator does; blocks of one size go in pipeline order.

torchrun numbers ranks node by node in ``--node-rank`` order, and local ranks 0.. on a node.
Nodes are launched in the order pipeline ranks first use them; on a node, the GPUs used get
local ranks in slot order. A uniform plan of one class is thus laid out row-major as (pp, dp,
tp), the layout a DeviceMesh reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.cluster.schema import Node
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.plan.schema import PlanNode, RankEntry

__all__ = ["ReplicaSlots", "build_rank_map", "place"]


@dataclass(frozen=True)
class ReplicaSlots:
    """One replica's GPUs: node and slots (GPU indices on it), by tp index."""

    node: Node
    slots: tuple[int, ...]
    tp: int = 0  # its tp degree: slot i is cp index i // tp, tp index i % tp (0: all tp)


def _fit(free: dict[str, list[bool]], nodes: list[Node], size: int) -> tuple[Node, int]:
    for node in nodes:
        used = free[node.name]
        for start in range(0, node.gpus - size + 1, size):
            if not any(used[start : start + size]):
                for slot in range(start, start + size):
                    used[slot] = True
                return node, start
    raise ValueError(f"no aligned block of {size} free GPUs left")


def place(model: CostModel, config: PlanConfig) -> list[list[list[ReplicaSlots]]]:
    """``out[p][g][r]``: the GPUs of replica r of group g of pipeline rank p (module doc).

    Raises ValueError when the configuration's GPUs do not fit the cluster's nodes."""
    pp = config.pipeline_degree
    nodes = model.cluster.nodes()
    of_class = {c.index: [n for n in nodes if n.group in c.groups] for c in model.classes}
    free = {node.name: [False] * node.gpus for node in nodes}
    # (size, pipeline rank, group, replica or None for a whole-stage block)
    blocks: list[tuple[int, int, int, int | None]] = []
    for p, stage in enumerate(config.stages[:pp]):
        if model.in_one_node(stage.groups):
            blocks.append((stage.gpus, p, 0, None))
            continue
        for g, group in enumerate(stage.groups):
            blocks.extend((group.tp * group.cp, p, g, r) for r in range(group.replicas))
    out: list[list[list[ReplicaSlots | None]]] = [
        [[None] * group.replicas for group in stage.groups] for stage in config.stages[:pp]
    ]
    for size, p, g, r in sorted(blocks, key=lambda b: (-b[0], b[1], b[2], b[3] or 0)):
        stage = config.stages[p]
        device_class = stage.groups[g].device_class
        node, start = _fit(free, of_class[device_class], size)
        if r is not None:
            tp = stage.groups[g].tp
            out[p][g][r] = ReplicaSlots(node, tuple(range(start, start + size)), tp)
            continue
        slot = start
        for gg, group in enumerate(stage.groups):
            width = group.tp * group.cp
            for rr in range(group.replicas):
                out[p][gg][rr] = ReplicaSlots(node, tuple(range(slot, slot + width)), group.tp)
                slot += width
    return out  # type: ignore[return-value]


def build_rank_map(
    placement: list[list[list[ReplicaSlots]]],
) -> tuple[list[PlanNode], list[RankEntry], list[list[list[list[int]]]]]:
    """Nodes in launch order, one RankEntry per GPU, and the global ranks of every replica
    (``ranks[p][g][r]``, by tp index), for a ``place`` result (module docstring)."""
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
