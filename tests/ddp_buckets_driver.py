"""Run as a plain process (``python tests/ddp_buckets_driver.py``): one-process gloo group,
a plain DDP and the runtime's ``replicate`` each run one backward; prints one JSON line
{"params", "plain_bucket_bytes", "runtime_bucket_bytes", "runtime_state_bytes"}.

Not in the test process itself: the DDP reducers hold their gloo group in C++, and when the
last of them goes (a test's frame cleared) the group's destructor joins its worker threads
while holding the GIL; a worker still releasing a finished all-reduce's work needs the GIL to
drop its tensors' Python objects, and both wait for ever (seen once in the suite: a pytest
worker hung in ``~ProcessGroupGloo`` → ``thread::join`` beside a gloo thread in
``take_gil``; pytorch/pytorch#56297). The runtime's ``exit_process`` ends here instead,
without the teardown, as a training rank does.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from autoplan.runtime.data_parallel import replicate
from autoplan.runtime.memory import gradient_bucket_bytes, model_state_bytes
from autoplan.runtime.world import exit_process


def main() -> None:
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 4096))
    params = sum(p.numel() for p in model.parameters())
    plain = nn.parallel.DistributedDataParallel(model)
    plain(torch.randn(2, 512)).sum().backward()

    other = nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 4096))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
    ddp = replicate(other, mesh, torch.device("cpu"), find_unused_parameters=False)
    ddp(torch.randn(2, 512)).sum().backward()
    figures = {
        "params": params,
        "plain_bucket_bytes": gradient_bucket_bytes(plain),
        "runtime_bucket_bytes": gradient_bucket_bytes(ddp),
        "runtime_state_bytes": model_state_bytes([other], [], [ddp]),
    }
    print(json.dumps(figures), flush=True)
    exit_process(0)


if __name__ == "__main__":
    main()
