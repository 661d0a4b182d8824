"""Context parallelism as a searched knob: one search per cp degree, on the cost model's view.

A cp degree c turns every replica of a plan into c tp groups, each running a chunk of every
sample's sequence (``autoplan.cost.context_parallel``). The search needs no new dimension
for it: on ``CostModel.with_context_parallel(c)`` a device class counts cp groups of c GPUs of
one node as its GPUs, and costs every group at cp c, so the same search (uniform,
shared-stage and heterogeneous families, sequence parallelism on and off) runs over plans whose
replicas are tp × c GPUs inside a node (cp within a node first, where the ring's sends are on
NVLink). Its configurations come back with ``cp = c`` on their groups and are costed again by
the model itself (``evaluate``, the figure the plan reports); the best over the degrees is the
best of the space with the knob in it. In the run at cp 1, the heterogeneous family also
chooses cp per stage (``autoplan.solve.stage_degrees``); the uniform and shared-stage families
keep one cp for every stage.

Degrees searched: 1 and the powers of two up to ``MAX_CONTEXT_PARALLEL`` that divide some
class's GPUs per node and whose 2·c load-balanced chunks divide the sequence, for a model with
an attention core. Sequences shorter than ``SolveOptions.cp_min_seq_len`` are searched at cp 1
only unless cp is pinned: there a chunk's attention is too short to hide the ring's sends and a
sample's activations rarely bind, and each degree costs one more search.
"""

from __future__ import annotations

from collections.abc import Callable

from autoplan.cost.config import with_cp
from autoplan.cost.model import CostModel
from autoplan.solve.deadline import Deadline
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, Merged, SearchResult
from autoplan.solve.stage_degrees import MAX_CONTEXT_PARALLEL, cp_choices

__all__ = ["MAX_CONTEXT_PARALLEL", "cp_choices", "search_with_context_parallel"]

# (model view, batch, options, the run's deadline, the incumbent's ms) -> one search's candidates
Searcher = Callable[[CostModel, int, SolveOptions, Deadline, float], SearchResult]


def search_with_context_parallel(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    searcher: Searcher,
    deadline: Deadline | None = None,
) -> SearchResult:
    """``searcher`` once per cp degree on the model's view of it, the candidates merged and
    ranked by ``model.evaluate`` (module docstring). ``deadline`` (default: the options' time
    limit from now) is shared: each run gets an equal part of what is left. Each run prunes
    against the best plan held (of the degrees before it): the view's figure of a
    configuration is the model's (``CostModel.with_context_parallel``), so what it prunes
    cannot beat that plan."""
    runs = cp_choices(model, options)
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    merged = Merged()
    for position, cp in enumerate(runs):
        if cp > 1 and not any(c.gpus_per_node % cp == 0 for c in model.classes):
            # A pinned degree no node holds: no plan of these families (the spanning family,
            # autoplan.solve.context_span_family, may still span two nodes).
            continue
        view = model if cp == 1 else model.with_context_parallel(cp)
        result = searcher(
            view, batch, options, deadline.share(len(runs) - position), merged.best_ms()
        )
        candidates = result.candidates
        if cp > 1:
            candidates = []
            for candidate in result.candidates:
                config = with_cp(candidate.config, cp)
                cost = model.evaluate(config)
                candidates.append(Candidate(cost.iteration_ms, config, cost))
        merged.add(result, candidates)
    return merged.result(options.top_k + 1)
