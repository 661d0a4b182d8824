"""The searched context-parallel knob against brute force: on small random instances the
solver's best with cp searched equals the best of every configuration of the space at cp 1
and cp 2 (tests/test_solver_oracle.py's enumerations on the cost model's view of each
degree; heterogeneous pipelines with each stage at either degree: tests/stage_degrees_oracle),
and the plan's figure is what ``evaluate`` gives the config with cp on its groups."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from autoplan.errors import InputError
from autoplan.plan.validate import validate_plan
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.context_parallel import cp_choices
from tests.stage_degrees_oracle import brute_force_stage_degrees
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import brute_force, brute_force_hetero, instances

# cp searched at any length (the synthetic sequences are short); SP and the zero-bubble
# variants off, as in the solver oracle (their own oracles cover them).
OPTIONS = SolveOptions(top_k=1, cp_min_seq_len=1, sequence_parallel=False, zero_bubble=False)
SEEN: set[int] = set()  # the cp of the solver's best, over the examples


@st.composite
def cp_instances(draw):
    """The solver oracle's instances with nodes of 2 GPUs (so cp 2 fits a node)."""
    profile, cluster, batch = draw(instances())
    groups = [g.model_copy(update={"gpus_per_node": 2}) for g in cluster.node_groups]
    return profile, cluster.model_copy(update={"node_groups": groups}), batch


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
    phases=[Phase.explicit, Phase.generate],  # a failure is reported as found, not shrunk
)
@given(cp_instances())
def test_searched_context_parallel_equals_brute_force(instance) -> None:
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    assert cp_choices(model, OPTIONS) == [1, 2]
    expected = math.inf
    for cp in (1, 2):
        view = model if cp == 1 else model.with_context_parallel(cp)
        expected = min(expected, brute_force(view, batch, OPTIONS), brute_force_hetero(view, batch))
    expected = min(expected, brute_force_stage_degrees(model, batch, OPTIONS, [(1, 1), (2, 1)]))
    found = [c for c in solve_candidates(model, batch, OPTIONS).candidates if c.cost.feasible]
    if math.isinf(expected):
        assert not found
        return
    assert found, f"brute force found {expected} ms; the solver found nothing"
    best = found[0]
    assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9), (
        best.config.summary(),
        best.iteration_ms,
        expected,
    )
    for stage in best.config.stages:  # one cp a stage; stages may differ
        cps = {g.cp for g in stage.groups}
        assert len(cps) == 1
        SEEN.update(cps)
    assert math.isclose(model.evaluate(best.config).iteration_ms, best.iteration_ms, rel_tol=1e-12)


def test_the_oracle_instances_have_both_degrees_win() -> None:
    """Runs after the oracle test (file order): cp 2 is the best on some instances and not on
    others, so the equality above is tested on both sides."""
    assert {1, 2} == SEEN


def test_degrees_searched_follow_the_nodes_and_the_sequence() -> None:
    def model(seq_len: int, per_node: int, attention: bool = True):
        layers = [layer(i, flops=10**12, params=10**6, saved=10**6, output=10**6) for i in range(2)]
        if not attention:
            layers = [x.model_copy(update={"selective_recompute_flops": 0}) for x in layers]
        cluster = make_cluster([("a", gpu("A", 100.0, 80.0), per_node, 1)])
        return cost_model(make_profile(layers, seq_len=seq_len), cluster, SolveOptions())

    default = SolveOptions()
    assert cp_choices(model(8192, 8), default) == [1, 2, 4, 8]
    assert cp_choices(model(8192, 4), default) == [1, 2, 4]  # within a node
    assert cp_choices(model(8196, 8), default) == [1, 2]  # 2·cp must divide 8196 tokens
    assert cp_choices(model(4096, 8), default) == [1]  # below cp_min_seq_len
    assert cp_choices(model(8192, 8, attention=False), default) == [1]
    assert cp_choices(model(8192, 8), SolveOptions(strategy="megatron")) == [1]
    assert cp_choices(model(4096, 8), SolveOptions(cp=4)) == [4]
    with pytest.raises(InputError, match="--cp 3: 2 × 3 load-balanced chunks"):
        cp_choices(model(4096, 8), SolveOptions(cp=3))


def test_a_stage_at_cp_2_beside_one_at_cp_1_beats_every_single_degree() -> None:
    # Two layers of 900 MB of activations a sample, no tp. G0: 0.8 GiB, so a layer fits only
    # with its sequence split over a node's 2 GPUs (cp 2). G1: as fast, 8 GiB, but its GPUs
    # exchange at 0.2 GB/s, so its ring costs more than the attention it overlaps. Best: one
    # layer on a G1 at cp 1, the other on G0's two GPUs at cp 2, pipelined.
    layers = [
        layer(i, flops=4 * 10**11, params=10**7, saved=9 * 10**8, output=10**7, tp_divides=None)
        for i in range(2)
    ]
    cluster = make_cluster(
        [
            ("g0", gpu("G0", tflops=50.0, memory_gib=0.8), 2, 1),
            ("g1", gpu("G1", tflops=50.0, memory_gib=8.0), 2, 1),
        ],
        intra_gb_per_s=100.0,
        inter_gb_per_s=10.0,
    )
    slow = [
        g if g.name == "g0" else g.model_copy(update={"intra_node_bandwidth_gb_per_s": 0.2})
        for g in cluster.node_groups
    ]
    cluster = cluster.model_copy(update={"node_groups": slow})
    model = cost_model(make_profile(layers), cluster, OPTIONS)
    best = next(c for c in solve_candidates(model, 4, OPTIONS).candidates if c.cost.feasible)
    shape = [(stage.cp, stage.groups[0].device_class) for stage in best.config.stages]
    assert shape == [(1, 1), (2, 0)], best.config.summary()
    expected = brute_force_stage_degrees(model, 4, OPTIONS, [(1, 1), (2, 1)])
    assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9)
    # The plan carries each stage's cp, and the validator takes it (pp 2 pinned: see below).
    plan = solve(model.profile, model.cluster, 4, OPTIONS.model_copy(update={"pp": 2}))
    assert [s.replicas[0].context_parallel_degree for s in plan.stages] == [1, 2]
    validate_plan(plan, model.profile)
    # Unpinned, a cp group across the two types beats it (autoplan.solve.context_span_family):
    # both layers on G0, G0, G1 ranks of 36, 36 and 56 tokens, G0's memory holding its chunks.
    spanning = solve(model.profile, model.cluster, 4, OPTIONS)
    (replica,) = spanning.stages[0].replicas
    assert replica.context_tokens == [36, 36, 56]
    assert spanning.prediction.iteration_time_ms < best.iteration_ms / 1.1
    validate_plan(spanning, model.profile)
    for cp in (1, 2):
        pinned = OPTIONS.model_copy(update={"cp": cp})
        one = next(c for c in solve_candidates(model, 4, pinned).candidates if c.cost.feasible)
        assert one.iteration_ms > best.iteration_ms * 1.1, (cp, one.config.summary())
