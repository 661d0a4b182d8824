"""``CostModel.totals`` (the whole-model sums the shared-stage family reads) equals the last
entries of ``CostModel.tables`` to the bit, in every mode, on random instances, on their
sequence-parallel, context-parallel and expert-parallel views, and at sub-block grain (where
the totals are read from the tables); and the share search's sizes are unchanged by it. So
does ``CostModel.work_prefix`` (the stage floors' work prefix sums) equal the tables' whole
``work`` lists."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from autoplan.cost.model import CostModel
from autoplan.cost.offload import ALL_MODES
from autoplan.solve import SolveOptions, cost_model
from autoplan.solve.space import tp_choices
from tests.test_expert_parallel_cost import memory_bound_moe_instance
from tests.test_solver_oracle import instances
from tests.test_sub_block_solve import clusters, sub_block_profiles

OPTIONS = SolveOptions()


def _assert_totals_are_the_tables(model: CostModel) -> int:
    """Every (class, tp, micro-batch size 1-3) of ``model``: totals and work prefixes first
    (before the tables exist, so computed from the layer costs), then the tables; the count
    compared."""
    compared = 0
    for k, _ in enumerate(model.classes):
        for tp in tp_choices(model, OPTIONS):
            for b in (1, 2, 3):
                prefixes = {mode: model.work_prefix(k, tp, b, mode) for mode in ALL_MODES}
                totals = model.totals(k, tp, b)
                tables = model.tables(k, tp, b)
                for mode in ALL_MODES:
                    assert prefixes[mode] == tables.work[mode], (k, tp, b, mode)
                assert totals.params == tables.params[-1]
                for mode in ALL_MODES:
                    assert totals.work(mode) == tables.work[mode][-1], (k, tp, b, mode)
                    assert totals.backward(mode) == tables.backward[mode][-1], (k, tp, b, mode)
                    assert totals.saved(mode) == tables.saved[mode][-1], (k, tp, b, mode)
                    assert totals.parked(mode) == tables.parked[mode][-1], (k, tp, b, mode)
                # The distinct layers: the same largest transient as over every layer.
                for mode in ALL_MODES:
                    assert max(model.transient_bytes(c, mode) for c in totals.layers) == max(
                        model.transient_bytes(c, mode) for c in tables.layers
                    )
                compared += 1
    return compared


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(instances())
def test_totals_equal_the_tables_last_entries(instance) -> None:
    profile, cluster, _batch = instance
    model = cost_model(profile, cluster, OPTIONS)
    assert _assert_totals_are_the_tables(model) > 0
    # A view's totals are its own (SP changes the tp > 1 figures; cp the sequence's share).
    assert _assert_totals_are_the_tables(model.with_sequence_parallel(True)) > 0
    narrow = model.with_context_parallel(2)
    if any(c.total_gpus for c in narrow.classes):
        _assert_totals_are_the_tables(narrow)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(sub_block_profiles(), clusters())
def test_totals_at_sub_block_grain_are_the_tables(profile, cluster) -> None:
    model = cost_model(profile, cluster, OPTIONS)
    assert _assert_totals_are_the_tables(model) > 0


def test_totals_of_an_expert_parallel_view_are_its_tables() -> None:
    profile, cluster = memory_bound_moe_instance()
    model = cost_model(profile, cluster, OPTIONS)
    for ep in (1, 2, 4):
        assert _assert_totals_are_the_tables(model.with_expert_parallel(ep)) > 0
