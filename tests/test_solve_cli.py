"""``autoplan solve`` end to end: real files in, plan file out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.plan.validate import validate_plan
from tests.synthetic_profiles import gpu, make_cluster, transformer_profile

runner = CliRunner()


def _replica_values(plan: Plan, name: str) -> set:
    return {getattr(replica, name) for stage in plan.stages for replica in stage.replicas}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("solve")
    profile = transformer_profile(blocks=8, hidden=1024, seq_len=512, heads=16)
    profile_path = folder / "profile.json"
    write_json_model(profile_path, profile)
    cluster = make_cluster(
        [("fast", gpu("FAST", 200, 16), 4, 1), ("slow", gpu("SLOW", 50, 12), 4, 1)]
    )
    cluster_path = folder / "cluster.yaml"
    cluster_path.write_text(yaml.safe_dump(cluster.model_dump(mode="json")))
    return profile_path, cluster_path


def _solve(inputs, out: Path, *extra: str):
    profile_path, cluster_path = inputs
    args = ["solve", str(profile_path), "--cluster", str(cluster_path), "--global-batch", "32"]
    return runner.invoke(app, [*args, "-o", str(out), *extra])


def test_writes_a_valid_plan_and_the_same_bytes_on_rerun(inputs, tmp_path) -> None:
    first = _solve(inputs, tmp_path / "a.json")
    assert first.exit_code == 0, first.output
    second = _solve(inputs, tmp_path / "b.json")
    assert second.exit_code == 0, second.output
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    plan = read_json_model(tmp_path / "a.json", Plan)
    profile = json.loads(inputs[0].read_text())
    assert plan.inputs.profile_sha256 and plan.inputs.global_batch_size == 32
    assert (
        sum(s.layer_end - s.layer_start for s in plan.stages[: plan.parallelism.pipeline_degree])
        > 0
    )
    assert plan.stages[-1].layer_end == len(profile["layers"])
    from autoplan.profile.schema import Profile

    validate_plan(plan, Profile.model_validate(profile))
    assert "iteration" in first.output and "wrote" in first.output


@pytest.mark.parametrize(
    ("flags", "check"),
    [
        (["--tp", "2"], lambda p: _replica_values(p, "tensor_parallel_degree") == {2}),
        (["--pp", "2"], lambda p: p.parallelism.pipeline_degree == 2),
        (["--dp", "2", "--pp", "1"], lambda p: {s.data_parallel_degree for s in p.stages} == {2}),
        (
            ["--micro-batch-size", "2", "--pp", "2"],
            lambda p: _replica_values(p, "micro_batch_size") == {2},
        ),
        (["--schedule", "gpipe", "--pp", "2"], lambda p: p.parallelism.schedule == "gpipe"),
        (["--recompute", "full"], lambda p: _replica_values(p, "recompute") == {"full"}),
        (["--no-zero1", "--pp", "2"], lambda p: not any(s.zero1 for s in p.stages)),
        (
            ["--layer-split", "4,6", "--dp", "1"],
            lambda p: [s.layer_end - s.layer_start for s in p.stages] == [4, 6],
        ),
        (
            [
                "--tp",
                "1",
                "--pp",
                "2",
                "--dp",
                "2",
                "--micro-batch-size",
                "2",
                "--schedule",
                "1f1b",
                "--recompute",
                "selective",
                "--zero1",
            ],
            lambda p: (
                (
                    p.parallelism.pipeline_degree,
                    {s.data_parallel_degree for s in p.stages} == {2},
                    p.parallelism.num_micro_batches,
                    all(s.zero1 for s in p.stages),
                )
                == (2, True, 8, True)
            ),
        ),
        (
            ["--schedule", "interleaved_1f1b", "--pp", "2"],
            lambda p: (
                p.parallelism.virtual_stages_per_rank > 1
                and p.parallelism.num_micro_batches % 2 == 0
                and len(p.stages) == 2 * p.parallelism.virtual_stages_per_rank
            ),
        ),
        (["--strategy", "megatron"], lambda p: p.inputs.strategy == "megatron"),
        (["--strategy", "data-parallel"], lambda p: p.parallelism.pipeline_degree == 1),
    ],
)
def test_pinned_knobs_are_respected(inputs, tmp_path, flags, check) -> None:
    result = _solve(inputs, tmp_path / "plan.json", *flags)
    assert result.exit_code == 0, result.output
    plan = read_json_model(tmp_path / "plan.json", Plan)
    assert check(plan), plan.parallelism
    assert plan.inputs.pinned or flags[0] == "--strategy"
    validate_plan(plan)


def test_infeasible_exits_2_with_one_line_naming_memory(inputs, tmp_path) -> None:
    profile_path, _ = inputs
    tiny = make_cluster([("tiny", gpu("TINY", 10, 0.05), 2, 1)])
    cluster_path = tmp_path / "tiny.yaml"
    cluster_path.write_text(yaml.safe_dump(tiny.model_dump(mode="json")))
    result = runner.invoke(
        app,
        [
            "solve",
            str(profile_path),
            "--cluster",
            str(cluster_path),
            "--global-batch",
            "8",
            "-o",
            str(tmp_path / "x.json"),
        ],
    )
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, result.output
    assert "optimizer states need" in lines[0] and "the cluster has" in lines[0]
    assert not (tmp_path / "x.json").exists()


def test_impossible_pins_exit_2(inputs, tmp_path) -> None:
    for flags, words in [
        (["--tp", "3"], "tp=3"),
        (["--dp", "5"], "dp=5 does not divide"),
        (["--tp", "4", "--dp", "4", "--pp", "2"], "32 GPUs asked; the cluster has 8"),
        (["--layer-split", "3,3"], "add up to"),
        (["--schedule", "zigzag"], "schedule"),
    ]:
        result = _solve(inputs, tmp_path / "x.json", *flags)
        assert result.exit_code == 2, (flags, result.output)
        assert words in result.output, (flags, result.output)
        assert len(result.output.strip().splitlines()) == 1


def test_separate_processes_with_different_hash_seeds_write_the_same_bytes(tmp_path) -> None:
    # Set and dict iteration over strings depends on PYTHONHASHSEED: a plan that leaned on it
    # would differ between runs even though one process always repeats itself.
    shipped = Path(__file__).parent.parent / "profiles"
    outputs = []
    for seed in ("1", "2"):
        out = tmp_path / f"plan-{seed}.json"
        command = [
            sys.executable,
            "-c",
            "from autoplan.cli import app; app()",
            "solve",
            str(shipped / "llama2-7b.profile.json"),
            "--cluster",
            "a100-v100",
            "--global-batch",
            "128",
            "-o",
            str(out),
        ]
        env = {**os.environ, "PYTHONHASHSEED": seed}
        subprocess.run(command, check=True, capture_output=True, env=env)
        outputs.append(out.read_bytes())
    assert outputs[0] == outputs[1]


def test_a_time_limit_that_stops_the_search_before_any_plan_says_so() -> None:
    """Not 'no configuration fits in memory': the problem has plans, the search ran out of time."""
    from autoplan.cluster.catalog import example_cluster_path, load_cluster
    from autoplan.errors import InfeasibleError
    from autoplan.files import read_json_model
    from autoplan.profile.schema import Profile
    from autoplan.solve import SolveOptions, solve

    shipped = Path(__file__).parent.parent / "profiles"
    profile = read_json_model(shipped / "gpt3-175b.profile.json", Profile)
    cluster = load_cluster(example_cluster_path("mixed-1024"))
    # SP pinned off: one run, whose uniform family takes the least share a run past the
    # deadline gets (``Deadline.share``). With SP searched, the SP-on run holds only the
    # shared single-stage family, whose first share program can finish within that share
    # and return a plan.
    with pytest.raises(
        InfeasibleError, match=r"time limit \(1e-06 s\) stopped the search.*--time-limit"
    ):
        solve(profile, cluster, 1536, SolveOptions(time_limit_s=1e-6, sequence_parallel=False))
