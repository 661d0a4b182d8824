"""The search at sub-block grain, seeded with the block-grain plan.

A plan over blocks is a plan over sub-block units whose cuts fall on block boundaries (each
block's attention and MLP parts in one stage), and the cost model prices such a plan the same
at either grain (``autoplan.cost.block_parts``: a stage holding both parts of a block runs the
block). So the finer search first solves the coarser problem, the profile with each block's
parts merged (``block_profile``), which has half the units and is several times faster, lifts
its candidates to units (``lift``) and costs them on the sub-block model; the best of them is
the incumbent the sub-block search starts from (``search(..., incumbent_ms=...)``): it only
explores what can beat it, and what it returns is never slower than the block plan. The two
sets of candidates are merged and ranked as ``search`` ranks them. The driver of both grains
is ``autoplan.solve.portfolio``.

The time limit is shared: the block search may take all of it (it is the smaller problem,
and its plan is what the finer one must not fall below), the sub-block search gets what is
left; stopped early, it returns the best found, at worst the block plan. A pinned
``layer_split`` counts units, so it is searched at sub-block grain only; so are the baseline
strategies (their rule, e.g. an even split, is over the units).
"""

from __future__ import annotations

import dataclasses
import logging

from autoplan.cost.block_parts import block_pairs, block_profile
from autoplan.cost.config import PlanConfig
from autoplan.profile.schema import Profile
from autoplan.solve.options import SolveOptions

__all__ = ["MIN_FINE_SHARE", "block_seed_profile", "lift"]

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
