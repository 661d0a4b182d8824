"""The search's certificate (``autoplan.solve.certificate``): a proven lower bound beside the
plan, its status and its words. The bound against brute force is in tests/test_solver_oracle.py
(every random instance there checks it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.errors import InfeasibleError
from autoplan.files import read_json_model
from autoplan.plan.schema import PLAN_SCHEMA_VERSION, Plan, SearchRecord
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.certificate import search_record, work_bound_ms, zero_bubble_bound_ms
from autoplan.solve.progress import watching
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

runner = CliRunner()
# A limit no machine reaches: these searches must run to their end however loaded the CI
# machine is (the time-limited test sets its own small limits).
EXACT = SolveOptions(top_k=1, zero_bubble=False, time_limit_s=3600)


def _medium():
    profile = transformer_profile(8, hidden=1024, seq_len=512, heads=16)
    cluster = make_cluster(
        [
            ("f", gpu("FAST", 300.0, 40.0), 4, 2),
            ("m", gpu("MID", 120.0, 24.0), 4, 1),
            ("s", gpu("SLOW", 40.0, 16.0), 4, 2),
        ],
        inter_gb_per_s=5.0,
    )
    return profile, cluster, 32


def test_a_search_run_to_the_end_is_proven_with_gap_zero() -> None:
    profile, cluster, batch = _medium()
    plan = solve(profile, cluster, batch, EXACT)
    assert plan.search is not None
    assert plan.search.status == "proven"
    assert plan.search.gap == 0
    assert plan.search.lower_bound_ms == plan.prediction.iteration_time_ms
    assert plan.search.words() == "optimal (proven)"


def test_a_time_limited_search_is_never_proven() -> None:
    profile, cluster, batch = _medium()
    exact = solve(profile, cluster, batch, EXACT).prediction.iteration_time_ms
    stopped = 0
    for limit in (0.2, 0.5, 1.0, 2.0):
        options = EXACT.model_copy(update={"time_limit_s": limit})
        model = cost_model(profile, cluster, options)
        result = solve_candidates(model, batch, options)
        # The plan states its time to six decimals; the search's bound is unrounded.
        assert result.lower_bound_ms <= exact * (1 + 1e-9) + 1e-6, limit
        if not result.timed_out or not any(c.cost.feasible for c in result.candidates):
            continue
        stopped += 1
        try:
            plan = solve(profile, cluster, batch, options)
        except InfeasibleError:  # this second solve stopped before it found a plan
            continue
        if plan.search is not None and plan.search.status != "limit":
            continue  # this second solve ran to its end (the machine was quicker)
        assert plan.search is not None
        assert plan.search.words().startswith("time limit: ")
        bound = plan.search.lower_bound_ms
        assert bound is None or bound <= exact * (1 + 1e-9)
    assert stopped, "no time limit stopped the search with a plan found"


def test_the_gap_option_stops_within_its_gap_and_the_bound_stays_below_the_optimum() -> None:
    profile, cluster, batch = _medium()
    exact = solve(profile, cluster, batch, EXACT).prediction.iteration_time_ms
    plan = solve(profile, cluster, batch, EXACT.model_copy(update={"gap": 0.05}))
    found = plan.search
    assert found is not None and found.status in ("proven", "gap")
    assert found.gap is not None and found.gap <= 0.05 + 1e-6  # the figures are rounded to 1e-6 ms
    assert found.lower_bound_ms is not None and found.lower_bound_ms <= exact * (1 + 1e-9)
    assert plan.prediction.iteration_time_ms <= exact / (1 - 0.05) * (1 + 1e-9)


def test_zero_bubble_plans_are_bounded_by_the_work_and_zero_bubble_bounds() -> None:
    """With the zero-bubble schedules in the space (tried only at the best partitions) the
    bound is at most the larger of the work bound and the zero-bubble bound, which every
    dp-1 plan of every schedule respects (the latter's oracle:
    tests/test_zero_bubble_bound_oracle.py)."""
    profile, cluster, batch = _medium()
    options = SolveOptions(top_k=3)
    model = cost_model(profile, cluster, options)
    result = solve_candidates(model, batch, options)
    work = work_bound_ms(model, batch, options)
    bound = max(work, zero_bubble_bound_ms(model, batch, options))
    assert result.lower_bound_ms <= bound * (1 + 1e-12)
    for candidate in result.candidates:
        assert candidate.iteration_ms >= work * (1 - 1e-9), candidate.config.schedule
    exact = solve(profile, cluster, batch, EXACT).prediction.iteration_time_ms
    assert result.lower_bound_ms <= exact + 1e-6  # the plan's figure is rounded to 1e-6 ms


def test_the_record_says_proven_only_at_gap_zero() -> None:
    assert search_record(100.0, 100.0, False, 5).status == "proven"
    assert search_record(100.0, 100.0, True, 5).status == "limit"  # never proven by a stop
    near = search_record(100.0, 99.6, False, 5)
    assert near.status == "gap" and math.isclose(near.gap or 0, 0.004)
    assert near.words() == "within 0.4% of optimal (bound 99.6 ms)"
    big = search_record(10_000.0, 9_774.0, False, 5)
    assert big.words() == "within 2.3% of optimal (bound 9,774 ms)"
    assert search_record(100.0, 0.0, True, 5).words() == "time limit: no bound"
    with pytest.raises(ValidationError):
        SearchRecord(status="proven", lower_bound_ms=90.0, gap=0.1, explored=1)


PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "gpt2-small.profile.json"


def _solve(out, *extra: str):
    args = ["solve", str(PROFILE), "--cluster", "a100-v100", "--global-batch", "64"]
    return runner.invoke(app, [*args, "-o", str(out), "--top-k", "1", *extra])


def test_solve_says_what_it_proved_and_show_too(tmp_path) -> None:
    out = tmp_path / "plan.json"
    result = _solve(out, "--no-zero-bubble")
    assert result.exit_code == 0, result.output
    assert "optimal (proven)" in " ".join(result.stdout.split())
    shown = runner.invoke(app, ["show", str(out)])
    assert shown.exit_code == 0, shown.output
    assert "optimal (proven)" in " ".join(shown.stdout.split())
    with_zero_bubble = _solve(tmp_path / "zb.json")
    assert with_zero_bubble.exit_code == 0, with_zero_bubble.output
    said = " ".join(with_zero_bubble.stdout.split())  # rich wraps the title line
    assert "of optimal (bound " in said or "optimal (proven)" in said


def test_a_bad_gap_is_one_line_and_exit_2(tmp_path) -> None:
    result = _solve(tmp_path / "plan.json", "--gap", "1.5")
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "error: --gap must be in [0, 1) (a fraction: 0.01 is 1%); got 1.5"
    ]


def test_a_version_2_plan_reads_with_no_certificate(tmp_path) -> None:
    out = tmp_path / "plan.json"
    assert _solve(out).exit_code == 0
    data = json.loads(out.read_text())
    data["schema_version"] = 2
    del data["search"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps(data))
    plan = read_json_model(old, Plan)
    assert plan.schema_version == PLAN_SCHEMA_VERSION and plan.search is None
    shown = runner.invoke(app, ["show", str(old)])
    assert shown.exit_code == 0, shown.output
    assert "no bound recorded" in shown.stdout
    assert "optimal (proven)" not in shown.stdout


def test_a_watcher_sees_the_plans_found_and_the_bound() -> None:
    profile, cluster, batch = _medium()
    seen: list[tuple[float, float]] = []
    with watching(lambda state: seen.append((state.incumbent_ms, state.bound_ms))) as state:
        plan = solve(profile, cluster, batch, EXACT)
    assert seen and state.bound_ms > 0 and math.isfinite(state.incumbent_ms)
    # The bound it showed holds; the best it showed is the families' figure for the plan.
    assert state.bound_ms <= plan.prediction.iteration_time_ms
    assert math.isclose(state.incumbent_ms, plan.prediction.iteration_time_ms, rel_tol=1e-6)
    incumbents = [found for found, _ in seen]
    assert incumbents == sorted(incumbents, reverse=True)  # it only improves


def test_the_zero_bubble_bound_with_a_tp_one_class_cannot_run() -> None:
    """A pinned tp that one class's nodes cannot hold leaves that class without rank kinds:
    the packing of layer types skips it (it once raised KeyError), and the solve proves."""
    profile = transformer_profile(8, hidden=1024, seq_len=512, heads=16)
    cluster = make_cluster(
        [("f", gpu("FAST", 300.0, 40.0), 4, 2), ("s", gpu("SLOW", 40.0, 16.0), 2, 2)],
        inter_gb_per_s=5.0,
    )
    options = SolveOptions(top_k=1, tp=4, time_limit_s=3600)
    model = cost_model(profile, cluster, options)
    assert math.isfinite(zero_bubble_bound_ms(model, 32, options))
    plan = solve(profile, cluster, 32, options)
    assert plan.search is not None and plan.search.lower_bound_ms is not None
    assert plan.search.lower_bound_ms <= plan.prediction.iteration_time_ms


def test_the_zero_bubble_bound_under_a_cap_is_the_least_of_the_two() -> None:
    """``cap_ms``: the bound itself below the cap, the cap at or above it (a cap at or
    under the bound without activations skips the counts' packings: here that bound is the
    whole one, so every cap under it does). A model per call: its cache never answers."""
    profile, cluster, batch = _medium()
    options = SolveOptions(top_k=1)
    uncapped = zero_bubble_bound_ms(cost_model(profile, cluster, options), batch, options)
    assert math.isfinite(uncapped)
    for cap in (0.0, 0.5 * uncapped, 0.999 * uncapped, uncapped, 1.001 * uncapped, math.inf):
        model = cost_model(profile, cluster, options)
        assert zero_bubble_bound_ms(model, batch, options, cap_ms=cap) == min(uncapped, cap)
