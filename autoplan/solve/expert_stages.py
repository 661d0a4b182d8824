"""Expert parallelism per stage in the heterogeneous search: each stage its own ep degree.

The heterogeneous DP (``solvers.pipeline_dp``) draws its stage options, their costs and its
bounds from a source (``HeteroSource``: one option per replica allocation). With ep searched,
``ExpertStageSource`` offers each allocation once per ep degree e its replica counts admit
(e divides every count: expert groups of e replicas of one kind), as an option of its own:

- option (allocation, e) is costed by the ``HeteroSource`` of the cost model's ep-e view
  (``CostModel.with_expert_parallel``): its MoE layers' all-to-alls, experts divided by e,
  ZeRO 0 or 1 for e > 1 (the levels ``autoplan.cost.expert_parallel`` composes with ep);
- its stage carries e (``StageChoice.ep``), so ``CostModel.evaluate`` costs it at e.

Since every (allocation, e) is its own option, the DP's exactness covers the per-stage choice:
an H100 stage at ep 8 beside an L4 stage at ep 1 is in the space, and where the best plan has
one degree everywhere the search still finds it. The bounds are the ep-1 source's, for each
(allocation, e): they are of per-sample work without recompute (floors) and of per-sample
GPU time (prefix), and ep only adds to a layer's time (the all-to-alls) while it saves memory,
which those bounds do not count.

Degrees: 1 and the divisors of the gcd of the MoE layers' expert counts up to the cluster's
GPUs (``expert_degrees``); a pinned ``--ep`` keeps one degree for every stage (the per-plan
views of ``autoplan.solve.expert_parallel``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Hashable

import numpy as np

from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.solve.hetero import HeteroSource, SourceType
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors
from solvers.pipeline_dp import StageCostResult

__all__ = ["ExpertStageSource", "expert_degrees", "stage_source"]


def expert_degrees(model: CostModel, options: SolveOptions) -> list[int]:
    """The ep degrees to search (module docstring); raises InputError for a pinned degree the
    model cannot take."""
    counts = expert_counts(model.profile)
    pinned = options.expert_parallel
    if not counts:
        if pinned not in (None, 1):
            raise InputError(f"--ep {pinned}: {model.profile.model.name} has no experts")
        return [1]
    common = math.gcd(*counts)
    if pinned is not None:
        if common % pinned:
            raise InputError(f"--ep {pinned} must divide the experts of every MoE layer ({common})")
        return [pinned]
    gpus = sum(c.total_gpus for c in model.classes)
    return [e for e in divisors(common) if e <= gpus]


def degree_options(options: SolveOptions, ep: int) -> SolveOptions | None:
    """The options of a search at ep ``ep``: ZeRO 1 (or 0 where pinned off) for ep > 1, none
    where ZeRO-2/3 is pinned (not composed with ep)."""
    if ep == 1:
        return options
    if (options.zero_stage or 0) > 1:
        return None
    pinned_off = options.zero_stage == 0 or options.zero1 is False
    return options.model_copy(update={"zero_stage": 0 if pinned_off else 1})


class ExpertStageSource:
    """``HeteroSource``'s allocations, each at every ep it admits (module docstring)."""

    def __init__(
        self,
        model: CostModel,
        batch: int,
        num_micro_batches: int,
        schedule: str,
        options: SolveOptions,
        degrees: list[int],
    ) -> None:
        self.base = HeteroSource(model, batch, num_micro_batches, schedule, options)
        # (degree, its source, the source's option) of each of this source's options.
        self._options: list[tuple[int, HeteroSource, int]] = [
            (1, self.base, o) for o in range(len(self.base.allocations))
        ]
        base_of = list(range(len(self.base.allocations)))
        position = {a: o for o, a in enumerate(self.base.allocations)}
        for ep in degrees:
            ep_options = degree_options(options, ep)
            if ep == 1 or ep_options is None:
                continue
            view = model.with_expert_parallel(ep)
            source = HeteroSource(view, batch, num_micro_batches, schedule, ep_options)
            for o, allocation in enumerate(source.allocations):
                if allocation in position:
                    self._options.append((ep, source, o))
                    base_of.append(position[allocation])
        self._base_of = np.array(base_of, dtype=np.int64)
        self._uses = [self.base.options()[b] for b in base_of]

    def options(self) -> list[tuple[int, ...]]:
        return self._uses

    def floor_table(self, j: int) -> np.ndarray:
        return self.base.floor_table(j)[self._base_of]

    def prefix_table(self, free: np.ndarray) -> np.ndarray:
        return self.base.prefix_table(free)

    def key_covers(self, low: Hashable, high: Hashable) -> bool:
        return self.base.key_covers(low, high)

    def cost(
        self, option: int, i: int, j: int, position: int, next_key: Hashable | None
    ) -> StageCostResult | None:
        ep, source, own = self._options[option]
        found = source.cost(own, i, j, position, next_key)
        if found is None or ep == 1:
            return found
        assert isinstance(found.payload, tuple)  # HeteroSource's (groups, ZeRO level)
        return dataclasses.replace(found, payload=(*found.payload, ep))


def stage_source(model: CostModel, options: SolveOptions) -> SourceType:
    """The heterogeneous search's source on ``model``: per-stage ep (``ExpertStageSource``)
    on the ep-1 model of a model with experts where ep is not pinned, else ``HeteroSource``."""
    if model.expert_parallel != 1 or options.expert_parallel is not None:
        return HeteroSource
    degrees = expert_degrees(model, options)
    if degrees == [1]:
        return HeteroSource

    def make(
        model: CostModel, batch: int, m: int, schedule: str, options: SolveOptions
    ) -> ExpertStageSource:
        return ExpertStageSource(model, batch, m, schedule, options, degrees)

    return make
