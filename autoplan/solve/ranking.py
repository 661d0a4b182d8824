"""The search's candidates and their one ranking.

Every family (``autoplan.solve.uniform``, ``shares``, ``hetero``, the zero-bubble variants) and
every searched knob (sequence, context and expert parallelism, the sub-block seed) hands back
``Candidate``s; they are merged and ranked here and nowhere else, so that a plan is chosen the
same way whichever runs found it: feasible first, then the iteration time, then a canonical
key of the configuration (ties go to the smaller key, so the same inputs give the same plan).
A configuration found by two runs is kept once, as the first run offered it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from autoplan.cost.config import PlanConfig
from autoplan.cost.model import PlanCost

__all__ = ["Candidate", "Merged", "SearchResult", "config_key", "identity", "ranked"]


@dataclass(frozen=True)
class Candidate:
    """A costed configuration."""

    iteration_ms: float
    config: PlanConfig
    cost: PlanCost


@dataclass
class SearchResult:
    """Best configurations first, and how the search went.

    ``lower_bound_ms``: no plan of the space searched costs less (``autoplan.solve.certificate``;
    0.0 proves nothing)."""

    candidates: list[Candidate]
    configs_considered: int
    partitions_solved: int
    timed_out: bool
    lower_bound_ms: float = 0.0


def config_key(config: PlanConfig) -> tuple:
    """A canonical order of configurations, for ties."""
    return (
        config.world_size,
        config.pipeline_degree,
        config.num_micro_batches,
        config.schedule,
        config.chunks,
        config.stages,
    )


def identity(config: PlanConfig) -> tuple:
    """What makes two configurations the same plan (the canonical key and the SP setting)."""
    return (*config_key(config), config.sequence_parallel)


def _order(candidate: Candidate) -> tuple:
    time_ms = candidate.iteration_ms if math.isfinite(candidate.iteration_ms) else math.inf
    return (not candidate.cost.feasible, time_ms, identity(candidate.config))


def ranked(candidates: Iterable[Candidate]) -> list[Candidate]:
    """``candidates`` best first, each plan once (the first offered of equal ``identity``)."""
    unique: dict[tuple, Candidate] = {}
    for candidate in candidates:
        unique.setdefault(identity(candidate.config), candidate)
    return sorted(unique.values(), key=_order)


class Merged:
    """The results of several runs of the search (one per setting of a knob) as one: their
    candidates ranked together, their work counted, stopped if any stopped, and bounded by
    the least of their bounds (each run's bound covers its part of the space; the parts
    together are the space)."""

    def __init__(self) -> None:
        self.candidates: list[Candidate] = []
        self.considered = 0
        self.solved = 0
        self.timed_out = False
        self.lower_bound_ms = math.inf

    def add(self, result: SearchResult, candidates: Iterable[Candidate] | None = None) -> None:
        """One run's ``result``; ``candidates`` in place of its own where the caller turned
        them into the merged space's terms (a degree set on the configuration, a new cost)."""
        self.considered += result.configs_considered
        self.solved += result.partitions_solved
        self.timed_out = self.timed_out or result.timed_out
        self.lower_bound_ms = min(self.lower_bound_ms, result.lower_bound_ms)
        self.candidates.extend(result.candidates if candidates is None else candidates)

    def best_ms(self) -> float:
        """The fastest feasible plan held (inf: none): the incumbent the next run prunes
        against (a run searches only what can beat it; the best plan stays exact)."""
        return min((c.iteration_ms for c in self.candidates if c.cost.feasible), default=math.inf)

    def result(self, keep: int) -> SearchResult:
        """The merged result: the ``keep`` best distinct candidates, best first."""
        return SearchResult(
            ranked(self.candidates)[:keep],
            self.considered,
            self.solved,
            self.timed_out,
            self.lower_bound_ms,
        )
