"""Run a test driver's ranks as processes forked from one that imported the driver once.

``python tests/forked_ranks.py NPROC SCRIPT [ARGS...]`` runs ``SCRIPT`` as ``__main__`` in NPROC
processes, each with the variables torchrun gives the workers of a one-node launch (``RANK``,
``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``, ``TORCHELASTIC_USE_AGENT_STORE``); they join through torch.distributed's own
``env://`` rendezvous on a TCP store this process hosts, as torchrun's agent hosts one.

Why not torchrun: each of its workers imports torch, DTensor and pipelining again (~4 s of one
core here by ``-X importtime``, more than most of these tests' training), and torchrun itself
imports torch once more (~1.5 s): about 17 CPU-s of imports for a four-rank launch. The tests run
through this check numerics and memory, not launching: torchrun's agent, rendezvous and failure
reports are tested through ``autoplan run`` itself (tests/test_launch.py,
tests/test_readme_commands.py, tests/test_runtime_solved.py).

Forking is safe here because importing the driver starts no thread (checked before the first
fork; each rank has one intra-op thread, ``OMP_NUM_THREADS=1``, as the tests want on shared
cores): the children start from one single-threaded image. A rank that fails ends
the launch: the others are killed at once, as torchrun does, rather than left waiting in a
collective until gloo's timeout; every rank is in this process's session, so a caller that
kills the session on a time-out leaves none behind.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import traceback
from datetime import timedelta


def _run_rank(script: str, args: list[str], rank: int, nproc: int, port_reader: int) -> None:
    """The child: wait for the store's port, take a worker's variables, run the driver."""
    code = 1
    try:
        port = int(os.read(port_reader, 16).decode())
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": str(nproc),
                "LOCAL_WORLD_SIZE": str(nproc),
                "GROUP_RANK": "0",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "TORCHELASTIC_USE_AGENT_STORE": "True",
            }
        )
        sys.argv = [script, *args]
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # No interpreter teardown in a forked child (the drivers end so too: exit_process).
        os._exit(code)


def main(nproc: int, script: str, args: list[str]) -> int:
    """Fork ``nproc`` ranks of ``script``; the exit code of the first rank to fail, else 0."""
    # Before torch is imported: with more than one, OpenMP starts its pool at import.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch.distributed as dist

    # The driver's imports, once, in this process: the ranks inherit them.
    runpy.run_path(script, run_name="__forked_ranks_preload__")
    tasks = "/proc/self/task"
    if threading.active_count() != 1 or (os.path.isdir(tasks) and len(os.listdir(tasks)) != 1):
        raise RuntimeError(f"importing {script} started threads: forking it is not safe")
    sys.stdout.flush()
    sys.stderr.flush()
    children: dict[int, int] = {}
    writers: list[int] = []
    for rank in range(nproc):
        reader, writer = os.pipe()
        pid = os.fork()
        if pid == 0:
            # Only the parent may hold a write end: a rank whose parent died then reads EOF
            # and fails, rather than waiting on a pipe an earlier rank keeps open.
            for held in (*writers, writer):
                os.close(held)
            _run_rank(script, args, rank, nproc, reader)
        os.close(reader)
        children[pid] = rank
        writers.append(writer)
    # Hosted only now, after the forks: its server thread must not be copied into a rank.
    store = dist.TCPStore(
        "127.0.0.1", 0, nproc, is_master=True, timeout=timedelta(minutes=5), wait_for_workers=False
    )
    for writer in writers:
        os.write(writer, str(store.port).encode())
        os.close(writer)
    failed = 0
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(status)
        if code != 0 and not failed:
            print(f"forked_ranks: rank {rank} exited with {code}", file=sys.stderr)
            failed = code if code > 0 else 1
            for other in children:
                os.kill(other, signal.SIGKILL)
    return failed


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), sys.argv[2], sys.argv[3:]))
