"""Experts placed by speed in plans: the emitted replicas (expert group by expert group, each
replica's ``routed_experts``), the validator's rules, ``show``, ``autoplan cost`` reading the
plan back to the same figures, a version-3 plan read as version 4, and the exports refusing
in one line. moe-tiny (4 experts), profiled on fake tensors, on two made-up GPU types."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.config import PlanConfig, StageChoice
from autoplan.cost.model import CostModel
from autoplan.cost.offload import group_of
from autoplan.errors import InputError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.inputs import read_plan
from autoplan.plan.schema import PLAN_SCHEMA_VERSION, Plan, PlanInputs
from autoplan.plan.stage_spec import format_stage_specs, parse_stages, plan_stage_specs
from autoplan.plan.validate import plan_problems
from autoplan.price.configuration import PipelineKnobs, config_from_plan, config_from_specs
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable
from autoplan.solve.emit import emit_plan
from autoplan.view.plan_tables import stages_section
from tests.synthetic_profiles import gpu, make_cluster

FAST = gpu("Fast", 100.0, 80.0)
SLOW = gpu("Slow", 50.0, 80.0)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return profile_model("moe-tiny", 16, 2, "fp32")


def _model(profile: Profile) -> CostModel:
    cluster = make_cluster([("f", FAST, 2, 1), ("s", SLOW, 2, 1)])
    return CostModel(profile, cluster, gpu_specs(cluster))


def _config(profile: Profile, experts: tuple[int, ...] = (3, 1)) -> PlanConfig:
    """One stage: 2 Fast replicas of 2 samples and 2 Slow of 1, two expert groups of one
    of each, holding ``experts`` experts per rank by group."""
    groups = (group_of(0, 1, 2, 2, "none"), group_of(1, 1, 2, 1, "none"))
    stage = StageChoice(0, len(profile.layers), groups, 0, ep=2, experts=experts)
    # Expert groups run on the groups executor's per-stage groups.
    return PlanConfig(2, "1f1b", 1, (stage,), executor="groups")


def _plan(profile: Profile, experts: tuple[int, ...] = (3, 1)) -> Plan:
    model = _model(profile)
    config = _config(profile, experts)
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256="test",
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=model.cluster,
        global_batch_size=12,
        strategy="optimal",
    )
    return emit_plan(model, config, model.evaluate(config), inputs, [])


def test_replicas_go_expert_group_by_expert_group(profile: Profile) -> None:
    plan = _plan(profile)
    (stage,) = plan.stages
    assert [r.gpu_type for r in stage.replicas] == ["Fast", "Slow", "Fast", "Slow"]
    assert [r.routed_experts for r in stage.replicas] == [3, 1, 3, 1]
    assert [r.micro_batch_size for r in stage.replicas] == [2, 1, 2, 1]
    # Each rank's dp_index is its replica's place in that order.
    for index, replica in enumerate(stage.replicas):
        assert [plan.rank_map[rank].dp_index for rank in replica.ranks] == [index]
    assert plan.schema_version == PLAN_SCHEMA_VERSION >= 4
    assert plan_problems(plan, profile) == []


def test_cost_reads_the_plan_back_to_its_figures(profile: Profile) -> None:
    plan = _plan(profile)
    model = _model(profile)
    config = config_from_plan(model, plan)
    assert config.stages[0].experts == (3, 1)
    assert model.evaluate(config).iteration_ms == pytest.approx(
        model.evaluate(_config(profile)).iteration_ms
    )


@pytest.mark.parametrize(
    ("held", "message"),
    [
        ([3, 2, 3, 2], "routed_experts sum to 5; the model's MoE layers have 4"),
        ([3, 1, 1, 3], "holds [1, 3] experts; the first holds [3, 1]"),
        ([3, 1, 3, None], "some replicas list routed_experts and some do not"),
    ],
)
def test_the_validator_checks_the_experts_held(
    profile: Profile, held: list[int | None], message: str
) -> None:
    plan = _plan(profile)
    stage = plan.stages[0]
    replicas = [
        r.model_copy(update={"routed_experts": x})
        for r, x in zip(stage.replicas, held, strict=True)
    ]
    broken = plan.model_copy(update={"stages": [stage.model_copy(update={"replicas": replicas})]})
    assert any(message in problem for problem in plan_problems(broken, profile)), plan_problems(
        broken, profile
    )


def test_even_experts_may_not_mix_types_and_ep_1_places_none(profile: Profile) -> None:
    plan = _plan(profile)
    stage = plan.stages[0]
    even = [r.model_copy(update={"routed_experts": None}) for r in stage.replicas]
    broken = plan.model_copy(update={"stages": [stage.model_copy(update={"replicas": even})]})
    assert any("an expert group is one kind" in p for p in plan_problems(broken, profile))
    one = plan.model_copy(
        update={"stages": [stage.model_copy(update={"expert_parallel_degree": 1})]}
    )
    assert any("only a stage with ep > 1 places experts" in p for p in plan_problems(one))


def test_show_draws_what_each_rank_holds(profile: Profile) -> None:
    section = stages_section(_plan(profile))
    assert "no · ep 2 (3 Fast + 1 Slow)" in str(section.rows)


def test_a_version_3_plan_reads_as_the_current_version(profile: Profile, tmp_path: Path) -> None:
    data = json.loads(_plan(profile).model_dump_json())
    # A version-3 plan had no routed_experts: its expert groups were one kind (here: none).
    data["schema_version"] = 3
    data["stages"][0]["expert_parallel_degree"] = 1
    for replica in data["stages"][0]["replicas"]:
        del replica["routed_experts"]
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(data))
    plan = read_plan(path)
    assert plan.schema_version == PLAN_SCHEMA_VERSION
    assert all(r.routed_experts is None for r in plan.stages[0].replicas)


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_exports_refuse_experts_by_speed_in_one_line(profile: Profile, target: str) -> None:
    plan = _plan(profile)
    with pytest.raises(NotExpressibleError) as refused:
        export_plan(plan, target, layer_kinds(plan, profile))
    text = str(refused.value)
    assert "places experts by GPU speed (3 on Fast + 1 on Slow" in text and "\n" not in text


def test_run_takes_experts_by_speed(profile: Profile) -> None:
    """autoplan's runtime executes them (tests/test_uneven_experts_runtime.py)."""
    assert check_runnable(_plan(profile)) is None


def test_the_stage_notation_says_each_types_experts(profile: Profile) -> None:
    """``show``'s "as cost --stages" line writes each type's experts (``xN``) and parses back
    to the same configuration and figures; types that disagree on saying theirs are one
    line."""
    plan = _plan(profile)
    text = format_stage_specs(plan_stage_specs(plan))
    assert text == "Fast*2(mb2,x3)+Slow*2(mb1,x1):L0-5:tp1:ep2"
    model = _model(profile)
    config = config_from_specs(model, parse_stages(text), PipelineKnobs(num_micro_batches=2))
    assert config.stages[0].experts == (3, 1)
    assert model.evaluate(config).iteration_ms == pytest.approx(
        model.evaluate(_config(profile)).iteration_ms
    )
    with pytest.raises(InputError, match="some types say their experts"):
        config_from_specs(
            model,
            parse_stages("Fast*2(mb2,x3)+Slow*2(mb1):L0-5:tp1:ep2"),
            PipelineKnobs(num_micro_batches=2),
        )
    with pytest.raises(InputError, match="must give every one of"):
        config_from_specs(
            model,
            parse_stages("Fast*2(mb2,x3)+Slow*1(mb2,x1):L0-5:tp1:ep2"),
            PipelineKnobs(num_micro_batches=2),
        )
