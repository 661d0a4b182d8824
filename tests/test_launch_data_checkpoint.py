"""``autoplan launch --data/--checkpoint-dir``: the per-node scripts pass the token file and
checkpoint options to every process (paths as the nodes see them, quoted), bad options are
one line; and a written script, run with bash (real torchrun, 2 processes, gloo), trains on the
file, saves, and a second script resumes."""

from __future__ import annotations

import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import read_json_model, write_json_model
from autoplan.runtime.report import RunReport
from tests.plan_factory import make_plan

ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _script(tmp_path: Path, out: str, *args: str) -> Path:
    plan_path = tmp_path / "plan.json"
    if not plan_path.exists():
        write_json_model(plan_path, make_plan([3, 3], num_micro_batches=2))
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(tmp_path / out), *args])
    assert result.exit_code == 0, result.output
    (script,) = sorted((tmp_path / out).glob("node*.sh"))
    return script


def _runtime_words(script: Path) -> list[str]:
    line = next(line for line in script.read_text().splitlines() if "autoplan.runtime" in line)
    words = shlex.split(line)
    return words[words.index("autoplan.runtime") + 2 :]  # after the plan path


def test_the_scripts_pass_the_data_and_checkpoint_options(tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        "launch",
        "--data",
        "/shared/tokens v2.bin",
        "--data-dtype",
        "uint32",
        "--checkpoint-dir",
        "/shared/ckpt",
        "--save-every",
        "50",
        "--resume",
    )
    words = _runtime_words(script)
    for option in (
        ["--data", "/shared/tokens v2.bin"],
        ["--data-dtype", "uint32"],
        ["--checkpoint-dir", "/shared/ckpt"],
        ["--save-every", "50"],
        ["--resume"],
    ):
        start = words.index(option[0])
        assert words[start : start + len(option)] == option
    plain = _runtime_words(_script(tmp_path, "plain"))
    assert not {"--data", "--checkpoint-dir", "--resume"} & set(plain)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--data-dtype", "float16", "--data", "t.bin"], "--data-dtype 'float16': not a token"),
        (["--no-shuffle"], "--data-dtype and --no-shuffle describe a --data file"),
        (["--resume"], "--save-every and --resume need --checkpoint-dir"),
        (["--data", "a\nb"], "is not a usable path"),
    ],
)
def test_bad_data_and_checkpoint_options_are_one_line(
    tmp_path: Path, args: list[str], message: str
) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([3, 3], num_micro_batches=2))
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(tmp_path / "o"), *args])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
    assert not (tmp_path / "o").exists()


@pytest.mark.distributed
def test_a_written_script_trains_on_the_file_saves_and_resumes(tmp_path: Path) -> None:
    np.save(tmp_path / "tokens.npy", np.arange(5000, dtype=np.uint16) % 128)
    common = ["--master-addr", "127.0.0.1", "--data", str(tmp_path / "tokens.npy")]
    common += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    for out, steps, extra in (("first", 2, ["--save-every", "1"]), ("second", 3, ["--resume"])):
        port = str(_free_port())
        report = str(tmp_path / f"{out}.json")
        script = _script(
            tmp_path,
            out,
            *common,
            *extra,
            "--steps",
            str(steps),
            "--master-port",
            port,
            "--report",
            report,
        )
        done = subprocess.run(
            ["bash", str(script)], env=environment, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
    names = sorted(path.name for path in (tmp_path / "ckpt").iterdir())
    assert names == ["step-00000001", "step-00000002", "step-00000003"]
    first, second = (
        read_json_model(tmp_path / f"{n}.json", RunReport) for n in ("first", "second")
    )
    assert [s.step for s in first.steps + second.steps] == [0, 1, 2]
