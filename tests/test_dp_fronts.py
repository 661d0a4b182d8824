"""The heterogeneous DP's vectorised parts against their plain definitions: the labels kept at
a position (``solvers.pipeline_dp._Front``) against the pairwise dominance rule
(``_dominates``), and the stage floors (``HeteroSource.floor_table``) never above a stage's
cost. The DP against brute force is tests/test_solver_oracle.py."""

from __future__ import annotations

import random
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.hetero import HeteroSource
from solvers.pipeline_dp import PipelineLabel, _dominates, _Front, _Keys, best_pipelines

OPTIONS = SolveOptions(top_k=1, zero_bubble=False, sequence_parallel=False)
PROFILE = Profile.model_validate_json(
    (Path(__file__).parent.parent / "profiles" / "gpt2-small.profile.json").read_text()
)


def _reference_insert(kept: list[PipelineLabel], new: PipelineLabel, m: int, covers) -> bool:
    """The rule as pairs: keep new unless a label of its key or a covering key dominates it,
    then drop the labels of its key or a key it covers that it dominates."""
    for old in kept:
        if (old.key == new.key or covers(old.key, new.key)) and _dominates(old, new, m):
            return False
    kept[:] = [
        old
        for old in kept
        if not ((new.key == old.key or covers(new.key, old.key)) and _dominates(new, old, m))
    ]
    kept.append(new)
    return True


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(1, 16))
def test_front_keeps_what_the_pairwise_rule_keeps(seed: int, m: int) -> None:
    """Random labels (few distinct values, so that ties and exact dominance happen) inserted
    one by one: the same labels kept, in the same order, as the rule applied pair by pair."""
    rng = random.Random(seed)

    def covers(low, high) -> bool:  # a partial order on keys: (a, b) covers (c, d) if <=
        return low[0] <= high[0] and low[1] <= high[1]

    front = _Front(2, _Keys(covers))
    kept: list[PipelineLabel] = []
    for order in range(60):
        values = [rng.choice([0.0, 1.0, 2.0, 2.5, 4.0]) for _ in range(4)]
        label = PipelineLabel(
            values[0],
            values[0] + values[1] * 3,
            values[2],
            rng.randint(1, 3),
            (rng.randint(0, 2), rng.randint(0, 2)),
            (rng.randint(0, 1), rng.randint(0, 1)),
            0,
            None,
            None,
            order,
            values[3],
        )
        assert front.insert(label, m) == _reference_insert(kept, label, m, covers)
        mine = [x.order for labels in front.by_key().values() for x in labels]
        assert sorted(mine) == sorted(x.order for x in kept)
    for key, labels in front.by_key().items():
        assert [x.order for x in labels] == [x.order for x in kept if x.key == key]


def test_stage_floors_never_exceed_a_stage_cost() -> None:
    """Every (option, start, end) the source can cost, at every position and for the first
    and a later stage: its floor is at most its steady time (two kinds included, with whole
    shares)."""
    model = cost_model(PROFILE, load_cluster(example_cluster_path("h100-a100-l4")), OPTIONS)
    checked = two_kinds = 0
    for batch, m in ((64, 4), (48, 16), (32, 32)):
        source = HeteroSource(model, batch, m, "1f1b", OPTIONS)
        for j in range(1, model.num_layers + 1):
            floors = source.floor_table(j)
            for option, allocation in enumerate(source.allocations):
                for i in range(j):
                    for position in (1, 3):
                        found = source.cost(option, i, j, position, None)
                        if found is None:
                            continue
                        assert floors[option, i] <= found.steady_ms * (1 + 1e-12), (
                            allocation,
                            i,
                            j,
                        )
                        checked += 1
                        two_kinds += len(allocation) == 2
    assert checked > 1000 and two_kinds > 100


def test_send_floors_never_exceed_a_boundary_transfer() -> None:
    """For every next stage's side the space makes and every (option, start, end): the floor
    plus both ways of the least transfer is at most the stage's steady time, and the least
    transfer at most what the stage adds to the next (``HeteroSource.send_floor``)."""
    model = cost_model(PROFILE, load_cluster(example_cluster_path("h100-a100-l4")), OPTIONS)
    source = HeteroSource(model, 48, 16, "1f1b", OPTIONS)
    receivers = set()
    for option in range(len(source.allocations)):
        found = source.cost(option, 5, 9, 1, None)
        if found is not None:
            receivers.add(found.key)
    checked = 0
    for receiver in sorted(receivers, key=repr):
        for j in (3, 8, model.num_layers - 1):
            floors = source.floor_table(j)
            sends = source.send_floor(j, receiver)
            for option in range(len(source.allocations)):
                for i in range(0, j, 2):
                    found = source.cost(option, i, j, 2, receiver)
                    if found is None:
                        continue
                    assert floors[option, i] + 2 * sends[option] <= found.steady_ms * (1 + 1e-12)
                    assert 2 * sends[option] <= found.next_added_ms * (1 + 1e-12)
                    checked += 1
    assert checked > 500 and len(receivers) > 3


def test_a_run_cut_off_reports_a_floor_below_its_optimum(monkeypatch) -> None:
    """The DP stopped by its deadline at many points (a clock that ticks per look): the floor
    it reports, from the labels it left open, is never above the run's optimum, and it is
    above the root bound once the search is far enough along."""
    import functools
    import itertools

    import solvers.pipeline_dp as pipeline_dp
    from autoplan.solve.hetero import _root_bound

    model = cost_model(PROFILE, load_cluster(example_cluster_path("a100-v100")), OPTIONS)
    resources = tuple(c.total_gpus for c in model.classes)
    m = 4
    source = HeteroSource(model, 64, m, "1f1b", OPTIONS)
    exact, done = pipeline_dp.best_pipelines(model.num_layers, m, resources, source, max_stages=m)
    optimum = exact[0].objective(m)
    assert done.floor_ms == optimum  # run to its end: nothing it did not return is below
    root = _root_bound(model, 64, OPTIONS, (m, "1f1b", m, 1), {0: source}, 0, HeteroSource)
    above_root = 0
    for ticks in (1, 5, 20, 80, 200, 600):
        ticking = functools.partial(next, itertools.count())
        monkeypatch.setattr(pipeline_dp.time, "monotonic", ticking)
        _finals, stats = pipeline_dp.best_pipelines(
            model.num_layers, m, resources, source, max_stages=m, deadline=float(ticks)
        )
        monkeypatch.undo()
        if not stats.timed_out:
            continue
        assert stats.floor_ms <= optimum * (1 + 1e-12), ticks
        above_root += stats.floor_ms > root
    assert above_root >= 1


def test_fill_ratio_bounds_the_stages_in_front_of_every_label() -> None:
    """On the best pipelines of several runs (shares down to one sample): in front of each
    stage boundary, the prefix bound times the fill ratio is at most the sum of the steady
    times of the stages there, and the root bound at most the pipeline's F."""
    import numpy as np

    from autoplan.solve.hetero import _root_bound

    model = cost_model(PROFILE, load_cluster(example_cluster_path("a100-v100")), OPTIONS)
    resources = np.array([c.total_gpus for c in model.classes], dtype=np.int64)
    checked = above_one = 0
    for batch, m in ((8, 8), (16, 16), (64, 4)):
        source = HeteroSource(model, batch, m, "1f1b", OPTIONS)
        uses = np.array(source.options(), dtype=np.int64)
        root = _root_bound(model, batch, OPTIONS, (m, "1f1b", m, 1), {}, 0, HeteroSource)
        finals, _ = best_pipelines(
            model.num_layers, m, tuple(resources.tolist()), source, max_stages=min(m, 6), keep=4
        )
        for final in finals:
            assert root <= final.objective(m) * (1 + 1e-12)
            stages = final.chain()  # first stage first
            for cut in range(1, len(stages)):
                label = stages[cut]  # covers [label.start, L); stages[:cut] are in front
                free = resources - np.array(label.used, dtype=np.int64)
                prefix = source.prefix_table(free[None, :])[0, label.start]
                ratio = source.fill_ratio(free[None, :], np.all(uses <= free, axis=1))[0]
                in_front = [x.first_stage for x in stages[:cut]]
                assert prefix * ratio <= sum(in_front) * (1 + 1e-12)
                checked += 1
                above_one += ratio > 1
    assert checked >= 20 and above_one >= 5
