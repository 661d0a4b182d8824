"""Version-1 plans (written by autoplan before schema version 2, kept in tests/data/plan_v1)
read as version 2: same stages, ranks and shares, valid, shown, simulated and run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import read_json_model
from autoplan.inputs import read_plan
from autoplan.plan.schema import PLAN_SCHEMA_VERSION
from autoplan.plan.validate import plan_problems
from autoplan.profile.schema import Profile

DATA = Path(__file__).parent / "data" / "plan_v1"
PROFILES = Path(__file__).parent.parent / "profiles"
runner = CliRunner()

SHIPPED = {
    "llama2-7b-h100-a100-l4-pp4.json": "llama2-7b",
    "gpt2-small-a100-v100-shares.json": "gpt2-small",
}


@pytest.mark.parametrize("name", sorted(p.name for p in DATA.glob("*.json")))
def test_a_version_1_plan_keeps_its_stages_ranks_and_shares(name: str) -> None:
    old = json.loads((DATA / name).read_text())
    assert old["schema_version"] == 1
    plan = read_plan(DATA / name)
    par = old["parallelism"]
    dp, tp = par["data_parallel_degree"], par["tensor_parallel_degree"]
    assert plan.schema_version == PLAN_SCHEMA_VERSION
    assert plan.parallelism.pipeline_degree == par["pipeline_degree"]
    assert plan.parallelism.micro_batch_size == sum(par["replica_micro_batch_sizes"])
    types = {entry["rank"]: entry["gpu_type"] for entry in old["rank_map"]}
    for before, after in zip(old["stages"], plan.stages, strict=True):
        assert (after.layer_start, after.layer_end) == (before["layer_start"], before["layer_end"])
        assert after.shares == par["replica_micro_batch_sizes"]
        for d, replica in enumerate(after.replicas):
            first = before["pipeline_rank"] * dp * tp + d * tp
            assert replica.ranks == list(range(first, first + tp))
            assert replica.gpu_type == types[first]
    total = sum(g.count * g.gpus_per_node for g in plan.inputs.cluster.node_groups)
    idle = sum(i.count for i in plan.prediction.idle_gpus)
    assert total - idle == len(plan.rank_map)


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_a_version_1_plan_is_valid_against_its_profile(name: str) -> None:
    profile = read_json_model(PROFILES / f"{SHIPPED[name]}.profile.json", Profile)
    assert plan_problems(read_plan(DATA / name), profile) == []


def test_a_version_1_plan_that_left_gpus_unused_lists_them_as_idle() -> None:
    plan = read_plan(DATA / "llama2-7b-h100-a100-l4-pp4.json")
    assert [(i.gpu_type, i.count) for i in plan.prediction.idle_gpus] == [("L4", 16)]


def test_show_and_simulate_read_a_version_1_plan(tmp_path: Path) -> None:
    path = DATA / "gpt2-small-a100-v100-shares.json"
    shown = runner.invoke(app, ["show", str(path)])
    assert shown.exit_code == 0, shown.output
    assert "micro-batch 15" in shown.output and "V100-32GB" in shown.output
    simulated = runner.invoke(app, ["simulate", str(path), "--trace", str(tmp_path / "t.json")])
    assert simulated.exit_code == 0, simulated.output
    assert json.loads((tmp_path / "t.json").read_text())


def test_a_version_1_plan_with_uneven_shares_runs(tmp_path: Path) -> None:
    """gpt-tiny over 4 CPU processes of two speeds, shares 11/11/5/5, from a version-1 file."""
    report = tmp_path / "report.json"
    path = DATA / "gpt-tiny-cpu-hetero-shares.json"
    result = runner.invoke(
        app, ["run", str(path), "--local", "--steps", "2", "--report", str(report)]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["world_size"] == 4 and len(data["steps"]) == 2
