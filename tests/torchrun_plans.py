"""Run hand-made or solved plans under real torchrun processes (gloo), one launch per world
size, through tests/distributed_driver.py; each plan's report lands in ``out_dir / name``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autoplan.files import write_json_model
from autoplan.plan.schema import Plan

__all__ = ["run_plans", "torchrun"]

ROOT = Path(__file__).resolve().parent.parent


def torchrun(script: str, args: list[str], nproc: int, timeout_s: int = 300) -> None:
    """``tests/<script> args`` under ``nproc`` standalone torchrun processes, one intra-op thread
    each (the cores are shared); fails the test with the stderr tail on a non-zero exit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            str(ROOT / "tests" / script),
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def run_plans(plans: dict[str, Plan], out_dir: Path, timeout_s: int = 400) -> Path:
    """Train every plan of ``plans`` for the driver's steps; fails the test on a non-zero exit."""
    for world_size in sorted({plan.world_size for plan in plans.values()}):
        plans_dir = out_dir / f"plans-{world_size}"
        plans_dir.mkdir(parents=True, exist_ok=True)
        for name, plan in plans.items():
            if plan.world_size == world_size:
                write_json_model(plans_dir / f"{name}.json", plan)
        torchrun("distributed_driver.py", [str(plans_dir), str(out_dir)], world_size, timeout_s)
    return out_dir
