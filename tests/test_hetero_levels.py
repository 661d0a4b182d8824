"""The heterogeneous family's exact pass by levels (``autoplan.solve.hetero.hetero_candidates``):
with a poor incumbent it searches its runs below rising levels, finds the optimum and proves
it, as one pass against the incumbent would."""

from __future__ import annotations

import itertools
import math
import time

import pytest

import autoplan.solve.hetero as hetero_module
from autoplan.solve.hetero import hetero_candidates
from tests.test_relaxed_bound import _gpt2_on_a100_v100
from tests.test_solver_oracle import OPTIONS


@pytest.mark.parametrize("slack", [1.02, 1.25])
def test_a_poor_incumbent_still_gives_the_optimum_proven(slack) -> None:
    """The incumbent ``slack`` above the optimum: the optimum is found and the family's floor
    reaches it (proven)."""
    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    assert best.configs and not best.timed_out
    optimum = model.evaluate(best.configs[0]).iteration_ms
    again = hetero_candidates(model, batch, OPTIONS, optimum * slack, keep=1, deadline=math.inf)
    assert again.configs and not again.timed_out
    assert math.isclose(model.evaluate(again.configs[0]).iteration_ms, optimum, rel_tol=1e-9)
    assert math.isclose(again.floor_ms, optimum, rel_tol=1e-9), (again.floor_ms, optimum)


def test_the_levels_rise_by_the_step_from_the_least_root_bound(monkeypatch) -> None:
    """With an incumbent 25% above the optimum, runs are searched below levels under the
    optimum itself (where a run can only prove its floor), each a power of 1 + ``LEVEL_STEP``
    times the least root bound. (Batch 16: at 64 the least root bound is within a step of
    the optimum, 57.6 ms with ZeRO-2 hiding its collectives, and the first level is above it.)"""
    model = _gpt2_on_a100_v100()
    batch = 16
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    bounds: list[float] = []
    search = hetero_module.best_pipelines

    def recorded(*args, **kwargs):
        bounds.append(kwargs["upper_bound"])
        return search(*args, **kwargs)

    monkeypatch.setattr(hetero_module, "best_pipelines", recorded)
    incumbent = optimum * 1.25
    hetero_candidates(model, batch, OPTIONS, incumbent, keep=1, deadline=math.inf)
    below = sorted({round(b, 9) for b in bounds if b < optimum * (1 - 1e-9)})
    assert len(below) >= 2, below
    ratios = [b / a for a, b in itertools.pairwise(below)]
    step = 1 + hetero_module.LEVEL_STEP
    for ratio in ratios:
        powers = math.log(ratio) / math.log(step)
        assert abs(powers - round(powers)) < 1e-6, (ratio, step)


def test_with_the_time_left_always_short_the_small_steps_still_prove_the_optimum(
    monkeypatch,
) -> None:
    """Every level chosen as if no time were left (the smallest steps,
    ``autoplan.solve.levels``): the optimum is still found and proven, as with the fixed
    steps. (Batch 16, as above: levels below the optimum to hurry through.)"""
    model = _gpt2_on_a100_v100()
    batch = 16
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    chosen: list[float] = []
    choose = hetero_module.next_level

    def hurried(level, target, left_s, costs, runs, floors, **kwargs):
        chosen.append(choose(level, target, 0.0, costs, runs, floors, **kwargs))
        return chosen[-1]

    monkeypatch.setattr(hetero_module, "next_level", hurried)
    again = hetero_candidates(model, batch, OPTIONS, optimum * 1.25, keep=1, deadline=math.inf)
    assert again.configs and not again.timed_out
    assert math.isclose(model.evaluate(again.configs[0]).iteration_ms, optimum, rel_tol=1e-9)
    assert math.isclose(again.floor_ms, optimum, rel_tol=1e-9), (again.floor_ms, optimum)
    # Some level was below a whole step: the hurried rule was taken.
    finite = [x for x in chosen if math.isfinite(x)]
    assert any(b / a < 1 + hetero_module.LEVEL_STEP * 0.99 for a, b in itertools.pairwise(finite))


def test_a_finite_deadline_with_time_to_spare_keeps_the_fixed_levels(monkeypatch) -> None:
    """A deadline far away searches the same levels as none at all."""
    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    incumbent = model.evaluate(best.configs[0]).iteration_ms * 1.25
    search = hetero_module.best_pipelines
    seen: dict[str, list[float]] = {"inf": [], "far": []}
    for name, deadline in (("inf", math.inf), ("far", time.monotonic() + 3600.0)):

        def recorded(*args, _name=name, **kwargs):
            seen[_name].append(kwargs["upper_bound"])
            return search(*args, **kwargs)

        monkeypatch.setattr(hetero_module, "best_pipelines", recorded)
        hetero_candidates(model, batch, OPTIONS, incumbent, keep=1, deadline=deadline)
    assert seen["inf"] == seen["far"]


def test_a_pass_stopped_at_its_ceiling_goes_on_to_the_optimum_proven() -> None:
    """With a ceiling below the optimum, the pass stops once every run is proven there
    (``HeteroState.capped``, its floor at or above the ceiling and never above the optimum);
    called again with the same state and no ceiling, it finds the optimum and proves it, as
    one pass would."""
    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    state = hetero_module.HeteroState()
    incumbent = optimum * 1.25
    ceiling = optimum * 0.99
    capped = hetero_candidates(
        model, batch, OPTIONS, incumbent, keep=1, deadline=math.inf, state=state, ceiling=ceiling
    )
    assert state.capped and not state.done and not capped.timed_out
    assert ceiling <= capped.floor_ms <= optimum * (1 + 1e-9), (capped.floor_ms, ceiling, optimum)
    assert not capped.configs  # nothing below the ceiling, and no level above it searched
    again = hetero_candidates(
        model, batch, OPTIONS, incumbent, keep=1, deadline=math.inf, state=state
    )
    assert state.done and not state.capped and not again.timed_out
    assert math.isclose(model.evaluate(again.configs[0]).iteration_ms, optimum, rel_tol=1e-9)
    assert math.isclose(again.floor_ms, optimum, rel_tol=1e-9), (again.floor_ms, optimum)


def test_a_pass_cut_by_the_clock_goes_on_where_it_stopped() -> None:
    """A pass whose deadline has passed stops at once (timed out, a floor never above the
    optimum); the same state given time finds the optimum and proves it."""
    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    state = hetero_module.HeteroState()
    cut = hetero_candidates(
        model, batch, OPTIONS, optimum * 1.25, keep=1, deadline=-math.inf, state=state
    )
    assert cut.timed_out and state.timed_out and not state.done
    assert cut.floor_ms <= optimum * (1 + 1e-9)
    again = hetero_candidates(
        model, batch, OPTIONS, optimum * 1.25, keep=1, deadline=math.inf, state=state
    )
    assert state.done and not again.timed_out
    assert math.isclose(model.evaluate(again.configs[0]).iteration_ms, optimum, rel_tol=1e-9)
    assert math.isclose(again.floor_ms, optimum, rel_tol=1e-9), (again.floor_ms, optimum)


def test_a_jump_cut_by_its_share_of_the_time_goes_on_by_steps(monkeypatch) -> None:
    """A jump to the bound gets half of the time left (``levels.TIME_SHARE``); here the first
    search of a jump is cut at once (its deadline passed, as a jump near the optimum that
    outgrows its share): the pass is not timed out, searches no other jump, goes on by steps
    and proves the optimum. (Batch 16: levels below the optimum to step through; the
    incumbent the optimum itself, so that no level finds a plan before the jump to it.)"""
    model = _gpt2_on_a100_v100()
    batch = 16
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    deadline = time.monotonic() + 3600.0
    search = hetero_module.best_pipelines
    jumps: list[float] = []
    after: list[float] = []

    def cut_first_jump(*args, **kwargs):
        if kwargs["deadline"] < deadline:  # a jump's own share of the time
            jumps.append(kwargs["upper_bound"])
            if len(jumps) == 1:
                kwargs["deadline"] = -math.inf
        elif jumps:
            after.append(kwargs["upper_bound"])
        return search(*args, **kwargs)

    monkeypatch.setattr(hetero_module, "best_pipelines", cut_first_jump)
    state = hetero_module.HeteroState()
    found = hetero_candidates(
        model, batch, OPTIONS, optimum * (1 + 1e-6), keep=1, deadline=deadline, state=state
    )
    assert len(jumps) == 1, jumps  # the jump was taken, cut, and not taken again
    assert state.jump_failed and state.done and not found.timed_out
    assert after, "no level searched after the cut jump"
    assert math.isclose(model.evaluate(found.configs[0]).iteration_ms, optimum, rel_tol=1e-9)
    assert math.isclose(found.floor_ms, optimum, rel_tol=1e-9), (found.floor_ms, optimum)
