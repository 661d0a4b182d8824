"""Which GPUs each replica runs on: the placement the plan's rank map is built from.

Placement (``place``) hands out each device class's GPUs in blocks: a stage that fits one
block of a node (``CostModel.in_one_node``: one class, a block size of its nodes) takes one
block for all its replicas, so that its all-reduce stays on the intra-node link as the cost
model assumes; otherwise each replica (tp GPUs) is a block. Block sizes divide one another
and the node (``devices.block_sizes``), so taking the largest blocks first, each at the first
aligned free place in the class's nodes (file order), fits every block whenever their total
fits, as a buddy allocator does; blocks of one size go in pipeline order.
"""

from __future__ import annotations

from autoplan.cluster.schema import Node
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.plan.ranks import ReplicaSlots

__all__ = ["place"]


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
    # Every block above was fitted (``_fit`` raises otherwise), so every replica has its GPUs.
    placed = [[[r for r in group if r is not None] for group in rank] for rank in out]
    if [[len(group) for group in rank] for rank in placed] != [
        [len(group) for group in rank] for rank in out
    ]:
        raise ValueError("a replica was left without GPUs")
    return placed
