"""Sub-block grain with a launch floor that binds: whole blocks cost as blocks, and the
block-grain plan seeds the finer search (``autoplan.cost.block_parts``,
``autoplan.solve.granularity``).

- The same plan at either grain costs the same: every candidate of the block-grain search,
  lifted to units, has the block-grain iteration time on the sub-block model, with launch
  floors that bind for a part alone (the kernels of each part take longer to launch than
  its GPU time at small micro-batches), activation offload and the zero-bubble schedules in
  the space.
- Never slower, with offload and every ZeRO level searched: the seeded sub-block search's
  best is never slower than the block-grain best (it holds the lifted block plan).
- Still exact: with the floors binding, the solver's best at sub-block grain equals brute
  force over the whole space (the search's prefix sums plus the start correction against
  ``CostModel.evaluate``'s stage-by-stage pieces), and so does the search given an incumbent
  just above the optimum (what the seeding passes: it prunes, never loses the optimum).
"""

from __future__ import annotations

import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cost.block_parts import block_pairs, block_profile, unit_boundaries
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve.granularity import lift
from autoplan.solve.portfolio import portfolio_search
from tests.synthetic_profiles import gpu, make_cluster
from tests.test_solver_oracle import OPTIONS, brute_force, brute_force_hetero
from tests.test_sub_block_solve import sub_block_profiles

# The space with offload and ZeRO 1-3 searched (the earlier never-slower tests pinned both).
FREE = SolveOptions(top_k=8, zero_bubble=False, sequence_parallel=False)


@st.composite
def launch_bound_profiles(draw) -> Profile:
    """``sub_block_profiles`` with kernel counts: each part launches 20-120 kernels a pass."""
    profile = draw(sub_block_profiles())
    layers = [
        unit.model_copy(
            update={
                "forward_kernels": draw(st.integers(20, 120)),
                "backward_kernels": draw(st.integers(20, 240)),
            }
        )
        for unit in profile.layers
    ]
    return profile.model_copy(update={"layers": layers})


@st.composite
def launch_clusters(draw):
    """One or two GPU types whose launches take 20-200 us (so a light part is launch-bound)."""
    groups = []
    for index in range(draw(st.integers(1, 2))):
        spec = gpu(
            f"G{index}",
            tflops=draw(st.sampled_from([25.0, 60.0])),
            memory_gib=draw(st.sampled_from([0.6, 1.5, 8.0])),
            bandwidth=draw(st.sampled_from([100.0, 1000.0])),
            host_link=draw(st.sampled_from([2.0, 25.0])),
        ).model_copy(update={"kernel_launch_us": draw(st.sampled_from([20.0, 80.0, 200.0]))})
        groups.append((f"g{index}", spec, draw(st.sampled_from([1, 2])), draw(st.integers(1, 2))))
    return make_cluster(groups, inter_gb_per_s=draw(st.sampled_from([0.5, 10.0])))


def _best(profile: Profile, cluster, batch: int, options: SolveOptions):
    model = cost_model(profile, cluster, options)
    return model, solve_candidates(model, batch, options).candidates


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(launch_bound_profiles(), launch_clusters(), st.sampled_from([2, 4]))
def test_a_block_plan_costs_the_same_at_either_grain(profile, cluster, batch) -> None:
    block = block_profile(profile)
    assert len(block.layers) == len(profile.layers) - len(block_pairs(profile))
    sub_model = cost_model(profile, cluster, FREE)
    # Zero-bubble schedules too: their backward splits into I and W by block at either grain.
    _, found = _best(block, cluster, batch, FREE.model_copy(update={"zero_bubble": True}))
    boundaries = unit_boundaries(profile)
    for candidate in found:
        lifted = sub_model.evaluate(lift(candidate.config, boundaries))
        assert math.isclose(lifted.iteration_ms, candidate.iteration_ms, rel_tol=1e-9), (
            candidate.config.summary(),
            lifted.iteration_ms,
            candidate.iteration_ms,
        )


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(launch_bound_profiles(), launch_clusters(), st.sampled_from([2, 4]))
def test_the_seeded_sub_block_plan_is_never_slower(profile, cluster, batch) -> None:
    _, coarse = _best(block_profile(profile), cluster, batch, FREE)
    _, fine = _best(profile, cluster, batch, FREE)
    coarse_ms = min((c.iteration_ms for c in coarse if c.cost.feasible), default=math.inf)
    fine_ms = min((c.iteration_ms for c in fine if c.cost.feasible), default=math.inf)
    assert fine_ms <= coarse_ms * (1 + 1e-9), (fine_ms, coarse_ms)


@settings(  # 4 examples: the brute force over the heterogeneous space is the suite's time
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(launch_bound_profiles(), launch_clusters(), st.sampled_from([1, 2, 4]))
def test_launch_bound_sub_block_search_equals_brute_force(profile, cluster, batch) -> None:
    model = cost_model(profile, cluster, OPTIONS)
    uniform = brute_force(model, batch, OPTIONS)
    expected = min(uniform, brute_force_hetero(model, batch))
    found = [c for c in solve_candidates(model, batch, OPTIONS).candidates if c.cost.feasible]
    got = found[0].iteration_ms if found else math.inf
    if math.isinf(expected):
        assert math.isinf(got)
        return
    assert math.isclose(got, expected, rel_tol=1e-9), (got, expected)
    # An incumbent just above the optimum prunes everything else and still finds it.
    seeded = portfolio_search(model, None, batch, OPTIONS, incumbent_ms=expected * 1.001)
    best = min(c.iteration_ms for c in seeded.candidates if c.cost.feasible)
    assert math.isclose(best, expected, rel_tol=1e-9), (best, expected)


def test_shipped_sub_block_profiles_merge_into_the_shipped_block_profiles() -> None:
    """The parts merged (``block_profile``) are the block the profiler traced whole: every
    figure of every layer, tensor-parallel ones included (what the seeding and the per-block
    cost rely on)."""
    from autoplan.files import read_json_model

    folder = Path(__file__).resolve().parents[1] / "profiles"
    for name in ("llama2-7b", "gpt3-175b"):
        sub = read_json_model(folder / f"{name}.sub-block.profile.json", Profile)
        whole = read_json_model(folder / f"{name}.profile.json", Profile)
        merged = block_profile(sub)
        assert unit_boundaries(sub)[-1] == len(sub.layers)
        assert len(merged.layers) == len(whole.layers) == len(unit_boundaries(sub)) - 1
        skip = {"index", "replica_of", "measured"}
        for mine, theirs in zip(merged.layers, whole.layers, strict=True):
            assert mine.model_dump(exclude=skip) == theirs.model_dump(exclude=skip), mine.name
