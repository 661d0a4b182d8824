"""The uniform family with sequence parallelism chosen per stage (``autoplan.solve.uniform``'s
``per_stage_sp``: the SP-off run's, ``autoplan.solve.sequence_parallel``) against brute force:
every uniform plan with each stage's SP off or on (interleaved plans: the whole plan's, on
its view's split) costed by ``CostModel.evaluate``; the family's floor and every bound it
queues candidates with never above the optima they bound; the partition DP with choices per
stage and the rule that drops a setting no better than the other, against enumeration; an
instance where both settings of a stage stay choices of the DP; and a built instance where a
uniform plan mixing SP and non-SP stages beats both plan-wide settings."""

from __future__ import annotations

import dataclasses
import importlib
import itertools
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.cost.config import canonical_sequence_parallel
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve.bounds import group_bound
from autoplan.solve.flight_bound import order_bound
from autoplan.solve.space import zero_levels
from solvers.oracle import compositions
from solvers.partition_dp import best_partition, pipeline_objective
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_flight_bound import tight_instances
from tests.test_sequence_parallel_cost import _mixed_instance
from tests.test_sequence_parallel_oracle import _with_replicated_work
from tests.test_solver_oracle import brute_force, instances

uniform = importlib.import_module("autoplan.solve.uniform")

# SP searched (not pinned); zero bubble off: its plans are outside the brute force.
OPTIONS = SolveOptions(top_k=1, zero_bubble=False, space="uniform")
OFF = OPTIONS.model_copy(update={"sequence_parallel": False})
SEEN: list[tuple[bool, ...]] = []  # per example: the SP setting of each tp > 1 stage of the best


def _stage_settings(config) -> tuple[bool, ...]:
    return tuple(
        config.stage_sequence_parallel(s)
        for s, stage in enumerate(config.stages)
        if stage.tensor_parallel
    )


@settings(
    max_examples=int(__import__("os").environ.get("ORACLE_EXAMPLES", 40)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(instances(), st.booleans())
def test_uniform_family_with_sp_per_stage_equals_brute_force(instance, replicated) -> None:
    """The family's best equals brute force over the uniform plans with every stage's SP
    enumerated; its floor is that optimum (a search run to its end proves it) and never
    above it; pruned against an incumbent just above the optimum it still finds it. With
    ``replicated`` a quarter of each layer's FLOPs is left whole by tp, which SP shards (SP
    faster); without, SP only adds its all-gathers and saves memory."""
    profile, cluster, batch = instance
    if replicated:
        profile = _with_replicated_work(profile)
    model = cost_model(profile, cluster, OPTIONS)
    expected = brute_force(model, batch, OFF, per_stage_sp=True, shared=False)
    result = uniform.uniform_search(model, batch, OPTIONS, deadline=math.inf, per_stage_sp=True)
    found = [c for c in result.candidates if c.cost.feasible]
    assert result.lower_bound_ms <= expected * (1 + 1e-9)
    if math.isinf(expected):
        assert not found
        return
    assert found, f"brute force found {expected} ms; the family found nothing"
    best = found[0]
    assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9), (
        best.config.summary(),
        best.iteration_ms,
        expected,
    )
    assert math.isclose(result.lower_bound_ms, expected, rel_tol=1e-9)
    # Said one way, and its figure is what evaluate gives the config with its flags.
    assert canonical_sequence_parallel(best.config) == best.config
    assert model.evaluate(best.config).iteration_ms == best.iteration_ms
    pruned = uniform.uniform_search(
        model,
        batch,
        OPTIONS,
        deadline=math.inf,
        incumbent_ms=expected * (1 + 1e-9),
        per_stage_sp=True,
    )
    assert pruned.candidates
    assert math.isclose(pruned.candidates[0].iteration_ms, expected, rel_tol=1e-9)
    SEEN.append(_stage_settings(best.config))


def test_the_oracle_optima_run_sp_on_some_stages_and_off_on_others() -> None:
    """Runs after the oracle test (file order): among its optima are plans with a stage
    running SP and plans with a tp > 1 stage not running it, so both choices are tested."""
    assert any(any(s) for s in SEEN) and any(not all(s) for s in SEEN if s), SEEN


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(instances())
def test_the_space_with_sp_searched_equals_brute_force(instance) -> None:
    """``--space uniform`` with SP searched: the SP-off run's uniform family per stage and
    the shared single-stage plans of both settings; the best and the proven bound are the
    brute force's over all of them."""
    profile, cluster, batch = instance
    model = cost_model(_with_replicated_work(profile), cluster, OPTIONS)
    expected = min(
        brute_force(model, batch, OFF, per_stage_sp=True),
        brute_force(model.with_sequence_parallel(True), batch, OFF, uniform=False),
    )
    result = solve_candidates(model, batch, OPTIONS)
    found = [c for c in result.candidates if c.cost.feasible]
    assert result.lower_bound_ms <= expected * (1 + 1e-9)
    if math.isinf(expected):
        assert not found
        return
    assert found and math.isclose(found[0].iteration_ms, expected, rel_tol=1e-9)
    assert math.isclose(result.lower_bound_ms, expected, rel_tol=1e-9)


@settings(max_examples=4, deadline=None, derandomize=True)
@given(tight_instances())
def test_bounds_never_above_the_per_stage_optimum(instance) -> None:
    """Every candidate of the uniform space with SP per stage: its group's bound, its queued
    bound and its own order bound <= its exact DP over each stage's setting (no pruning),
    which is no worse than the DP with SP off everywhere and than the one with it on."""
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    on_view = model.with_sequence_parallel(True)
    checked = mixed = 0
    for group in uniform._groups(model, batch, OPTIONS, False, True):
        if group.tp == 1:
            assert not group.per_stage_sp
            continue
        assert group.per_stage_sp
        levels = zero_levels(group.dp, True, OPTIONS)
        full = group_bound(model, group)
        for pending in uniform._expand(model, group, math.inf, levels):
            bound = order_bound(model, pending, levels)
            found = uniform._solve_pipeline(model, pending, OPTIONS, math.inf)
            plain = dataclasses.replace(pending, per_stage_sp=False)
            off = uniform._solve_pipeline(model, plain, OPTIONS, math.inf)
            on = uniform._solve_pipeline(on_view, plain, OPTIONS, math.inf)
            if found is None:
                assert off is None and on is None
                continue
            assert max(full, pending.bound) <= bound <= found[1] * (1 + 1e-9), (pending, bound)
            assert found[1] <= min(x[1] for x in (off, on) if x is not None) * (1 + 1e-12)
            assert math.isclose(model.evaluate(found[0]).iteration_ms, found[1], rel_tol=1e-9)
            checked += 1
            settings_ = _stage_settings(found[0])
            mixed += any(settings_) and not all(settings_)
    assert checked > 0
    MIXED.append(mixed)


MIXED: list[int] = []  # per example: candidates whose per-stage optimum mixes the settings


def test_the_bound_instances_hold_mixed_optima() -> None:
    """Runs after the test above (file order): some candidates' optima there run SP on some
    tp > 1 stages and not on others, so the bounds are tested below mixed plans too."""
    assert any(MIXED), MIXED


def test_a_uniform_plan_mixing_sp_stages_beats_both_plan_wide_settings() -> None:
    """``_mixed_instance`` (B needs SP to hold its layers without full recompute, A's slow
    NVLink makes SP's all-gathers cost it): with ``--space uniform`` the best is one (dp, tp)
    for both stages, SP on B's and off on A's, faster by more than 3% than the best with SP
    pinned on and with it pinned off, equal to brute force and proven."""
    profile, cluster = _mixed_instance()
    batch = 2
    best = {}
    for sp in (None, True, False):
        options = OPTIONS.model_copy(update={"sequence_parallel": sp})
        model = cost_model(profile, cluster, options)
        result = solve_candidates(model, batch, options)
        found = [c for c in result.candidates if c.cost.feasible]
        best[sp] = (found[0], result.lower_bound_ms)
    mixed, bound = best[None]
    config = mixed.config
    assert config.executor == "mesh" and len({s.groups[0].tp for s in config.stages}) == 1
    runs_sp = {s.classes: config.stage_sequence_parallel(i) for i, s in enumerate(config.stages)}
    assert runs_sp == {(1,): True, (0,): False}, config.summary()
    assert mixed.iteration_ms < 0.97 * best[True][0].iteration_ms
    assert mixed.iteration_ms < 0.97 * best[False][0].iteration_ms
    model = cost_model(profile, cluster, OPTIONS)
    expected = brute_force(model, batch, OFF, per_stage_sp=True, shared=False)
    assert math.isclose(mixed.iteration_ms, expected, rel_tol=1e-9)
    assert math.isclose(bound, mixed.iteration_ms, rel_tol=1e-9)


def _enumerate(layers: int, stages: int, m: int, options) -> float:
    """The best F over every split and every stage's choice (``options(s, i, j)``)."""
    best = math.inf
    for sizes in compositions(layers, stages):
        bounds = [0, *itertools.accumulate(sizes)]
        per_stage = [options(s, bounds[s], bounds[s + 1]) or () for s in range(stages)]
        for chosen in itertools.product(*per_stage):
            if any(c is None for c in chosen):
                continue
            value = pipeline_objective(
                max(c[0] for c in chosen),
                sum(c[1] for c in chosen),
                max(c[2] for c in chosen),
                m,
            )
            best = min(best, value)
    return best


@settings(max_examples=80, deadline=None, derandomize=True)
@given(
    st.integers(1, 6),
    st.integers(1, 4),
    st.lists(st.tuples(st.floats(0.1, 10), st.floats(0, 6)), min_size=36, max_size=36),
    st.integers(1, 8),
)
def test_partition_dp_with_choices_equals_enumeration(layers, stages, table, m) -> None:
    """``best_partition`` with two choices per stage (each None past a memory-like limit,
    never again for larger j) against every split and every choice vector; its
    ``choices`` priced again give its objective; with the uniform family's rule
    (``_no_worse``) dropping a choice no better than the other, the same optimum."""
    stages = min(stages, layers)

    def options(s: int, i: int, j: int):
        out = []
        for x in (0, 1):
            c, t = table[(s * 7 + i * 3 + 11 * x) % 36]
            extra, _ = table[(j * 5 + s + 13 * x) % 36]
            time = c * (j - i) + extra
            out.append((time, time, t) if c * (j - i) < 30 else None)
        return None if out == [None, None] else tuple(out)

    def pruned(s: int, i: int, j: int):
        found = options(s, i, j)
        if found is None or None in found:
            return found
        off, on = found
        if uniform._no_worse(off, on):
            return (off, None)
        if uniform._no_worse(on, off):
            return (None, on)
        return found

    expected = _enumerate(layers, stages, m, options)
    for stage_cost in (options, pruned):
        result = best_partition(layers, stages, m, stage_cost, choices=True)
        assert (result is None) == math.isinf(expected)
        if result is None:
            continue
        assert math.isclose(result.objective, expected, rel_tol=1e-12)
        chosen = [
            options(s, result.boundaries[s], result.boundaries[s + 1])[result.choices[s]]
            for s in range(stages)
        ]
        again = pipeline_objective(
            max(c[0] for c in chosen), sum(c[1] for c in chosen), max(c[2] for c in chosen), m
        )
        assert math.isclose(again, result.objective, rel_tol=1e-12)


def _tail_bound_instance():
    """Two blocks with a quarter of their FLOPs whole under tp (SP shards it), tp 2 on a
    slow NVLink (SP's all-gathers at a stage's ends cost about what it saves a forward) and
    dp 2 over a slow network (the all-reduce outlasts the last backward): SP shortens a
    stage's backward by more than its time, so its tail grows by more than its time
    shrinks, and neither setting is no worse than the other (found by a random search)."""
    shapes = [(50, 31, 10, 12), (5, 39, 16, 18)]
    layers = [
        layer(
            i, flops=f * 10**10, params=p * 10**6, saved=a * 10**7, output=o * 10**6, tp_divides=2
        )
        for i, (f, p, a, o) in enumerate(shapes)
    ]
    profile = _with_replicated_work(make_profile(layers))
    cluster = make_cluster(
        [("g", gpu("G", 60.0, 8.0), 2, 2)], intra_gb_per_s=5.0, inter_gb_per_s=0.5
    )
    return profile, cluster, 4


def test_both_settings_stay_choices_and_the_family_equals_brute_force() -> None:
    """On ``_tail_bound_instance`` some stage of some candidate has both settings as DP
    choices (the faster has the longer tail, by more than it saves); the family's best there
    equals brute force with every stage's SP enumerated, and is proven."""
    profile, cluster, batch = _tail_bound_instance()
    model = cost_model(profile, cluster, OPTIONS)
    both = 0
    for group in uniform._groups(model, batch, OPTIONS, False, True):
        levels = zero_levels(group.dp, True, OPTIONS)
        for pending in uniform._expand(model, group, math.inf, levels):
            if pending.chunks != 1 or not pending.per_stage_sp:
                continue
            modes = uniform.recompute_modes(OPTIONS)
            _, coster = uniform._pipeline_coster(model, pending, modes, levels)
            n, pp = model.num_layers, len(pending.classes)
            for s, i in itertools.product(range(pp), range(n)):
                for j in range(i + 1, n + 1):
                    found = coster(s, i, j)
                    both += found is not None and None not in found
    assert both > 0
    expected = brute_force(model, batch, OFF, per_stage_sp=True, shared=False)
    result = uniform.uniform_search(model, batch, OPTIONS, deadline=math.inf, per_stage_sp=True)
    assert math.isclose(result.candidates[0].iteration_ms, expected, rel_tol=1e-9)
    assert math.isclose(result.lower_bound_ms, expected, rel_tol=1e-9)
