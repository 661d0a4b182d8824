"""The uniform search's bounds and early stops never prune the optimum: on instances bigger
than brute force can take (8-14 layers, three GPU types), the search equals every candidate
solved without any bound. In a file of its own so that, with the suite's one file per worker,
it runs beside the brute-force oracles of tests/test_solver_oracle.py rather than after them."""

from __future__ import annotations

import importlib
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.plan.validate import validate_plan
from autoplan.schedule.names import ZERO_BUBBLE_SCHEDULES
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile


@st.composite
def medium_instances(draw):
    """Bigger than brute force can take: 8-14 layers, three GPU types, 4-GPU nodes."""
    blocks = draw(st.integers(6, 12))
    profile = transformer_profile(
        blocks, hidden=draw(st.sampled_from([1024, 2048])), seq_len=512, heads=16
    )
    specs = [
        gpu("FAST", 300.0, draw(st.sampled_from([8.0, 40.0]))),
        gpu("MID", 120.0, draw(st.sampled_from([8.0, 24.0]))),
        gpu("SLOW", 40.0, draw(st.sampled_from([4.0, 16.0]))),
    ]
    count = draw(st.integers(2, 3))
    cluster = make_cluster(
        [(f"g{i}", spec, 4, draw(st.integers(1, 2))) for i, spec in enumerate(specs[:count])],
        inter_gb_per_s=draw(st.sampled_from([5.0, 50.0])),
    )
    return profile, cluster, draw(st.sampled_from([8, 16, 32]))


@settings(max_examples=8, deadline=None, derandomize=True)
@given(medium_instances())
def test_search_bounds_never_prune_the_optimum(instance) -> None:
    """The uniform search (bounds, early stops) against every candidate solved without any
    bound; the heterogeneous search is never worse, and its plan passes the validator."""
    uniform_module = importlib.import_module("autoplan.solve.uniform")
    shares_module = importlib.import_module("autoplan.solve.shares")
    profile, cluster, batch = instance
    options = SolveOptions(top_k=1, space="uniform")
    model = cost_model(profile, cluster, options)
    unpruned = math.inf
    for group in uniform_module._groups(model, batch, options):
        for pending in uniform_module._expand(model, group, math.inf):
            found = uniform_module._solve_pipeline(model, pending, options, math.inf)
            if found is not None:
                unpruned = min(unpruned, model.evaluate(found[0]).iteration_ms)
    for config in shares_module.shared_candidates(model, batch, options, 10.0):
        unpruned = min(unpruned, model.evaluate(config).iteration_ms)
    # The zero-bubble variants re-time the plans the search found (``solve.zero_bubble``),
    # outside the space enumerated above: compare the rest.
    result = [
        c
        for c in solve_candidates(model, batch, options).candidates
        if c.cost.feasible and c.config.schedule not in ZERO_BUBBLE_SCHEDULES
    ]
    if math.isinf(unpruned):
        assert not result
        return
    assert math.isclose(result[0].iteration_ms, unpruned, rel_tol=1e-9)
    plan = solve(profile, cluster, batch, SolveOptions(top_k=1))
    validate_plan(plan, profile)
    assert plan.prediction.iteration_time_ms <= unpruned * (1 + 1e-6)
