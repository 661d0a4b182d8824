"""Process groups: the backend (NCCL on CUDA, gloo on CPU) and the plan's (pp, dp, tp) mesh."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from autoplan.errors import LaunchMismatchError
from autoplan.plan.schema import Plan, RankEntry
from autoplan.runtime.launch_check import LaunchEnv

__all__ = ["MESH_DIMS", "build_mesh", "init_distributed"]

logger = logging.getLogger(__name__)

MESH_DIMS = ("pp", "dp", "tp")


def init_distributed(env: LaunchEnv) -> torch.device:
    """Join the default process group (once per process) and return this rank's device.

    NCCL when every process of this node has a CUDA device of its own, gloo otherwise;
    decided here, at run time, so one plan runs on a GPU cluster and on a laptop. (Deciding by
    node, not by process, keeps one backend per launch: 4 processes on a 1-GPU machine all use
    gloo rather than mixing NCCL and gloo.)
    """
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= env.local_world_size
    device = torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "nccl" if use_cuda else "gloo"
        if env.world_size == 1 and not _launched_by_torchrun():
            # A single process started without torchrun has no rendezvous address.
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        else:
            dist.init_process_group(backend, device_id=device if use_cuda else None)
        logger.info("rank %d/%d joined with %s on %s", env.rank, env.world_size, backend, device)
    return device


def _launched_by_torchrun() -> bool:
    return "MASTER_ADDR" in os.environ


def build_mesh(plan: Plan, device: torch.device, entry: RankEntry) -> DeviceMesh:
    """The (pp, dp, tp) DeviceMesh of the plan; checks this rank sits where the rank map says."""
    par = plan.parallelism
    shape = (par.pipeline_degree, par.data_parallel_degree, par.tensor_parallel_degree)
    mesh = init_device_mesh(device.type, shape, mesh_dim_names=MESH_DIMS)
    coordinate = mesh.get_coordinate()
    expected = [entry.pipeline_rank, entry.dp_index, entry.tp_index]
    if coordinate is None or list(coordinate) != expected:
        raise LaunchMismatchError(
            f"rank {entry.rank} is at (pp, dp, tp) = {coordinate} of the row-major mesh "
            f"{shape}, but the plan's rank map says {tuple(expected)}"
        )
    return mesh
