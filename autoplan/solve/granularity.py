"""The search at sub-block grain, seeded with the block-grain plan.

A plan over blocks is a plan over sub-block units whose cuts fall on block boundaries (each
block's attention and MLP parts in one stage), and the cost model prices such a plan the same
at either grain (``autoplan.cost.block_parts``: a stage holding both parts of a block runs the
block). So the finer search first solves the coarser problem, the profile with each block's
parts merged (``block_profile``), which has half the units and is several times faster, lifts
its candidates to units (``lift``) and costs them on the sub-block model; the best of them is
the incumbent the sub-block search starts from (``search(..., incumbent_ms=...)``): it only
explores what can beat it, and what it returns is never slower than the block plan. The two
sets of candidates are merged and ranked as ``search`` ranks them.

The time limit is shared: the block search may take all of it (it is the smaller problem,
and its plan is what the finer one must not fall below), the sub-block search gets what is
left; stopped early, it returns the best found, at worst the block plan. A pinned
``layer_split`` counts units, so it is searched at sub-block grain only; so are the baseline
strategies (their rule, e.g. an even split, is over the units).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable

from autoplan.cost.block_parts import block_pairs, block_profile, unit_boundaries
from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.profile.schema import Profile
from autoplan.solve.certificate import work_bound_ms
from autoplan.solve.deadline import Deadline
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, SearchResult, ranked
from autoplan.solve.sequence_parallel import search_with_sequence_parallel

__all__ = ["BLOCK_SHARE", "MIN_FINE_SHARE", "block_seed_profile", "lift", "seeded_search"]

BLOCK_SHARE = 1.0
"""Part of the time limit the block-grain search may take (module docstring)."""

MIN_FINE_SHARE = 0.05
"""Below this part of the limit left, the units are not searched (the search's set-up alone
would overrun the limit); the block plans are returned, marked as stopped by the limit."""

logger = logging.getLogger(__name__)


def block_seed_profile(profile: Profile, options: SolveOptions) -> Profile | None:
    """The block-grain profile to seed a search of ``profile`` with, or None where there is
    none: a baseline strategy, a block-grain profile, no splittable block, or a pinned
    (unit) layer split."""
    if options.strategy != "optimal" or options.layer_split is not None:
        return None
    if profile.model.granularity != "sub-block":
        return None
    if not block_pairs(profile):
        return None
    return block_profile(profile)


def lift(config: PlanConfig, boundaries: list[int]) -> PlanConfig:
    """A block-grain configuration as the same plan over sub-block units: layer l is the
    units ``[boundaries[l], boundaries[l + 1])`` (``unit_boundaries``)."""
    stages = tuple(
        dataclasses.replace(
            stage,
            layer_start=boundaries[stage.layer_start],
            layer_end=boundaries[stage.layer_end],
        )
        for stage in config.stages
    )
    return dataclasses.replace(config, stages=stages)


def seeded_search(
    model: CostModel,
    block_model: CostModel | None,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    deadline: Deadline | None = None,
    incumbent_ms: float = math.inf,
) -> SearchResult:
    """``search_with_sequence_parallel`` on ``model``, seeded with the best plans of
    ``block_model`` (the same model at block grain; None: not seeded) as the module
    docstring says; ``deadline`` (default: the options' time limit from now) bounds both;
    ``incumbent_ms``: a plan the caller holds, which both prune against."""
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    if block_model is None:
        return search_with_sequence_parallel(
            model, batch, options, progress, incumbent_ms=incumbent_ms, deadline=deadline
        )
    block_deadline = Deadline(
        deadline.at - deadline.budget_s * (1.0 - BLOCK_SHARE), deadline.budget_s * BLOCK_SHARE
    )
    coarse = search_with_sequence_parallel(
        block_model, batch, options, progress, incumbent_ms=incumbent_ms, deadline=block_deadline
    )
    boundaries = unit_boundaries(model.profile)
    seeds = []
    for candidate in coarse.candidates:
        config = lift(candidate.config, boundaries)
        cost = model.evaluate(config)
        seeds.append(Candidate(cost.iteration_ms, config, cost))
    incumbent = min(
        [incumbent_ms, *(c.iteration_ms for c in seeds if c.cost.feasible)], default=math.inf
    )
    if deadline.left_s() < MIN_FINE_SHARE * deadline.budget_s:
        # No time left to search the units: the block plans, not proven best at this grain.
        logger.warning(
            "time limit reached at block grain: the plan is the best block plan, the "
            "sub-block units were not searched"
        )
        fine = SearchResult([], 0, 0, True, work_bound_ms(model, batch, options))
    else:
        fine = search_with_sequence_parallel(
            model, batch, options, progress, incumbent_ms=incumbent, deadline=deadline
        )
    best_first = ranked(fine.candidates + seeds)
    return SearchResult(
        best_first[: options.top_k + 1],
        coarse.configs_considered + fine.configs_considered,
        coarse.partitions_solved + fine.partitions_solved,
        # The finer search prunes only against plans it holds: exact unless it stopped.
        fine.timed_out,
        # Its floor holds for the units' space; the block plans are plans of it too.
        min([fine.lower_bound_ms, incumbent]),
    )
