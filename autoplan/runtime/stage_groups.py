"""Where a rank sits in a plan's stages, and the process groups of the groups executor.

A version-2 plan gives each stage its own replicas (tp GPUs each, with a share of every
micro-batch); this module answers the questions the groups executor asks of that structure:
which replica of which stages this rank runs (:class:`RankPlace`), which samples of a
micro-batch a replica owns (:func:`share_ranges`), and which replicas of two neighbouring
stages hold the same samples (:func:`boundary_routes`).

Process groups: ``dist.new_group`` is collective over the whole world (every rank must create
every group, in the same order, even groups it is not in), so :class:`ProcessGroups` takes
the full list of rank sets that any rank will use, computed from the plan alike on every rank,
and creates them once, sorted. A replica's tensor-parallel group becomes a 1-D DeviceMesh with
``DeviceMesh.from_group`` (no further collective), the mesh DTensor's Colwise/Rowwise
parallelism runs on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from autoplan.plan.schema import Plan, Replica, Stage

__all__ = [
    "ProcessGroups",
    "RankPlace",
    "Route",
    "boundary_routes",
    "rank_place",
    "share_ranges",
    "tp_mesh",
]


def share_ranges(stage: Stage) -> list[tuple[int, int]]:
    """Samples ``[start, end)`` of every micro-batch that each replica of ``stage`` owns."""
    ranges: list[tuple[int, int]] = []
    start = 0
    for share in stage.shares:
        ranges.append((start, start + share))
        start += share
    return ranges


@dataclass(frozen=True)
class Route:
    """Samples ``[start, end)`` of each micro-batch go from ``src`` (a replica index of stage
    ``boundary``) to ``dst`` (a replica of stage ``boundary + 1``); their gradients come back."""

    boundary: int
    src: int
    dst: int
    start: int
    end: int


def boundary_routes(plan: Plan, boundary: int) -> list[Route]:
    """The overlaps of the sample ranges of stage ``boundary``'s and the next stage's replicas,
    by source replica, then destination: only these rows cross the boundary."""
    senders = share_ranges(plan.stages[boundary])
    receivers = share_ranges(plan.stages[boundary + 1])
    routes = []
    for src, (src_start, src_end) in enumerate(senders):
        for dst, (dst_start, dst_end) in enumerate(receivers):
            start, end = max(src_start, dst_start), min(src_end, dst_end)
            if start < end:
                routes.append(Route(boundary, src, dst, start, end))
    return routes


@dataclass(frozen=True)
class RankPlace:
    """What one rank runs: replica ``replica`` (tp index ``tp_index``) of each stage of
    pipeline rank ``pipeline_rank`` (``stages``, in order; with interleaving several, all on
    the same replicas)."""

    rank: int
    pipeline_rank: int
    replica: int
    tp_index: int
    stages: tuple[int, ...]

    def replica_of(self, plan: Plan, stage: int) -> Replica:
        """This rank's replica of ``stage`` (one of its own)."""
        return plan.stages[stage].replicas[self.replica]


def rank_place(plan: Plan, rank: int) -> RankPlace:
    """Where ``rank`` sits (the plan has passed ``check_runnable``)."""
    entry = plan.rank_map[rank]
    return RankPlace(
        rank=rank,
        pipeline_rank=entry.pipeline_rank,
        replica=entry.dp_index,
        tp_index=entry.tp_index,
        stages=tuple(stage.index for stage in plan.stages_of_rank(entry.pipeline_rank)),
    )


def _key(ranks: Iterable[int]) -> tuple[int, ...]:
    return tuple(sorted(set(ranks)))


class ProcessGroups:
    """One process group per distinct rank set of more than one rank, created on every rank
    in one sorted order; looked up by rank set (order ignored) on its members."""

    def __init__(self, rank_sets: Iterable[Sequence[int]]) -> None:
        me = dist.get_rank()
        self._groups: dict[tuple[int, ...], dist.ProcessGroup] = {}
        for ranks in sorted({_key(ranks) for ranks in rank_sets if len(set(ranks)) > 1}):
            group = dist.new_group(list(ranks))
            if me in ranks:
                self._groups[ranks] = group

    def get(self, ranks: Iterable[int]) -> dist.ProcessGroup | None:
        """The group of ``ranks`` (this rank among them); None for a single rank."""
        key = _key(ranks)
        if len(key) == 1:
            return None
        if key not in self._groups:
            raise KeyError(f"no process group of ranks {list(key)} on rank {dist.get_rank()}")
        return self._groups[key]

    def __len__(self) -> int:
        return len(self._groups)


def tp_mesh(groups: ProcessGroups, replica: Replica, device: torch.device) -> DeviceMesh:
    """The 1-D DeviceMesh of ``replica``'s tp group (this rank is in it; tp > 1)."""
    group = groups.get(replica.ranks)
    if group is None:
        raise ValueError(f"replica on ranks {replica.ranks} has no tp group")
    return DeviceMesh.from_group(group, device.type, mesh_dim_names=("tp",))
