"""The search driver: every run of the search as one portfolio under one deadline.

The space has knobs that change every layer's cost, so each of their settings is searched as
its own run on a view of the cost model: the context-parallel degree c
(``CostModel.with_context_parallel``, ``autoplan.solve.context_parallel``), the
expert-parallel degree e (``with_expert_parallel``, ``autoplan.solve.expert_parallel``) and
sequence parallelism off or on (``with_sequence_parallel``,
``autoplan.solve.sequence_parallel``). A run is one (c, e, SP) triple; each runs the families
of ``autoplan.solve.search`` on its view, but for SP: the shared single-stage family runs
in both SP runs of one (c, e), SP for the whole plan, and the uniform and heterogeneous
families only in the SP-off run, which choose SP per stage (the uniform family costs each
stage both ways: ``autoplan.solve.uniform``; the heterogeneous source joins the SP-on view's
tp > 1 options: ``autoplan.solve.stage_degrees``; the bounds of each take the least over both
settings, so they hold for every choice), unless SP is pinned. At sub-block grain every run
is searched first at block grain and its plans seed the unit grain
(``autoplan.solve.granularity``).

Formulation: the space is the union of the runs' spaces (a configuration belongs to one: its
degrees and, for the shared family, its SP setting; a uniform or heterogeneous pipeline with
its SP per stage belongs to the SP-off run of its degrees), so its best plan is the best of the
runs' bests, and a proven lower bound on it is the least of the runs' bounds
(``SearchResult.lower_bound_ms``).
The driver keeps one incumbent (the best feasible plan held by any run, in the plain model's
milliseconds: a view's figure of a configuration is the model's) and one deadline; it works in
two phases:

1. every run's quick families (uniform, shared single-stage: ``start_search``), so that the
   incumbent is the best of all of them before any exact pass starts;
2. every run's heterogeneous family (``finish_search``), pruning against the incumbent, which
   each run's plans lower for the runs after it. Pruning against a plan held loses nothing
   better than it: the best plan stays exact; the runners-up are the best other plans costed.
   The run at c = e = 1 goes last where degrees are searched: its heterogeneous family chooses
   the degrees per stage (``autoplan.solve.stage_degrees``), the largest space, and it gets the
   time the others leave. Of one degrees' runs, SP on goes first: with no heterogeneous family
   of its own, its phase is only its zero-bubble variants and ranking, and the SP-off run's
   heterogeneous family, which chooses SP per stage, gets the time.

The certificate is the least of the runs' floors, so a run's exact pass proving past the
level at which the clock cut a run before it buys nothing yet: its pass stops there (a ceiling:
``hetero.hetero_candidates``' ``state`` keeps where it stands), and the time it leaves goes,
after the last run, to the run of the least floor, which goes on where it stopped up to one
``LEVEL_STEP`` past the next least floor, then the next, until the time is spent or every run
is done (runs of several cp or ep degrees, each with a heterogeneous family: the one cut
first goes on once the others have proven its level). A run left short of its end
makes the result ``timed_out``. Where no run is cut, this is the one phase as before.

Each run's candidates are turned into the plain model's terms (its degrees set on the
configuration, its SP setting, said one way: ``canonical_sequence_parallel``, so the same plan
from two runs is one; ``CostModel.evaluate`` the figure) and ranked once
(``autoplan.solve.ranking``). Time: each phase's run gets an equal share of what is left
(``autoplan.solve.deadline``); a run stopped by it makes the whole result ``timed_out``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Sequence

from autoplan.cost.block_parts import unit_boundaries
from autoplan.cost.config import PlanConfig, canonical_sequence_parallel, with_cp
from autoplan.cost.model import CostModel
from autoplan.solve.certificate import work_bound_ms
from autoplan.solve.deadline import Deadline
from autoplan.solve.expert_parallel import with_expert_degree
from autoplan.solve.granularity import MIN_FINE_SHARE, lift
from autoplan.solve.hetero import HeteroState
from autoplan.solve.levels import LEVEL_STEP
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, Merged, SearchResult, ranked
from autoplan.solve.search import Started, finish_search, start_search
from autoplan.solve.sequence_parallel import has_tensor_parallel, sequence_parallel_runs
from autoplan.solve.stage_degrees import cp_choices, degree_options, expert_degrees

__all__ = ["Run", "portfolio_search", "runs_of"]

Progress = Callable[[int, int], None] | None

logger = logging.getLogger(__name__)

_LEAST_TURN_S = 0.1
"""Least time left worth a run's going on (a turn recosts its zero-bubble variants)."""


@dataclasses.dataclass(frozen=True)
class Run:
    """One (cp, ep, SP) setting: the view the families search and their options.

    ``tensor_parallel_only``: the quick families search only tp > 1 (the SP-off run of the
    same degrees searches the tp-1 plans, the same plans with SP off); ``heterogeneous``
    and ``uniform``: those families run; ``per_stage_sp``: they choose SP per stage
    (``autoplan.solve.sequence_parallel``)."""

    cp: int
    ep: int
    sequence_parallel: bool
    view: CostModel
    options: SolveOptions
    tensor_parallel_only: bool
    heterogeneous: bool = True
    per_stage_sp: bool = False
    uniform: bool = True

    def plain(self, config: PlanConfig, pinned_on: bool) -> PlanConfig | None:
        """``config`` (of this run's view) as a configuration of the plain model: its
        degrees and SP setting on it, said one way (``canonical_sequence_parallel``); None
        where SP is pinned on and means nothing in it."""
        # (A search of the SP-off view returns plan-wide SP where its every tp > 1 stage
        # chose it: ``canonical_sequence_parallel`` in ``finish_search`` and the uniform
        # family.)
        setting = (self.sequence_parallel or config.sequence_parallel) and has_tensor_parallel(
            config
        )
        if self.sequence_parallel and not setting and pinned_on:
            return None
        config = with_expert_degree(config, self.ep)
        if self.cp > 1:
            config = with_cp(config, self.cp)
        return canonical_sequence_parallel(dataclasses.replace(config, sequence_parallel=setting))


def runs_of(model: CostModel, options: SolveOptions) -> list[Run]:
    """The runs of the space of ``options`` on ``model`` (module docstring), by degree."""
    runs: list[Run] = []
    for cp in cp_choices(model, options):
        if cp > 1 and not any(c.gpus_per_node % cp == 0 for c in model.classes):
            # A pinned degree no node holds: no plan of these families (the spanning family,
            # autoplan.solve.context_span_family, may still span two nodes).
            continue
        cp_view = model if cp == 1 else model.with_context_parallel(cp)
        for ep in expert_degrees(cp_view, options):
            ep_options = degree_options(options, ep)
            if ep_options is None:
                continue  # ZeRO-2/3 pinned: ep > 1 is not composed with them
            view = cp_view if ep == 1 else cp_view.with_expert_parallel(ep)
            for sp_run in sequence_parallel_runs(view, ep_options):
                runs.append(
                    Run(
                        cp,
                        ep,
                        sp_run.sequence_parallel,
                        view.with_sequence_parallel(sp_run.sequence_parallel),
                        sp_run.options,
                        sp_run.tensor_parallel_only,
                        sp_run.heterogeneous,
                        sp_run.per_stage,
                        sp_run.uniform,
                    )
                )
    return runs


def _exact_order(runs: Sequence[Run]) -> list[int]:
    """The order of the heterogeneous phase: the per-stage-degree runs (c = e = 1) last where
    several degrees are searched, and of each degrees' runs SP on first (module docstring)."""
    many = len({(run.cp, run.ep) for run in runs}) > 1
    return sorted(
        range(len(runs)),
        key=lambda i: (many and runs[i].cp == runs[i].ep == 1, not runs[i].sequence_parallel),
    )


def _search(
    model: CostModel,
    runs: Sequence[Run],
    batch: int,
    options: SolveOptions,
    progress: Progress,
    deadline: Deadline,
    incumbent_ms: float,
) -> SearchResult:
    """The two phases of the module docstring over ``runs`` of ``model`` (one grain)."""
    started: list[tuple[Run, Started]] = []
    for position, run in enumerate(runs):
        begun = start_search(
            run.view,
            batch,
            run.options,
            progress,
            incumbent_ms=incumbent_ms,
            tensor_parallel_only=run.tensor_parallel_only,
            deadline=deadline.share(len(runs) - position),
            uniform=run.uniform,
            per_stage_sp=run.per_stage_sp,
        )
        started.append((run, begun))
        incumbent_ms = min(incumbent_ms, begun.best_ms())
    pinned_on = bool(options.sequence_parallel)
    order = _exact_order(runs)
    states = {index: HeteroState() for index in order}
    results: dict[int, tuple[SearchResult, list[Candidate]]] = {}

    def finish(index: int, at: float, ceiling: float) -> None:
        """Run ``index``'s heterogeneous family until ``at`` or ``ceiling``, from where its
        state stands; its result in ``results``, in the plain model's terms."""
        run, begun = started[index]
        held = min(
            [
                incumbent_ms,
                *(c.iteration_ms for _, cs in results.values() for c in cs if c.cost.feasible),
            ]
        )
        result = finish_search(
            run.view,
            batch,
            begun,
            progress,
            incumbent_ms=held,
            deadline=at,
            state=states[index],
            ceiling=ceiling,
            heterogeneous=run.heterogeneous,
            per_stage_sp=run.per_stage_sp,
        )
        candidates = []
        for candidate in result.candidates:
            config = run.plain(candidate.config, pinned_on)
            if config is None:
                continue
            if run.cp > 1 or run.ep > 1:
                cost = model.evaluate(config)
                candidate = Candidate(cost.iteration_ms, config, cost)
            else:
                candidate = Candidate(candidate.iteration_ms, config, candidate.cost)
            candidates.append(candidate)
        results[index] = (result, candidates)
        state = states[index]
        if state.done:  # never goes on: its stage sources' tables freed now
            state.sources.clear()
            state.relaxations.clear()
            state.fronts.clear()

    def unfinished(index: int) -> bool:
        """Whether run ``index``'s exact pass stopped (clock or ceiling) short of its end."""
        state = states[index]
        return state.started and not state.done and (state.timed_out or state.capped)

    for position, index in enumerate(order):
        # A run before that the clock cut bounds the certificate by the level it was cut at:
        # proving this one past that level buys nothing until it goes on (below).
        ceiling = min(
            (states[j].level for j in order[:position] if states[j].timed_out), default=math.inf
        )
        finish(index, deadline.share(len(started) - position).at, ceiling)
    # What time is left goes to the run of the least floor, up to a step past the next
    # least (the certificate is the least of them), until none is left short of its end.
    while deadline.left_s() > _LEAST_TURN_S:
        pending = [index for index in order if unfinished(index)]
        if not pending:
            break
        index = min(pending, key=lambda i: states[i].floor_ms())
        others = min((states[j].floor_ms() for j in pending if j != index), default=math.inf)
        ceiling = others * (1 + LEVEL_STEP) if others > 0 else math.inf
        before = states[index].floor_ms()
        # All the time left: the ceiling hands the rest on once it is past the others.
        finish(index, deadline.at, ceiling)
        if states[index].capped and states[index].floor_ms() <= before:
            break  # no level to go on to (a guard: a turn below its ceiling always climbs)
    merged = Merged()
    for index in order:  # every run finished at least once (the loop above)
        result, candidates = results[index]
        if unfinished(index):  # stopped short of its end by the clock, not proven
            result = dataclasses.replace(result, timed_out=True)
        merged.add(result, candidates)
    # No runs (a pinned degree no node holds, SP pinned on where no tp > 1 is allowed): no
    # plan of these families, and the bound says so (inf).
    return merged.result(options.top_k + 1)


def portfolio_search(
    model: CostModel,
    block_model: CostModel | None,
    batch: int,
    options: SolveOptions,
    progress: Progress = None,
    deadline: Deadline | None = None,
    incumbent_ms: float = math.inf,
) -> SearchResult:
    """The best ``options.top_k + 1`` plans of the space (module docstring), best first.
    ``block_model``: the same model at block grain, whose plans seed the search of
    ``model``'s sub-block units (``autoplan.solve.granularity``; None: not seeded);
    ``deadline``: default the options' time limit from now; ``incumbent_ms``: a plan the
    caller holds, which every run prunes against (only plans faster than it may come back)."""
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    runs = runs_of(model, options)
    if block_model is None:
        return _search(model, runs, batch, options, progress, deadline, incumbent_ms)
    coarse = _search(
        block_model, runs_of(block_model, options), batch, options, progress, deadline, incumbent_ms
    )
    boundaries = unit_boundaries(model.profile)
    seeds = []
    for candidate in coarse.candidates:
        config = lift(candidate.config, boundaries)
        cost = model.evaluate(config)
        seeds.append(Candidate(cost.iteration_ms, config, cost))
    incumbent_ms = min([incumbent_ms, *(c.iteration_ms for c in seeds if c.cost.feasible)])
    if deadline.left_s() < MIN_FINE_SHARE * deadline.budget_s:
        # No time left to search the units: the block plans, not proven best at this grain.
        logger.warning(
            "time limit reached at block grain: the plan is the best block plan, the "
            "sub-block units were not searched"
        )
        fine = SearchResult([], 0, 0, True, work_bound_ms(model, batch, options))
    else:
        fine = _search(model, runs, batch, options, progress, deadline, incumbent_ms)
    return SearchResult(
        ranked(fine.candidates + seeds)[: options.top_k + 1],
        coarse.configs_considered + fine.configs_considered,
        coarse.partitions_solved + fine.partitions_solved,
        # The finer search prunes only against plans it holds: exact unless it stopped.
        fine.timed_out,
        # Its floor holds for the units' space; the block plans are plans of it too.
        min(fine.lower_bound_ms, incumbent_ms),
    )
