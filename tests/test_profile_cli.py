"""``autoplan profile`` and ``autoplan models`` through the real CLI (typer's runner)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import read_json_model
from autoplan.profile.schema import Profile
from autoplan.zoo import model_names

runner = CliRunner()
WIDE = {"COLUMNS": "200"}


def test_profile_writes_a_valid_profile(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    result = runner.invoke(
        app,
        ["profile", "llama-tiny", "--seq", "32", "--micro-batch", "2", "-o", str(out)],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    profile = read_json_model(out, Profile)
    assert (profile.seq_len, profile.micro_batch_size, profile.dtype) == (32, 2, "bf16")
    assert profile.model.name == "llama-tiny"
    assert profile.model.parameter_count == 45_344
    assert f"wrote {out}" in result.output
    assert "layers.block_0" in result.output


def test_profile_of_a_factory_model(tmp_path: Path) -> None:
    out = tmp_path / "f.json"
    result = runner.invoke(
        app,
        ["profile", "tests.test_profile:make_mlp", "--seq", "4", "--dtype", "fp32", "-o", str(out)],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    profile = read_json_model(out, Profile)
    assert len(profile.layers) == 3
    assert profile.totals.param_count == 16 * 32 + 32 * 16 + 16


def test_profile_measure_records_times(tmp_path: Path) -> None:
    out = tmp_path / "m.json"
    result = runner.invoke(
        app,
        ["profile", "gpt-tiny", "--seq", "16", "--dtype", "fp32", "--measure", "-o", str(out)],
        env=WIDE,
    )
    assert result.exit_code == 0, result.output
    profile = read_json_model(out, Profile)
    assert all(len(layer.measured) == 1 for layer in profile.layers)


_CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="--measure times the GPU")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["llama2-7x", "--seq", "16"], "unknown model 'llama2-7x'; did you mean llama2-7b"),
        (["no_such_pkg.models:build", "--seq", "16"], "cannot import module 'no_such_pkg.models'"),
        (["llama2-7b", "--seq", "8192"], "exceeds llama2-7b's maximum of 4096 positions"),
        (["gpt-tiny", "--seq", "16", "--micro-batch", "0"], "must be at least 1, got 0"),
        (["gpt-tiny", "--seq", "16", "--dtype", "int8"], "dtype 'int8' is not one of"),
        (["llama2-70b", "--seq", "4096", "--dtype", "fp32", "--measure"], "without --measure"),
        pytest.param(
            ["gpt-tiny", "--seq", "16", "--measure"],
            "--measure in bf16 on the CPU is not trusted",
            marks=_CPU_ONLY,
        ),
        pytest.param(
            ["gpt-tiny", "--seq", "16", "--dtype", "fp16", "--measure"],
            "in fp16 on the CPU",
            marks=_CPU_ONLY,
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(
    args: list[str], message: str, tmp_path: Path
) -> None:
    result = runner.invoke(app, ["profile", *args, "-o", str(tmp_path / "x.json")])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("error: ")
    assert message in lines[0]
    assert not (tmp_path / "x.json").exists()


def test_models_lists_the_zoo() -> None:
    result = runner.invoke(app, ["models"], env=WIDE)
    assert result.exit_code == 0, result.output
    for name in model_names():
        assert name in result.output
    assert "68,976,648,192" in result.output  # llama2-70b
    assert "1,008,038,758,400" in result.output  # megatron-1t


def test_a_users_factory_file_in_the_current_directory(tmp_path: Path) -> None:
    """The installed `autoplan` command imports 'my_model:build' from where it is run."""
    (tmp_path / "my_model.py").write_text(
        "import torch\n"
        "def build(batch_size=1):\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh()), "
        "torch.randn(batch_size, 8)\n"
    )
    script = Path(sys.executable).parent / "autoplan"
    result = subprocess.run(
        [str(script), "profile", "my_model:build", "--seq", "1", "--micro-batch", "3"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    profile = read_json_model(tmp_path / "profile.json", Profile)
    assert [layer.param_count for layer in profile.layers] == [72, 0]
    assert profile.layers[0].forward_flops == 2 * 3 * 8 * 8
