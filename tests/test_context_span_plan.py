"""A solved plan of one cp group across two GPU types (autoplan.solve.context_span_plan): its
split searched, valid, played by the simulator as predicted and refused by the exports; the mesh
executor runs the one ``autoplan solve`` chooses on a cluster where no node holds the sequence
(tests/test_context_span_family.py, also written by ``span_plan``) on gloo (float64) equal to one
process within 1e-10 in tests/test_context_parallel_runtime.py (``span_solved``)."""

from __future__ import annotations

import pytest

from autoplan.cluster.catalog import example_cluster_path, gpu_specs, load_cluster
from autoplan.cost.context_span import ContextMember, ContextSpan
from autoplan.cost.model import CostModel
from autoplan.errors import InfeasibleError, InputError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.plan.validate import plan_problems
from autoplan.price.configuration import price_configuration
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.runtime.trainer import select_executor
from autoplan.simulate import simulate_plan
from autoplan.solve.context_span import best_split, price_split
from autoplan.solve.context_span_plan import span_plan


@pytest.fixture(scope="module")
def profile() -> Profile:
    return profile_model("gpt-tiny", 16, 2, "fp64")


def _solved(profile: Profile) -> tuple[CostModel, Plan]:
    cluster = load_cluster(example_cluster_path("cpu-hetero"))
    model = CostModel(profile, cluster, gpu_specs(cluster))
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256="test",
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=cluster,
        global_batch_size=8,
        strategy="context-span",
    )
    return model, span_plan(model, inputs, ((0, 1), (1, 1)), 1, 4)


def test_the_solved_spanning_plan_is_valid_and_simulated_as_predicted(profile: Profile) -> None:
    model, plan = _solved(profile)
    (stage,) = plan.stages
    (replica,) = stage.replicas
    assert [plan.rank_map[r].gpu_type for r in replica.ranks] == ["cpu-fast", "cpu-slow"]
    tokens = replica.context_tokens
    assert tokens is not None and tokens[0] > tokens[1] and sum(tokens) == 16
    # The split is best_split's: no other split of these two ranks is faster.
    found = best_split(model, ((0, 1), (1, 1)), 1, 2, (0, len(profile.layers)), 1)
    assert found is not None and list(found.span.rank_tokens()) == tokens
    even = ContextSpan((ContextMember(0, 1, 8), ContextMember(1, 1, 8)), 1)
    priced = price_split(model, even, 2, (0, len(profile.layers)), 1)
    assert priced is not None and found.work_ms < priced.work_ms
    assert plan_problems(plan, profile) == []
    assert plan.runs_on_mesh() and select_executor(plan) == "mesh"
    assert simulate_plan(plan).iteration_time_ms == pytest.approx(
        plan.prediction.iteration_time_ms, rel=1e-9
    )
    # Four micro-batches of the group's forward + backward, the step and what DDP leaves.
    figures = plan.prediction
    assert figures.iteration_time_ms == pytest.approx(
        4 * found.work_ms + figures.breakdown.dp_comm_ms + figures.breakdown.optimizer_ms
    )
    assert {m.gpu_type for m in figures.memory} == {"cpu-fast", "cpu-slow"}
    kinds = layer_kinds(plan, profile)
    for target in ("megatron", "torchtitan"):
        with pytest.raises(NotExpressibleError, match="unevenly over its cp ranks"):
            export_plan(plan, target, kinds)


def test_what_cannot_be_placed_is_refused_in_one_line(profile: Profile) -> None:
    model, plan = _solved(profile)
    with pytest.raises(InfeasibleError, match="do not divide the global batch 8"):
        span_plan(model, plan.inputs, ((0, 1), (1, 1)), 1, 3)
    with pytest.raises(InfeasibleError, match="no cpu-fast node holds 4 GPUs"):
        span_plan(model, plan.inputs, ((0, 4), (1, 1)), 1, 4)


def test_pricing_again_refuses_uneven_chunks_rather_than_drop_them(profile: Profile) -> None:
    plan = _solved(profile)[1]
    with pytest.raises(InputError, match="does not price"):
        price_configuration(profile, None, plan=plan)
