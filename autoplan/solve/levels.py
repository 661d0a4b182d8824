r"""Where the heterogeneous exact pass puts its next level (``hetero.hetero_candidates``).

The exact pass searches every run (micro-batch count and schedule) for pipelines below a
level; a run that completes the search holding none is proven at that level (its floor), and
the certificate is the least floor. A level the time limit cuts proves nothing beyond the
level before, and a search's cost grows steeply as its level nears the optimum. Measured in
process on Llama-2-70B, h100-a100-l4, batch 256 (SP on): the m = 64 run took 1.9, 4.2 and
12.6 s below 45.2k, 46.1k and 47.0k ms (about 3x per 2% step); the m = 128 run 1.6 s below
47.0k and 83 s below the incumbent 49.1k; and GPT-3 175B on 16,384 GPUs: a level at 6,087.6 ms
cost its runs 3.5 s in all, the incumbent's 6,423.5 then 23 s for each of three runs. The
fixed rule (steps of ``LEVEL_STEP``, and the bound itself once within two steps of it) spent
the end of the time limit on a level it could not finish, and kept the level before.

So the next level is the fixed rule's where its predicted cost fits in ``TIME_SHARE`` (half) of
the time left (a jump to the bound only where the runs' last efforts, grown at the steepest
rate of ``GROWTH_RANGE``, stay within ``JUMP_EFFORT``: the last steps before an optimum grow
faster than the steps before them, and a jump cut by the clock proves nothing), else the
largest of the smaller steps (``SMALLER_STEPS`` of ``LEVEL_STEP``) that fits, else the
smallest. The half leaves room for a prediction short by up to 2x: a level cut
by the clock proves nothing beyond the one before, and with the whole time left as the budget
GPT-3 175B on 16,384 GPUs with ``--gap 0.02 --time-limit 120`` jumped to a level it could not
finish and ended at 7.1% (at 60 s: 3.1%); with the half, 2.6%.

A run's predicted cost below level L is its last search's seconds t at level L'
times (L / L')^g, g the run's own growth between its last two searches, held within
``GROWTH_RANGE`` (1.5x to 10x per step: one search's time is noisy on a shared machine), or
``LEVEL_GROWTH`` (3x per step) where the run has fewer than two searches long enough to read
it from (``_LEAST_TIMED_S``); a run not searched yet (its root bound was above every level
so far) is predicted at the costliest run's figure; a run proven at L or above costs nothing.
The prediction only chooses which level is searched next: every level searched to its end is
a proven floor whatever it is, so the certificate stays valid. With no deadline (or time to
spare) the levels are the fixed rule's, as before.

A jump is still a bet: near the optimum a search's effort can grow faster than the steepest
rate read from the levels before it (Llama-2-70B on h100-a100-l4 with ``--gap 0.005``: the
m = 64 run costed 152 stages and labels below 46.6k ms, more than 850,000 below the target
48.8k, 4.8% higher, where the rule predicted 640,000 for all runs; cut by the clock, the
certificate stayed at 46.6k, 5.1%). So the heterogeneous pass gives a jump ``TIME_SHARE`` of
the time left, and where that cuts it goes on by steps (``jump=False``) from the last level it
proved: 1.2-1.7% at the limit there instead (how far the last step gets varies run to run).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

__all__ = [
    "GROWTH_RANGE",
    "JUMP_EFFORT",
    "LEVEL_GROWTH",
    "LEVEL_STEP",
    "SMALLER_STEPS",
    "TIME_SHARE",
    "LevelCosts",
    "next_level",
]

LEVEL_STEP = 0.02
"""Relative step of the levels the exact pass raises its pruning bound by
(``hetero.hetero_candidates``)."""

LEVEL_GROWTH = math.log(3.0) / math.log(1.0 + LEVEL_STEP)
"""Growth exponent of a search's cost in its level where a run's own is not known: 3x per
``LEVEL_STEP`` (module docstring)."""

GROWTH_RANGE = (
    math.log(1.5) / math.log(1.0 + LEVEL_STEP),
    math.log(10.0) / math.log(1.0 + LEVEL_STEP),
)
"""The least and most growth exponent read from a run's own searches: 1.5x and 10x per
``LEVEL_STEP``."""

JUMP_EFFORT = 1_000_000
"""The most stages costed and labels kept that a jump to the bound may be predicted to take
(``next_level``): counts, not seconds, so that where a solve jumps does not depend on the
machine's speed."""

SMALLER_STEPS = (0.5, 0.25, 0.125)
"""Fractions of ``LEVEL_STEP`` tried, largest first, where a whole step is predicted not to
finish in the time left."""

TIME_SHARE = 0.5
"""The share of the time left a level's predicted cost may take (``next_level``)."""

_LEAST_TIMED_S = 0.05
"""Searches shorter than this are too noisy to read a run's own growth from."""


@dataclass
class LevelCosts:
    """Each run's exact searches: (level, seconds) of each, oldest first."""

    searches: dict[int, list[tuple[float, float]]] = field(default_factory=dict)
    efforts: dict[int, tuple[float, int]] = field(default_factory=dict)

    def record(self, run: int, level: float, seconds: float, effort: int = 0) -> None:
        """Run ``run`` searched below ``level`` to its end in ``seconds``, costing ``effort``
        stages and keeping labels."""
        if math.isfinite(level) and level > 0:
            self.searches.setdefault(run, []).append((level, max(seconds, 0.0)))
            self.efforts[run] = (level, effort)

    def jump_effort(self, level: float, runs: Iterable[int], floors: Mapping[int, float]) -> float:
        """Predicted effort of searching ``runs`` below ``level``: each run's last at the
        most growth of ``GROWTH_RANGE`` (a run never searched at the costliest's; one proven
        at ``level`` or above costs nothing)."""
        known: list[float] = []
        unknown = 0
        for run in runs:
            if floors.get(run, -math.inf) >= level:
                continue
            if run not in self.efforts:
                unknown += 1
                continue
            last_level, effort = self.efforts[run]
            known.append(effort * max(1.0, level / last_level) ** GROWTH_RANGE[1])
        return sum(known) + unknown * max(known, default=0.0)

    def _run_s(self, run: int, level: float) -> float | None:
        """Run ``run``'s predicted seconds below ``level`` (None: never searched)."""
        done = self.searches.get(run)
        if not done:
            return None
        last_level, last_s = done[-1]
        growth = LEVEL_GROWTH
        if len(done) >= 2:
            before_level, before_s = done[-2]
            if min(before_s, last_s) >= _LEAST_TIMED_S and last_level > before_level:
                own = math.log(last_s / before_s) / math.log(last_level / before_level)
                growth = min(max(own, GROWTH_RANGE[0]), GROWTH_RANGE[1])
        return last_s * (level / last_level) ** growth if level > last_level else last_s

    def predicted_s(self, level: float, runs: Iterable[int], floors: Mapping[int, float]) -> float:
        """Predicted seconds of searching ``runs`` below ``level`` (module docstring); a run
        whose floor (``floors``) is at or above it is not searched."""
        known: list[float] = []
        unknown = 0
        for run in runs:
            if floors.get(run, -math.inf) >= level:
                continue
            seconds = self._run_s(run, level)
            if seconds is None:
                unknown += 1
            else:
                known.append(seconds)
        return sum(known) + unknown * max(known, default=0.0)


def next_level(
    level: float,
    target: float,
    left_s: float,
    costs: LevelCosts,
    runs: Iterable[int],
    floors: Mapping[int, float],
    *,
    jump: bool = True,
) -> float:
    """The level after ``level`` (searched to its end), ``math.inf`` for the bound itself
    (``target``: the bound pruned against); ``left_s``: seconds to the deadline (module
    docstring). ``jump`` False: no jump to the bound before the steps reach it (one was cut
    by its share of the time: ``hetero.hetero_candidates``)."""
    runs = list(runs)
    step = level * (1.0 + LEVEL_STEP)
    # The fixed rule: within two steps of the bound, the bound itself next (a level that
    # close costs about what the bound's own pass does, and finds what that pass would),
    # unless the jump is predicted, at the steepest growth, to cost more than JUMP_EFFORT:
    # the last steps before an optimum grow faster than the steps before them, and a jump the
    # clock cuts proves nothing (Llama-2-70B on h100-a100-l4, m = 64: jumps of 6% and 2.3% to
    # the incumbent, predicted by seconds to fit in half of 50 and 41 s, took them all; a step
    # from 48.0k ms proved 48.97k, within 0.25%). Counted in effort, not seconds, so that the
    # levels of a solve the clock does not stop do not depend on the machine's speed.
    within = step * (1.0 + LEVEL_STEP) ** 2 >= target if jump else step >= target
    usual = math.inf if within else step
    if (
        math.isinf(usual)
        and step < target
        and costs.jump_effort(target, runs, floors) > JUMP_EFFORT
    ):
        usual = step
    # A level the clock cuts proves nothing beyond the one before: a step is taken where its
    # predicted cost fits in half the time left, so a prediction short by up to 2x still ends.
    budget_s = left_s * TIME_SHARE
    if math.isinf(left_s) or costs.predicted_s(min(usual, target), runs, floors) <= budget_s:
        return usual
    smaller = [level * (1.0 + LEVEL_STEP * f) for f in (1.0, *SMALLER_STEPS)]
    smaller = [x for x in smaller if x < usual and x < target]
    for candidate in smaller:
        if costs.predicted_s(candidate, runs, floors) <= budget_s:
            return candidate
    # Nothing is predicted to finish: the smallest step, which may still (a prediction).
    return smaller[-1] if smaller else usual
