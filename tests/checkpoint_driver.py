"""Test driver run under torchrun: a chain of runs of one model, each resuming from the
checkpoint the run before it saved, each under its own plan.

``python -m torch.distributed.run --nproc-per-node W tests/checkpoint_driver.py CHAIN OUT``
reads ``CHAIN`` (JSON: ``{"data": token file, "runs": [{"name", "plan", "steps",
"save_every"}]}``) and trains each run in order in the same processes, on the token file,
with checkpoints in ``OUT/checkpoints`` (every run but the first resumes); rank 0 writes each
run's report to ``OUT/<name>.json``.
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
from autoplan.runtime.mesh import exit_process
from autoplan.runtime.token_data import TokenSource
from autoplan.runtime.trainer import train


def main(chain_path: Path, out_dir: Path) -> None:
    chain = json.loads(chain_path.read_text())
    rank = int(os.environ["RANK"])
    data = TokenSource(Path(chain["data"]))
    for position, run in enumerate(chain["runs"]):
        plan = read_json_model(run["plan"], Plan)
        config = CheckpointConfig(out_dir / "checkpoints", run["save_every"], resume=position > 0)
        report = train(plan, run["steps"], data=data, checkpoint=config)
        if rank == 0:
            write_json_model(out_dir / f"{run['name']}.json", report)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
