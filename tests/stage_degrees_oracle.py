"""Brute force over heterogeneous pipelines whose stages each take their own (cp, ep): the
oracle of ``autoplan.solve.stage_degrees`` (tests/test_context_parallel_oracle.py,
tests/test_expert_parallel_cost.py).

Every micro-batch count, pipeline degree, layer split and, per stage, every allocation of the
space of each (cp, ep) view (``tests.test_solver_oracle._allocations`` on the view: cp groups
of a node as its GPUs, replica counts that ep divides) with the space's own rule for the
stage's shares, recompute and ZeRO level at that view (``HeteroSource.stage_groups``); GPUs are
counted in real GPUs (a cp view's times cp) over the whole pipeline; each plan is costed by
``CostModel.evaluate`` on the plain model, its stages carrying their cp and ep."""

from __future__ import annotations

import dataclasses
import itertools
import math

from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.expert_parallel import expert_counts
from autoplan.cost.model import CostModel
from autoplan.solve.expert_span import ExpertSpanSource, span_options
from autoplan.solve.hetero import HeteroSource
from autoplan.solve.options import SolveOptions
from autoplan.solve.space import divisors
from autoplan.solve.stage_degrees import degree_options
from solvers.oracle import compositions
from tests.test_solver_oracle import _allocations

__all__ = ["brute_force_stage_degrees"]


def brute_force_stage_degrees(
    model: CostModel,
    batch: int,
    options: SolveOptions,
    degrees: list[tuple[int, int]],
    spans: bool | None = None,
    per_stage_sp: bool = False,
) -> float:
    """The best feasible iteration time (ms) with each stage at any (cp, ep) of ``degrees``
    (module docstring), and with ``spans`` (None: ``options.experts_by_speed``, as the search
    takes it) also any mixed allocation of a mixture-of-experts model with its experts placed
    by speed, every expert-group count and integer split (``autoplan.solve.expert_span``, its
    stage rule); with ``per_stage_sp`` each stage with tp > 1 also with sequence parallelism
    on (its rule on the view with SP on, ``StageChoice.sequence_parallel``); inf where none
    fits."""
    if spans is None:
        spans = options.experts_by_speed and bool(expert_counts(model.profile))
    best = math.inf
    n = model.num_layers
    totals = [c.total_gpus for c in model.classes]
    views = []
    for cp, ep in degrees:
        at_ep = degree_options(options, ep)
        if at_ep is None:
            continue
        view = model if cp == 1 else model.with_context_parallel(cp)
        view = view if ep == 1 else view.with_expert_parallel(ep)
        views.append((cp, ep, view, at_ep, False))
        if per_stage_sp:
            views.append((cp, ep, view.with_sequence_parallel(True), at_ep, True))
    for m in divisors(batch):
        kinds = [
            (cp, ep, view, at_ep, sp, _allocations(view, batch // m))
            for cp, ep, view, at_ep, sp in views
        ]
        for pp in range(1, n + 1):
            schedule = "1f1b" if pp <= m else "gpipe"
            sources = [
                (cp, ep, sp, HeteroSource(view, batch, m, schedule, at_ep), allocations)
                for cp, ep, view, at_ep, sp, allocations in kinds
            ]
            span_source = None
            every_span = []
            span_level = degree_options(options, 2)
            if spans and span_level is not None:
                plain = HeteroSource(model, batch, m, schedule, options)
                span_source = ExpertSpanSource(plain, span_level)
                mixed = [a for a in _allocations(model, batch // m) if len(a) == 2]
                every_span = span_options(model, mixed)
            for sizes in compositions(n, pp):
                bounds = [0, *itertools.accumulate(sizes)]

                def extend(
                    s,
                    used,
                    stages,
                    m=m,
                    pp=pp,
                    bounds=bounds,
                    sources=sources,
                    every_span=every_span,
                    span_source=span_source,
                ) -> None:
                    nonlocal best
                    if s == pp:
                        schedule = "1f1b" if pp <= m else "gpipe"
                        # The family's plans run on the groups executor (its costs say so).
                        config = PlanConfig(m, schedule, 1, tuple(stages), executor="groups")
                        cost = model.evaluate(config)
                        if cost.feasible:
                            best = min(best, cost.iteration_ms)
                        return
                    flight = m if pp > m else min(m, pp - s)
                    for cp, ep, sp, source, allocations in sources:
                        for allocation in allocations:
                            if any(count % ep for _, _, count in allocation):
                                continue
                            if sp and all(t == 1 for _, t, _ in allocation):
                                continue  # the same stage as with SP off
                            use = list(used)
                            for k, t, count in allocation:
                                use[k] += t * count * cp
                            if any(u > total for u, total in zip(use, totals, strict=True)):
                                continue
                            found = source.stage_groups(
                                allocation, bounds[s], bounds[s + 1], flight
                            )
                            if found is None:
                                continue
                            groups, zero, _ = found
                            groups = tuple(dataclasses.replace(g, cp=cp) for g in groups)
                            stage = StageChoice(
                                bounds[s], bounds[s + 1], groups, zero, ep, sequence_parallel=sp
                            )
                            extend(s + 1, use, [*stages, stage])
                    for option in every_span:
                        assert span_source is not None
                        use = list(used)
                        for k, t, count in option.allocation:
                            use[k] += t * count
                        if any(u > total for u, total in zip(use, totals, strict=True)):
                            continue
                        spanned = span_source.stage(option, bounds[s], bounds[s + 1], flight)
                        if spanned is None:
                            continue
                        stage = StageChoice(
                            bounds[s],
                            bounds[s + 1],
                            spanned.groups,
                            spanned.zero,
                            option.ep,
                            option.experts,
                        )
                        extend(s + 1, use, [*stages, stage])

                extend(0, [0] * len(totals), [])
    return best
