"""The searched sequence-parallel knob against brute force: on small random instances, the
solver's best with SP searched equals the best of every configuration of the space costed
by ``CostModel.evaluate``: the shared single-stage plans with SP off and on
(tests/test_solver_oracle.py's enumerations, run on the cost model's view of each setting),
the uniform pipelines and the heterogeneous ones with SP off or on per stage
(``brute_force`` and ``brute_force_hetero`` with ``per_stage_sp``). The reported lower
bound is never above that optimum, nor is the DP's root bound of any run above the run's own
optimum (its prefix bound's ω is the least over SP off and on:
``autoplan.solve.stage_degrees``)."""

from __future__ import annotations

import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model, solve_candidates
from autoplan.solve.context_parallel import cp_choices
from autoplan.solve.hetero import _root_bound, _runs, hetero_candidates
from autoplan.solve.search import start_search
from autoplan.solve.sequence_parallel import has_tensor_parallel
from autoplan.solve.stage_degrees import stage_source
from tests.stage_degrees_oracle import brute_force_stage_degrees
from tests.test_solver_oracle import (
    brute_force,
    brute_force_hetero,
    brute_force_hetero_runs,
    hetero_instances,
    instances,
)

# Zero bubble off: its plans are outside the brute force, and without them a search run to its
# end proves its best (the bound is checked below).
OPTIONS = SolveOptions(top_k=1, zero_bubble=False)
SEEN: set[bool] = set()  # the SP setting of the solver's best, over the examples


def _with_replicated_work(profile: Profile) -> Profile:
    """The synthetic layers with a quarter of their FLOPs left whole by tp (norms, residual
    adds), which SP shards: so SP is faster on some instances, not only smaller."""
    layers = []
    for layer in profile.layers:
        tp = layer.tensor_parallel
        if tp is not None:
            tp = tp.model_copy(
                update={
                    "sharded_forward_flops": layer.forward_flops * 3 // 4,
                    "sharded_backward_flops": layer.backward_flops * 3 // 4,
                }
            )
        layers.append(layer.model_copy(update={"tensor_parallel": tp}))
    return profile.model_copy(update={"layers": layers})


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(instances())
def test_searched_sequence_parallel_equals_brute_force(instance) -> None:
    profile, cluster, batch = instance
    profile = _with_replicated_work(profile)
    model = cost_model(profile, cluster, OPTIONS)
    off = OPTIONS.model_copy(update={"sequence_parallel": False})
    expected = min(
        brute_force_hetero(model, batch, per_stage_sp=True),
        # The uniform plans with each stage's SP its own, the shared ones of both settings.
        brute_force(model, batch, off, per_stage_sp=True),
        brute_force(model.with_sequence_parallel(True), batch, off, uniform=False),
    )
    result = solve_candidates(model, batch, OPTIONS)
    found = [c for c in result.candidates if c.cost.feasible]
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
    SEEN.add(any(best.config.stage_sequence_parallel(i) for i in range(len(best.config.stages))))
    # Proven: the searches' stage times are evaluate's (SP's all-gathers at the ends of a
    # stage's runs of blocks included), so the bound they report reaches the optimum.
    assert result.lower_bound_ms <= expected * (1 + 1e-9)
    assert math.isclose(result.lower_bound_ms, expected, rel_tol=1e-9), (
        result.lower_bound_ms,
        expected,
    )
    # The plan's figure is what evaluate gives the config with its SP flag.
    assert math.isclose(model.evaluate(best.config).iteration_ms, best.iteration_ms, rel_tol=1e-12)


def test_the_oracle_instances_have_both_settings_win() -> None:
    """Runs after the oracle test (file order): its instances are ones where SP wins and ones
    where it does not, so the equality above is tested on both sides."""
    assert {True, False} == SEEN


SKIPPED: list[int] = []  # per example: the tp-1 plans the SP-on quick families leave out


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(instances())
def test_the_sp_on_run_leaves_the_tp1_plans_to_the_sp_off_run(instance) -> None:
    """The SP-on run's uniform and shared families search tp > 1 only (a tp-1 plan is the
    SP-off run's, the same plan): none of theirs lacks tp, and their best with tp is no
    worse than that of the run that searched tp 1 too (which prunes against its tp-1 best)."""
    profile, cluster, batch = instance
    model = cost_model(_with_replicated_work(profile), cluster, OPTIONS)
    view = model.with_sequence_parallel(True)
    full = start_search(view, batch, OPTIONS)
    only = start_search(view, batch, OPTIONS, tensor_parallel_only=True)
    assert all(has_tensor_parallel(c.config) for c in only.candidates)
    with_tp = [c for c in full.candidates if c.cost.feasible and has_tensor_parallel(c.config)]
    assert only.best_ms() <= min((c.iteration_ms for c in with_tp), default=math.inf)
    SKIPPED.append(sum(not has_tensor_parallel(c.config) for c in full.candidates))


def test_the_skip_instances_hold_tp1_plans() -> None:
    """Runs after the test above (file order): on some of its instances the full run held
    tp-1 plans, so the skip was tested where it leaves something out."""
    assert any(SKIPPED)


CHOSEN: list[bool] = []  # per example: whether a stage of the DP's optimum runs SP


@settings(
    max_examples=int(__import__("os").environ.get("ORACLE_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
@given(hetero_instances())
def test_per_stage_sequence_parallel_dp_equals_brute_force(instance) -> None:
    """The heterogeneous DP with SP per stage (``stage_source``'s SP options) against every
    pipeline with every stage's SP setting enumerated; its floor and each run's root bound
    (prefix bound, fill ratio and relaxation over the joined options) never above the
    optimum they bound."""
    profile, cluster, batch = instance
    profile = _with_replicated_work(profile)
    options = OPTIONS.model_copy(update={"sequence_parallel": None})
    model = cost_model(profile, cluster, options)
    runs = brute_force_hetero_runs(model, batch, per_stage_sp=True)
    expected = min(runs.values(), default=math.inf)
    source_type = stage_source(model, options, sequence_parallel=True)
    found = hetero_candidates(
        model, batch, options, math.inf, keep=1, deadline=math.inf, source_type=source_type
    )
    sources: dict = {}
    for index, run in enumerate(_runs(model.num_layers, batch, options)):
        m, schedule = run[0], run[1]
        root = _root_bound(model, batch, options, run, sources, index, source_type, {})
        assert root <= runs.get((m, schedule), math.inf) * (1 + 1e-9), (run, root, runs)
    assert found.floor_ms <= expected * (1 + 1e-9)
    if math.isinf(expected):
        assert not found.configs
        return
    assert found.configs, f"brute force found {expected} ms; the DP found nothing"
    config = found.configs[0]
    cost = model.evaluate(config)
    assert cost.feasible
    assert math.isclose(cost.iteration_ms, expected, rel_tol=1e-9), (
        config.summary(),
        cost.iteration_ms,
        expected,
    )
    # Pruned against a bound just above the optimum (root bounds, levels, completion floors
    # and the prefix bound all at work): the same optimum.
    pruned = hetero_candidates(
        model,
        batch,
        options,
        expected * (1 + 1e-9),
        keep=1,
        deadline=math.inf,
        source_type=stage_source(model, options, sequence_parallel=True),
    )
    assert pruned.configs
    assert math.isclose(model.evaluate(pruned.configs[0]).iteration_ms, expected, rel_tol=1e-9)
    CHOSEN.append(any(config.stage_sequence_parallel(s) for s in range(len(config.stages))))


def test_the_per_stage_instances_hold_sp_optima() -> None:
    """Runs after the test above (file order): on some of its instances the optimum has a
    stage running SP (one of the joined SP options), so the equality covers them. (A plan
    mixing SP and non-SP stages is rarely the optimum of these random instances: a built
    one is in tests/test_sequence_parallel_cost.py.)"""
    assert any(CHOSEN), CHOSEN


@st.composite
def cp_sp_instances(draw):
    """The solver oracle's instances with one node of 4 GPUs per type, so that a stage may
    run cp 2 or 4 (a node's cp groups), tp 2, or cp 2 and tp 2."""
    profile, cluster, batch = draw(instances())
    groups = [g.model_copy(update={"gpus_per_node": 4, "count": 1}) for g in cluster.node_groups]
    return profile, cluster.model_copy(update={"node_groups": groups}), batch


CP_SP_SEEN: set[tuple[int, bool]] = set()  # (cp, SP) of the stages of the DP's optima


@settings(
    max_examples=int(__import__("os").environ.get("ORACLE_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(cp_sp_instances())
def test_per_stage_sp_beside_per_stage_cp_equals_brute_force(instance) -> None:
    """The DP with cp and SP both per stage (the (cp, SP) views joined: its prefix bound the
    plain view's at the least over SP off and on, which holds for the cp views too) against
    every pipeline with each stage at cp 1, 2 or 4 and SP off or on; its floor never above
    it."""
    profile, cluster, batch = instance
    profile = _with_replicated_work(profile)
    options = OPTIONS.model_copy(update={"sequence_parallel": None, "cp_min_seq_len": 1})
    model = cost_model(profile, cluster, options)
    degrees = [(cp, 1) for cp in cp_choices(model, options)]
    assert degrees == [(1, 1), (2, 1), (4, 1)]
    expected = brute_force_stage_degrees(model, batch, options, degrees, per_stage_sp=True)
    source_type = stage_source(model, options, sequence_parallel=True)
    found = hetero_candidates(
        model, batch, options, math.inf, keep=1, deadline=math.inf, source_type=source_type
    )
    assert found.floor_ms <= expected * (1 + 1e-9)
    if math.isinf(expected):
        assert not found.configs
        return
    assert found.configs, f"brute force found {expected} ms; the DP found nothing"
    best = model.evaluate(found.configs[0])
    assert math.isclose(best.iteration_ms, expected, rel_tol=1e-9), (
        found.configs[0].summary(),
        best.iteration_ms,
        expected,
    )
    config = found.configs[0]
    CP_SP_SEEN.update(
        (stage.cp, config.stage_sequence_parallel(s)) for s, stage in enumerate(config.stages)
    )


def test_the_cp_sp_instances_have_both_knobs_chosen() -> None:
    """Runs after the test above (file order): its optima hold stages at cp 2 and stages
    running SP, so the joined views are tested where each is chosen."""
    assert any(cp == 2 for cp, _ in CP_SP_SEEN) and any(sp for _, sp in CP_SP_SEEN), CP_SP_SEEN
