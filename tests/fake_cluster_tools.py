"""Stand-ins for ``torchrun``, ``srun`` and ``scontrol`` on PATH, so that tests run generated
launch scripts for real (bash executes every line) and see exactly what each node would start.

``torchrun`` records its argv (NUL-separated, so any byte survives), its plan node variables
and the options the enclosing ``srun`` got, one file per call; ``srun`` passes its options on in
the environment and runs the rest of its command line; ``scontrol show hostnames LIST`` prints
LIST's comma-separated names one per line.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Call", "install_fake_tools", "read_calls", "run_script"]

_TORCHRUN = r"""#!/bin/bash
out="$FAKE_TOOLS_LOG/torchrun.$$.$RANDOM"
{
  printf '%s\0' "SRUN=${FAKE_SRUN_OPTS:-}" "NODE_RANK=${AUTOPLAN_NODE_RANK:-}"
  printf '%s\0' "NODE=${AUTOPLAN_NODE:-}"
  printf '%s\0' "$@"
} > "$out"
"""

_SRUN = r"""#!/bin/bash
opts=()
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do opts+=("$1"); shift; done
export FAKE_SRUN_OPTS="${opts[*]}"
exec "$@"
"""

_SCONTROL = r"""#!/bin/bash
[ "$1" = show ] && [ "$2" = hostnames ] || exit 1
tr ',' '\n' <<< "$3"
"""


@dataclass(frozen=True)
class Call:
    """One torchrun the script started."""

    srun_options: list[str]
    node_rank: str
    node: str
    argv: list[str]


def install_fake_tools(folder: Path) -> tuple[Path, Path]:
    """Write the fake tools into ``folder/bin``; returns (bin folder, log folder)."""
    bin_dir, log_dir = folder / "bin", folder / "calls"
    bin_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (("torchrun", _TORCHRUN), ("srun", _SRUN), ("scontrol", _SCONTROL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(0o755)
    return bin_dir, log_dir


def run_script(
    script: Path,
    bin_dir: Path,
    log_dir: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``script`` with bash, the fake tools first on PATH."""
    environment = {
        "PATH": f"{bin_dir}:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "FAKE_TOOLS_LOG": str(log_dir),
        **(env or {}),
    }
    return subprocess.run(
        ["bash", str(script)],
        env=environment,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def read_calls(log_dir: Path) -> list[Call]:
    """The torchrun calls recorded so far, sorted by plan node rank."""
    calls = []
    for path in log_dir.glob("torchrun.*"):
        fields = path.read_bytes().decode().split("\0")[:-1]
        srun, rank, node, *argv = fields
        calls.append(
            Call(
                srun_options=srun.removeprefix("SRUN=").split(),
                node_rank=rank.removeprefix("NODE_RANK="),
                node=node.removeprefix("NODE="),
                argv=argv,
            )
        )
    return sorted(calls, key=lambda call: call.node_rank)
