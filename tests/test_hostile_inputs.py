"""Security: names and paths from a plan, a cluster or the command line cannot run shell code.

Every name field of a plan gets each hostile payload (a newline, ';', '$()', backticks,
quotes, '/', a leading '-'). For each, `autoplan launch` either refuses the plan (one line,
exit 2, no script written) or writes scripts that `bash -n` accepts and that, run with
stand-in torchrun/srun/scontrol on PATH, create no marker file. Paths (the plan's own file
name, the output folder, --report) are free text a user chose: they must come through quoted,
byte for byte.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import write_json_model
from tests.fake_cluster_tools import install_fake_tools, read_calls, run_script
from tests.plan_factory import make_plan

runner = CliRunner()

MARKER_NAME = "pwned"
PAYLOADS = [
    "x\ntouch {marker}",
    "x;touch {marker}",
    "$(touch {marker})",
    "`touch {marker}`",
    "x' ; touch {marker} ; '",
    'x" ; touch {marker} ; "',
    "x&&touch {marker}",
    "../../x",
    "-x",
]

Edit = Callable[[dict[str, Any], str], None]


def _set(*path: Any) -> Edit:
    def edit(data: dict[str, Any], value: str) -> None:
        target = data
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value

    return edit


def _every(collection: tuple[Any, ...], key: str) -> Edit:
    """Set ``key`` in every item of the list at ``collection``."""

    def edit(data: dict[str, Any], value: str) -> None:
        target: Any = data
        for part in collection:
            target = target[part]
        for item in target:
            item[key] = value

    return edit


def _every_replica(key: str) -> Edit:
    def edit(data: dict[str, Any], value: str) -> None:
        for stage in data["stages"]:
            for replica in stage["replicas"]:
                replica[key] = value

    return edit


def _group_name(data: dict[str, Any], value: str) -> None:
    # Renamed consistently everywhere, as a hostile author would.
    old = data["inputs"]["cluster"]["node_groups"][0]["name"]
    text = json.dumps(data).replace(f'"{old}-', '"' + json.dumps(value)[1:-1] + "-")
    data.clear()
    data.update(json.loads(text))
    data["inputs"]["cluster"]["node_groups"][0]["name"] = value


def _gpu_type(data: dict[str, Any], value: str) -> None:
    text = json.dumps(data).replace('"cpu"', json.dumps(value))
    data.clear()
    data.update(json.loads(text))


FIELDS: dict[str, Edit] = {
    "cluster name": _set("inputs", "cluster", "name"),
    "node group name (everywhere)": _group_name,
    "GPU type (everywhere)": _gpu_type,
    "plan node name": _every(("nodes",), "name"),
    "plan node GPU type": _every(("nodes",), "gpu_type"),
    "rank map node": _every(("rank_map",), "node"),
    "rank map GPU type": _every(("rank_map",), "gpu_type"),
    "replica node": _every_replica("node"),
    "replica GPU type": _every_replica("gpu_type"),
    "memory estimate GPU type": _every(("prediction", "memory"), "gpu_type"),
    "model name": _set("inputs", "model", "name"),
    "dtype": _set("inputs", "dtype"),
    "strategy": _set("inputs", "strategy"),
    "profile hash": _set("inputs", "profile_sha256"),
}


def _plan_data() -> dict[str, Any]:
    return json.loads(make_plan([2, 2], data_parallel=2).model_dump_json())


def _run_all_scripts(out: Path, tmp_path: Path) -> list[Any]:
    bin_dir, log_dir = install_fake_tools(tmp_path / "fake")
    env = {
        "MASTER_ADDR": "127.0.0.1",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "h1,h2,h3",
        "SLURM_JOB_NODELIST_HET_GROUP_0": "h1",
        "SLURM_JOB_NODELIST_HET_GROUP_1": "h2",
    }
    for script in sorted(out.iterdir()):
        check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert check.returncode == 0, f"{script.name}: {check.stderr}"
        run_script(script, bin_dir, log_dir, env=env, cwd=tmp_path / "fake")
    return read_calls(log_dir)


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
@pytest.mark.parametrize("field", list(FIELDS))
def test_hostile_names_are_refused_or_inert(tmp_path: Path, field: str, payload: str) -> None:
    marker = tmp_path / MARKER_NAME
    data = _plan_data()
    FIELDS[field](data, payload.format(marker=marker))
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps(data))
    out = tmp_path / "out"
    result = runner.invoke(app, ["launch", str(plan_path), "-o", str(out)])
    assert "Traceback" not in result.output
    if result.exit_code != 0:
        assert result.exit_code == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
        assert not out.exists()
    else:
        _run_all_scripts(out, tmp_path)
    for command in (["validate", str(plan_path)], ["show", str(plan_path)]):
        checked = runner.invoke(app, command)
        if result.exit_code != 0:  # what launch refuses, every plan reader refuses
            assert checked.exit_code == 2 and checked.stderr.count("\n") == 1, checked.output
    assert not marker.exists()


@pytest.mark.parametrize("payload", PAYLOADS, ids=range(len(PAYLOADS)))
def test_hostile_paths_come_through_quoted_byte_for_byte(tmp_path: Path, payload: str) -> None:
    marker = tmp_path / MARKER_NAME
    text = payload.format(marker=marker).replace("/", "_")
    folder = tmp_path / f"dir {text}"
    folder.mkdir()
    plan_path = folder / f"{text}.json"
    write_json_model(plan_path, make_plan([2, 2], data_parallel=2))
    out = tmp_path / f"out {text}"
    report = str(folder / f"report {text}.json")
    result = runner.invoke(
        app,
        ["launch", str(plan_path), "-o", str(out), "--report", report, "--rdzv-backend", "c10d"],
    )
    if "\n" in text:  # a --report with a line break is refused, one line
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, result.output
        assert not out.exists()
        return
    assert result.exit_code == 0, result.output
    calls = _run_all_scripts(out, tmp_path)
    assert calls, "the scripts ran torchrun"
    for call in calls:
        assert str(plan_path.resolve()) in call.argv
        assert call.argv[call.argv.index("--report") + 1] == str(Path(report).resolve())
    assert not marker.exists()


def test_a_hostile_master_address_is_refused(tmp_path: Path) -> None:
    plan_path = tmp_path / "plan.json"
    write_json_model(plan_path, make_plan([2, 2]))
    for address in ("$(touch x)", "a b", "a\nb", "-x", "host;id"):
        result = runner.invoke(
            app, ["launch", str(plan_path), "-o", str(tmp_path / "o"), "--master-addr", address]
        )
        assert result.exit_code == 2 and "not a host name" in result.stderr.splitlines()[-1]
    assert not (tmp_path / "o").exists()
