"""Run as the ranks of a launch (2 processes, tests/forked_ranks.py): what one tp rank's blocks
hold after a forward pass, with and without sequence parallelism, measured by MemTracker
(``bytes_held_after``).

``python -m torch.distributed.run --nproc-per-node 2 tests/sp_memory_driver.py OUT B S``
writes ``OUT/rank<r>.json``: {"sp": bytes, "tp": bytes} for gpt-tiny in fp32 at micro-batch
B and sequence S.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from autoplan.profile.live_memory import bytes_held_after
from autoplan.runtime.tensor_parallel import apply_tensor_parallel
from autoplan.runtime.world import exit_process
from autoplan.zoo import get_model_spec


def _held(sequence_parallel: bool, batch: int, seq: int) -> int:
    mesh = init_device_mesh("cpu", (2,))
    spec = get_model_spec("gpt-tiny")
    torch.manual_seed(0)
    model = spec.build()
    apply_tensor_parallel(
        model, mesh, spec.tensor_parallel_divisor, sequence_parallel=sequence_parallel
    )
    layers = list(model.layers.values())
    ids = spec.example_input(batch, seq)
    hidden = layers[0](ids)  # the embedding: allocated before the measurement

    def blocks() -> torch.Tensor:
        x = hidden
        for block in layers[1:-1]:
            x = block(x)
        return x.sum()  # keeps nothing of x: what is held is what autograd saved

    held, total = bytes_held_after(model, blocks)
    total.backward()  # the graph was real (and the re-gathers ran)
    return held


def main(out_dir: Path, batch: int, seq: int) -> None:
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])
    result = {"sp": _held(True, batch, seq), "tp": _held(False, batch, seq)}
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    # Ends without the interpreter's teardown, as the runtime does (exit_process says why).
    exit_process(0)
