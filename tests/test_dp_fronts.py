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
from solvers.pipeline_dp import PipelineLabel, _dominates, _Front, _Keys

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
