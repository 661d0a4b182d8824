"""The corpus of bad inputs (tests/bad_inputs/, manifest expected.tsv): each one, run by every
command it concerns, exits 2 with exactly one line on stderr (after the usage, for a bad flag)
that says why, shows no traceback, changes or creates no file, and is done within 30 s.

Commands run in-process (typer's CliRunner), a few through the installed ``autoplan`` to cover
the real entry point. Regenerate the corpus with ``python -m tests.bad_inputs.generate``.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autoplan.cli import app
from autoplan.files import write_json_model
from tests.plan_factory import make_plan

CORPUS = Path(__file__).resolve().parent / "bad_inputs"
REPO = CORPUS.parents[1]
KINDS = ("cluster", "profile", "plan", "flags", "outputs")
TIME_LIMIT_S = 30.0

DEFAULT_COMMANDS = {
    "cluster": [
        "solve {profile} --cluster {input} --global-batch 8 -o {out}",
        "sweep {profile} --cluster {input} --nodes 1 --csv {out}",
    ],
    "profile": [
        "solve {input} --cluster {cluster} --global-batch 8 -o {out}",
        "sweep {input} --cluster {cluster} --nodes 1 --csv {out}",
    ],
    "plan": [
        "validate {input}",
        "show {input}",
        "simulate {input} --out {out}",
        "compare {plan} {input}",
        "launch {input} -o {outdir}",
        "run {input} --local --report {out}",
        "export {input} --to megatron -o {out}",
    ],
}

runner = CliRunner()


@dataclass(frozen=True)
class Case:
    file: str
    command: str  # a template; for flags/outputs, the file's own line
    expect: str
    subprocess: bool

    @property
    def kind(self) -> str:
        return self.file.split("/")[0]


def _cases() -> list[Case]:
    cases = []
    for line in (CORPUS / "expected.tsv").read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        file, expect, commands, how = [*line.split("\t"), "", ""][:4]
        kind = file.split("/")[0]
        if kind in ("flags", "outputs"):
            templates = [(CORPUS / file).read_text().strip()]
        else:
            templates = commands.split("|") if commands else DEFAULT_COMMANDS[kind]
        cases += [Case(file, t, expect, how == "subprocess") for t in templates]
    return cases


CASES = _cases()


def test_the_corpus_is_large_and_every_file_is_in_the_manifest() -> None:
    files = {f"{kind}/{path.name}" for kind in KINDS for path in (CORPUS / kind).iterdir()}
    listed = {case.file for case in CASES}
    assert files == listed
    assert len(files) >= 80
    assert all(len([f for f in files if f.startswith(kind)]) >= 10 for kind in KINDS)


def _snapshot(folder: Path) -> dict[str, str]:
    out = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = Path(root) / name
            relative = str(path.relative_to(folder))
            if path.is_file() and not path.is_symlink():
                out[relative] = hashlib.sha256(path.read_bytes()).hexdigest()
            else:
                out[relative] = "dir" if path.is_dir() else "special"
    return out


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Good inputs the bad ones are combined with."""
    folder = tmp_path_factory.mktemp("good")
    write_json_model(folder / "plan.json", make_plan([2, 2], data_parallel=2))
    shutil.copy(REPO / "profiles" / "gpt2-small.profile.json", folder / "profile.json")
    shutil.copy(REPO / "profiles" / "clusters" / "cpu-local.yaml", folder / "cluster.yaml")
    return folder


def _argv(case: Case, work: Path) -> list[str]:
    values = {
        "input": str(work / Path(case.file).name),
        "plan": str(work / "plan.json"),
        "profile": str(work / "profile.json"),
        "cluster": str(work / "cluster.yaml"),
        "out": str(work / "out.json"),
        "outdir": str(work / "outdir"),
        "tmp": str(work),
        "catalog": str(REPO / "profiles" / "gpus.yaml"),
        "fifo": str(work / "fifo.json"),
        "nl": "\n",
    }
    return [word.format(**values) for word in shlex.split(case.command)]


def _run(case: Case, argv: list[str], cwd: Path, temp: Path) -> tuple[int, str, str]:
    if case.subprocess:
        script = Path(sys.executable).parent / "autoplan"
        done = subprocess.run(
            [str(script), *argv],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=TIME_LIMIT_S,
            env={**os.environ, "TMPDIR": str(temp)},
        )
        return done.returncode, done.stdout, done.stderr
    result = runner.invoke(app, argv, catch_exceptions=True)
    # An exception other than the CLI's own exit is a crash, whatever it printed.
    assert isinstance(result.exception, SystemExit | None), repr(result.exception)
    return result.exit_code, result.stdout, result.stderr


def _run_dirs(temp: Path) -> set[str]:
    return {p.name for p in temp.glob("autoplan-run-*")}


@pytest.mark.parametrize(
    "case", CASES, ids=[f"{case.file}:{case.command.split()[0]}" for case in CASES]
)
def test_a_bad_input_is_one_line_and_exit_2(
    case: Case, fixtures: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A temporary folder of the test's own: the check that a bad input leaves no run folder
    # behind must not see the run folders of tests running beside it.
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    work = tmp_path / "work"
    shutil.copytree(fixtures, work)
    if case.kind not in ("flags", "outputs"):
        shutil.copy(CORPUS / case.file, work / Path(case.file).name)
    if "{fifo}" in case.command:
        os.mkfifo(work / "fifo.json")
    shipped = _snapshot(REPO / "profiles")
    before = _snapshot(work)
    runs = _run_dirs(temp)
    start = time.monotonic()
    code, stdout, stderr = _run(case, _argv(case, work), work, temp)
    elapsed = time.monotonic() - start
    lines = stderr.strip("\n").splitlines()
    assert code == 2, f"exit {code}\nstdout: {stdout}\nstderr: {stderr}"
    assert "Traceback" not in stdout + stderr
    assert lines, "nothing on stderr"
    assert lines[-1].startswith("error: ") and case.expect in lines[-1], lines[-1]
    if case.kind == "flags":
        # A usage error may show the usage and a hint first, nothing else.
        assert all(line.startswith(("Usage:", "Try ")) for line in lines[:-1]), lines
    else:
        assert len(lines) == 1, lines
    assert _snapshot(work) == before, "a file was changed or created"
    assert _snapshot(REPO / "profiles") == shipped
    assert _run_dirs(temp) == runs
    assert elapsed < TIME_LIMIT_S
