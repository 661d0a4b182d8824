"""Expert parallelism as a searched knob: one search per ep degree, merged.

Like sequence parallelism (``autoplan.solve.sequence_parallel``), ep changes every layer's
costs (its MoE layers' all-to-alls and expert memory: ``autoplan.cost.expert_parallel``), so
the search runs once per degree e on a view of the cost model costing every stage at e
(``CostModel.with_expert_parallel``), whose space holds only replica groups of a multiple of
e replicas (the uniform, heterogeneous and shared-stage searches read ``expert_parallel``),
and the candidates are merged: the best of the runs is the best of the space with ep in it.
In the run at ep 1, the heterogeneous family chooses ep per stage (``autoplan.solve.
stage_degrees``: each stage its own degree); the uniform and shared-stage families keep one
degree per plan.

Degrees searched: 1 and every divisor of the gcd of the MoE layers' expert counts up to the
cluster's GPUs (a dense model: 1 only); pinned, that degree. ep > 1 runs with ZeRO level 1
(its optimizer states sharded over the replicas of one expert index), or 0 where pinned so:
ZeRO-1 never costs time and saves memory, and the cost model does not compose ZeRO-2/3 with
ep (``autoplan.cost.expert_parallel``). A plan's
stages carry the degree (``StageChoice.ep``), and its cost is ``CostModel.evaluate`` of that
config on the plain model, which the view's figures equal.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.solve.deadline import Deadline
from autoplan.solve.options import SolveOptions
from autoplan.solve.ranking import Candidate, Merged, SearchResult
from autoplan.solve.stage_degrees import degree_options, expert_degrees

__all__ = ["expert_degrees", "search_with_expert_parallel", "with_expert_degree"]

# (model view, block-grain view, batch, options, the run's deadline, the incumbent's ms)
# -> one search's candidates
Search = Callable[[CostModel, CostModel | None, int, SolveOptions, Deadline, float], SearchResult]


def with_expert_degree(config: PlanConfig, ep: int) -> PlanConfig:
    """``config`` with every stage at expert-parallel degree ``ep``."""
    if ep == 1:
        return config
    return dataclasses.replace(
        config, stages=tuple(dataclasses.replace(stage, ep=ep) for stage in config.stages)
    )


def search_with_expert_parallel(
    model: CostModel,
    block_model: CostModel | None,
    batch: int,
    options: SolveOptions,
    run: Search,
    deadline: Deadline | None = None,
    incumbent_ms: float = math.inf,
) -> SearchResult:
    """``run`` (the search at one ep, on views of ``model`` and ``block_model``) once per
    degree of ``expert_degrees``, the candidates merged and ranked (module docstring);
    ``deadline`` (default: the options' time limit from now) shared out among the degrees.
    Each degree's run prunes against the best plan held (``incumbent_ms``, a plan the caller
    holds, or one of the degrees before it): the view's figures are the model's."""
    degrees = expert_degrees(model, options)
    deadline = Deadline.after(options.time_limit_s) if deadline is None else deadline
    if degrees == [1]:
        return run(model, block_model, batch, options, deadline, incumbent_ms)
    merged = Merged()
    for position, ep in enumerate(degrees):
        share = deadline.share(len(degrees) - position)
        degree = degree_options(options, ep)
        if degree is None:
            continue  # ZeRO-2/3 pinned: ep > 1 is not composed with them
        result = run(
            model.with_expert_parallel(ep),
            None if block_model is None else block_model.with_expert_parallel(ep),
            batch,
            degree,
            share,
            min(incumbent_ms, merged.best_ms()),
        )
        candidates = []
        for candidate in result.candidates:
            config = with_expert_degree(candidate.config, ep)
            cost = model.evaluate(config)
            candidates.append(Candidate(cost.iteration_ms, config, cost))
        merged.add(result, candidates)
    return merged.result(options.top_k + 1)
