"""Where a rank sits in a plan's stages: its replica, its samples, its neighbours' replicas.

A version-2 plan gives each stage its own replicas (tp GPUs each, with a share of every
micro-batch); this module answers the questions the executors ask of that structure:
which replica of which stages this rank runs (:class:`RankPlace`), which samples of a
micro-batch a replica owns (:func:`share_ranges`), and which replicas of two neighbouring
stages hold the same samples (:func:`boundary_routes`). Plan arithmetic only: the process
groups built on it are ``process_groups``'.
"""

from __future__ import annotations

from dataclasses import dataclass

from autoplan.plan.schema import Plan, Replica, Stage

__all__ = ["RankPlace", "Route", "boundary_routes", "rank_place", "share_ranges"]


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
