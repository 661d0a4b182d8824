"""Where the exact pass's next level goes (``autoplan.solve.levels``): the fixed steps with
time to spare, smaller ones where the prediction says the time left is short."""

from __future__ import annotations

import math

import pytest

from autoplan.solve.levels import (
    GROWTH_RANGE,
    LEVEL_GROWTH,
    LEVEL_STEP,
    TIME_SHARE,
    LevelCosts,
    next_level,
)


def _costs(*searches: tuple[int, float, float]) -> LevelCosts:
    costs = LevelCosts()
    for run, level, seconds in searches:
        costs.record(run, level, seconds)
    return costs


@pytest.mark.parametrize("left_s", [math.inf, 1e6])
def test_time_to_spare_keeps_the_fixed_rule(left_s: float) -> None:
    """A step of ``LEVEL_STEP``, and the bound itself (inf) within two steps of it."""
    costs = _costs((0, 100.0, 1.0), (1, 100.0, 2.0))
    assert next_level(100.0, 200.0, left_s, costs, [0, 1], {}) == 100.0 * (1 + LEVEL_STEP)
    assert next_level(100.0, 105.0, left_s, costs, [0, 1], {}) == math.inf


def test_a_short_time_takes_the_largest_smaller_step_predicted_to_fit() -> None:
    """3 s of searches at 100: a whole step is predicted at 9 s, a half step at ~5.2 s
    (3 x 1.01^g)."""
    costs = _costs((0, 100.0, 1.0), (1, 100.0, 2.0))
    whole = costs.predicted_s(100.0 * (1 + LEVEL_STEP), [0, 1], {})
    assert whole == pytest.approx(9.0)
    half = 100.0 * (1 + LEVEL_STEP / 2)
    assert costs.predicted_s(half, [0, 1], {}) == pytest.approx(
        3.0 * (1 + LEVEL_STEP / 2) ** LEVEL_GROWTH
    )
    # A step may take TIME_SHARE of the time left.
    assert next_level(100.0, 200.0, 6.0 / TIME_SHARE, costs, [0, 1], {}) == half
    assert next_level(100.0, 200.0, 6.0, costs, [0, 1], {}) < half
    assert next_level(100.0, 200.0, 10.0 / TIME_SHARE, costs, [0, 1], {}) == 100.0 * (
        1 + LEVEL_STEP
    )
    # Half of 10 s: the half step (~5.2 s) no longer fits, the quarter (~4.0 s) does.
    assert next_level(100.0, 200.0, 10.0, costs, [0, 1], {}) == 100.0 * (1 + LEVEL_STEP / 4)
    # Nothing fits: the smallest step.
    assert next_level(100.0, 200.0, 0.0, costs, [0, 1], {}) == 100.0 * (1 + LEVEL_STEP / 8)


def test_the_bound_is_skipped_where_its_pass_is_predicted_not_to_fit() -> None:
    """Within two steps of the bound: the bound where it fits, else a level below it."""
    costs = _costs((0, 100.0, 1.0))
    target = 104.0
    at_target = costs.predicted_s(target, [0], {})
    assert next_level(100.0, target, (at_target + 1e-6) / TIME_SHARE, costs, [0], {}) == math.inf
    below = next_level(100.0, target, at_target * 0.99 / TIME_SHARE, costs, [0], {})
    assert 100.0 < below < target
    assert costs.predicted_s(below, [0], {}) <= at_target * 0.99


def test_proven_runs_cost_nothing_and_unsearched_ones_the_costliest() -> None:
    costs = _costs((0, 100.0, 1.0), (1, 100.0, 4.0))
    level = 101.0
    scale = (level / 100.0) ** LEVEL_GROWTH
    assert costs.predicted_s(level, [0, 1], {1: 101.0}) == pytest.approx(scale)
    # Run 2 never searched (its floor, its root bound, was above every level so far).
    assert costs.predicted_s(level, [0, 1, 2], {2: 100.5}) == pytest.approx(9.0 * scale)
    assert costs.predicted_s(level, [0, 1, 2], {2: 102.0}) == pytest.approx(5.0 * scale)


def test_a_run_is_predicted_by_its_own_growth_within_the_range() -> None:
    """1 s at 100 then 10 s at 101: ~10x per 1%, past the range's 10x per step (2%); 1 s then
    1.5 s per 1% (~2.25x per step) is within it; a run that got cheaper grows by the least."""
    steep = _costs((0, 100.0, 1.0), (0, 101.0, 10.0))
    assert steep.predicted_s(102.0, [0], {}) == pytest.approx(
        10.0 * (102.0 / 101.0) ** GROWTH_RANGE[1]
    )
    mild = _costs((0, 100.0, 1.0), (0, 101.0, 1.5))
    own = math.log(1.5) / math.log(1.01)
    assert GROWTH_RANGE[0] < own < GROWTH_RANGE[1]
    assert mild.predicted_s(102.0, [0], {}) == pytest.approx(1.5 * (102.0 / 101.0) ** own)
    flat = _costs((0, 100.0, 2.0), (0, 101.0, 1.0))
    assert flat.predicted_s(102.0, [0], {}) == pytest.approx(
        1.0 * (102.0 / 101.0) ** GROWTH_RANGE[0]
    )
    # Too short to read (noise): the default growth.
    short = _costs((0, 100.0, 0.01), (0, 101.0, 1.0))
    assert short.predicted_s(102.0, [0], {}) == pytest.approx(1.0 * (102.0 / 101.0) ** LEVEL_GROWTH)


def test_a_jump_predicted_to_cost_too_much_effort_takes_a_step() -> None:
    """Within two steps of the bound, with time to spare: the bound, unless the runs' last
    efforts grown at the steepest rate pass ``JUMP_EFFORT`` (counts: the same levels on any
    machine); then the step, and from within a step the bound whatever the effort."""
    from autoplan.solve.levels import JUMP_EFFORT

    light, heavy = LevelCosts(), LevelCosts()
    light.record(0, 100.0, 1.0, 1000)
    heavy.record(0, 100.0, 1.0, JUMP_EFFORT // 10)
    target = 104.0
    assert heavy.jump_effort(target, [0], {}) > JUMP_EFFORT >= light.jump_effort(target, [0], {})
    assert next_level(100.0, target, math.inf, light, [0], {}) == math.inf
    assert next_level(100.0, target, math.inf, heavy, [0], {}) == 100.0 * (1 + LEVEL_STEP)
    assert next_level(100.0, 101.0, math.inf, heavy, [0], {}) == math.inf
    # After a jump cut by the clock (``jump=False``): steps until a step reaches the bound.
    assert next_level(100.0, target, math.inf, light, [0], {}, jump=False) == 100.0 * (
        1 + LEVEL_STEP
    )
    assert next_level(100.0, 101.0, math.inf, light, [0], {}, jump=False) == math.inf
    # A run proven at the bound costs nothing.
    assert heavy.jump_effort(target, [0], {0: target}) == 0.0
