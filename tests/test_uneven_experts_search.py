"""Experts placed by speed in the search (``autoplan.solve.expert_span``): every mixed
allocation's expert-group counts and integer splits are stage options of the heterogeneous
DP, and its best equals brute force over the space with them (``tests/stage_degrees_oracle``
with ``spans``), on small instances where they win and where they do not; the plan of a win
is emitted, valid and drawn; ``--even-experts`` leaves them out.

The instances: an embedding and two MoE blocks (8 experts holding 90% of 80 M parameters
each, half the block's FLOPs) on one node of G0 (100 TFLOP/s) and one of G1 (50), n GPUs
each. At 1.3 GiB a GPU, batch 3, two G0 and one G1 replica of one sample each, expert groups
of all three ranks, 3 + 3 + 2 experts: no GPU holds a block's experts whole, per-type expert
groups leave the G1 replica alone, and even experts cannot split 8 three ways."""

from __future__ import annotations

import itertools
import math

import pytest

from autoplan.cost.expert_parallel import ExpertMember, ExpertSpan, span_alltoall_ms
from autoplan.plan.validate import plan_problems
from autoplan.solve import SolveOptions, cost_model, solve, solve_candidates
from autoplan.solve.expert_span import ExpertSpanSource, span_options
from autoplan.solve.hetero import HeteroSource
from autoplan.solve.stage_degrees import degree_options
from autoplan.view.plan_tables import stages_section
from tests.stage_degrees_oracle import brute_force_stage_degrees
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import _brute_force_shared, brute_force
from tests.test_uneven_experts_cost import moe_layer

OPTIONS = SolveOptions(top_k=1, zero_bubble=False, sequence_parallel=False)
DEGREES = [(1, 1), (1, 2), (1, 4), (1, 8)]


def _model(memory_gib: float, gpus: int, inter_gb_per_s: float):
    layers = [
        layer(0, flops=10**10, params=10**6, saved=10**7, output=10**6, kind="embedding"),
        moe_layer(1),
        moe_layer(2),
    ]
    cluster = make_cluster(
        [
            ("g0", gpu("G0", tflops=100.0, memory_gib=memory_gib), gpus, 1),
            ("g1", gpu("G1", tflops=50.0, memory_gib=memory_gib), gpus, 1),
        ],
        intra_gb_per_s=100.0,
        inter_gb_per_s=inter_gb_per_s,
    )
    return cost_model(make_profile(layers), cluster, OPTIONS)


def _brute_force_every_family(model, batch: int) -> float:
    """The best of the families' brute forces: heterogeneous stages at every degree with the
    experts placed by speed (priced for the groups executor), and the plans priced for the
    mesh or found with free shares, which the heterogeneous space prices otherwise or lacks:
    uniform pipelines without experts split (the mesh) and single stages of uneven shares
    over both types (tests/test_solver_oracle)."""
    best = brute_force_stage_degrees(model, batch, OPTIONS, DEGREES, spans=True)
    return min(best, brute_force(model, batch, OPTIONS), _brute_force_shared(model, batch, 1))


def _best(model, batch: int, options: SolveOptions = OPTIONS):
    found = [c for c in solve_candidates(model, batch, options).candidates if c.cost.feasible]
    return found[0] if found else None


def test_every_split_of_every_expert_group_count_is_an_option() -> None:
    model = _model(1.3, 2, 100.0)
    source = HeteroSource(model, 4, 1, "1f1b", OPTIONS)
    spans = [s for s in span_options(model, source.allocations) if s.allocation[0][1] == 1]
    # Two G0 replicas and one G1: one expert group of 3 ranks, 2·x1 + x2 = 8.
    three = [s for s in spans if [n for _, _, n in s.allocation] == [2, 1]]
    assert sorted(s.experts for s in three) == [(1, 6), (2, 4), (3, 2)]
    # One of each: 7 splits of 8; two of each: k = 1 (2·x1 + 2·x2 = 8) and k = 2 (x1 + x2).
    one = [s for s in spans if [n for _, _, n in s.allocation] == [1, 1]]
    assert sorted(s.experts for s in one) == [(x, 8 - x) for x in range(1, 8)]
    two = {(s.groups, s.experts) for s in spans if [n for _, _, n in s.allocation] == [2, 2]}
    assert {(1, (x, 4 - x)) for x in range(1, 4)} | {(2, (x, 8 - x)) for x in range(1, 8)} == two


def test_experts_by_speed_win_where_no_even_placement_fits_well() -> None:
    # Over a 10 GB/s link the stage's all-reduce, summed after the backward by the groups
    # executor that runs expert groups, costs more than a pipeline of the two types does.
    model = _model(1.3, 2, 100.0)
    best = _best(model, 3)
    assert best is not None
    (stage,) = best.config.stages
    assert (stage.ep, stage.experts) == (3, (3, 2)), best.config.summary()
    even = _best(model, 3, OPTIONS.model_copy(update={"experts_by_speed": False}))
    assert even is not None and all(not s.experts for s in even.config.stages)
    assert best.iteration_ms < even.iteration_ms
    # Both are the optimum of their space.
    with_spans = brute_force_stage_degrees(model, 3, OPTIONS, DEGREES, spans=True)
    without = brute_force_stage_degrees(model, 3, OPTIONS, DEGREES, spans=False)
    assert math.isclose(best.iteration_ms, with_spans, rel_tol=1e-9)
    assert math.isclose(even.iteration_ms, without, rel_tol=1e-9)


CASES = list(itertools.product((0.8, 1.0, 1.3, 1.6), (1, 2), (3, 6)))


@pytest.mark.parametrize(("memory_gib", "gpus", "batch"), CASES)
def test_the_search_with_experts_by_speed_equals_brute_force(
    memory_gib: float, gpus: int, batch: int
) -> None:
    inter = 100.0 if (gpus + batch) % 2 else 10.0
    model = _model(memory_gib, gpus, inter)
    best = _best(model, batch)
    expected = _brute_force_every_family(model, batch)
    if best is None:
        assert math.isinf(expected)
    else:
        assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9), best.config.summary()


def test_the_plan_of_a_win_is_valid_and_drawn() -> None:
    model = _model(1.3, 2, 100.0)
    plan = solve(model.profile, model.cluster, 3, OPTIONS)
    (stage,) = plan.stages
    assert [r.gpu_type for r in stage.replicas] == ["G0", "G0", "G1"]
    assert [r.routed_experts for r in stage.replicas] == [3, 3, 2]
    assert plan_problems(plan, model.profile) == []
    assert "1 · ep 3 (3 G0 + 3 G0 + 2 G1)" in str(stages_section(plan).rows)


def test_experts_placed_by_memory_too() -> None:
    """tests/test_expert_parallel_cost.py's instance: G0 is fast with 0.44 GiB, G1 half as
    fast with 8 GiB and a slow intra-node link. One stage of 4 G0 and 4 G1 replicas, expert
    groups of one of each holding 1 + 3 of the 4 experts, beats the best of each stage its
    own even ep (306 against 342 ms, both as the groups executor runs them: the all-reduce
    after the backward): the small GPU keeps one expert, the large one three."""
    from tests.test_expert_parallel_cost import memory_bound_moe_instance

    profile, cluster = memory_bound_moe_instance()
    model = cost_model(profile, cluster, OPTIONS)
    best = _best(model, 8)
    assert best is not None
    (stage,) = best.config.stages
    assert (stage.ep, stage.experts) == (2, (1, 3)), best.config.summary()
    expected = brute_force_stage_degrees(model, 8, OPTIONS, [(1, 1), (1, 2), (1, 4)], spans=True)
    assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9)
    even = brute_force_stage_degrees(model, 8, OPTIONS, [(1, 1), (1, 2), (1, 4)], spans=False)
    assert best.iteration_ms < 0.9 * even


def test_even_experts_is_recorded_in_the_plan() -> None:
    model = _model(1.3, 2, 100.0)
    even = OPTIONS.model_copy(update={"experts_by_speed": False})
    plan = solve(model.profile, model.cluster, 3, even)
    assert plan.inputs.pinned["experts_by_speed"] == "False"
    assert all(r.routed_experts is None for s in plan.stages for r in s.replicas)
    assert "experts_by_speed" not in solve(model.profile, model.cluster, 3, OPTIONS).inputs.pinned


@pytest.mark.parametrize(
    ("memory_gib", "gpus", "inter_gb_per_s"), [(1.3, 2, 100.0), (1.6, 2, 10.0)]
)
def test_span_floors_stay_below_every_stage_they_bound(
    memory_gib: float, gpus: int, inter_gb_per_s: float
) -> None:
    """Each option's floor on [i, j) (compute spread over every replica, plus the least
        all-to-alls over the option's share pairs) is at most the work of its stage there, at
        every flight (inf where a member's static bytes rule out every share, so no stage fits
    anywhere it says inf); the all-to-all part is the least of ``span_alltoall_ms`` over the share
        pairs (a second, plain computation of it) and is what lifts the floor."""
    model = _model(memory_gib, gpus, inter_gb_per_s)
    layers = model.profile.layers
    for batch in (3, 4, 6):
        base = HeteroSource(model, batch, 1, "1f1b", OPTIONS)
        source = ExpertSpanSource(base, degree_options(OPTIONS, 2) or OPTIONS)
        assert source.spans
        lifted = ruled_out = kept = repeats = 0
        for option, span in enumerate(source.spans):
            (k1, _, n1), (k2, _, n2) = span.allocation
            a1, a2 = n1 // span.groups, n2 // span.groups
            pairs = [
                (s, (batch - n1 * s) // n2)
                for s in range(1, batch)
                if (batch - n1 * s) % n2 == 0 and (batch - n1 * s) >= n2
            ]
            least = 0.0
            if pairs:
                least = min(
                    span_alltoall_ms(
                        group,
                        layer.experts.dispatch_bytes
                        / (layer.experts.num_experts * model.profile.micro_batch_size),
                        model.span_links(group),
                    )
                    for layer in layers
                    if layer.experts is not None
                    for group in [
                        ExpertSpan(
                            (
                                ExpertMember(k1, s1, span.experts[0], a1),
                                ExpertMember(k2, s2, span.experts[1], a2),
                            )
                        )
                        for s1, s2 in pairs
                    ]
                )
            for j in range(1, len(layers) + 1):
                floors = source.floor_table(j)
                for i in range(j):
                    moe = sum(layer.experts is not None for layer in layers[i:j])
                    exchange = source._exchange[option, j] - source._exchange[option, i]
                    if pairs:
                        assert math.isclose(exchange, 4 * moe * least, rel_tol=1e-9)
                        lifted += exchange > 0
                    first = source._canonical[(span.allocation, span.groups)]
                    repeat = moe == 0 and first != span
                    ruled_out += math.isinf(floors[option, i]) and not repeat
                    for flight in (1, 2):
                        found = source.stage(span, i, j, flight)
                        if repeat:
                            # Left to the first split of its (allocation, count), an earlier
                            # option whose stage it is, whose floor is a floor of it.
                            assert found == source._stage(first, i, j, flight)
                            at = source.spans.index(first)
                            assert at < option
                            assert found is None or not math.isinf(floors[at, i])
                            repeats += 1
                        elif found is not None:
                            assert floors[option, i] <= found.work_ms * (1 + 1e-12), (span, i, j)
                        kept += found is not None
        assert lifted > 0 and ruled_out > 0 and kept > 0 and repeats > 0
