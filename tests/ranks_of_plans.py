"""Run hand-made or solved plans in real processes (gloo), one launch per world size, through
tests/distributed_driver.py; each plan's report lands in ``out_dir / name``. The ranks are
forked with torchrun's variables (tests/forked_ranks.py says why not torchrun itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from autoplan.files import write_json_model
from autoplan.plan.schema import Plan

__all__ = ["run_plans", "run_ranks"]

ROOT = Path(__file__).resolve().parent.parent


def run_ranks(script: str, args: list[str], nproc: int, timeout_s: int = 300) -> None:
    """``tests/<script> args`` as ``nproc`` ranks of one node (tests/forked_ranks.py: forked,
    with torchrun's variables), one intra-op thread each (the cores are shared); fails the test
    with the stderr tail on a non-zero exit, and kills every rank on a time-out."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [
        sys.executable,
        str(ROOT / "tests" / "forked_ranks.py"),
        str(nproc),
        str(ROOT / "tests" / script),
        *args,
    ]
    with subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    ) as launch:
        try:
            _, stderr = launch.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(launch.pid, signal.SIGKILL)
            _, stderr = launch.communicate()
            raise AssertionError(f"{script} ran past {timeout_s} s: {stderr[-4000:]}") from None
    assert launch.returncode == 0, stderr[-4000:]


def run_plans(plans: dict[str, Plan], out_dir: Path, timeout_s: int = 400) -> Path:
    """Train every plan of ``plans`` for the driver's steps; fails the test on a non-zero exit."""
    for world_size in sorted({plan.world_size for plan in plans.values()}):
        plans_dir = out_dir / f"plans-{world_size}"
        plans_dir.mkdir(parents=True, exist_ok=True)
        for name, plan in plans.items():
            if plan.world_size == world_size:
                write_json_model(plans_dir / f"{name}.json", plan)
        run_ranks("distributed_driver.py", [str(plans_dir), str(out_dir)], world_size, timeout_s)
    return out_dir
