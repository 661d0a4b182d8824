"""Plans are priced for the executor of autoplan's runtime that runs them
(``PlanConfig.executor``, ``Parallelism.executor``): the mesh executor's DDP all-reduces the
gradients during the last backward, the groups executor sums them after it
(``autoplan.runtime.grad_sync``), so a heterogeneous plan pays its all-reduce whole. The
search prices each family's plans so, the plan records it, ``run`` runs the plan where it was
priced, ``simulate`` plays it so, and the validator refuses a mesh price the mesh cannot run.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.offload import group_of
from autoplan.plan.validate import plan_problems
from autoplan.runtime.trainer import select_executor
from autoplan.simulate.engine import simulate_plan
from autoplan.solve import SolveOptions, cost_model, solve
from autoplan.view.plan_tables import engine_text
from tests.synthetic_profiles import gpu, layer, make_cluster, make_profile

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
OPTIONS = SolveOptions(top_k=1, zero_bubble=False, sequence_parallel=False, zero_stage=0)


def _two_types(params: int = 40 * 10**6):
    """Two layers; two GPUs of type A and one of B, one per node, over a slow link (with the
    default ``params`` the all-reduce is longer than a backward)."""
    profile = make_profile(
        [layer(i, flops=2 * 10**11, params=params, saved=10**7, output=10**6) for i in (0, 1)]
    )
    cluster = make_cluster(
        [
            ("a", gpu("A", tflops=25.0, memory_gib=8.0), 1, 2),
            ("b", gpu("B", tflops=10.0, memory_gib=8.0), 1, 1),
        ],
        intra_gb_per_s=100.0,
        inter_gb_per_s=0.5,
    )
    return profile, cluster


def test_the_groups_executor_pays_the_whole_allreduce_by_hand() -> None:
    profile, cluster = _two_types()
    model = cost_model(profile, cluster, OPTIONS)
    assert model.exposed_allreduce_ms(30.0, 12.0, "mesh") == 18.0
    assert model.exposed_allreduce_ms(30.0, 12.0, "groups") == 30.0
    # One stage of the two A GPUs, ZeRO 0: the same layout on either executor.
    stage = StageChoice(0, 2, (group_of(0, 1, 2, 1, "none"),), 0)
    mesh = model.evaluate(PlanConfig(2, "1f1b", 1, (stage,)))
    groups = model.evaluate(PlanConfig(2, "1f1b", 1, (stage,), executor="groups"))
    allreduce = mesh.rank_allreduce_ms[0]
    backward = mesh.stages[0].groups[0].backward_ms
    assert allreduce > backward > 0
    assert math.isclose(groups.iteration_ms - mesh.iteration_ms, backward, rel_tol=1e-9)


def test_a_heterogeneous_plan_records_the_groups_executor_and_pays_for_it() -> None:
    # A node of two A GPUs and one B: the best plan is one stage of an A replica at tp 2
    # taking 7 samples beside a B replica at tp 1 taking 1 (the heterogeneous family's): no
    # one mesh holds replicas of two tp degrees.
    profile = make_profile(
        [layer(i, flops=2 * 10**11, params=4 * 10**6, saved=10**7, output=10**6) for i in (0, 1)]
    )
    cluster = make_cluster(
        [
            ("a", gpu("A", tflops=25.0, memory_gib=8.0), 2, 1),
            ("b", gpu("B", tflops=10.0, memory_gib=8.0), 1, 1),
        ],
        intra_gb_per_s=100.0,
        inter_gb_per_s=0.5,
    )
    plan = solve(profile, cluster, 8, OPTIONS)
    replicas = plan.stages[0].replicas
    assert [(r.gpu_type, r.tensor_parallel_degree, r.micro_batch_size) for r in replicas] == [
        ("A", 2, 7),
        ("B", 1, 1),
    ]
    assert plan.parallelism.executor == "groups" and not plan.runs_on_mesh()
    assert plan_problems(plan, profile) == []
    # Its prediction is the groups executor's: priced for the mesh it would be faster by what
    # the mesh hides, and simulate plays the sums after the last backward.
    model = cost_model(profile, cluster, OPTIONS)
    from autoplan.price.configuration import config_from_plan

    config = config_from_plan(model, plan)
    assert config.executor == "groups"
    priced = model.evaluate(config).iteration_ms
    assert math.isclose(priced, plan.prediction.iteration_time_ms, rel_tol=1e-6)
    hidden = model.evaluate(dataclasses.replace(config, executor="mesh")).iteration_ms
    assert hidden < priced
    played = simulate_plan(plan).iteration_time_ms
    assert math.isclose(played, plan.prediction.iteration_time_ms, rel_tol=1e-9)
    assert "groups executor" in engine_text(plan.inputs.engine, plan.parallelism.executor)
    # The runtime runs it where it was priced.
    assert select_executor(plan) == "groups"


def test_a_uniform_plan_is_priced_for_the_mesh_and_runs_there() -> None:
    profile, cluster = _two_types()
    plan = solve(profile, cluster, 4, OPTIONS.model_copy(update={"space": "uniform"}))
    assert plan.runs_on_mesh() and plan.parallelism.executor == "mesh"
    assert select_executor(plan) == "mesh"
    assert plan_problems(plan, profile) == []


def test_a_mesh_price_the_mesh_cannot_run_is_priced_again_and_refused_when_edited() -> None:
    from autoplan.api import price

    # Stages of different replicas (two cpu-fast, then one cpu-slow): no one mesh holds them.
    # Stage specs are priced for the mesh first; the plan comes out priced for the groups
    # executor, as the runtime runs it.
    priced = price(
        PROFILES / "gpt2-small.profile.json",
        "cpu-hetero",
        stages="cpu-fast*2:L0-6:tp1:mb1 | cpu-slow*1:L7-13:tp1:mb2",
        global_batch=8,
    )
    plan = priced.plan
    assert plan.parallelism.executor == "groups" and not plan.runs_on_mesh()
    assert select_executor(plan) == "groups"
    edited = plan.model_copy(
        update={"parallelism": plan.parallelism.model_copy(update={"executor": "mesh"})}
    )
    assert any("priced for the mesh executor" in p for p in plan_problems(edited))
