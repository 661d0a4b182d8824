"""The README's examples run as written: every ``autoplan ...`` line of its ```bash blocks, in
order, in one temporary folder with the repository's .venv, exits 0; so does its ```python
block (in a folder of its own).

A few lines run in another form, each listed in ``SUBSTITUTIONS`` with its reason: a line
whose model takes minutes to solve runs on GPT-2 small, and a line that needs what the
README's own context gives (a plan small enough for this machine) gets it. The test fails when
a listed line is no longer in the README (the list would silently test nothing), or when a
bash line is neither an ``autoplan`` command nor listed in ``NOT_RUN`` with its reason. The
README's Llama-2-70B lines themselves were run by hand (they take minutes).

To stay within about a minute on two cores, the chains of lines in ``BESIDE`` (they share no
file with the other lines) and the Python example run beside the ordered chain of the others,
two at a time.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
BIN = Path(sys.executable).parent
TIMEOUT_S = 120

# README line → (the commands run instead, why).
SUBSTITUTIONS: dict[str, tuple[list[str], str]] = {
    "autoplan profile llama2-70b --seq 4096 -o llama2-70b.json": (
        ["autoplan profile gpt2-small --seq 1024 -o small.json"],
        "the Llama-2-70B profile is only the input of solves that take a minute each; the "
        "lines below run on GPT-2 small instead",
    ),
    "autoplan solve llama2-70b.json --cluster h100-a100-l4 --global-batch 256 -o plan.json": (
        ["autoplan solve small.json --cluster h100-a100-l4 --global-batch 256 -o plan.json"],
        "Llama-2-70B's search on h100-a100-l4 runs to its 60 s time limit",
    ),
    "autoplan solve llama2-70b.json --cluster h100-a100-l4 --global-batch 256 --tp 4 --pp 8 "
    "-o pinned.json": (
        [
            "autoplan solve small.json --cluster h100-a100-l4 --global-batch 256 --tp 4 --pp 8 "
            "-o pinned.json --time-limit 2"
        ],
        "Llama-2-70B's pinned search takes about a minute; GPT-2 small's is held to 2 s (its "
        "best found is a plan all the same)",
    ),
    "autoplan sweep llama2-70b.json --cluster h100-a100-l4 --nodes 6,12,24 --global-batch "
    "256,512 --price H100=3.0 --price A100-80GB=1.8 --price L4=0.8 --csv sweep.csv --png "
    "sweep.png": (
        [
            "autoplan sweep small.json --cluster h100-a100-l4 --nodes 3,6 --global-batch 256,512 "
            "--price H100=3.0 --price A100-80GB=1.8 --price L4=0.8 --csv sweep.csv --png "
            "sweep.png --time-limit 1"
        ],
        "six Llama-2-70B solves of 20 s each; GPT-2 small on two smaller sizes, each solve "
        "held to 1 s",
    ),
    "autoplan sweep llama2-70b.json --cluster mixed-1024 --nodes 16,32 --gpu-mix "
    "H100=0.25,A100-80GB=0.75 --global-batch 512 --tokens 2e12": (
        [
            "autoplan sweep small.json --cluster mixed-1024 --nodes 4,8 --gpu-mix "
            "H100=0.25,A100-80GB=0.75 --global-batch 512 --tokens 2e12 --time-limit 1"
        ],
        "two Llama-2-70B solves on 128 and 256 GPUs of 20 s each; GPT-2 small on 4 and 8 "
        "nodes, each solve held to 1 s",
    ),
    "autoplan validate plan.json --profile llama2-70b.json": (
        ["autoplan validate plan.json --profile small.json"],
        "plan.json is solved from small.json here",
    ),
    "autoplan run plan.json --local --steps 5 --report run.json": (
        [
            "autoplan solve tiny.json --cluster cpu-local --global-batch 8 -o local-plan.json",
            "autoplan run local-plan.json --local --steps 5 --report run.json",
        ],
        "--local runs small plans on this machine's CPUs, as the README's comment says; "
        "plan.json is for 48 GPUs, so the gpt-tiny profile of step 1 is solved on cpu-local",
    ),
    "autoplan run plan.json --local --steps 2 --data tokens.npy --checkpoint-dir ckpt "
    "--save-every 1": (
        [
            "autoplan run local-plan.json --local --steps 2 --data tokens.npy --checkpoint-dir "
            "ckpt --save-every 1"
        ],
        "the cpu-local plan of the line above; tokens.npy is gpt-tiny token ids (_prepare)",
    ),
    "autoplan run plan.json --local --steps 4 --data tokens.npy --checkpoint-dir ckpt --resume": (
        [
            "autoplan run local-plan.json --local --steps 4 --data tokens.npy --checkpoint-dir "
            "ckpt --resume"
        ],
        "resumes the checkpoint of the line above",
    ),
}

_FIDELITY = (
    "autoplan fidelity ../shared/calibration/measured_runs.csv --profile "
    "OPT-350=profiles/calibration/opt-350.megatron.tf32.profile.json --layer-times "
    "../shared/calibration/layer_times.csv"
)
_CALIBRATION = REPO.parent / "shared" / "calibration"
SUBSTITUTIONS[_FIDELITY] = (
    [
        f"autoplan fidelity {_CALIBRATION / 'measured_runs.csv'} --profile OPT-350="
        f"{REPO / 'profiles/calibration/opt-350.megatron.tf32.profile.json'} --layer-times "
        f"{_CALIBRATION / 'layer_times.csv'}"
        if (_CALIBRATION / "measured_runs.csv").is_file()
        else "autoplan fidelity --help"
    ],
    "the README names ../shared beside the repository; the test runs in a folder of its own "
    "(where ../shared is absent, only the command's help)",
)

# Bash lines that are not autoplan commands, and why they are not run here.
NOT_RUN: dict[str, str] = {
    "make demo": "sets up .venv and runs scripts/demo.sh (a minute); its steps are the "
    "commands of this README",
    "make test": "runs the whole suite, this test included",
    "python -m autoplan.runtime plan.json --steps 100 --report run.json": "what each torchrun "
    "process runs, under torchrun's environment; `autoplan run --local` starts it so",
}

# Chains of README lines that share no file with the other lines: each runs, in its order,
# beside the ordered chain of the rest. Why each may.
BESIDE: list[tuple[list[str], str]] = [
    (["autoplan models"], "reads and writes no file"),
    ([_FIDELITY], "reads shipped files only and writes none"),
    (
        ["autoplan profile mypkg.models:build --seq 1024 -o mine.json"],
        "writes mine.json, which no other line reads",
    ),
    # Not the gpt-tiny profile and the local run: four torchrun processes beside other work
    # spin on gloo and cost more CPU than they save.
]

# The README's own example package ('mypkg.models:build' in step 1): autoplan finds it in the
# current folder. A small embedding + MLP stack that takes any sequence length.
_FACTORY = textwrap.dedent(
    """
    import torch
    from torch import nn


    def build(batch_size=1, seq_len=1024):
        model = nn.Sequential(
            nn.Embedding(512, 64),
            nn.Linear(64, 256),
            nn.GELU(),
            nn.Linear(256, 64),
            nn.Linear(64, 512),
        )
        return model, torch.randint(0, 512, (batch_size, seq_len))
    """
)

_FENCE = re.compile(r"^```(\w*)\s*$")


def _blocks(language: str) -> list[str]:
    """The README's fenced blocks of ``language``, in order."""
    blocks, current, inside = [], [], None
    for line in README.read_text().splitlines():
        fence = _FENCE.match(line)
        if fence and inside is None:
            inside, current = fence.group(1), []
        elif line.startswith("```") and inside is not None:
            if inside == language:
                blocks.append("\n".join(current))
            inside = None
        elif inside is not None:
            current.append(line)
    return blocks


def _bash_lines() -> list[str]:
    """Every command line of the bash blocks, comments dropped, whitespace normalised."""
    lines = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                lines.append(" ".join(words))
    return lines


def _prepare(folder: Path) -> dict[str, str]:
    """The folder the commands run in: the shipped files they name, the example factory;
    the environment, with the .venv first on PATH."""
    named = {
        word for line in _bash_lines() for word in line.split() if word.startswith("profiles/")
    }
    for block in _blocks("python"):
        named |= set(re.findall(r"profiles/[\w./-]+\.json", block))
    for name in named:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, folder / name)
    # The token file of the run lines: ids of gpt-tiny's 128-token vocabulary.
    tokens = [(i * 37 + 11) % 128 for i in range(20_000)]
    np.save(folder / "tokens.npy", np.array(tokens, dtype=np.uint16))
    (folder / "mypkg").mkdir()
    (folder / "mypkg" / "__init__.py").write_text("")
    (folder / "mypkg" / "models.py").write_text(_FACTORY)
    return {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}


def _commands(line: str) -> list[str]:
    """What the test runs for a README line: the line, or its substitution."""
    return SUBSTITUTIONS[line][0] if line in SUBSTITUTIONS else [line]


def _run(argv: list[str], folder: Path, environment: dict[str, str]) -> str | None:
    """None when ``argv`` (its first word a .venv program) exits 0, else what it printed
    last."""
    command = [str(BIN / argv[0]), *argv[1:]]
    done = subprocess.run(
        command, cwd=folder, env=environment, capture_output=True, text=True, timeout=TIMEOUT_S
    )
    if done.returncode == 0:
        return None
    return f"{shlex.join(argv)}\n  exit {done.returncode}: {(done.stdout + done.stderr)[-1500:]}"


def test_every_listed_line_is_still_in_the_readme_and_every_line_is_accounted_for() -> None:
    lines = _bash_lines()
    beside = [line for chain, _ in BESIDE for line in chain]
    for listed in (list(SUBSTITUTIONS), list(NOT_RUN), beside):
        assert [key for key in listed if key not in lines] == []
    unknown = [line for line in lines if line.split()[0] != "autoplan" and line not in NOT_RUN]
    assert unknown == [], "a README line that is not an autoplan command: list it in NOT_RUN"
    assert all(reason for _, reason in SUBSTITUTIONS.values())
    assert len(_blocks("python")) == 1


@pytest.mark.distributed  # `autoplan run --local` starts torchrun
def test_the_readme_examples_run(tmp_path: Path) -> None:
    bash, python = tmp_path / "bash", tmp_path / "python"
    bash.mkdir()
    python.mkdir()
    environment = _prepare(bash)
    _prepare(python)
    (block,) = _blocks("python")
    (python / "example.py").write_text(block)
    beside = {line for chain, _ in BESIDE for line in chain}
    chain = [line for line in _bash_lines() if line not in NOT_RUN and line not in beside]

    def run_lines(lines: list[str]) -> list[str]:
        """Each line's commands in order, in the bash folder: what failed."""
        return [
            failure
            for line in lines
            for command in _commands(line)
            if (failure := _run(shlex.split(command), bash, environment)) is not None
        ]

    def run_example() -> list[str]:
        failure = _run(["python", "example.py"], python, environment)
        return [] if failure is None else [failure]

    with ThreadPoolExecutor(max_workers=2) as pool:
        jobs = [pool.submit(run_lines, lines) for lines, _ in BESIDE]
        jobs.append(pool.submit(run_example))
        failures = run_lines(chain)
        for job in jobs:
            failures += job.result()
    assert failures == [], "\n".join(failures)
    # The files the README says the commands write are there.
    for name in ("plan.json", "grid.json", "t.json", "timeline.png", "sweep.csv", "sweep.png"):
        assert (bash / name).stat().st_size > 0, name
    assert (bash / "run.json").is_file() and (bash / "launch").is_dir()
    assert (python / "plan.json").is_file() and (python / "sweep.png").is_file()
