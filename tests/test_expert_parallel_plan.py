"""Plans with expert parallelism: the solve writes ep per stage, the validator checks it,
``show`` draws it, and the exports map it (Megatron-LM's --expert-model-parallel-size) or
refuse it in one line (torchtitan, DeepSpeed). The plan is a real solve of moe-tiny, profiled
on fake tensors, on the shipped cpu-local cluster."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.errors import InputError, PlanInvalidError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.plan.validate import validate_plan
from autoplan.profile.profiler import profile_model
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable
from tests.test_export import _sourced_argv

runner = CliRunner()


@pytest.fixture(scope="module")
def solved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Profile, Path]:
    folder = tmp_path_factory.mktemp("ep")
    profile = profile_model("moe-tiny", 16, 2, "fp32")
    write_json_model(folder / "profile.json", profile)
    plan_path = folder / "plan.json"
    result = runner.invoke(
        app,
        [
            *("solve", str(folder / "profile.json"), "--cluster", "cpu-local"),
            *("--global-batch", "8", "--pp", "1", "--ep", "2", "-o", str(plan_path)),
        ],
    )
    assert result.exit_code == 0, result.output
    return read_json_model(plan_path, Plan), profile, plan_path


def test_profile_records_the_routed_experts(solved) -> None:
    _, profile, _ = solved
    moe = [layer for layer in profile.layers if layer.experts is not None]
    assert [layer.name for layer in moe] == ["layers.block_1", "layers.block_2", "layers.block_3"]
    experts = moe[0].experts
    # 2 samples × 16 tokens, top 2 of 4, factor 2: ceil(2 · 32 · 2 / 4) = 32 slots an expert.
    assert (experts.num_experts, experts.top_k, experts.capacity_tokens) == (4, 2, 32)
    assert experts.expert_param_count == 4 * 3 * 32 * 48
    assert experts.expert_forward_flops == 32 * 2 * 3 * 32 * 48
    assert experts.dispatch_bytes == 4 * 32 * 32 * 4  # experts × slots × hidden × fp32


def test_the_solve_writes_ep_and_the_plan_is_valid(solved) -> None:
    plan, profile, plan_path = solved
    assert [stage.expert_parallel_degree for stage in plan.stages] == [2]
    assert plan.inputs.pinned["expert_parallel"] == "2"
    validate_plan(plan, profile)
    result = runner.invoke(app, ["show", str(plan_path)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "expert parallelism ep 2 on 1 stage" in result.output
    # ZeRO-1 over the two replicas of each expert index.
    assert [stage.zero_stage for stage in plan.stages] == [1]
    assert "1 · ep 2" in result.output
    simulated = runner.invoke(app, ["simulate", str(plan_path)], env={"COLUMNS": "200"})
    assert simulated.exit_code == 0, simulated.output
    assert "cpu tp1 ep2, 2 samples" in simulated.output


@pytest.mark.parametrize(
    ("update", "message"),
    [
        ({"expert_parallel_degree": 3}, "stage 0 (ep 3): ep must divide its 4 replicas"),
        ({"zero_stage": 2}, "has ZeRO-2; ep composes with ZeRO 0 or 1"),
    ],
)
def test_the_validator_refuses_what_ep_cannot_run(solved, update: dict, message: str) -> None:
    plan, profile, _ = solved
    broken = plan.model_copy(update={"stages": [plan.stages[0].model_copy(update=update)]})
    with pytest.raises(PlanInvalidError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate_plan(broken, profile)


def test_the_validator_checks_ep_against_the_experts(solved) -> None:
    plan, profile, _ = solved
    # The same plan read against a profile whose MoE layers have 3 experts, and a dense one.
    three = profile.model_copy(
        update={
            "layers": [
                layer.model_copy(
                    update={"experts": layer.experts.model_copy(update={"num_experts": 3})}
                )
                if layer.experts
                else layer
                for layer in profile.layers
            ]
        }
    )
    assert validate_plan(plan, profile) is None
    with pytest.raises(PlanInvalidError, match="ep must divide the 3 experts of its MoE layers"):
        validate_plan(plan, three)
    dense = profile.model_copy(
        update={"layers": [layer.model_copy(update={"experts": None}) for layer in profile.layers]}
    )
    with pytest.raises(PlanInvalidError, match="the model has no mixture-of-experts layers"):
        validate_plan(plan, dense)


def test_megatron_gets_the_expert_model_parallel_size(solved, tmp_path: Path) -> None:
    plan, profile, _ = solved
    result = export_plan(plan, "megatron", layer_kinds(plan, profile))
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--expert-model-parallel-size", type=int)
    known, _ = parser.parse_known_args(_sourced_argv(result.text, tmp_path))
    assert known.expert_model_parallel_size == 2


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("torchtitan", "torchtitan's expert_parallel_degree must divide data_parallel_shard"),
        ("deepspeed", "DeepSpeed sets expert parallelism in the model's MoE layers"),
    ],
)
def test_targets_without_replicated_expert_groups_refuse_in_one_line(
    solved, target: str, message: str
) -> None:
    plan, profile, _ = solved
    with pytest.raises(NotExpressibleError) as refused:
        export_plan(plan, target, layer_kinds(plan, profile))
    assert message in str(refused.value) and "\n" not in str(refused.value)


def test_sequence_parallelism_is_refused_on_experts(solved, tmp_path: Path) -> None:
    """The runtime's router does not take a sequence-sharded stream: the search leaves SP
    off, a pinned --sp is one line, the validator and the runtime refuse an SP plan."""
    plan, profile, _ = solved
    sp = plan.model_copy(
        update={"parallelism": plan.parallelism.model_copy(update={"sequence_parallel": True})}
    )
    with pytest.raises(PlanInvalidError, match="the model has mixture-of-experts layers"):
        validate_plan(sp, profile)
    with pytest.raises(InputError, match="solve with --no-sp"):
        check_runnable(sp)
    # A stage's own flag likewise (SP on that stage alone).
    stages = [plan.stages[0].model_copy(update={"sequence_parallel": True}), *plan.stages[1:]]
    own = plan.model_copy(update={"stages": stages})
    with pytest.raises(PlanInvalidError, match=r"is on \(stage 0\), but the model has mixture-of"):
        validate_plan(own, profile)
    with pytest.raises(InputError, match="solve with --no-sp"):
        check_runnable(own)
    write_json_model(tmp_path / "profile.json", profile)
    result = runner.invoke(
        app,
        [
            *("solve", str(tmp_path / "profile.json"), "--cluster", "cpu-local"),
            *("--global-batch", "8", "--tp", "2", "--sp", "-o", str(tmp_path / "plan.json")),
        ],
    )
    assert result.exit_code == 2
    assert "sequence parallelism is not run on mixture-of-experts models" in result.output


def test_a_pinned_ep_counts_in_the_gpus_asked(solved, tmp_path: Path) -> None:
    _, profile, _ = solved
    write_json_model(tmp_path / "profile.json", profile)
    result = runner.invoke(
        app,
        [
            *("solve", str(tmp_path / "profile.json"), "--cluster", "cpu-local"),
            *("--global-batch", "8", "--pp", "2", "--ep", "4", "-o", str(tmp_path / "p.json")),
        ],
    )
    assert result.exit_code == 2
    assert "pp × dp × tp = 8 GPUs asked (dp at least ep 4); the cluster has 4" in result.output
