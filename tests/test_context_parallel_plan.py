"""Context parallelism in plans: emitted ranks (cp index, then tp index), the validator's cp
rules, the exports (Megatron-LM ``--context-parallel-size``, torchtitan
``context_parallel_degree``, DeepSpeed refusing in one line), ``show`` and which executor
runs it."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoplan.cluster.catalog import gpu_specs
from autoplan.cost.config import PlanConfig, ReplicaGroup, StageChoice
from autoplan.cost.model import CostModel
from autoplan.errors import InputError
from autoplan.export import NotExpressibleError, export_plan, layer_kinds
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan, PlanInputs
from autoplan.plan.validate import plan_problems
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable
from autoplan.runtime.trainer import select_executor
from autoplan.simulate import simulate_plan
from autoplan.solve.emit import emit_plan
from autoplan.view.plan_tables import replicas_text
from tests.synthetic_profiles import gpu, make_cluster
from tests.test_export import TORCHTITAN_FIELDS, _megatron_parser, _sourced_argv

ROOT = Path(__file__).resolve().parents[1]
A = gpu("A", 100.0, 80.0)


@pytest.fixture(scope="module")
def profile() -> Profile:
    return read_json_model(ROOT / "profiles" / "gpt2-small.profile.json", Profile)


def _plan(profile: Profile, cp: int = 2, tp: int = 2, dp: int = 1, nodes: int = 1) -> Plan:
    cluster = make_cluster([("a", A, 8, nodes)])
    model = CostModel(profile, cluster, gpu_specs(cluster))
    group = (ReplicaGroup(0, tp, dp, 2, "none", cp=cp),)
    config = PlanConfig(4, "1f1b", 1, (StageChoice(0, 7, group, 0), StageChoice(7, 14, group, 0)))
    inputs = PlanInputs(
        model=profile.model,
        profile_sha256="test",
        seq_len=profile.seq_len,
        dtype=profile.dtype,
        cluster=cluster,
        global_batch_size=8,
        strategy="optimal",
    )
    return emit_plan(model, config, model.evaluate(config), inputs, [])


def test_cp_replicas_number_cp_index_then_tp_index(profile: Profile) -> None:
    plan = _plan(profile)
    first = plan.stages[0].replicas[0]
    assert (first.tensor_parallel_degree, first.context_parallel_degree) == (2, 2)
    assert first.ranks == [0, 1, 2, 3] and plan.stages[1].replicas[0].ranks == [4, 5, 6, 7]
    # Rank i of a replica is cp index i // tp, tp index i % tp.
    assert [(e.cp_index, e.tp_index) for e in plan.rank_map[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert plan_problems(plan, profile) == []
    assert plan.uniform_shape() is None  # no (pp, dp, tp) mesh holds cp
    assert replicas_text(plan.stages[0]).startswith("A tp2 cp2 × 1 (")


def test_validator_names_what_cp_breaks(profile: Profile) -> None:
    plan = _plan(profile)
    # 1024 tokens do not split into 2 × 3 chunks, and a rank entry with the wrong cp index.
    stage = plan.stages[0]
    odd = stage.replicas[0].model_copy(
        update={"context_parallel_degree": 3, "tensor_parallel_degree": 1, "ranks": [0, 1, 2]}
    )
    broken = plan.model_copy(
        update={"stages": [stage.model_copy(update={"replicas": [odd]}), *plan.stages[1:]]}
    )
    problems = "\n".join(plan_problems(broken))
    assert "2 × 3 load-balanced chunks do not divide the sequence length 1024" in problems
    entries = list(plan.rank_map)
    entries[2] = entries[2].model_copy(update={"cp_index": 0})
    message = "\n".join(plan_problems(plan.model_copy(update={"rank_map": entries})))
    assert "rank 2 says (pipeline 0, dp 0, cp 0, tp 0" in message
    assert "as rank 2 of replica 0 of pipeline rank 0 it is (pipeline 0, dp 0, cp 1, tp 0" in (
        message
    )


def test_exports_carry_cp_or_refuse_it(profile: Profile, tmp_path: Path) -> None:
    plan = _plan(profile)
    kinds = layer_kinds(plan, profile)
    text = export_plan(plan, "megatron", kinds).text
    args = _megatron_parser().parse_args(_sourced_argv(text, tmp_path))
    assert args.context_parallel_size == 2 and args.tensor_model_parallel_size == 2
    assert "pp 2 x dp 1 x cp 2 x tp 2" in text
    import tomllib

    config = tomllib.loads(export_plan(plan, "torchtitan", kinds).text)
    assert set(config["parallelism"]) <= TORCHTITAN_FIELDS["parallelism"]
    assert config["parallelism"]["context_parallel_degree"] == 2
    with pytest.raises(NotExpressibleError, match="context parallelism \\(cp 2\\)"):
        export_plan(plan, "deepspeed", kinds)
    # Without cp the key is not written at all.
    plain = tomllib.loads(export_plan(_plan(profile, cp=1), "torchtitan", kinds).text)
    assert "context_parallel_degree" not in plain["parallelism"]


def test_runtime_runs_cp_on_the_mesh_executor_only(profile: Profile) -> None:
    plan = _plan(profile)
    check_runnable(plan)  # one (pp, dp, cp, tp) mesh: runnable
    assert select_executor(plan) == "mesh"
    with pytest.raises(InputError, match="context parallelism runs on the mesh executor"):
        select_executor(plan, "groups")


def test_simulator_plays_and_labels_a_cp_plan(profile: Profile) -> None:
    plan = _plan(profile)
    result = simulate_plan(plan)
    assert result.iteration_time_ms == pytest.approx(plan.prediction.iteration_time_ms, rel=0.01)
    labels = {replica.label for rank in result.ranks for replica in rank.replicas}
    assert labels == {"A tp2 cp2, 2 samples"}


# ---- uneven chunks (Replica.context_tokens, schema version 5) --------------------------------


def _with_tokens(plan: Plan, tokens: list[int]) -> Plan:
    stages = [
        stage.model_copy(
            update={
                "replicas": [
                    r.model_copy(update={"context_tokens": tokens}) for r in stage.replicas
                ]
            }
        )
        for stage in plan.stages
    ]
    return plan.model_copy(update={"stages": stages})


def test_uneven_chunks_are_checked_and_refused_by_exports(profile: Profile, tmp_path: Path) -> None:
    plan = _with_tokens(_plan(profile), [768, 256])
    assert plan_problems(plan, profile) == []
    assert plan.mesh_shape() == (1, 2, 2)  # the same chunks at both stages: one mesh
    problems = "\n".join(plan_problems(_with_tokens(_plan(profile), [769, 255])))
    assert "context_tokens [769, 255] must be positive even counts" in problems
    problems = "\n".join(plan_problems(_with_tokens(_plan(profile), [768, 258])))
    assert "summing to the sequence length 1024" in problems
    # Under sequence parallelism the tp group (here 4) splits each rank's chunk.
    wide = _plan(profile, tp=4, nodes=2)
    sp = wide.model_copy(
        update={"parallelism": wide.parallelism.model_copy(update={"sequence_parallel": True})}
    )
    assert plan_problems(_with_tokens(sp, [772, 252])) == []
    odd = _with_tokens(sp, [770, 254])
    assert "context_tokens [770, 254] are not all divisible by 4" in "\n".join(plan_problems(odd))
    replica = plan.stages[0].replicas[0]
    with pytest.raises(ValueError, match="context_tokens for 3 cp ranks"):
        type(replica)(**{**replica.model_dump(), "context_tokens": [2, 2, 1020]})
    # Chunks that differ from stage to stage cannot pass between pipeline stages on one mesh.
    mixed = plan.model_copy(
        update={"stages": [plan.stages[0], _with_tokens(_plan(profile), [512, 512]).stages[1]]}
    )
    assert mixed.mesh_shape() is None
    kinds = layer_kinds(plan, profile)
    for target in ("megatron", "torchtitan"):
        with pytest.raises(NotExpressibleError, match=r"unevenly over its cp ranks \(768 \+ 256"):
            export_plan(plan, target, kinds)


def test_a_version_4_plan_reads_with_equal_chunks(profile: Profile, tmp_path: Path) -> None:
    import json

    from autoplan.inputs import read_plan
    from autoplan.plan.schema import PLAN_SCHEMA_VERSION

    data = json.loads(_plan(profile).model_dump_json())
    data["schema_version"] = 4
    for stage in data["stages"]:
        for replica in stage["replicas"]:
            del replica["context_tokens"]
    path = tmp_path / "v4.json"
    path.write_text(json.dumps(data))
    plan = read_plan(path)
    assert plan.schema_version == PLAN_SCHEMA_VERSION >= 5
    assert all(r.context_tokens is None for s in plan.stages for r in s.replicas)
