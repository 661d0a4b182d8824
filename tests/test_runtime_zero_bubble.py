"""Zero-bubble schedules on real torchrun processes (gloo, float64) through PyTorch's own
schedule classes: ZB-H1 (interleaved zero bubble, one stage per rank), ZB1P (two stages per
rank, under full recompute), ZB-V and DualPipeV (stages in a V) each give the loss and
gradients of single-process training within 1e-10. One launch runs every plan (all are
pp 2, dp 1, so world size 2)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.report import RunReport
from tests.distributed_driver import STEPS
from tests.plan_factory import make_plan
from tests.single_process_reference import reference_training

pytestmark = pytest.mark.distributed

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 1e-10


def zero_bubble_plans(data_parallel: int = 1) -> dict[str, Plan]:
    """Name → plan; gpt-tiny has 6 layers (embed, 4 blocks, head)."""
    common = {"data_parallel": data_parallel}
    return {
        "zbh1_pp2": make_plan(
            [3, 3], schedule="interleaved_zero_bubble", num_micro_batches=4, **common
        ),
        "zb1p_pp2_v2": make_plan(
            [2, 1, 1, 2],
            virtual_stages_per_rank=2,
            schedule="interleaved_zero_bubble",
            num_micro_batches=4,
            recompute="full",
            **common,
        ),
        "zbv_pp2": make_plan(
            [2, 1, 1, 2], virtual_stages_per_rank=2, schedule="zbv", num_micro_batches=3, **common
        ),
        "dualpipev_pp2": make_plan(
            [1, 2, 2, 1],
            virtual_stages_per_rank=2,
            schedule="dualpipev",
            num_micro_batches=6,
            **common,
        ),
    }


def run_plans(plans: dict[str, Plan], plans_dir: Path, out_dir: Path) -> None:
    """All ``plans`` (one world size) in one torchrun launch of the test driver."""
    for name, plan in plans.items():
        write_json_model(plans_dir / f"{name}.json", plan)
    (world_size,) = {plan.world_size for plan in plans.values()}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc-per-node={world_size}", str(ROOT / "tests" / "distributed_driver.py")]
    result = subprocess.run(
        [*command, str(plans_dir), str(out_dir)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]


def largest_gradient_error(plan: Plan, out_dir: Path) -> tuple[float, float]:
    """(largest loss error, largest gradient error) of a run against single-process training."""
    losses, reference = reference_training(plan, STEPS)
    report = read_json_model(out_dir / "report.json", RunReport)
    assert [record.step for record in report.steps] == list(range(STEPS))
    loss_error = max(abs(r.loss - e) for r, e in zip(report.steps, losses, strict=True))
    grad_error = 0.0
    for step in range(STEPS):
        covered: set[str] = set()
        for rank in range(plan.world_size):
            dumped = torch.load(out_dir / f"rank{rank}_step{step}.pt")
            for name, grad in dumped.items():
                grad_error = max(grad_error, (grad - reference[step][name]).abs().max().item())
                covered.add(name)
        assert covered == set(reference[step]), set(reference[step]) ^ covered
    return loss_error, grad_error


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("runs")
    run_plans(zero_bubble_plans(), tmp_path_factory.mktemp("plans"), out_dir)
    return out_dir


@pytest.mark.parametrize("name", list(zero_bubble_plans()))
def test_zero_bubble_training_equals_single_process(runs: Path, name: str) -> None:
    loss_error, grad_error = largest_gradient_error(zero_bubble_plans()[name], runs / name)
    assert loss_error < TOLERANCE
    assert grad_error < TOLERANCE
