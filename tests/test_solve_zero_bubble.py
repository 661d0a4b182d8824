"""Zero-bubble schedules in the search: pinned or free, never where torch cannot run them."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings

from autoplan.errors import InfeasibleError
from autoplan.plan.validate import validate_plan
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve import solve as _solve
from autoplan.solve.search import search
from autoplan.solve.zero_bubble import zero_bubble_variants
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile
from tests.test_solver_oracle import OPTIONS, brute_force, instances

PROFILE = transformer_profile(8, 1024, 512, vocab=1024, heads=16)
CLUSTER = make_cluster([("g", gpu("G", 100.0, 80.0), 4, 1)])
BATCH = 16


def solve(options: SolveOptions):
    plan = _solve(PROFILE, CLUSTER, BATCH, options)
    validate_plan(plan, PROFILE)
    return plan


@pytest.mark.parametrize("schedule", ZERO_BUBBLE_SCHEDULES)
def test_pinned_zero_bubble_schedule_is_planned_at_dp_1(schedule: str) -> None:
    plan = solve(SolveOptions(schedule=schedule))
    par = plan.parallelism
    assert par.schedule == schedule
    assert all(stage.data_parallel_degree == 1 for stage in plan.stages)
    assert [s.pipeline_rank for s in plan.stages] == [
        par.rank_of_stage(s.index) for s in plan.stages
    ]
    if schedule != "interleaved_zero_bubble":
        pp = par.pipeline_degree
        assert [s.pipeline_rank for s in plan.stages][pp:] == list(range(pp - 1, -1, -1))


def test_free_search_takes_zero_bubble_when_faster_and_never_at_dp_above_1() -> None:
    model = cost_model(PROFILE, CLUSTER, SolveOptions())
    at_dp1 = search(model, BATCH, SolveOptions(dp=1, top_k=8))
    best = at_dp1.candidates[0]
    # Among dp-1 plans the zero-bubble variants beat the 1F1B-family layouts they came from.
    assert best.config.schedule in ZERO_BUBBLE_SCHEDULES
    others = [c for c in at_dp1.candidates if c.config.schedule not in ZERO_BUBBLE_SCHEDULES]
    assert others and best.iteration_ms < min(c.iteration_ms for c in others)
    for pinned in ("1f1b", "interleaved_1f1b"):
        assert (
            best.iteration_ms
            < solve(SolveOptions(dp=1, schedule=pinned)).prediction.iteration_time_ms
        )
    free = search(model, BATCH, SolveOptions(top_k=16))
    for candidate in free.candidates:
        if candidate.config.schedule in ZERO_BUBBLE_SCHEDULES:
            assert all(g.replicas == 1 for s in candidate.config.stages for g in s.groups)


def test_zero_bubble_with_selective_recompute_or_dp_is_infeasible() -> None:
    with pytest.raises(InfeasibleError):
        solve(SolveOptions(schedule="zbv", recompute="selective"))
    with pytest.raises(InfeasibleError):
        solve(SolveOptions(schedule="interleaved_zero_bubble", dp=2))


class _WithZeroBubble:
    """A cost model whose ``evaluate`` also costs the configuration's zero-bubble variants
    and returns the best feasible: brute force over it covers every split under them."""

    def __init__(self, model) -> None:
        self._model = model

    def __getattr__(self, name: str):
        return getattr(self._model, name)

    def evaluate(self, config):
        costs = [self._model.evaluate(config)]
        costs += [self._model.evaluate(c) for c in zero_bubble_variants([config])]
        feasible = [c for c in costs if c.feasible]
        return min(feasible, key=lambda c: c.iteration_ms) if feasible else costs[0]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(instances())
def test_zero_bubble_search_between_its_oracles(instance) -> None:
    """The search with zero bubble is no slower than the exact 1F1B-family optimum, and no
    faster than brute force over every split under every zero-bubble schedule."""
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    family = brute_force(model, batch, OPTIONS)
    # Every ZeRO level the search tries: where DDP's buckets (levels 0 and 1 keep them) do
    # not fit, levels 2 and 3 may.
    everything = brute_force(_WithZeroBubble(model), batch, OPTIONS, levels=(0, 1, 2, 3))
    # The oracles' space: without sequence parallelism (OPTIONS), which they do not try.
    options = SolveOptions(top_k=1, space="uniform", sequence_parallel=False)
    found = [c for c in solve_candidates(model, batch, options).candidates if c.cost.feasible]
    if math.isinf(family):
        assert math.isinf(everything) and not found
        return
    best = found[0].iteration_ms
    assert everything <= best * (1 + 1e-9)
    assert best <= family * (1 + 1e-9)


def test_no_zero_bubble_plan_has_an_expert_group() -> None:
    """What the search's floor at ep > 1 relies on (``finish_search`` adds no zero-bubble
    floor there): a stage of an ep-e view holds a multiple of e >= 2 replicas, and no
    zero-bubble variant of such a pipeline exists (torch runs them at dp 1)."""
    from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice

    for ep in (2, 4):
        group = ReplicaGroup(0, 1, ep, 1, "none")
        stages = (StageChoice(0, 2, (group,), ep=ep), StageChoice(2, 4, (group,), ep=ep))
        for schedule, chunks in (("1f1b", 1), ("interleaved_1f1b", 2)):
            config = PlanConfig(8, schedule, chunks, stages)
            assert zero_bubble_variants([config]) == []
    # The same pipeline at one replica per stage has its zero-bubble variant.
    single = ReplicaGroup(0, 1, 1, 1, "none")
    plain = PlanConfig(8, "1f1b", 1, (StageChoice(0, 2, (single,)), StageChoice(2, 4, (single,))))
    assert zero_bubble_variants([plain])
