"""Precision per GPU type: a dtype a planned GPU has no tensor cores for is named, with what
it costs, wherever a plan is shown (show, solve and cost summaries); cost re-prices the plan in
the dtype the GPU does run fast."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autoplan import api
from autoplan.cli import app
from autoplan.cluster.catalog import load_catalog, tensor_core_problem

runner = CliRunner()
PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "llama2-7b.profile.json"
STAGES = "A100-80GB:L0-15:tp4:dp2 | V100-32GB:L16-33:tp4:dp2"


def test_tensor_core_problems_follow_the_catalog() -> None:
    catalog = load_catalog()
    v100 = tensor_core_problem(catalog["V100-32GB"], "bf16")
    assert v100 is not None
    assert "no bf16 tensor cores" in v100 and "15.7 TFLOP/s" in v100
    assert "8.0x below its fp16 peak (125)" in v100 and "--dtype fp16" in v100
    assert tensor_core_problem(catalog["V100-32GB"], "fp16") is None
    assert tensor_core_problem(catalog["A100-80GB"], "bf16") is None
    assert tensor_core_problem(catalog["V100-32GB"], "tf32") is None  # fp32 training, as asked
    turing = tensor_core_problem(catalog["RTX-2080"], "bf16")
    assert turing is not None and "4.0x below its fp16 peak" in turing


def test_show_and_cost_name_the_problem_and_its_price(tmp_path: Path) -> None:
    out = tmp_path / "plan.json"
    args = ["cost", "--profile", str(PROFILE), "-c", "a100-v100", "--stages", STAGES]
    result = runner.invoke(app, [*args, "--global-batch", "64", "-o", str(out)])
    assert result.exit_code == 0, result.output
    words = " ".join(result.output.replace("│", " ").split())
    assert "PRECISION V100-32GB has no bf16 tensor cores" in words
    assert "A100-80GB has no" not in words
    bf16 = api.load_plan(out).prediction.iteration_time_ms
    half = api.load_profile(PROFILE).model_copy(update={"dtype": "fp16"})
    fp16 = api.cost_plan(half, "a100-v100", stages=STAGES, global_batch=64)
    assert fp16.prediction.iteration_time_ms < bf16
    assert f"({bf16 / fp16.prediction.iteration_time_ms:.2f}x faster)" in words
    shown = runner.invoke(app, ["show", str(out)], env={"COLUMNS": "200"})
    assert "PRECISION" in shown.output and "V100-32GB has no bf16" in shown.output
    # A plan on A100s alone says nothing of precision.
    a100 = runner.invoke(app, [*args[:6], "A100-80GB:L0-33:tp4:dp2", "--global-batch", "64"])
    assert a100.exit_code == 0 and "PRECISION" not in a100.output
