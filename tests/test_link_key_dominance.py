"""Dominance across link keys in the heterogeneous DP (``solvers.pipeline_dp._insert``,
``HeteroSource.key_covers``): its premise against the cost model, and that it keeps the
optimum while it drops labels. The DP against brute force is tests/test_solver_oracle.py."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

from autoplan.cluster.catalog import example_cluster_path, load_cluster
from autoplan.cost.offload import group_of
from autoplan.profile.schema import Profile
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.hetero import HeteroSource
from autoplan.solve.space import class_tp_choices
from solvers.pipeline_dp import best_pipelines

OPTIONS = SolveOptions(top_k=1, zero_bubble=False, sequence_parallel=False)
PROFILE = Profile.model_validate_json(
    (Path(__file__).parent.parent / "profiles" / "gpt2-small.profile.json").read_text()
)


class _KeysApart(HeteroSource):
    """The same source with dominance only within one link key (as before)."""

    def key_covers(self, low, high) -> bool:
        return False


def test_a_covering_key_never_pays_more_for_any_sender() -> None:
    """``key_covers(low, high)`` promises that every stage in front pays no more for its
    boundary to ``low`` than to ``high``: checked for every pair of stage sides the space
    makes on a three-type cluster, every sender, at two activation sizes."""
    model = cost_model(PROFILE, load_cluster(example_cluster_path("h100-a100-l4")), OPTIONS)
    source = HeteroSource(model, 64, 4, "1f1b", OPTIONS)
    sides = set()
    for c in model.classes:
        for t in class_tp_choices(model, c.index, OPTIONS):
            for replicas in (1, 2, 3, 8):
                for share in (1, 2, 5, 16):
                    sides.add(model.link_side((group_of(c.index, t, replicas, share, "none"),)))
    sides = sorted(sides, key=repr)
    covered = 0
    for low, high in itertools.permutations(sides, 2):
        if not source.key_covers(low, high):
            continue
        covered += 1
        for sender in sides:
            for size in (1e5, 5e7):
                assert model.boundary_ms(sender, low, size) <= model.boundary_ms(
                    sender, high, size
                ), (sender, low, high)
    assert covered > 0


def test_dominance_across_keys_keeps_the_optimum_with_fewer_labels() -> None:
    model = cost_model(PROFILE, load_cluster(example_cluster_path("a100-v100")), OPTIONS)
    resources = tuple(c.total_gpus for c in model.classes)
    fewer = False
    for m in (4, 8):
        across = HeteroSource(model, 64, m, "1f1b", OPTIONS)
        apart = _KeysApart(model, 64, m, "1f1b", OPTIONS)
        best, stats = best_pipelines(model.num_layers, m, resources, across, max_stages=m)
        reference, reference_stats = best_pipelines(
            model.num_layers, m, resources, apart, max_stages=m
        )
        assert best and reference
        assert math.isclose(best[0].objective(m), reference[0].objective(m), rel_tol=1e-12)
        assert stats.labels <= reference_stats.labels
        fewer = fewer or stats.labels < reference_stats.labels
    assert fewer
