"""``autoplan.api``: the Python interface gives what the CLI gives, from models or from files."""

from __future__ import annotations

import csv
import inspect
import json
from pathlib import Path

import pytest

from autoplan import api
from autoplan.errors import InfeasibleError, InputError, PlanInvalidError
from autoplan.files import file_sha256, read_json_model

REPO = Path(__file__).resolve().parents[1]
GPT2 = REPO / "profiles" / "gpt2-small.profile.json"
LLAMA70 = REPO / "profiles" / "llama2-70b.profile.json"


def test_every_public_name_exists_and_every_function_is_documented() -> None:
    for name in api.__all__:
        value = getattr(api, name)
        assert inspect.getdoc(value), name
    functions = {n for n in api.__all__ if inspect.isfunction(getattr(api, n))}
    assert {"profile", "solve", "simulate", "sweep"} <= functions


def test_profile_solve_simulate_from_models_equal_the_same_from_files(tmp_path: Path) -> None:
    profile = api.profile("gpt-tiny", seq_len=64)
    assert profile.model.name == "gpt-tiny" and len(profile.layers) == 6
    api.save(profile, tmp_path / "tiny.json")
    from_model = api.solve(profile, "cpu-local", global_batch=8)
    from_file = api.solve(tmp_path / "tiny.json", REPO / "profiles/clusters/cpu-local.yaml", 8)
    # The hash of a profile in memory is that of the file `save` writes: the plans are equal.
    assert from_model.inputs.profile_sha256 == file_sha256(tmp_path / "tiny.json")
    assert from_model == from_file
    api.save(from_model, tmp_path / "plan.json")
    assert api.load_plan(tmp_path / "plan.json") == from_model
    simulated = api.simulate(from_model)
    assert simulated == api.simulate(tmp_path / "plan.json")
    assert simulated.iteration_time_ms == pytest.approx(
        from_model.prediction.iteration_time_ms, rel=0.05
    )


def test_solve_options_are_keywords_and_bad_ones_are_input_errors() -> None:
    cluster = api.load_cluster("a100-v100")
    plan = api.solve(str(GPT2), cluster, 64, tp=2, time_limit_s=20)
    assert {r.tensor_parallel_degree for s in plan.stages for r in s.replicas} == {2}
    assert plan.inputs.profile_sha256 == file_sha256(GPT2)
    with pytest.raises(InputError, match="solve option tpp: Extra inputs are not permitted"):
        api.solve(GPT2, cluster, 64, tpp=2)
    with pytest.raises(InputError, match="solve option strategy"):
        api.solve(GPT2, cluster, 64, strategy="fastest")
    with pytest.raises(InfeasibleError, match="megatron baseline costs every GPU"):
        api.solve(LLAMA70, "h100-a100-l4", 256, strategy="megatron")
    with pytest.raises(InputError, match="no example cluster 'a100-v1000'"):
        api.load_cluster("a100-v1000")


def test_sweep_rows_and_their_files(tmp_path: Path) -> None:
    prices = {"A100-80GB": 1.8, "V100-32GB": 0.9}
    rows = api.sweep(GPT2, "a100-v100", nodes=[1, 2], global_batch=64, prices=prices)
    assert [(row.nodes, row.global_batch_size) for row in rows] == [(1, 64), (2, 64)]
    assert all(row.feasible and row.cost_usd for row in rows)
    api.save_sweep(rows, tmp_path / "rows.csv")
    with open(tmp_path / "rows.csv", newline="") as handle:
        assert [r["nodes"] for r in csv.DictReader(handle)] == ["1", "2"]
    api.save_sweep(rows, tmp_path / "rows.png", title="gpt2-small")
    assert (tmp_path / "rows.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(InputError, match=r"writes \.csv or \.png"):
        api.save_sweep(rows, tmp_path / "rows.xlsx")


def test_a_broken_plan_file_is_refused(tmp_path: Path) -> None:
    plan = api.solve(GPT2, "a100-v100", 64, time_limit_s=20)
    data = plan.model_dump(mode="json")
    data["rank_map"][0]["node"] = "nowhere-0"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(data))
    assert read_json_model(broken, api.Plan)  # the schema alone accepts it
    with pytest.raises(PlanInvalidError, match="nowhere-0"):
        api.simulate(broken)
