"""Torchrun driver of the async Pipelined Backpropagation tests: runs every case in one launch.

``python -m torch.distributed.run --standalone --nproc-per-node 4 tests/async_pb_driver.py
OUT N`` runs, one after another in the same four processes, each case of ``CASES`` (pp stages
on ranks 0..pp-1, the other ranks wait) over N micro-batches with the real executor
(``autoplan.runtime.async_stage.run_distributed``, gloo point-to-point transfers). Each stage
saves its final parameters to ``OUT/<case>/stage<s>.pt``; the last stage also its per-micro-batch
losses and the peak number of micro-batches it held to ``OUT/<case>/losses.pt``.

Then, in the same launch, every plan case of ``OUT/plan_cases.json`` (name -> zero_delay,
steps): the plan ``OUT/plans/<name>.json`` (world size 4: stages of several replicas or of tp)
trained by the plan executor (``autoplan.runtime.async_executor.AsyncExecutor``) on the cycle of
batches of ``tests/async_pb_plans.py``; every rank saves its stage's parameters (full tensors)
and the per-step losses to ``OUT/<name>/rank<r>.pt``. Cases named ``train_*`` run through
``autoplan.runtime.trainer.train`` instead (its own data and learning rate), and rank 0 saves
the run report to ``OUT/<name>/report.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.async_executor import AsyncExecutor
from autoplan.runtime.async_stage import run_distributed
from autoplan.runtime.executor_protocol import RankSetup
from autoplan.runtime.launch_check import LaunchEnv, check_launch
from autoplan.runtime.trainer import train
from autoplan.runtime.world import exit_process
from tests import async_pb_plans as plans
from tests import async_pb_task as task

# name -> (pp, zero_delay, weight_prediction, spike_compensation)
CASES: dict[str, tuple[int, bool, bool, bool]] = {
    **{f"zero_pp{p}": (p, True, True, True) for p in (2, 3, 4)},
    **{f"plain_pp{p}": (p, False, False, False) for p in (2, 3, 4)},
    **{f"lwp_pp{p}": (p, False, True, False) for p in (2, 4)},
    **{f"lwpsc_pp{p}": (p, False, True, True) for p in (2, 3, 4)},
}
ZERO_DELAY_MICRO_BATCHES = 24


def main(out_dir: Path, num_micro_batches: int) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    for name, (pp, zero_delay, lwp, sc) in CASES.items():
        if rank < pp:
            (worker,) = task.workers(pp, zero_delay, lwp, sc, stages=[rank], lr=task.LR_STUDY)
            # Exactness needs no long run: zero-delay cases stop after ZERO_DELAY_MICRO_BATCHES.
            n = num_micro_batches
            if zero_delay:
                n = min(n, ZERO_DELAY_MICRO_BATCHES)
            run_distributed(
                worker,
                n,
                boundary_shape=lambda s: (task.MICRO_BATCH, task.WIDTH),
                rank_of_stage=lambda s: s,
                dtype=torch.float64,
            )
            case_dir = out_dir / name
            case_dir.mkdir(parents=True, exist_ok=True)
            params = [p.detach().clone() for p in worker.module.parameters()]
            torch.save(params, case_dir / f"stage{rank}.pt")
            if worker.is_last:
                losses = [worker.losses[i] for i in range(n)]
                saved = {"losses": losses, "peak": worker.peak_in_flight}
                torch.save(saved, case_dir / "losses.pt")
        dist.barrier()
    _plan_cases(out_dir, rank)
    dist.destroy_process_group()


def _plan_cases(out_dir: Path, rank: int) -> None:
    listing = out_dir / "plan_cases.json"
    cases = json.loads(listing.read_text()) if listing.exists() else {}
    for name, case in cases.items():
        plan = read_json_model(out_dir / "plans" / f"{name}.json", Plan)
        if name.startswith("train_"):  # the runtime's entry point, as `autoplan run` calls it
            report = train(plan, case["steps"])
            if rank == 0:
                (out_dir / name).mkdir(parents=True, exist_ok=True)
                write_json_model(out_dir / name / "report.json", report)
            dist.barrier()
            continue
        entry = check_launch(plan, LaunchEnv.from_environ().in_plan(plan))
        setup = RankSetup(plan, entry, torch.device("cpu"), 0, plans.LR)
        engine = AsyncExecutor(setup, zero_delay=case["zero_delay"])
        records = engine.train(plans.batches(plan, case["steps"]))
        params = {
            # full_tensor is a collective of the tp group: its ranks run it in one order.
            name: (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for name, p in engine.models[0].named_parameters()
        }
        case_dir = out_dir / name
        case_dir.mkdir(parents=True, exist_ok=True)
        saved = {"params": params, "losses": [record.loss for record in records]}
        torch.save(saved, case_dir / f"rank{rank}.pt")
        dist.barrier()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
