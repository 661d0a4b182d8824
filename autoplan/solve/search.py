"""The search: the best plan over every family of the space (``autoplan.solve.space``).

1. Uniform pipelines (``autoplan.solve.uniform``, one (dp, tp) for every stage, interleaving
   included): exact best-first search; its best is the first bound of what follows.
2. Shared single-stage plans (``autoplan.solve.shares``): the share ILP per (tp, classes).
3. Heterogeneous pipelines (``autoplan.solve.hetero``): per micro-batch count, the exact
   label-setting DP of ``solvers.pipeline_dp``, pruned by the best time found so far.

Each family's best is exact within it, so the best of the three is exact within the space;
the alternatives are the best other configurations the search costed. Each family also
reports its floor (``autoplan.solve.certificate``): the result's ``lower_bound_ms`` is the
least of them and of the plans found, a proven lower bound on the space's best plan. The
zero-bubble schedules are tried only at the partitions found best (``solve.zero_bubble``), so
where they are in the space the bound also holds the zero-bubble plans elsewhere under the work
and zero-bubble bounds (``certificate``), which hold for every dp-1 plan of every schedule.
Every candidate is costed again by ``CostModel.evaluate`` (layer by layer), the figure the
plan reports.
Deterministic: families and candidates are visited in a fixed order, and ties go to the
canonical order of ``config_key``, unless the time limit stops the search (logged).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass

from autoplan.cost.config import canonical_sequence_parallel
from autoplan.cost.model import CostModel
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve.certificate import Floors, work_bound_ms, zero_bubble_bound_ms
from autoplan.solve.deadline import Deadline
from autoplan.solve.hetero import HeteroState, hetero_candidates
from autoplan.solve.options import SolveOptions
from autoplan.solve.progress import report_found
from autoplan.solve.ranking import Candidate, SearchResult, ranked
from autoplan.solve.shares import shared_search
from autoplan.solve.stage_degrees import stage_source
from autoplan.solve.uniform import uniform_search
from autoplan.solve.zero_bubble import zero_bubble_variants

__all__ = ["Started", "finish_search", "search", "start_search"]

logger = logging.getLogger(__name__)


def _zero_bubble_floor(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    candidates: list[Candidate],
    incumbent_ms: float = math.inf,
) -> float:
    """No zero-bubble plan of the space is faster (``autoplan.solve.certificate``), or none
    is faster than the best of ``candidates`` and ``incumbent_ms`` (the bound stops there:
    it is the floor of a search whose caller holds that plan, or that has a floor as low)."""
    best = min(
        [incumbent_ms, *(c.iteration_ms for c in candidates if c.cost.feasible)], default=math.inf
    )
    return max(
        work_bound_ms(model, batch, options),
        zero_bubble_bound_ms(model, batch, options, cap_ms=best),
    )


@dataclass
class Started:
    """A search whose quick families (uniform, shared) have run; the heterogeneous family
    and the ranking are left to ``finish_search``."""

    options: SolveOptions
    deadline: float  # time.monotonic() value past which the search stops
    candidates: list[Candidate]
    considered: int
    solved: int
    timed_out: bool
    floors: Floors

    def best_ms(self) -> float:
        """The fastest feasible plan found so far (inf: none)."""
        return min((c.iteration_ms for c in self.candidates if c.cost.feasible), default=math.inf)


def start_search(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    incumbent_ms: float = math.inf,
    tensor_parallel_only: bool = False,
    deadline: Deadline | None = None,
    *,
    uniform: bool = True,
    per_stage_sp: bool = False,
) -> Started:
    """The uniform and shared families of ``search`` (cheap, exact within themselves): a
    caller running several searches (``autoplan.solve.portfolio``) starts them all first, so that
    each heterogeneous family prunes against the best plan of every one.
    ``tensor_parallel_only``: those two families' plans with tp > 1 only (the caller holds
    the tp-1 ones from another run, where they are the same plans). ``uniform`` False: the
    uniform family does not run here (another run's covers it); ``per_stage_sp``: it
    chooses sequence parallelism per stage (``autoplan.solve.sequence_parallel``)."""
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    if options.schedule in ZERO_BUBBLE_SCHEDULES and options.dp is None:
        options = options.model_copy(update={"dp": 1})  # torch runs them only at dp 1
    heterogeneous = options.strategy == "optimal" and options.space == "heterogeneous"
    started = Started(options, deadline.at, [], 0, 0, False, Floors())
    if uniform:
        found = uniform_search(
            model,
            batch,
            options,
            None if heterogeneous else progress,
            deadline=deadline.at,
            incumbent_ms=incumbent_ms,
            tensor_parallel_only=tensor_parallel_only,
            per_stage_sp=per_stage_sp,
        )
        started.candidates += found.candidates
        started.considered = found.configs_considered
        started.solved = found.partitions_solved
        started.timed_out = found.timed_out
        started.floors.add(found.lower_bound_ms)
    if options.strategy == "optimal":
        shared = shared_search(
            model, batch, options, deadline.budget_s, deadline.at, tensor_parallel_only
        )
        if not shared.complete:
            started.floors.add(work_bound_ms(model, batch, options))
        for config in shared.configs:
            cost = model.evaluate(config)
            started.candidates.append(Candidate(cost.iteration_ms, config, cost))
            if cost.feasible:
                report_found(cost.iteration_ms)
    return started


def search(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    incumbent_ms: float = math.inf,
) -> SearchResult:
    """The ``options.top_k + 1`` best distinct configurations, best first (module docstring);
    with an ``incumbent_ms`` (a plan the caller holds: ``autoplan.solve.granularity``), the
    search prunes against it and may return only plans faster than it, or none."""
    started = start_search(model, batch, options, progress, incumbent_ms)
    return finish_search(model, batch, started, progress, incumbent_ms)


def finish_search(
    model: CostModel,
    batch: int,
    started: Started,
    progress: Callable[[int, int], None] | None = None,
    incumbent_ms: float = math.inf,
    deadline: float | None = None,
    state: HeteroState | None = None,
    ceiling: float = math.inf,
    *,
    heterogeneous: bool = True,
    per_stage_sp: bool = False,
) -> SearchResult:
    """The rest of ``search`` after ``start_search``: the heterogeneous family, pruned
    against ``incumbent_ms`` and the plans ``started`` holds, until ``deadline`` (default:
    the started search's), then the zero-bubble variants and the ranking. ``state`` and
    ``ceiling``: the heterogeneous pass's, to go on from a call before and to stop at a
    level (``hetero.hetero_candidates``). ``heterogeneous`` False: that family does not
    run here (another run's covers it); ``per_stage_sp``: it chooses sequence parallelism
    per stage (``autoplan.solve.sequence_parallel``)."""
    options = started.options
    deadline = started.deadline if deadline is None else deadline
    keep = options.top_k + 1
    heterogeneous = (
        heterogeneous and options.strategy == "optimal" and options.space == "heterogeneous"
    )
    candidates = list(started.candidates)
    considered, solved, timed_out = started.considered, started.solved, started.timed_out
    floors = Floors(started.floors.floor_ms)
    if heterogeneous and timed_out:
        floors.add(work_bound_ms(model, batch, options))  # never started
    if heterogeneous and not timed_out:
        found = hetero_candidates(
            model,
            batch,
            options,
            min(started.best_ms(), incumbent_ms),
            keep=keep,
            deadline=deadline,
            progress=progress,
            # cp, ep and SP per stage (solve.stage_degrees)
            source_type=stage_source(model, options, per_stage_sp),
            state=state,
            ceiling=ceiling,
        )
        considered += found.labels
        solved += found.stages_costed
        timed_out = timed_out or found.timed_out
        floors.add(found.floor_ms)
        for config in found.configs:
            config = canonical_sequence_parallel(config)
            cost = model.evaluate(config)
            candidates.append(Candidate(cost.iteration_ms, config, cost))
    # Zero bubble: the best pipelines again under the schedules their layout allows.
    if options.zero_bubble or options.schedule in ZERO_BUBBLE_SCHEDULES:
        for config in zero_bubble_variants([c.config for c in candidates], options.schedule):
            cost = model.evaluate(config)
            candidates.append(Candidate(cost.iteration_ms, config, cost))
    zero_bubble = options.zero_bubble or options.schedule in ZERO_BUBBLE_SCHEDULES
    # A zero-bubble plan has one replica per stage (torch runs them at dp 1), and a view at
    # ep e > 1 holds only stages of multiples of e replicas: none of its plans is one.
    no_zero_bubble_plan = model.expert_parallel > 1
    if zero_bubble and options.dp in (None, 1) and not no_zero_bubble_plan:
        # Torch runs them at dp 1 only. Tried at the best partitions only: the zero-bubble
        # plans elsewhere are bounded by the bounds that hold for every dp-1 plan of every
        # schedule (``certificate``: the work bound and the zero-bubble bound).
        # Past the least floor so far it cannot change the search's (the least of them):
        # capped there too (a 16k-GPU search at its limit skips the memory packings).
        cap = min(incumbent_ms, floors.floor_ms)
        floors.add(_zero_bubble_floor(model, batch, options, candidates, cap))
    if options.schedule in ZERO_BUBBLE_SCHEDULES:  # the 1F1B-family bases were only a means
        candidates = [c for c in candidates if c.config.schedule == options.schedule]
        floors = Floors(
            math.inf
            if no_zero_bubble_plan
            else _zero_bubble_floor(model, batch, options, candidates, incumbent_ms)
        )
    best_first = ranked(candidates)
    floors.add(min((c.iteration_ms for c in best_first if c.cost.feasible), default=math.inf))
    return SearchResult(best_first[:keep], considered, solved, timed_out, floors.floor_ms)
