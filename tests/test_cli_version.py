"""``autoplan --version``: the installed package's version, exit 0, no command needed."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from autoplan.cli import app

ROOT = Path(__file__).resolve().parent.parent


def test_version_prints_the_package_metadata_version_and_exits_0() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0, result.output
    assert result.output == f"autoplan {importlib.metadata.version('autoplan')}\n"


def test_the_installed_command_prints_its_version() -> None:
    # The console script itself, as a user runs it (typer's runner skips the entry point).
    script = Path(sys.executable).parent / "autoplan"
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"autoplan {importlib.metadata.version('autoplan')}"
    assert result.stderr == ""


def test_python_dash_m_autoplan_is_the_same_command() -> None:
    # Where the console script is not on the PATH (a virtual environment not activated).
    result = subprocess.run(
        [sys.executable, "-m", "autoplan", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"autoplan {importlib.metadata.version('autoplan')}"
    missing = subprocess.run(
        [sys.executable, "-m", "autoplan", "validate", "no-such-plan.json"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == ["error: no-such-plan.json: no such file"]
