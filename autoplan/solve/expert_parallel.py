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
import time
from collections.abc import Callable

from autoplan.cost.config import PlanConfig
from autoplan.cost.model import CostModel
from autoplan.solve.options import SolveOptions
from autoplan.solve.search import Candidate, SearchResult
from autoplan.solve.stage_degrees import degree_options, expert_degrees
from autoplan.solve.uniform import config_key

__all__ = ["expert_degrees", "search_with_expert_parallel", "with_expert_degree"]

Search = Callable[[CostModel, CostModel | None, int, SolveOptions], SearchResult]


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
) -> SearchResult:
    """``run`` (the search at one ep, on views of ``model`` and ``block_model``) once per
    degree of ``expert_degrees``, the candidates merged and ranked (module docstring)."""
    degrees = expert_degrees(model, options)
    if degrees == [1]:
        return run(model, block_model, batch, options)
    deadline = time.monotonic() + options.time_limit_s
    candidates: dict[tuple, Candidate] = {}
    considered = solved = 0
    timed_out = False
    lower_bound = math.inf  # the least of the runs' proven bounds (autoplan.solve.certificate)
    for position, ep in enumerate(degrees):
        left = max(deadline - time.monotonic(), 1e-3) / (len(degrees) - position)
        degree = degree_options(options, ep)
        if degree is None:
            continue  # ZeRO-2/3 pinned: ep > 1 is not composed with them
        result = run(
            model.with_expert_parallel(ep),
            None if block_model is None else block_model.with_expert_parallel(ep),
            batch,
            degree.model_copy(update={"time_limit_s": left}),
        )
        considered += result.configs_considered
        solved += result.partitions_solved
        timed_out = timed_out or result.timed_out
        lower_bound = min(lower_bound, result.lower_bound_ms)
        for candidate in result.candidates:
            config = with_expert_degree(candidate.config, ep)
            cost = model.evaluate(config)
            key = (*config_key(config), config.sequence_parallel)
            candidates.setdefault(key, Candidate(cost.iteration_ms, config, cost))
    ranked = sorted(
        candidates.values(),
        key=lambda c: (
            not c.cost.feasible,
            c.iteration_ms,
            config_key(c.config),
            c.config.sequence_parallel,
        ),
    )
    return SearchResult(ranked[: options.top_k + 1], considered, solved, timed_out, lower_bound)
