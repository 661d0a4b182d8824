"""Run a plan's torchrun agents on this machine, and when one fails, say which rank failed, on
which node, and its last error line, with the whole log kept in one file.

Each agent gets its own ``--log-dir`` with ``--redirects 3``, so each worker's stdout and stderr
land in files of their own (``<log dir>/node<k>/<run>/attempt_<n>/<local rank>/stderr.log``);
the agent's own output goes to ``node<k>-agent.log``. torchrun's summary of a failed agent
names its root cause (``Root Cause (first observed failure)``, ``rank : R``); that worker's
last stderr line is the reason. When several nodes fail (the others lose their peers), the
failure whose reason is autoplan's own one-line ``error:`` wins, else the first agent to exit.
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from autoplan.launch.torchrun import NodeLaunch, literal_argv
from autoplan.names import printable

__all__ = ["LocalRunResult", "agent_log_args", "environment_for_local_run", "run_agents"]

_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):.*?rank\s*:\s*(\d+)", re.S)
_POLL_S = 0.2


@dataclass(frozen=True)
class LocalRunResult:
    """How a local run ended: ``code`` 0, or the first failing agent's exit code and
    ``failure``, one line naming the failed rank, its node and its last error line."""

    code: int
    log_path: Path
    failure: str | None = None


def agent_log_args(log_dir: Path, node_rank: int) -> list[str]:
    """torchrun options that put node ``node_rank``'s worker output in files of their own."""
    return ["--log-dir", str(log_dir / f"node{node_rank}"), "--redirects", "3"]


def _last_line(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")


def _worker_stderr(log_dir: Path, node_rank: int, local_rank: int) -> Path | None:
    found = sorted((log_dir / f"node{node_rank}").glob(f"*/attempt_*/{local_rank}/stderr.log"))
    return found[-1] if found else None


def _combined_log(log_dir: Path, launches: list[NodeLaunch]) -> Path:
    """Every agent's and worker's output in one file, in node and rank order."""
    parts: list[str] = []
    for launch in launches:
        k = launch.node.node_rank
        agent = log_dir / f"node{k}-agent.log"
        parts.append(f"===== node {k} ({launch.node.name}): torchrun agent =====\n")
        parts.append(agent.read_text(errors="replace") if agent.exists() else "(no output)\n")
        for worker in sorted((log_dir / f"node{k}").glob("*/attempt_*/*/std*.log")):
            parts.append(f"===== node {k}: local rank {worker.parent.name}, {worker.name} =====\n")
            parts.append(worker.read_text(errors="replace"))
    path = log_dir / "run.log"
    path.write_text("".join(parts))
    return path


def _failure(log_dir: Path, launch: NodeLaunch, first_rank: int, code: int) -> tuple[str, bool]:
    """One line on why node ``launch`` failed, and whether it is autoplan's own error line."""
    node = launch.node
    agent_log = log_dir / f"node{node.node_rank}-agent.log"
    try:
        agent_text = agent_log.read_text(errors="replace")
    except OSError:
        agent_text = ""
    match = _ROOT_CAUSE.search(agent_text)
    if match is None:
        last = _last_line(agent_log) or f"exit code {code}"
        return f"torchrun on node {node.name} failed: {printable(last)}", False
    rank = int(match.group(1))
    stderr = _worker_stderr(log_dir, node.node_rank, rank - first_rank)
    last = _last_line(stderr) if stderr is not None else ""
    reason = printable(last) if last else "no error output (killed?)"
    return f"rank {rank} on node {node.name} failed: {reason}", last.startswith("error:")


def run_agents(launches: list[NodeLaunch], env: Mapping[str, str], log_dir: Path) -> LocalRunResult:
    """Start one agent per launch (output under ``log_dir``), wait for all; when one fails,
    stop the others and describe the failure."""
    log_dir.mkdir(parents=True, exist_ok=True)
    agents: list[subprocess.Popen[bytes]] = []
    handles = []
    try:
        for launch in launches:
            handle = open(log_dir / f"node{launch.node.node_rank}-agent.log", "wb")  # noqa: SIM115
            handles.append(handle)
            node_env = {
                **env,
                "AUTOPLAN_NODE_RANK": str(launch.node.node_rank),
                "AUTOPLAN_NODE": launch.node.name,
            }
            agents.append(
                subprocess.Popen(
                    literal_argv(launch.argv),
                    env=node_env,
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                )
            )
        failed: list[int] = []  # agent indices, in the order their failure was seen
        while True:
            codes = [agent.poll() for agent in agents]
            failed += [i for i, c in enumerate(codes) if c not in (None, 0) and i not in failed]
            if failed or all(code == 0 for code in codes):
                break
            time.sleep(_POLL_S)
        if failed:
            # The others lose their peers within seconds; give them that long to say so.
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(a.poll() is None for a in agents):
                time.sleep(_POLL_S)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.terminate()
                try:
                    agent.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    agent.kill()
                    agent.wait()
        for handle in handles:
            handle.close()
    log_path = _combined_log(log_dir, launches)
    if not failed:
        return LocalRunResult(code=0, log_path=log_path)
    failed += [
        i for i, agent in enumerate(agents) if agent.returncode not in (0, None) and i not in failed
    ]
    first_ranks = {}
    total = 0
    for launch in sorted(launches, key=lambda item: item.node.node_rank):
        first_ranks[launch.node.node_rank] = total
        total += launch.node.nproc_per_node
    described = [
        _failure(
            log_dir,
            launches[i],
            first_ranks[launches[i].node.node_rank],
            agents[i].returncode,
        )
        for i in failed
    ]
    line = next((text for text, own in described if own), described[0][0])
    return LocalRunResult(code=agents[failed[0]].returncode or 1, log_path=log_path, failure=line)


def environment_for_local_run(base: Mapping[str, str], device: str) -> dict[str, str]:
    """The agents' environment: one thread per process unless set, no inherited MASTER_ADDR,
    CUDA hidden for CPU runs, and Python's safe path (``-m`` does not put the current folder
    first on sys.path, so a stray module there cannot shadow autoplan's or torch's)."""
    env = {**base, "OMP_NUM_THREADS": base.get("OMP_NUM_THREADS", "1"), "PYTHONSAFEPATH": "1"}
    env.pop("MASTER_ADDR", None)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env
