"""ZeRO-2/3 in the cost model and the search.

- ``sharding``'s bytes per level, and what its collectives expose.
- Oracle: on small instances whose memory needs ZeRO-2 or ZeRO-3 somewhere, the solver's best
  (uniform and heterogeneous space) equals brute force over every layer split and, per stage,
  every ZeRO level and recompute, each configuration costed by ``CostModel.evaluate``.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cost import sharding
from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.offload import group_of, searched_modes
from autoplan.files import read_json_model
from autoplan.plan.validate import validate_plan
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.space import divisors, micro_batch_choices, pipeline_degrees, schedules
from solvers.oracle import compositions
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

# Every (recompute, offload) mode of the space (autoplan.cost.offload).
MODES = searched_modes(("none", "selective", "full"), None)
ROOT = Path(__file__).resolve().parent.parent


def test_static_bytes_per_level() -> None:
    # 100 parameters, 2 bytes each, 12 optimizer bytes each, over 4 replicas.
    assert sharding.static_bytes(100, 4, 0, 2, 12) == (200, 200, 1200)
    assert sharding.static_bytes(100, 4, 1, 2, 12) == (200, 200, 300)
    assert sharding.static_bytes(100, 4, 2, 2, 12) == (50, 50, 300)
    assert sharding.gathered_bytes(100, 4, 2, 2) == 200
    assert sharding.static_bytes(100, 4, 3, 2, 12) == (50, 50, 300)
    assert sharding.gathered_bytes(100, 4, 3, 2) == 0
    # One replica has nothing to shard.
    assert sharding.static_bytes(100, 1, 3, 2, 12) == (200, 200, 1200)
    assert sharding.static_bytes_per_param(4, 2, 2, 12) == 2 + 0.5 + 0.5 + 3


def test_exposed_collectives() -> None:
    # Level 2: one all-gather over the forward, one reduce-scatter over the backward.
    assert sharding.exposed_ms(2, 3.0, 2.0, 4.0) == (1.0, 0.0)
    # Level 3: the backward gathers again: 2 × 3 - 4 exposed.
    assert sharding.exposed_ms(3, 3.0, 2.0, 4.0) == (1.0, 2.0)
    assert sharding.exposed_ms(1, 3.0, 0.0, 0.0) == (0.0, 0.0)


def _instance(memory_gib: float, num_layers: int, intra_gb_per_s: float):
    layers = [
        layer(i, flops=4 * 10**11, params=50 * 10**6, saved=2 * 10**7, output=10**6)
        for i in range(num_layers)
    ]
    cluster = make_cluster(
        [("g", gpu("G", tflops=50.0, memory_gib=memory_gib), 4, 1)],
        intra_gb_per_s=intra_gb_per_s,
    )
    return make_profile(layers), cluster


def _brute_force(model, batch: int, options: SolveOptions) -> tuple[float, str]:
    """Every uniform configuration at tp 1 with any ZeRO level and recompute per stage."""
    best, summary = math.inf, ""
    n = model.num_layers
    for dp in divisors(batch):
        if dp > 4:
            continue
        levels = (0, 1, 2, 3) if dp > 1 else (0,)
        for mbs in micro_batch_choices(batch // dp, options):
            m = batch // (dp * mbs)
            for pp in pipeline_degrees(n, options):
                if pp * dp > 4:
                    continue
                for schedule, v in schedules(pp, m, n, options):
                    if v != 1:
                        continue
                    for sizes in compositions(n, pp):
                        bounds = [0, *itertools.accumulate(sizes)]
                        per_stage = list(itertools.product(levels, MODES))
                        for choice in itertools.product(per_stage, repeat=pp):
                            stages = tuple(
                                StageChoice(
                                    bounds[s],
                                    bounds[s + 1],
                                    (group_of(0, 1, dp, mbs, choice[s][1]),),
                                    choice[s][0],
                                )
                                for s in range(pp)
                            )
                            config = PlanConfig(m, schedule, 1, stages)
                            cost = model.evaluate(config)
                            if cost.feasible and cost.iteration_ms < best:
                                best, summary = cost.iteration_ms, config.summary()
    return best, summary


@pytest.mark.parametrize(
    ("memory_gib", "num_layers", "intra", "pinned"),
    [
        # dp 4 of one stage: ZeRO-1's 7 bytes per parameter do not fit, ZeRO-3's do.
        (1.25, 4, 100.0, {"pp": 1}),
        # The same, a slow link: the collectives show, the search still needs level 3.
        (1.25, 4, 2.0, {"pp": 1}),
        # Free pp: sharding competes with pipelining (1F1B: the zero-bubble schedules are
        # costed by their own play, another lever's oracle).
        (1.25, 4, 100.0, {"schedule": "1f1b"}),
        (0.9, 3, 20.0, {"schedule": "1f1b"}),
    ],
)
def test_solver_equals_brute_force_where_zero_2_or_3_is_needed(
    memory_gib: float, num_layers: int, intra: float, pinned: dict
) -> None:
    profile, cluster = _instance(memory_gib, num_layers, intra)
    batch = 4
    options = SolveOptions(top_k=1, tp=1, **pinned)
    model = cost_model(profile, cluster, options)
    expected, summary = _brute_force(model, batch, options)
    assert math.isfinite(expected)
    for space in ("uniform", "heterogeneous"):
        found = [
            c
            for c in solve_candidates(
                model, batch, options.model_copy(update={"space": space})
            ).candidates
            if c.cost.feasible
        ]
        assert found, space
        assert math.isclose(found[0].iteration_ms, expected, rel_tol=1e-9), (
            space,
            found[0].config.summary(),
            summary,
        )
    if "pp" in pinned:
        # The instance needs sharding beyond ZeRO-1: no ZeRO-1 plan fits.
        assert " z2" in summary or " z3" in summary, summary
        ones = SolveOptions(top_k=1, tp=1, zero_stage=1, **pinned)
        best = solve_candidates(cost_model(profile, cluster, ones), batch, ones).candidates
        assert not [c for c in best if c.cost.feasible]


@pytest.mark.parametrize("zero", [2, 3])
def test_solved_zero_plans_pass_the_validator_with_their_profile(zero: int) -> None:
    """Megatron 18.4B on 8 A100-80GB: data parallel over 8 GPUs fits only with ZeRO-2/3; the
    emitted plan says the level, and its memory estimate is above the validator's
    independent floor (which shards weights and gradients at these levels)."""
    profile = read_json_model(ROOT / "profiles" / "megatron-18.4b.profile.json", Profile)
    cluster = load_cluster(example_cluster_path("a100x8"))
    plan = solve(profile, cluster, 64, SolveOptions(dp=8, zero_stage=zero, time_limit_s=20))
    assert [stage.zero_stage for stage in plan.stages] == [zero]
    validate_plan(plan, profile)
    states = plan.prediction.memory[0]
    per_gpu = sum(layer.param_count for layer in profile.layers) / 8
    # bf16 weights and gradients plus 12 bytes of Adam each, all sharded 8 ways.
    assert states.optimizer_bytes == pytest.approx(12 * per_gpu, rel=1e-6)
    assert states.gradients_bytes == pytest.approx(2 * per_gpu, rel=1e-6)


@pytest.mark.parametrize(
    ("memory_gib", "intra", "batch", "needs_sharding"),
    [
        # Two classes of 2 GPUs, 4 layers of 50M parameters: ZeRO-1 does not fit, ZeRO-3 does.
        (1.25, 100.0, 8, True),
        # A slow link: the collectives show, with shares and recompute chosen around them.
        (1.25, 2.0, 12, True),
        # Memory to spare: ZeRO-1 (free) is the answer.
        (4.0, 100.0, 12, False),
    ],
)
def test_shares_family_equals_brute_force_over_zero_levels(
    memory_gib: float, intra: float, batch: int, needs_sharding: bool
) -> None:
    """The single-stage plans with uneven shares over two classes (``solve.shares``) search
    ZeRO levels 1-3 as every other stage does: their best equals brute force over every m,
    per-class share, recompute and ZeRO level 0-3 (tests/test_solver_oracle.py's)."""
    from autoplan.solve.shares import shared_candidates
    from tests.test_solver_oracle import _brute_force_shared

    layers = [
        layer(i, flops=4 * 10**11, params=50 * 10**6, saved=2 * 10**7, output=10**6)
        for i in range(4)
    ]
    cluster = make_cluster(
        [
            ("a", gpu("A", tflops=50.0, memory_gib=memory_gib), 2, 1),
            ("b", gpu("B", tflops=20.0, memory_gib=memory_gib), 2, 1),
        ],
        intra_gb_per_s=intra,
        inter_gb_per_s=intra / 2,
    )
    profile = make_profile(layers)
    options = SolveOptions(top_k=1, tp=1)
    model = cost_model(profile, cluster, options)
    costs = [(model.evaluate(c), c) for c in shared_candidates(model, batch, options, 10.0)]
    feasible = sorted(
        ((cost.iteration_ms, config.summary()) for cost, config in costs if cost.feasible)
    )
    expected = _brute_force_shared(model, batch, 1)
    assert feasible and math.isfinite(expected)
    assert math.isclose(feasible[0][0], expected, rel_tol=1e-9), feasible[0]
    sharded = " z2" in feasible[0][1] or " z3" in feasible[0][1]
    assert sharded == needs_sharding, feasible[0][1]
    ones = SolveOptions(top_k=1, tp=1, zero_stage=1)
    pinned = [
        model.evaluate(c).feasible
        for c in shared_candidates(cost_model(profile, cluster, ones), batch, ones, 10.0)
    ]
    assert any(pinned) != needs_sharding
