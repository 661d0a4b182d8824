"""The small commands start without the heavy libraries: ``autoplan --help``, ``gpus``,
``clusters`` and ``models`` (its rows cached: autoplan.cli.zoo_table) import neither torch nor
NumPy, matplotlib or PuLP (issue 26 measured `models` at 6-15 s and `--help` at 1.2-1.6 s when
every command module imported them). What is imported is checked, not the time: a fresh
interpreter runs the command and reports the modules it loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autoplan.cli.zoo_table import cache_path, zoo_rows

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "numpy", "matplotlib", "pulp", "scipy", "highspy")

_RUN = """
import contextlib, io, json, os, sys
from autoplan.cli import app
out, code = io.StringIO(), None
with contextlib.redirect_stdout(out):
    try:
        app(sys.argv[1:], prog_name="autoplan")
    except SystemExit as exit:
        code = exit.code
heavy = [name for name in os.environ["HEAVY_MODULES"].split(",") if name in sys.modules]
commands = sorted(
    name for name in sys.modules if name.startswith("autoplan.cli.") and name.endswith("_cmd")
)
print(json.dumps({"code": code, "out": out.getvalue(), "heavy": heavy, "commands": commands}))
"""


def _run(args: list[str], cache: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "XDG_CACHE_HOME": str(cache)}
    env |= {"COLUMNS": "200", "HEAVY_MODULES": ",".join(HEAVY)}
    result = subprocess.run(
        [sys.executable, "-c", _RUN, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("args", [["--help"], ["gpus"], ["clusters"], ["solve", "--help"]])
def test_small_commands_import_no_heavy_library(args: list[str], tmp_path: Path) -> None:
    run = _run(args, tmp_path)
    assert run["code"] in (0, None), run
    assert run["out"].strip(), "the command printed nothing"
    assert run["heavy"] == [], f"`autoplan {' '.join(args)}` imported {run['heavy']}"


@pytest.mark.parametrize(
    ("args", "module"), [(["solve", "--help"], "solve_cmd"), (["gpus"], "catalog_cmd")]
)
def test_a_command_loads_only_its_own_module(args: list[str], module: str, tmp_path: Path) -> None:
    """A command imports its own module and no other command's (``COMMAND_MODULES``): the
    solve path pays for neither the runtime's, the calibration's nor the viewers' commands."""
    run = _run(args, tmp_path)
    assert run["code"] in (0, None), run
    assert run["commands"] == [f"autoplan.cli.{module}"], run["commands"]


def test_help_lists_every_command(tmp_path: Path) -> None:
    """``--help`` loads every command module: each command of ``COMMAND_MODULES`` is listed."""
    from autoplan.cli.app import COMMAND_MODULES

    run = _run(["--help"], tmp_path)
    assert len(run["commands"]) == len(set(COMMAND_MODULES.values()))
    for name in COMMAND_MODULES:
        assert f" {name} " in run["out"], name


def test_models_lists_the_zoo_from_its_cache_without_torch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    rows = zoo_rows()  # computed here (torch, the zoo on the meta device) and cached
    assert cache_path().is_file() and cache_path().is_relative_to(tmp_path)
    run = _run(["models"], tmp_path)
    assert run["code"] in (0, None), run
    assert run["heavy"] == [], f"`autoplan models` imported {run['heavy']}"
    listed = run["out"]
    for row in rows:
        assert row[0] in listed and row[2] in listed, row
    # The cached rows are the zoo's own: a second computation without the cache agrees.
    from autoplan.zoo.registry import get_model_spec, model_names

    assert [row[0] for row in rows] == model_names()
    assert rows[0][2] == f"{get_model_spec(model_names()[0]).parameter_count():,}"


def test_a_damaged_cache_is_recomputed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = cache_path()
    path.parent.mkdir(parents=True)
    path.write_text('{"columns": ["name"], "rows": [["made-up"]]}')
    rows = zoo_rows()
    assert rows[0][0] != "made-up" and len(rows[0]) == 9
    assert json.loads(path.read_text())["rows"] == rows
