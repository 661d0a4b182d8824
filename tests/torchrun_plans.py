"""Run hand-made or solved plans under real torchrun processes (gloo), one launch per world
size, through tests/distributed_driver.py; each plan's report lands in ``out_dir / name``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autoplan.files import write_json_model
from autoplan.plan.schema import Plan

__all__ = ["run_plans"]

ROOT = Path(__file__).resolve().parent.parent


def run_plans(plans: dict[str, Plan], out_dir: Path, timeout_s: int = 400) -> Path:
    """Train every plan of ``plans`` for the driver's steps; fails the test on a non-zero exit."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    for world_size in sorted({plan.world_size for plan in plans.values()}):
        plans_dir = out_dir / f"plans-{world_size}"
        plans_dir.mkdir(parents=True, exist_ok=True)
        for name, plan in plans.items():
            if plan.world_size == world_size:
                write_json_model(plans_dir / f"{name}.json", plan)
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                f"--nproc-per-node={world_size}",
                str(ROOT / "tests" / "distributed_driver.py"),
                str(plans_dir),
                str(out_dir),
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout_s,
            check=False,
        )
        assert result.returncode == 0, result.stderr[-4000:]
    return out_dir
