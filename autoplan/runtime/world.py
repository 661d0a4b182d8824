"""A training process's life in the world: its device, joining the default process group
(NCCL on CUDA, gloo on CPU), and leaving it (``exit_process``)."""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn

import torch
import torch.distributed as dist

from autoplan.errors import LaunchMismatchError
from autoplan.runtime.launch_check import LaunchEnv

__all__ = ["exit_process", "init_distributed", "local_device"]

logger = logging.getLogger(__name__)


def local_device(env: LaunchEnv) -> torch.device:
    """This rank's device: CUDA device ``LOCAL_RANK`` when every process of this node has a
    CUDA device of its own, else the CPU.

    Decided here, at run time, so one plan runs on a GPU cluster and on a laptop. (Deciding by
    node, not by process, keeps one backend per launch: 4 processes on a 1-GPU machine all use
    gloo rather than mixing NCCL and gloo.)
    """
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= env.local_world_size
    return torch.device("cuda", env.local_rank) if use_cuda else torch.device("cpu")


def init_distributed(env: LaunchEnv, device: torch.device) -> None:
    """Join the default process group (once per process): NCCL on CUDA, gloo on the CPU."""
    use_cuda = device.type == "cuda"
    if use_cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return
    backend = "nccl" if use_cuda else "gloo"
    if env.world_size == 1 and not _launched_by_torchrun():
        # A single process started without torchrun has no rendezvous address.
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    elif env.launcher_rank is not None:
        # A c10d launch numbered this worker otherwise (launch_check): join under the plan's
        # rank. Safe only when every worker is a client of torchrun's agent store; with its own
        # store, rank 0 would host it where torchrun's rank 0 was expected.
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
            raise LaunchMismatchError(
                f"torchrun numbered this worker {env.launcher_rank} but the plan's rank is "
                f"{env.rank}, and torchrun shares no agent store (TORCH_DISABLE_SHARE_RDZV_TCP_"
                "STORE is set?): launch with --rdzv-backend static, or without that variable"
            )
        dist.init_process_group(
            backend,
            rank=env.rank,
            world_size=env.world_size,
            device_id=device if use_cuda else None,
        )
    else:
        dist.init_process_group(backend, device_id=device if use_cuda else None)
    numbered = "" if env.launcher_rank is None else f" (torchrun's rank {env.launcher_rank})"
    logger.info(
        "rank %d/%d%s joined with %s on %s", env.rank, env.world_size, numbered, backend, device
    )


def _launched_by_torchrun() -> bool:
    return "MASTER_ADDR" in os.environ


def exit_process(code: int) -> NoReturn:
    """End a training process: destroy its process groups, flush, and exit with ``code``
    without the interpreter's teardown (every rank's entry point ends here).

    Why not a normal exit: process groups that torch objects still hold in C++ (DeviceMesh
    sub-groups, DDP's, FSDP's) outlive ``destroy_process_group``, and so do their gloo worker
    threads. Such a thread releases each finished collective's work after the caller has seen
    it complete; when the work holds a tensor whose Python object the tensor now owns (the
    Python side let go first), the release takes the GIL. Once ``Py_FinalizeEx`` has begun,
    taking the GIL ends the thread with ``pthread_exit``, whose forced unwinding through that
    (noexcept) destructor calls ``std::terminate``: "terminate called without an active
    exception" and SIGABRT on whichever rank's worker thread was late, which on a loaded
    machine is now and then one of them (a core dump shows the worker in
    ``~AsyncAllgatherCoalescedWork`` → ``decref_pyobject`` → ``take_gil`` →
    ``PyThread_exit_thread`` while the main thread is in ``Py_FinalizeEx``). Exiting with
    ``os._exit`` after the groups are destroyed and the streams flushed leaves those threads
    nothing to race: the process ends with every file it wrote closed, and no peer waits on
    it (a destroyed gloo group needs no goodbye).
    """
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
