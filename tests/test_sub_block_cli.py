"""`autoplan profile --granularity sub-block` → `solve` → `show`: the units are named.

A pinned split of 2, 4 and 4 units puts the first boundary after block 0's attention part and
the second after block 2's; `show` names each stage's first and last unit, `validate` accepts
the plan and the runtime's check finds it runnable (the model's units match the plan's).
"""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import read_json_model
from autoplan.plan.schema import Plan
from autoplan.profile.schema import Profile
from autoplan.runtime.check import check_runnable

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def test_sub_block_profile_solve_and_show_name_the_units(tmp_path: Path) -> None:
    profile_path, plan_path = tmp_path / "p.json", tmp_path / "plan.json"
    profiled = runner.invoke(
        app,
        [
            *("profile", "gpt-tiny", "--seq", "16", "--dtype", "fp64"),
            *("--granularity", "sub-block", "-o", str(profile_path)),
        ],
        env=WIDE,
    )
    assert profiled.exit_code == 0, profiled.output
    assert "layers.block_0:attn" in profiled.output
    profile = read_json_model(profile_path, Profile)
    assert profile.model.granularity == "sub-block" and len(profile.layers) == 10
    solved = runner.invoke(
        app,
        [
            *("solve", str(profile_path), "-c", "cpu-local", "--global-batch", "4"),
            *("--layer-split", "2,4,4", "-o", str(plan_path)),
        ],
        env=WIDE,
    )
    assert solved.exit_code == 0, solved.output
    plan = read_json_model(plan_path, Plan)
    assert plan.inputs.model.granularity == "sub-block"
    assert [(s.layer_start, s.layer_end) for s in plan.stages] == [(0, 2), (2, 6), (6, 10)]
    check_runnable(plan)
    shown = runner.invoke(app, ["show", str(plan_path)], env=WIDE)
    assert shown.exit_code == 0, shown.output
    for text in ("embed .. block_0 attn", "block_0 mlp .. block_2 attn", "block_2 mlp .. head"):
        assert text in shown.output, shown.output
    validated = runner.invoke(app, ["validate", str(plan_path), "--profile", str(profile_path)])
    assert validated.exit_code == 0, validated.output


def test_a_bad_granularity_is_one_line() -> None:
    result = runner.invoke(
        app, ["profile", "gpt-tiny", "--seq", "16", "--granularity", "operator"], env=WIDE
    )
    assert result.exit_code == 2
    assert "--granularity must be block or sub-block" in result.output
    assert "Traceback" not in result.output
