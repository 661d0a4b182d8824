"""Sequence parallelism as a searched per-plan knob.

The model does not let SP be assumed free: it divides the replicated part of every block's
time and memory by t and turns each all-reduce into a reduce-scatter and an all-gather (the
same ring volume and latency steps), but it adds the all-gathers that re-make the
column-split linears' inputs for backward and those at the ends of each stage's run of
blocks (``autoplan.cost.sequence_parallel``): a plan can be slower with it. So the search is
run once per setting, on a view of the cost model for each
(``CostModel.with_sequence_parallel``), and the candidates merged: the best of the two runs
is the best of the space with the knob in it. A plan without tp > 1 anywhere is the same
plan either way and is kept with SP off (the validator rejects SP without tp). The second run
is skipped where it cannot differ: the tp is pinned to 1 or no layer splits; where it runs, its
uniform and shared families search only tp > 1 (theirs are one-tp plans: the tp-1 ones are the
first run's, already held; the heterogeneous family mixes tp 1 and tp > 1 stages, so it searches
all). Both runs' quick families (uniform, shared) come first, and each run's heterogeneous
family prunes against the best plan held by then (of either setting), so it explores only what
can beat it. Pinned on, the search runs once per tp > 1 the cluster allows, with that tp
pinned (so a heterogeneous plan mixing tp 1 and tp > 1 stages is not among those it
considers).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from autoplan.cost.config import PlanConfig
from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.solve.deadline import Deadline
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, Merged, SearchResult
from autoplan.solve.search import finish_search, start_search
from autoplan.solve.space import tp_choices

__all__ = ["has_tensor_parallel", "search_with_sequence_parallel"]


def has_tensor_parallel(config: PlanConfig) -> bool:
    """Whether some group of ``config`` runs tensor parallel (SP means something)."""
    return any(group.tp > 1 for stage in config.stages for group in stage.groups)


def _runs(model: CostModel, options: SolveOptions) -> list[tuple[bool, SolveOptions]]:
    """The searches to run: (SP setting, options of that run). A mixture-of-experts model
    runs without SP (the runtime's router does not take a sequence-sharded stream)."""
    if expert_counts(model.profile):
        if options.sequence_parallel:
            raise InputError(
                "--sp: sequence parallelism is not run on mixture-of-experts models; use --no-sp"
            )
        return [(False, options)]
    if options.sequence_parallel is False:
        return [(False, options)]
    if options.sequence_parallel:
        # Pinned on: only plans with tp > 1 mean it; one run per such tp.
        return [
            (True, options.model_copy(update={"tp": t}))
            for t in tp_choices(model, options)
            if t > 1
        ]
    splittable = any(layer.tensor_parallel is not None for layer in model.profile.layers)
    if options.tp == 1 or not splittable:
        return [(False, options)]
    return [(False, options), (True, options)]


def search_with_sequence_parallel(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    progress: Callable[[int, int], None] | None = None,
    incumbent_ms: float = math.inf,
    deadline: Deadline | None = None,
) -> SearchResult:
    """``search`` over the space with the sequence-parallel knob (module docstring);
    ``incumbent_ms`` as ``search`` takes it; ``deadline`` (default: the options' time limit
    from now) shared out among the runs."""
    runs = _runs(model, options)
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    merged = Merged()
    # Every setting's quick families first (``start_search``), so that each heterogeneous
    # family prunes against the best plan of all of them (GPT-Neo-2.7B 16+16: SP on's uniform
    # plan is 2% faster than SP off's best, and SP off's exact pass costs half with it).
    started = []
    for position, (setting, run_options) in enumerate(runs):
        view = model.with_sequence_parallel(setting)
        begun = start_search(
            view,
            batch,
            run_options,
            progress,
            incumbent_ms=incumbent_ms,
            # The SP-off run before it searched the same tp-1 plans: its best bounds this
            # run's pruning (``incumbent_ms``) and its candidates are kept with SP off.
            tensor_parallel_only=setting and position > 0 and not runs[0][0],
            deadline=deadline.share(len(runs) - position),
        )
        started.append((setting, view, begun))
        incumbent_ms = min(incumbent_ms, begun.best_ms())
    # Sequence parallelism on first: its plans are the faster where tp > 1 helps, and its
    # best prunes the other setting's heterogeneous family (GPT-3 175B on mixed-1024: 2.3x).
    started.sort(key=lambda item: not item[0])
    for position, (setting, view, begun) in enumerate(started):
        result = finish_search(
            view,
            batch,
            begun,
            progress,
            incumbent_ms=incumbent_ms,
            deadline=deadline.share(len(started) - position).at,
        )
        # The next setting's run only has to beat the best plan held: it prunes against it
        # (exact for the best plan; the runners-up then come from the runs that found them).
        incumbent_ms = min(
            [incumbent_ms, *(c.iteration_ms for c in result.candidates if c.cost.feasible)]
        )
        kept = []
        for candidate in result.candidates:
            setting_here = setting and has_tensor_parallel(candidate.config)
            if setting and not setting_here and options.sequence_parallel:
                continue  # pinned on: only plans where it means something
            config = dataclasses.replace(candidate.config, sequence_parallel=setting_here)
            kept.append(Candidate(candidate.iteration_ms, config, candidate.cost))
        merged.add(result, kept)
    if not runs:
        return SearchResult([], 0, 0, False, 0.0)
    return merged.result(options.top_k + 1)
