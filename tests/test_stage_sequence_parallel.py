"""Sequence parallelism per stage in the cost model (``StageChoice.sequence_parallel``): a
stage that runs it is costed as in a plan where every stage does, the others as without it,
and ``canonical_sequence_parallel`` says one plan one way."""

from __future__ import annotations

import dataclasses

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.config import (
    PlanConfig,
    ReplicaGroup,
    StageChoice,
    canonical_sequence_parallel,
)
from autoplan.cost.model import CostModel
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile


@pytest.fixture(scope="module")
def model() -> CostModel:
    profile = transformer_profile(6, 1024, 1024, vocab=8192, heads=16)
    cluster = make_cluster([("n", gpu("G", 100.0, 40.0), 4, 2)])
    return CostModel(profile, cluster, gpu_specs(cluster))


def _stages(tp_second: int = 2) -> tuple[StageChoice, StageChoice]:
    first = StageChoice(0, 4, (ReplicaGroup(0, 2, 2, 1, "none"),))
    second = StageChoice(4, 8, (ReplicaGroup(0, tp_second, 4 // tp_second, 1, "none"),))
    return first, second


def test_a_stage_alone_is_costed_as_with_sequence_parallelism_everywhere(
    model: CostModel,
) -> None:
    first, second = _stages()
    off = model.evaluate(PlanConfig(8, "1f1b", 1, (first, second)))
    on = model.evaluate(PlanConfig(8, "1f1b", 1, (first, second), sequence_parallel=True))
    mixed = model.evaluate(
        PlanConfig(8, "1f1b", 1, (dataclasses.replace(first, sequence_parallel=True), second))
    )
    # The flag changes the first stage's figures (else this test proves nothing) ...
    assert on.stages[0].groups != off.stages[0].groups
    assert on.memory[0].activations_bytes < off.memory[0].activations_bytes
    # ... and the mixed plan takes each stage's figures from the plan of its own setting.
    assert mixed.stages[0].groups == on.stages[0].groups
    assert mixed.stages[1].groups == off.stages[1].groups
    assert mixed.memory[0] == on.memory[0]
    assert mixed.memory[1] == off.memory[1]
    # The same figures from the view of the model with SP on (the search's) and the flag.
    view = model.with_sequence_parallel(True)
    assert view.evaluate(PlanConfig(8, "1f1b", 1, (first, second))) == on


def test_canonical_form_says_one_plan_one_way() -> None:
    first, second = _stages()
    sp = dataclasses.replace
    both = canonical_sequence_parallel(
        PlanConfig(
            8, "1f1b", 1, (sp(first, sequence_parallel=True), sp(second, sequence_parallel=True))
        )
    )
    assert both == PlanConfig(8, "1f1b", 1, (first, second), sequence_parallel=True)
    one = PlanConfig(8, "1f1b", 1, (sp(first, sequence_parallel=True), second))
    assert canonical_sequence_parallel(one) == one
    # A stage without tp runs the same either way: its flag is dropped, and the plan's
    # setting is then every stage's where the others with tp have it.
    plain_second = _stages(tp_second=1)[1]
    assert canonical_sequence_parallel(
        PlanConfig(
            8,
            "1f1b",
            1,
            (sp(first, sequence_parallel=True), sp(plain_second, sequence_parallel=True)),
        )
    ) == PlanConfig(8, "1f1b", 1, (first, plain_second), sequence_parallel=True)
    # Nothing with tp: no sequence parallelism at all.
    lone = StageChoice(0, 8, (ReplicaGroup(0, 1, 4, 1, "none"),))
    assert canonical_sequence_parallel(
        PlanConfig(8, "1f1b", 1, (lone,), sequence_parallel=True)
    ) == PlanConfig(8, "1f1b", 1, (lone,))
