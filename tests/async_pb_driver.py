"""Torchrun driver of the async Pipelined Backpropagation tests: runs every case in one launch.

``python -m torch.distributed.run --standalone --nproc-per-node 4 tests/async_pb_driver.py
OUT N`` runs, one after another in the same four processes, each case of ``CASES`` (pp stages
on ranks 0..pp-1, the other ranks wait) over N micro-batches with the real executor
(``autoplan.runtime.async_pb.run_distributed``, gloo point-to-point transfers). Each stage
saves its final parameters to ``OUT/<case>/stage<s>.pt``; the last stage also its per-micro-batch
losses and the peak number of micro-batches it held to ``OUT/<case>/losses.pt``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from autoplan.runtime.async_pb import run_distributed
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
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
