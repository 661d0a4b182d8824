"""The relaxed run bound (``solvers.relaxed_bound``) and the heterogeneous root bound built on
it (``autoplan.solve.hetero._root_bound``) never exceed the optimum they bound: on random
small problems of plain numbers against brute force over every partition and option, and on
random small clusters against the best plan of each run, every plan costed by evaluate."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoplan.solve import cost_model
from autoplan.solve.hetero import HeteroSource, _root_bound
from autoplan.solve.space import divisors
from solvers.oracle import compositions
from solvers.relaxed_bound import (
    GRID_POINTS,
    GRID_STEP,
    STAGE_CAP_KEPT,
    RunRelaxation,
    _shortest,
    stage_floors,
)
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile
from tests.test_solver_oracle import OPTIONS, brute_force_hetero_runs, hetero_instances


def _brute_force(n, m, resources, uses, floors, least, most):
    """min over partitions, options within the resources and least..most stages of
    (m - 1) max c + Σ c; and the least peak of any such pipeline."""
    best, lowest = math.inf, math.inf
    for p in range(least, most + 1):
        for sizes in compositions(n, p):
            bounds = [0, *itertools.accumulate(sizes)]
            for chosen in itertools.product(range(len(uses)), repeat=p):
                if np.any(uses[list(chosen)].sum(axis=0) > resources):
                    continue
                costs = [floors[o, bounds[s], bounds[s + 1]] for s, o in enumerate(chosen)]
                best = min(best, (m - 1) * max(costs) + sum(costs))
                lowest = min(lowest, max(costs))
    return best, lowest


@st.composite
def problems(draw):
    n = draw(st.integers(2, 4))
    kinds = draw(st.integers(1, 3))
    options = draw(st.integers(1, 4))
    uses = np.array(
        [[draw(st.integers(0, 2)) for _ in range(kinds)] for _ in range(options)], dtype=np.int64
    )
    uses[:, 0] = np.maximum(uses[:, 0], 1 - uses[:, 1:].sum(axis=1))  # each uses something
    resources = np.array([draw(st.integers(1, 4)) for _ in range(kinds)], dtype=np.int64)
    per_layer = np.array(
        [[draw(st.integers(1, 30)) for _ in range(n)] for _ in range(options)], dtype=np.float64
    )
    tables = []
    for j in range(1, n + 1):
        # The floor of [i, j): its layers' sum, per option (nonincreasing in i).
        tables.append(np.stack([per_layer[:, i:j].sum(axis=1) for i in range(j)], axis=1))
    edge = [
        (np.array([draw(st.integers(0, 5)) for _ in range(options)], dtype=np.float64),) * 2
        for _ in range(n + 1)
    ]
    floors = stage_floors(n, tables, edge)
    m = draw(st.sampled_from([1, 2, 4, 8]))
    least = draw(st.integers(1, n))
    most = draw(st.integers(least, n))
    weights = np.array([draw(st.sampled_from([0.5, 1.0, 3.0])) for _ in range(kinds)])
    return n, m, resources, uses, floors, least, most, weights


@settings(max_examples=150, deadline=None, derandomize=True)
@given(problems())
def test_the_relaxed_bound_is_never_above_brute_force(problem) -> None:
    """Never above the optimum; and where the resources never bind, within the peak grid's
    step of it (the relaxation is then the problem itself, up to the grid)."""
    n, m, resources, uses, floors, least, most, weights = problem
    best, lowest = _brute_force(n, m, resources, uses, floors, least, most)
    if math.isinf(best):
        return
    bound = RunRelaxation(
        n,
        m,
        tuple(resources.tolist()),
        uses,
        floors,
        weights,
        lowest,
        min_stages=least,
        max_stages=most,
    ).bound
    assert bound <= best * (1 + 1e-9), (bound, best)
    if np.all(uses.sum(axis=0) * n <= resources):
        # Every pipeline fits; the grid covers peaks to 1.46 × the least one.
        slack = (1 + GRID_STEP) * (1 + 1e-9)
        within = all(
            (m - 1) * floors[o, i, j] + floors[o, i, j] <= 1.4 * (m * lowest)
            for o in range(len(uses))
            for i in range(n)
            for j in range(i + 1, n + 1)
        )
        if within:
            assert bound * slack >= best, (bound, best)


def _one_fast_gpu_and_slow_ones(resources: tuple[int, int], per_layer: list[float]):
    """Four layers, m = 4, options of one or two GPUs of each of two classes, each layer the
    given time on each option (a stage's floor its layers' sum): (brute force's best,
    ``RunRelaxation``'s arguments with the two classes weighted alike)."""
    n, m = 4, 4
    uses = np.array([[1, 0], [2, 0], [0, 1], [0, 2]], dtype=np.int64)  # a stage's GPUs
    times = np.array(per_layer)
    tables = [np.stack([times * (j - i) for i in range(j)], axis=1) for j in range(1, n + 1)]
    zeros = np.zeros(len(uses))
    floors = stage_floors(n, tables, [(zeros, zeros)] * (n + 1))
    best, lowest = _brute_force(n, m, np.array(resources, dtype=np.int64), uses, floors, 1, n)
    return best, (n, m, resources, uses, floors, np.array([1.0, 1.0]), lowest)


def test_pricing_one_scarce_resource_alone_lifts_the_bound(monkeypatch) -> None:
    """One fast GPU and four slow ones, priced alike by the weights: the prices on each
    resource alone (``CLASS_PRICE_FACTORS``) price the one fast GPU that every cheap
    pipeline wants, and reach a bound the weights' multiples alone do not, still no higher
    than brute force."""
    import solvers.relaxed_bound as relaxed_bound

    # Prices only: no class counted exactly (``test_one_class_counted_exactly_...``).
    monkeypatch.setattr(relaxed_bound, "EXACT_STATES", 0)
    best, args = _one_fast_gpu_and_slow_ones((1, 4), [1.68, 1.37, 6.31, 8.69])
    bound = RunRelaxation(*args).bound
    monkeypatch.setattr(relaxed_bound, "CLASS_PRICE_FACTORS", ())
    weights_only = RunRelaxation(*args).bound
    assert bound <= best * (1 + 1e-9), (bound, best)
    # 26.82 against 24.41 (brute force 26.88)
    assert bound > 1.05 * weights_only, (bound, weights_only, best)


def test_one_class_counted_exactly_lifts_the_bound_above_the_priced_one(monkeypatch) -> None:
    """One fast GPU and two slow ones, weighted alike: every price lets the relaxation take
    stages fractionally; counting the slow class exactly (``_ExactTables``: the class of most
    GPUs × weight) lifts the bound to the brute force optimum here, never above it."""
    import solvers.relaxed_bound as relaxed_bound

    best, args = _one_fast_gpu_and_slow_ones((1, 2), [4.29, 1.71, 6.87, 3.46])
    exact = RunRelaxation(*args)
    monkeypatch.setattr(relaxed_bound, "EXACT_STATES", 0)
    priced = RunRelaxation(*args).bound
    assert exact._run is not None and exact._run.exact == 1  # 2 GPUs × 1 against 1 × 1
    assert exact.bound <= best * (1 + 1e-9), (exact.bound, best)
    # 41.24 against 32.58 priced (brute force 41.24)
    assert exact.bound > 1.2 * priced, (exact.bound, priced, best)


def _pipelines(n, uses, resources, least, most):
    """Every pipeline of the plain-number problem: (bounds, options), within the resources."""
    for p in range(least, most + 1):
        for sizes in compositions(n, p):
            bounds = [0, *itertools.accumulate(sizes)]
            for chosen in itertools.product(range(len(uses)), repeat=p):
                if not np.any(uses[list(chosen)].sum(axis=0) > resources):
                    yield bounds, chosen


@settings(max_examples=80, deadline=None, derandomize=True)
@given(problems())
def test_the_completion_floor_is_never_above_the_best_completion(problem) -> None:
    """For every partial pipeline (the stages covering [i, n) of some pipeline), its
    completion floor against the best pipeline that ends with those stages."""
    n, m, resources, uses, floors, _least, _most, weights = problem
    best, lowest = _brute_force(n, m, resources, uses, floors, 1, n)
    if math.isinf(best):
        return
    relaxation = RunRelaxation(
        n, m, tuple(resources.tolist()), uses, floors, weights, lowest, max_stages=n
    )
    # Best F over pipelines sharing each suffix (start, its options and bounds).
    completions: dict[tuple, float] = {}
    figures: dict[tuple, tuple[float, float, np.ndarray]] = {}
    for bounds, chosen in _pipelines(n, uses, resources, 1, n):
        costs = [floors[o, bounds[s], bounds[s + 1]] for s, o in enumerate(chosen)]
        value = (m - 1) * max(costs) + sum(costs)
        for cut in range(1, len(chosen)):
            key = (tuple(bounds[cut:]), chosen[cut:])
            completions[key] = min(completions.get(key, math.inf), value)
            tail = costs[cut:]
            free = resources - uses[list(chosen[cut:])].sum(axis=0)
            figures[key] = (max(tail), sum(tail), free)
    keys = sorted(completions)
    if not keys:
        return
    floor = relaxation.completion_floors(
        np.array([key[0][0] for key in keys]),
        np.array([figures[key][0] for key in keys]),
        np.array([figures[key][1] for key in keys]),
        np.zeros(len(keys)),
        np.array([figures[key][2] for key in keys]),
    )
    for key, value in zip(keys, floor.tolist(), strict=True):
        assert value <= completions[key] * (1 + 1e-9), (key, value, completions[key])


def test_stage_floors_add_both_transfers_to_inner_stages_only() -> None:
    """A stage pays the least transfer in (unless it is first) and out (unless it is last),
    twice each: a blocking transfer each way."""
    tables = [np.array([[1.0]]), np.array([[2.0, 1.0]]), np.array([[3.0, 2.0, 1.0]])]
    edges = [(np.array([10.0]), np.array([100.0]))] * 4
    floors = stage_floors(3, tables, edges)
    assert floors[0, 0, 3] == 3.0  # the whole model: no boundary
    assert floors[0, 0, 1] == 1.0 + 2 * 10.0  # first stage: out only
    assert floors[0, 2, 3] == 1.0 + 2 * 100.0  # last stage: in only
    assert floors[0, 1, 2] == 1.0 + 2 * 10.0 + 2 * 100.0
    assert math.isinf(floors[0, 2, 1])


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    derandomize=True,
)
@given(hetero_instances())
def test_the_root_bound_is_never_above_its_runs_best_plan(instance) -> None:
    """Each run's root bound (every micro-batch count, 1F1B and GPipe) against the best plan
    of that run, brute force costed by evaluate."""
    profile, cluster, batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    expected = brute_force_hetero_runs(model, batch)
    n = model.num_layers
    sources: dict[int, object] = {}
    for index, m in enumerate(divisors(batch)):
        for schedule, most, least in (("1f1b", min(m, n), 1), ("gpipe", n, m + 1)):
            if least > most:
                continue
            run = (m, schedule, most, least)
            bound = _root_bound(model, batch, OPTIONS, run, sources, 2 * index, HeteroSource)
            if schedule == "gpipe":
                sources.pop(2 * index, None)
            best = expected.get((m, schedule), math.inf)
            assert bound <= best * (1 + 1e-9), (run, bound, best)


def test_a_one_kind_options_side_is_the_side_its_stages_have() -> None:
    """``_least_side`` of a one-kind option equals the side of every stage it is costed
    into, and a two-kind option's is never above its stages' (the transfer floors rest on
    both)."""
    profile = make_profile(
        [layer(i, flops=10**11, params=10**6, saved=10**7, output=10**6) for i in range(4)]
    )
    cluster = make_cluster(
        [("a", gpu("A", 60.0, 8.0), 4, 2), ("b", gpu("B", 25.0, 8.0), 2, 1)],
        inter_gb_per_s=10.0,
    )
    model = cost_model(profile, cluster, OPTIONS)
    checked = 0
    for m in (1, 2, 3):
        source = HeteroSource(model, 12, m, "1f1b", OPTIONS)
        for option, allocation in enumerate(source.allocations):
            least = source._least_sides[option]
            for i, j in ((0, 4), (1, 3), (2, 3)):
                found = source.cost(option, i, j, 1, None)
                if found is None:
                    continue
                side = found.key
                checked += 1
                if len(allocation) == 1:
                    assert side == least, (allocation, side, least)
                else:
                    assert side.classes == least.classes
                    assert side.node_samples >= least.node_samples, (allocation, side, least)
                    assert side.largest_share >= least.largest_share, (allocation, side, least)
    assert checked > 20


def _gpt2_on_a100_v100():
    from pathlib import Path

    from autoplan.cluster.catalog import example_cluster_path, load_cluster
    from autoplan.profile.schema import Profile

    shipped = Path(__file__).parent.parent / "profiles"
    profile = Profile.model_validate_json((shipped / "gpt2-small.profile.json").read_text())
    return cost_model(profile, load_cluster(example_cluster_path("a100-v100")), OPTIONS)


def test_past_its_deadline_the_family_claims_only_the_cheap_root_bounds() -> None:
    """With an incumbent and a deadline already past, no run starts and no relaxation is
    computed: each run's floor is its cheap root bound (and its count's work bound), the
    family's floor their least, below the best plan."""
    from autoplan.solve.certificate import work_bound_ms
    from autoplan.solve.hetero import hetero_candidates

    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    assert best.configs and not best.timed_out
    optimum = model.evaluate(best.configs[0]).iteration_ms
    cut = hetero_candidates(model, batch, OPTIONS, optimum, keep=1, deadline=-math.inf)
    assert cut.timed_out and not cut.configs
    n = model.num_layers
    expected, sources = math.inf, {}
    index = 0
    for m in divisors(batch):
        runs = [("1f1b", min(m, n), 1)] + ([("gpipe", n, m + 1)] if m < n else [])
        for schedule, most, least in runs:
            run = (m, schedule, most, least)
            plain = _root_bound(
                model, batch, OPTIONS, run, sources, index, HeteroSource, None, False
            )
            expected = min(expected, max(work_bound_ms(model, batch, OPTIONS, [m]), plain))
            index += 1
    assert math.isclose(cut.floor_ms, expected, rel_tol=1e-12), (cut.floor_ms, expected)
    assert cut.floor_ms <= optimum * (1 + 1e-9)


def test_a_run_whose_root_bound_reaches_the_incumbent_is_skipped() -> None:
    """With the optimum as incumbent, the family's floor is the optimum (proven) where some
    run's root bound reaches it (such a run is skipped, its floor that root bound)."""
    from autoplan.solve.hetero import hetero_candidates

    model = _gpt2_on_a100_v100()
    batch = 64
    best = hetero_candidates(model, batch, OPTIONS, math.inf, keep=1, deadline=math.inf)
    optimum = model.evaluate(best.configs[0]).iteration_ms
    again = hetero_candidates(model, batch, OPTIONS, optimum, keep=1, deadline=math.inf)
    assert not again.timed_out
    assert math.isclose(again.floor_ms, optimum, rel_tol=1e-9), (again.floor_ms, optimum)
    n = model.num_layers
    skipped = 0
    for index, m in enumerate(divisors(batch)):
        run = (m, "1f1b", min(m, n), 1)
        bound = _root_bound(model, batch, OPTIONS, run, {}, index, HeteroSource)
        skipped += bound >= optimum
    assert skipped >= 1, "no run's root bound reaches the optimum: the test shows nothing"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    st.integers(1, 7).flatmap(
        lambda n: st.tuples(
            st.just(n),
            st.integers(1, n),
            st.integers(1, n),
            st.lists(st.integers(0, 50), min_size=2 * (n + 1) ** 2, max_size=2 * (n + 1) ** 2),
        )
    )
)
def test_the_shortest_partitions_are_the_brute_force_ones(case) -> None:
    """``_shortest`` (both of its stage counts: by stages, and by the layers beyond one per
    stage where few partitions have as many stages as asked) equals the least Σ cost over
    every partition of least..most stages, per row."""
    n, least, most, numbers = case
    cost = np.array(numbers, dtype=np.float64).reshape(2, n + 1, n + 1)
    least, most = min(least, most), max(least, most)
    cap = most if most <= STAGE_CAP_KEPT else n  # what RunRelaxation passes
    # _shortest reads [row, stage cell, cap]: the cells i < j packed by start, one cap here.
    starts, ends = np.triu_indices(n + 1, k=1)
    got = _shortest(cost[:, starts, ends, None], n, least, cap)[:, 0]
    for row in range(2):
        want = min(
            (
                sum(cost[row, a, b] for a, b in itertools.pairwise([0, *itertools.accumulate(s)]))
                for p in range(least, cap + 1 if cap < n else n + 1)
                for s in compositions(n, p)
            ),
            default=math.inf,
        )
        assert got[row] == want, (row, got[row], want)


@settings(max_examples=80, deadline=None, derandomize=True)
@given(problems(), st.sampled_from([0.5, 0.9, 0.99, 1.0, 1.01, 1.5]))
def test_a_target_gives_the_bound_or_a_coarser_one_that_reaches_it(problem, ratio) -> None:
    """With a target (what the run is pruned against), the bound is the full grid's, or a
    coarser one no higher than it that already reaches the target: the run is pruned on
    either or on neither."""
    n, m, resources, uses, floors, least, most, weights = problem
    _best, lowest = _brute_force(n, m, resources, uses, floors, least, most)
    if math.isinf(lowest):
        return
    args = (n, m, tuple(resources.tolist()), uses, floors, weights, lowest)
    full = RunRelaxation(*args, min_stages=least, max_stages=most).bound
    target = full * ratio if math.isfinite(full) else 1e9
    cut = RunRelaxation(*args, min_stages=least, max_stages=most, target=target)
    assert cut.bound <= full
    assert cut.bound == full or cut.bound >= target, (cut.bound, full, target)
    assert (cut.bound >= target) == (full >= target)
    if cut.bound < target:  # not pruned: the completion tables are the full grid's
        assert len(cut.grid) == GRID_POINTS + 1


def test_a_source_shared_with_the_other_schedule_costs_as_a_new_one() -> None:
    """``HeteroSource.with_schedule``: the 1F1B and GPipe runs of one m share a source's
    tables and caches; every stage cost and floor equals that of a source built for the
    schedule, whichever of the two was costed first (on stages whose memory makes the
    micro-batches in flight matter: the two schedules cost some of them differently)."""
    profile = make_profile(
        [layer(i, flops=10**11, params=10**6, saved=3 * 10**8, output=10**6) for i in range(4)]
    )
    cluster = make_cluster(
        [("a", gpu("A", 60.0, 8.0), 4, 2), ("b", gpu("B", 25.0, 8.0), 2, 1)],
        inter_gb_per_s=10.0,
    )
    model = cost_model(profile, cluster, OPTIONS)
    batch, m = 12, 3
    n = model.num_layers
    spans = [(i, j) for i in range(n) for j in range(i + 1, n + 1)]
    first = HeteroSource(model, batch, m, "1f1b", OPTIONS)
    for option in range(len(first.allocations)):  # fill the caches under 1F1B
        for i, j in spans:
            first.cost(option, i, j, 1, None)
    twin = first.with_schedule("gpipe")
    fresh = {s: HeteroSource(model, batch, m, s, OPTIONS) for s in ("1f1b", "gpipe")}
    compared = differ = 0
    for source, schedule in ((twin, "gpipe"), (first, "1f1b")):
        for j in range(1, n + 1):
            assert np.array_equal(source.floor_table(j), fresh[schedule].floor_table(j))
        for option in range(len(first.allocations)):
            for i, j in spans:
                for position in (1, 2, m + 1):
                    got = source.cost(option, i, j, position, None)
                    want = fresh[schedule].cost(option, i, j, position, None)
                    assert got == want, (schedule, option, i, j, position)
                    compared += got is not None
                    other = fresh["1f1b" if schedule == "gpipe" else "gpipe"]
                    differ += got != other.cost(option, i, j, position, None)
    assert compared > 50
    assert differ > 0, "the schedules cost every stage alike: the test shows nothing"


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems(), st.integers(1, 4), st.booleans())
def test_a_relaxation_like_another_reuses_its_tables_with_the_same_result(
    problem, least, same
) -> None:
    """``like``: a relaxation of the same inputs (the other schedule's run of one m, other
    stage counts) reuses the first one's tables, with the bound and tables of one computed
    alone; one of other inputs (another m) computes its own, alike."""
    n, m, resources, uses, floors, _least, most, weights = problem
    _best, lowest = _brute_force(n, m, resources, uses, floors, 1, n)
    if math.isinf(lowest):
        return
    first = RunRelaxation(
        n, m, tuple(resources.tolist()), uses, floors, weights, lowest, max_stages=most
    )
    other_m = m if same else m + 1
    args = (n, other_m, tuple(resources.tolist()), uses, floors, weights, lowest)
    least = min(least, n)
    alone = RunRelaxation(*args, min_stages=least)
    reused = RunRelaxation(*args, min_stages=least, like=first)
    assert reused.bound == alone.bound
    for name in ("grid", "prefix", "prices", "needs", "directions"):
        assert np.array_equal(getattr(reused, name), getattr(alone, name)), name


@pytest.mark.parametrize("cells", [1, 50, 1 << 18])
def test_floor_tables_in_passes_are_the_one_end_figures(monkeypatch, cells) -> None:
    """``HeteroSource.floor_table``, computed a few ends per pass (one end, some, all), is
    for every end j the figure of that end alone: a one-kind option's largest share, a
    two-kind option's best whole split (``_two_kind_floor`` both ways), plus the passes."""
    from autoplan.solve import hetero

    monkeypatch.setattr(hetero, "_FLOOR_CELLS", cells)
    model = _gpt2_on_a100_v100()
    source = HeteroSource(model, 64, 4, "1f1b", OPTIONS)
    counts, kinds = source._counts, source._kind_index
    n1, n2 = counts[:, 0, None], counts[:, 1, None]
    two = np.where(n2 > 0, n2, 1.0)
    for j in range(1, model.num_layers + 1):
        work = source._per_sample_matrix[:, j : j + 1] - source._per_sample_matrix[:, :j]
        per_kind = work[kinds]
        safe = np.where(per_kind > 0, per_kind, 1.0)
        balanced = np.maximum(
            hetero._two_kind_floor(safe[:, 0], safe[:, 1], n1, two, source.b),
            hetero._two_kind_floor(safe[:, 1], safe[:, 0], two, n1, source.b),
        )
        zero = ((per_kind <= 0) & (counts[:, :, None] > 0)).any(axis=1)
        balanced = np.where(zero, 0.0, balanced)
        single = source._single_prefix[:, j : j + 1] - source._single_prefix[:, :j]
        want = np.where(source._is_single[:, None], single, balanced) + source._overhead[:, None]
        # One-kind options: no lower than the fastest mode that fits (``_fitting_floors``).
        flight = np.where(np.full(j, j) < model.num_layers, min(source.m, 2), 1)
        offset = j * (j - 1) // 2
        for option in np.flatnonzero(source._is_single).tolist():
            k, t, x = source._top_share(option)
            fitting = source._fitting_floors(k, t, x, [option], slice(offset, offset + j), flight)
            want[option] = np.maximum(want[option], fitting[0])
        assert np.array_equal(source.floor_table(j), want), j
    assert (~source._is_single).any() and source._is_single.any()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_memory_floors_never_exceed_a_stage_that_fits(monkeypatch, schedule) -> None:
    """Where memory binds (GPT-2 small, 512 samples per micro-batch on A100s and V100s), a
    one-kind option's floor is its time in the fastest mode that fits with two micro-batches
    in flight (one for a stage ending at the last layer), inf where none fits: never above
    the stage's cost at any position it can hold (a stage ending before the last layer has
    one after it), and inf only where no such stage fits. The test shows something: floors
    above the no-recompute figure, and cells ruled out."""
    model = _gpt2_on_a100_v100()
    # A fixed time per pass (each GPU's ``pass_overhead_ms``), counted once.
    monkeypatch.setattr(type(model), "pass_overhead_ms", lambda self, k: 0.25 * (k + 1))
    m = 2
    source = HeteroSource(model, 1024, m, schedule, OPTIONS)
    n = model.num_layers
    raised = ruled_out = fits = 0
    for j in range(1, n + 1):
        floors = source.floor_table(j)
        plain = source._single_prefix[:, j : j + 1] - source._single_prefix[:, :j]
        plain = plain + source._overhead[:, None]
        for option in np.flatnonzero(source._is_single).tolist():
            for i in range(j):
                floor = float(floors[option, i])
                assert floor >= plain[option, i]
                raised += math.isfinite(floor) and floor > plain[option, i] * (1 + 1e-9)
                positions = [1] if j == n else [2, m + 1]
                costs = [source.cost(option, i, j, q, None) for q in positions]
                for cost in costs:
                    if cost is not None:
                        fits += 1
                        assert floor <= cost.steady_ms * (1 + 1e-12), (option, i, j)
                if math.isinf(floor):
                    ruled_out += 1
                    assert all(cost is None for cost in costs), (option, i, j)
    assert raised > 20 and ruled_out > 20 and fits > 100, (raised, ruled_out, fits)


def test_front_floors_never_exceed_a_stage_as_deep() -> None:
    """``front_floor_table(j, f)``: never below the floor, never above the cost of a stage
    f − 1 or more from the end (f micro-batches in flight or more under 1F1B), inf only
    where no such stage fits; above the floor somewhere (the test shows something)."""
    model = _gpt2_on_a100_v100()
    m = 4
    source = HeteroSource(model, 1024, m, "1f1b", OPTIONS)
    n = model.num_layers
    raised = 0
    for flight in (3, 4):
        for j in range(1, n):
            floors, front = source.floor_table(j), source.front_floor_table(j, flight)
            assert (front >= floors).all()
            raised += int((front > floors * (1 + 1e-9)).sum())
            for option in np.flatnonzero(source._is_single).tolist():
                for i in range(j):
                    costs = [source.cost(option, i, j, q, None) for q in (flight, m + 1)]
                    for cost in costs:
                        if cost is not None:
                            assert front[option, i] <= cost.steady_ms * (1 + 1e-12)
                    if math.isinf(front[option, i]):
                        assert all(cost is None for cost in costs)
    assert raised > 20, raised


@settings(max_examples=60, deadline=None, derandomize=True)
@given(problems(), st.integers(0, 2**32 - 1))
def test_kept_completion_figures_are_the_direct_ones_bitwise(problem, seed) -> None:
    """``RunRelaxation._least`` (figures kept per (start, free) and read per row) against
    ``_least_direct`` (every row in full), on both steps of caps, over calls that repeat and
    mix rows seen before with new ones, peaks below, between and above the caps; with the
    keys in an array and in a dict, and with nothing kept (``MINIMA_FIGURES`` 0): the same
    numbers, bit for bit."""
    import solvers.relaxed_bound as relaxed_bound

    n, m, resources, uses, floors, _least, _most, weights = problem
    _best, lowest = _brute_force(n, m, resources, uses, floors, 1, n)
    if math.isinf(lowest):
        return
    rng = np.random.default_rng(seed)
    saved = relaxed_bound.MINIMA_FIGURES, relaxed_bound.DENSE_KEYS
    for figures, dense in ((saved[0], saved[1]), (saved[0], 0), (0, saved[1])):
        relaxed_bound.MINIMA_FIGURES, relaxed_bound.DENSE_KEYS = figures, dense
        try:
            relaxation = RunRelaxation(
                n, m, tuple(resources.tolist()), uses, floors, weights, lowest, max_stages=n
            )
            if not len(relaxation.grid):
                return
            top = float(relaxation.grid[-2])
            for _call in range(6):
                rows = int(rng.integers(1, 40))
                starts = rng.integers(0, n + 1, rows)
                free = np.stack([rng.integers(0, r + 1, rows) for r in resources], axis=1)
                peaks = rng.choice(
                    [0.0, lowest * 0.5, lowest, top, top * 2, float(rng.random())], rows
                )
                peaks = peaks + rng.integers(0, 3, rows) * lowest * GRID_STEP
                for step in (1, relaxed_bound.COARSE_STEP):
                    kept = relaxation._least(starts, peaks, free, step)
                    direct = relaxation._least_direct(starts, peaks, free, step)
                    assert kept.tobytes() == direct.tobytes(), (kept, direct)
        finally:
            relaxed_bound.MINIMA_FIGURES, relaxed_bound.DENSE_KEYS = saved
