"""Test driver run as the ranks of a launch (tests/forked_ranks.py, or torchrun): chains of runs
of one model, each run resuming from the checkpoint the run before it saved, each under its own
plan.

``python -m torch.distributed.run --nproc-per-node W tests/checkpoint_driver.py OUT CHAIN...``
reads each ``CHAIN`` (JSON: ``{"data": token file, "runs": [{"name", "plan", "steps",
"save_every"}]}``) and trains its runs in order in the same processes, on the token file,
with checkpoints in ``OUT/<chain>/checkpoints`` (every run but the first resumes); rank 0
writes each run's report to ``OUT/<chain>/<name>.json`` (``<chain>``: the file's stem).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch.distributed as dist

from autoplan.files import read_json_model, write_json_model
from autoplan.plan.schema import Plan
from autoplan.runtime.checkpoint import CheckpointConfig
from autoplan.runtime.token_data import TokenSource
from autoplan.runtime.trainer import train
from autoplan.runtime.world import exit_process


def run_chain(chain_path: Path, out_dir: Path, rank: int) -> None:
    """Train one chain's runs in order (module docstring)."""
    chain = json.loads(chain_path.read_text())
    data = TokenSource(Path(chain["data"]))
    for position, run in enumerate(chain["runs"]):
        plan = read_json_model(run["plan"], Plan)
        config = CheckpointConfig(out_dir / "checkpoints", run["save_every"], resume=position > 0)
        report = train(plan, run["steps"], data=data, checkpoint=config)
        if rank == 0:
            write_json_model(out_dir / f"{run['name']}.json", report)
        dist.barrier()


def main(out_dir: Path, chains: list[Path]) -> None:
    rank = int(os.environ["RANK"])
    for chain_path in chains:
        run_chain(chain_path, out_dir / chain_path.stem, rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), [Path(arg) for arg in sys.argv[2:]])
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
