"""Sequence parallelism per stage in plans (``Stage.sequence_parallel``, schema 6): emitted from
a configuration with a per-stage flag in one canonical form, read back by ``autoplan cost``
and ``validate`` with the same prediction, a version-5 plan read unchanged, and written as a
stage's ``:sp`` in the ``--stages`` notation (show's line, runner-ups, ``cost --stages``),
checked per stage by the validator, said by ``show`` and refused by the exports, whose targets
set SP for the whole job."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.files import read_json_model
from autoplan.inputs import read_plan
from autoplan.plan.schema import PLAN_SCHEMA_VERSION, Plan, PlanInputs
from autoplan.plan.stage_spec import format_stage_specs, parse_stages
from autoplan.plan.validate import plan_problems
from autoplan.price.configuration import config_from_plan
from autoplan.profile.schema import Profile
from autoplan.solve.emit import alternative_records, emit_plan
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

ROOT = Path(__file__).resolve().parents[1]
PROFILE = ROOT / "profiles" / "gpt2-small.profile.json"
A = gpu("A", 100.0, 80.0)
runner = CliRunner()


@pytest.fixture(scope="module")
def profile() -> Profile:
    return read_json_model(PROFILE, Profile)


@pytest.fixture(scope="module")
def model(profile: Profile) -> CostModel:
    cluster = make_cluster([("a", A, 4, 1)])
    return CostModel(profile, cluster, gpu_specs(cluster))


def mixed_config(
    first: bool = True, second: bool = False, second_tp: int = 2, whole: bool = False
) -> PlanConfig:
    """gpt2-small's 14 layers on two stages of one replica: tp 2, then ``second_tp``; the
    stages' own SP flags ``first`` and ``second``, the plan's ``whole``."""
    one = (ReplicaGroup(0, 2, 1, 2, "none"),)
    two = (ReplicaGroup(0, second_tp, 1, 2, "none"),)
    return PlanConfig(
        4,
        "1f1b",
        1,
        (
            StageChoice(0, 7, one, sequence_parallel=first),
            StageChoice(7, 14, two, sequence_parallel=second),
        ),
        sequence_parallel=whole,
    )


def emitted(model: CostModel, config: PlanConfig) -> Plan:
    """``config`` emitted as solve emits its plans."""
    inputs = PlanInputs(
        model=model.profile.model,
        profile_sha256="test",
        seq_len=model.profile.seq_len,
        dtype=model.profile.dtype,
        cluster=model.cluster,
        global_batch_size=config.samples_per_iteration,
        strategy="optimal",
    )
    return emit_plan(model, config, model.evaluate(config), inputs, [])


def test_a_stage_flag_is_emitted_and_priced_as_its_own(model: CostModel) -> None:
    plan = emitted(model, mixed_config())
    assert plan.schema_version == PLAN_SCHEMA_VERSION == 6
    assert not plan.parallelism.sequence_parallel
    assert [s.sequence_parallel for s in plan.stages] == [True, False]
    off = emitted(model, mixed_config(first=False))
    on = emitted(model, mixed_config(first=False, whole=True))
    # Stage 0 as in the plan where every stage runs SP, stage 1 as in the one where none does
    # (and the two differ, else this proves nothing).
    timings = plan.prediction.stage_timings
    assert timings[0] == on.prediction.stage_timings[0] != off.prediction.stage_timings[0]
    assert timings[1] == off.prediction.stage_timings[1] != on.prediction.stage_timings[1]
    assert plan.prediction.iteration_time_ms not in (
        off.prediction.iteration_time_ms,
        on.prediction.iteration_time_ms,
    )
    # Read back, the configuration is the one emitted.
    assert config_from_plan(model, plan) == mixed_config()


def test_the_plan_says_it_one_way(model: CostModel) -> None:
    # Every stage with tp flagged: plan-wide, no stage flag.
    both = emitted(model, mixed_config(second=True))
    assert both.parallelism.sequence_parallel
    assert not any(s.sequence_parallel for s in both.stages)
    assert both == emitted(model, mixed_config(first=False, whole=True))
    # A stage without tp runs the same either way: its flag is dropped, and then the plan's
    # only stage with tp running SP makes it plan-wide.
    lone = emitted(model, mixed_config(second=True, second_tp=1))
    assert lone.parallelism.sequence_parallel
    assert not any(s.sequence_parallel for s in lone.stages)
    assert plan_problems(lone) == []


def test_cost_and_validate_reprice_a_mixed_plan_as_emitted(
    model: CostModel, profile: Profile, tmp_path: Path
) -> None:
    plan = emitted(model, mixed_config())
    assert plan_problems(plan, profile) == []
    path = tmp_path / "mixed.json"
    path.write_text(plan.model_dump_json(indent=1))
    checked = runner.invoke(app, ["validate", str(path), "--profile", str(PROFILE)])
    assert checked.exit_code == 0, checked.output
    assert "timings recomputed" in checked.output
    priced_path = tmp_path / "priced.json"
    priced = runner.invoke(
        app, ["cost", str(path), "--profile", str(PROFILE), "-o", str(priced_path)]
    )
    assert priced.exit_code == 0, priced.output
    again = read_plan(priced_path)
    assert [s.sequence_parallel for s in again.stages] == [True, False]
    # The same figures (the fingerprint differs: the file's profile_sha256 is the real one).
    fresh = again.prediction.model_dump(exclude={"costed_sha256"})
    assert fresh == plan.prediction.model_dump(exclude={"costed_sha256"})


def test_a_version_5_plan_reads_with_no_stage_flag(model: CostModel, tmp_path: Path) -> None:
    for whole in (False, True):
        data = json.loads(emitted(model, mixed_config(first=whole, whole=whole)).model_dump_json())
        data["schema_version"] = 5
        for stage in data["stages"]:
            del stage["sequence_parallel"]
        path = tmp_path / f"v5-{whole}.json"
        path.write_text(json.dumps(data))
        plan = read_plan(path)
        assert plan.schema_version == PLAN_SCHEMA_VERSION
        assert plan.parallelism.sequence_parallel is whole
        assert not any(s.sequence_parallel for s in plan.stages)
        # The same configuration as before the upgrade: flags of the plan, none of a stage.
        config = config_from_plan(model, plan)
        assert config == dataclasses.replace(
            mixed_config(first=False, whole=whole), executor=config.executor
        )


# --- `autoplan cost --stages` notation: a stage's own ':sp' ------------------------------------


def test_a_stage_spec_says_its_own_sequence_parallelism() -> None:
    specs = parse_stages("A:L0-6:tp2:dp1:sp | A:L7-13:tp2:dp1")
    assert [s.sequence_parallel for s in specs] == [True, False]
    assert format_stage_specs(specs) == "A:L0-6:tp2:dp1:sp | A:L7-13:tp2:dp1"
    assert parse_stages(format_stage_specs(specs)) == specs
    for bad in ("A:L0-13:tp2:dp1:sp:sp", "A(sp):L0-13:tp2:dp1"):
        with pytest.raises(InputError, match="is not one of"):
            parse_stages(bad)


def _cluster_file(model: CostModel, folder: Path) -> Path:
    path = folder / "cluster.yaml"
    path.write_text(yaml.safe_dump(model.cluster.model_dump(mode="json")))
    return path


def test_show_writes_a_mixed_plan_as_stages_that_price_to_it(
    model: CostModel, tmp_path: Path
) -> None:
    plan = emitted(model, mixed_config())
    path = tmp_path / "mixed.json"
    path.write_text(plan.model_dump_json())
    result = runner.invoke(app, ["show", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    line = json.loads(result.output)["sections"][0]["items"]["as cost --stages"]
    head, _, stages = line.partition(" | ")
    # Not plan-wide (no leading ' sp'), the first stage's own.
    assert head == "pp=2 m=4 1f1b"
    assert stages == "A*1:L0-6:tp2:mb2:sp | A*1:L7-13:tp2:mb2"
    priced_path = tmp_path / "priced.json"
    args = ["cost", "--profile", str(PROFILE), "-c", str(_cluster_file(model, tmp_path))]
    priced = runner.invoke(
        app, [*args, "--num-micro-batches", "4", "--stages", stages, "-o", str(priced_path)]
    )
    assert priced.exit_code == 0, priced.output
    again = read_plan(priced_path)
    assert again.stages == plan.stages and again.parallelism == plan.parallelism
    assert again.prediction.iteration_time_ms == plan.prediction.iteration_time_ms
    # Every stage's ':sp' is the plan-wide setting (one plan, one way), as `--sp` gives it.
    both = runner.invoke(
        app,
        [*args, "--num-micro-batches", "4", "-o", str(priced_path), "--stages",
         "A:L0-6:tp2:dp1:mb2:sp | A:L7-13:tp2:dp1:mb2:sp"],
    )  # fmt: skip
    assert both.exit_code == 0, both.output
    whole = read_plan(priced_path)
    assert whole.parallelism.sequence_parallel
    assert whole.stages == emitted(model, mixed_config(first=False, whole=True)).stages
    # The runner-up summaries use the same notation.
    (record,) = alternative_records(model, [(mixed_config(), model.evaluate(mixed_config()))], 8)
    assert record.summary == f"{head} | {stages}"


def test_sp_on_a_stage_without_tp_is_refused_in_one_line(model: CostModel, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["cost", "--profile", str(PROFILE), "-c", str(_cluster_file(model, tmp_path)),
         "--num-micro-batches", "4", "--stages", "A:L0-6:tp2:dp1:mb2 | A:L7-13:tp1:dp1:mb2:sp"],
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [
        "error: --stages stage 1: :sp (sequence parallelism) needs tp > 1 in the stage"
    ]


# --- The validator, per stage -------------------------------------------------------------------


def test_a_stage_flag_without_tp_is_a_problem_naming_the_stage(model: CostModel) -> None:
    plan = emitted(model, mixed_config(second_tp=1))
    assert plan_problems(plan) == []
    stages = list(plan.stages)
    stages[1] = stages[1].model_copy(update={"sequence_parallel": True})
    problems = plan_problems(plan.model_copy(update={"stages": stages}))
    assert problems == [
        "stage 1 runs sequence parallelism (its sequence_parallel) but none of its replicas "
        "runs tensor parallel"
    ]


def test_only_the_stages_running_sp_need_their_tp_to_divide_the_sequence() -> None:
    # A 6-token sequence: tp 2 divides it, tp 4 does not.
    profile = transformer_profile(4, 256, 6, vocab=1024, heads=4)
    cluster = make_cluster([("a", A, 8, 1)])
    six = CostModel(profile, cluster, gpu_specs(cluster))

    def config(first: bool, second: bool) -> PlanConfig:
        two, four = (ReplicaGroup(0, 2, 1, 2, "none"),), (ReplicaGroup(0, 4, 1, 2, "none"),)
        return PlanConfig(
            4,
            "1f1b",
            1,
            (
                StageChoice(0, 3, two, sequence_parallel=first),
                StageChoice(3, 6, four, sequence_parallel=second),
            ),
        )

    assert plan_problems(emitted(six, config(True, False)), profile) == []
    for first, second in ((False, True), (True, True)):
        problems = plan_problems(emitted(six, config(first, second)), profile)
        assert problems == [
            "sequence parallelism: tensor parallel degree 4 does not divide the sequence length 6"
        ]


# --- Views and exports ---------------------------------------------------------------------------


def test_show_says_which_stages_run_sp(model: CostModel, tmp_path: Path) -> None:
    for name, config, words in (
        ("mixed", mixed_config(), "sequence parallelism (SP) on stage 0"),
        ("second", mixed_config(first=False, second=True), "sequence parallelism (SP) on stage 1"),
        ("whole", mixed_config(second=True), "sequence parallelism (SP) on"),
        ("none", mixed_config(first=False), None),
    ):
        path = tmp_path / f"{name}.json"
        path.write_text(emitted(model, config).model_dump_json())
        result = runner.invoke(app, ["show", str(path), "--format", "json"])
        assert result.exit_code == 0, result.output
        pipeline = json.loads(result.output)["sections"][0]["items"]["pipeline"]
        if words is None:
            assert "sequence parallelism" not in pipeline
        else:
            assert pipeline.endswith(words), pipeline


@pytest.mark.parametrize("target", ["megatron", "torchtitan", "deepspeed"])
def test_exports_refuse_sp_on_some_stages_in_one_line(
    model: CostModel, profile: Profile, target: str, tmp_path: Path
) -> None:
    plan = emitted(model, mixed_config())
    with pytest.raises(NotExpressibleError) as refused:
        export_plan(plan, target, layer_kinds(plan, profile))
    assert str(refused.value) == (
        f"{target} cannot run this plan: sequence parallelism is on for stages 0 and off for "
        f"stages 1; {target} sets it for every stage"
    )
    path = tmp_path / "mixed.json"
    path.write_text(plan.model_dump_json())
    result = runner.invoke(app, ["export", str(path), "--to", target])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {refused.value}"]


def test_megatron_exports_sp_on_every_stage_as_its_global_flag(
    model: CostModel, profile: Profile
) -> None:
    whole = emitted(model, mixed_config(second=True))
    argv = export_plan(whole, "megatron", layer_kinds(whole, profile)).text
    assert "--sequence-parallel" in argv
    none = emitted(model, mixed_config(first=False))
    assert (
        "--sequence-parallel" not in export_plan(none, "megatron", layer_kinds(none, profile)).text
    )


# --- Zero-bubble plans: the weight-gradient split with the stage's SP ---------------------------


def _zbv(first: bool = False, whole: bool = False) -> PlanConfig:
    """gpt2-small on a V of 4 stages over 2 ranks of tp 2 (zbv), SP on stage 0 or all."""
    group = (ReplicaGroup(0, 2, 1, 2, "none"),)
    bounds = [(0, 4), (4, 7), (7, 11), (11, 14)]
    stages = tuple(
        StageChoice(a, b, group, sequence_parallel=first and i == 0)
        for i, (a, b) in enumerate(bounds)
    )
    return PlanConfig(4, "zbv", 2, stages, sequence_parallel=whole)


def test_zero_bubble_weight_gradients_run_with_the_stages_sp(model: CostModel) -> None:
    # The search's view with SP on and the plan's flag on the plain model (autoplan cost's
    # and validate's re-pricing) price the same plan alike, W split included.
    view = model.with_sequence_parallel(True).evaluate(_zbv())
    assert model.evaluate(_zbv(whole=True)).iteration_ms == view.iteration_ms
    off, on, mixed = (
        emitted(model, config).prediction.stage_timings
        for config in (_zbv(), _zbv(whole=True), _zbv(first=True))
    )
    weights = [[t.weight_gradient_ms for t in timings] for timings in (off, on, mixed)]
    assert weights[2][0] == weights[1][0] != weights[0][0]
    assert weights[2][1:] == weights[0][1:] != weights[1][1:]
