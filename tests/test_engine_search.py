"""Planning for an engine (``SolveOptions.engine``): the search minimises the cost the plan's
engine pays (``autoplan.cost.engines``), equals brute force under that engine's costs, records
the engine in the plan, and every figure downstream (cost, show, run) reads it from there."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from typer.testing import CliRunner

from autoplan.api import price
from autoplan.cli import app
from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.offload import group_of
from autoplan.errors import InputError
from autoplan.files import read_json_model, write_json_model
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable
from autoplan.simulate.engine import simulate_plan
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import brute_force, brute_force_hetero, instances

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
DEEPSPEED = SolveOptions(
    top_k=1, zero_bubble=False, sequence_parallel=False, engine="megatron-deepspeed"
)


def _replicated_case():
    """Two layers with a large gradient on two GPUs over a slow link: the all-reduce is
    longer than a backward, so what an engine hides behind it decides the iteration."""
    profile = make_profile(
        [layer(i, flops=2 * 10**11, params=40 * 10**6, saved=10**7, output=10**6) for i in (0, 1)]
    )
    cluster = make_cluster(
        [("g", gpu("G", tflops=25.0, memory_gib=8.0), 1, 2)],
        intra_gb_per_s=100.0,
        inter_gb_per_s=0.5,
    )
    return profile, cluster


def test_exposed_allreduce_by_engine_by_hand() -> None:
    profile, cluster = _replicated_case()
    model = cost_model(profile, cluster, SolveOptions())
    # autoplan's runtime: the excess over the shortest last backward; Megatron-DeepSpeed: all.
    assert model.exposed_allreduce_ms(30.0, 12.0) == 18.0
    assert model.exposed_allreduce_ms(30.0, 40.0) == 0.0
    deepspeed = model.with_engine("megatron-deepspeed")
    assert deepspeed.exposed_allreduce_ms(30.0, 12.0) == 30.0
    assert not deepspeed.hides_allreduce and model.hides_allreduce
    # evaluate reads the same rule: two data-parallel replicas of the whole model, ZeRO 0.
    group = group_of(0, 1, 2, 1, "none")
    config = PlanConfig(2, "1f1b", 1, (StageChoice(0, 2, (group,), 0),))
    ours, theirs = model.evaluate(config), deepspeed.evaluate(config)
    allreduce = ours.rank_allreduce_ms[0]
    backward = ours.stages[0].groups[0].backward_ms
    assert allreduce > backward > 0
    assert math.isclose(theirs.iteration_ms - ours.iteration_ms, backward, rel_tol=1e-9)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(instances())
def test_search_for_megatron_deepspeed_equals_brute_force(instance) -> None:
    """Under Megatron-DeepSpeed's costs the search's best is brute force's best (uniform and
    heterogeneous spaces), and its proven bound is never above it."""
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, DEEPSPEED)
    assert model.engine == "megatron-deepspeed"
    expected = min(brute_force(model, batch, DEEPSPEED), brute_force_hetero(model, batch))
    searched = solve_candidates(model, batch, DEEPSPEED)
    assert searched.lower_bound_ms <= expected * (1 + 1e-9)
    found = [c for c in searched.candidates if c.cost.feasible]
    if math.isinf(expected):
        assert not found
        return
    assert found and math.isclose(found[0].iteration_ms, expected, rel_tol=1e-9), (
        found[0].config.summary() if found else None,
        expected,
    )


def test_the_plan_records_its_engine_and_is_priced_by_it(tmp_path: Path) -> None:
    # A zoo model (plan files are checked against the zoo) on two GPUs over a slow link.
    profile = read_json_model(PROFILES / "gpt2-small.profile.json", Profile)
    _, cluster = _replicated_case()
    options = SolveOptions(
        top_k=1, zero_bubble=False, dp=2, zero_stage=0, engine="megatron-deepspeed"
    )
    plan = solve(profile, cluster, 4, options)
    assert plan.inputs.engine == "megatron-deepspeed"
    autoplan_plan = solve(profile, cluster, 4, options.model_copy(update={"engine": "autoplan"}))
    assert autoplan_plan.inputs.engine == "autoplan"
    # Nothing hidden costs more: the same space's best under Megatron-DeepSpeed is slower.
    assert plan.prediction.iteration_time_ms > autoplan_plan.prediction.iteration_time_ms
    # Re-pricing the plan file keeps its engine unless told otherwise.
    again = price(profile, plan=plan)
    assert again.plan.inputs.engine == "megatron-deepspeed"
    assert math.isclose(
        again.plan.prediction.iteration_time_ms, plan.prediction.iteration_time_ms, rel_tol=1e-9
    )
    ours = price(profile, plan=plan, engine="autoplan")
    assert ours.plan.inputs.engine == "autoplan"
    assert ours.plan.prediction.iteration_time_ms < plan.prediction.iteration_time_ms
    assert math.isclose(
        again.iteration_ms_by_engine["autoplan"], ours.plan.prediction.iteration_time_ms
    )
    # The simulator plays each plan as its engine runs it: within 2% of its prediction.
    for priced in (plan, autoplan_plan):
        played = simulate_plan(priced).iteration_time_ms
        assert abs(played / priced.prediction.iteration_time_ms - 1) <= 0.02
    # autoplan's runtime refuses a plan priced for another engine, in one line with the fix.
    with pytest.raises(InputError, match="--engine autoplan"):
        check_runnable(plan)
    path = tmp_path / "plan.json"
    write_json_model(path, plan)
    launched = CliRunner().invoke(app, ["launch", str(path), "-o", str(tmp_path / "scripts")])
    assert launched.exit_code == 2 and "--engine autoplan" in launched.output
    assert not (tmp_path / "scripts").exists()
    shown = CliRunner().invoke(app, ["show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "priced for" in shown.output
    assert "Megatron-DeepSpeed" in " ".join(shown.output.split())
