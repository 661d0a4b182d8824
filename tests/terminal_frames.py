"""Run a command as if on a terminal and read back the frames its live progress bar drew.

rich draws a live display only on a terminal; ``FORCE_COLOR`` and ``TTY_INTERACTIVE`` make it
believe stderr is one, so a test sees exactly what a person would, frame by frame (each frame
starts with a carriage return and an erase-line sequence).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

__all__ = ["AUTOPLAN", "progress_frames", "run_on_terminal"]

AUTOPLAN = str(Path(sys.executable).parent / "autoplan")

_ESCAPE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def run_on_terminal(
    args: list[str], cwd: Path, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``autoplan ARGS`` with stdout and stderr captured, rich believing they are a 120-column
    interactive terminal."""
    environment = {**os.environ, "FORCE_COLOR": "1", "TTY_INTERACTIVE": "1", "COLUMNS": "120"}
    environment.pop("NO_COLOR", None)
    return subprocess.run(
        [AUTOPLAN, *args],
        cwd=cwd,
        env=environment,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def progress_frames(stderr: str) -> list[str]:
    """The text of each frame a live display drew on ``stderr``, escapes removed, in order."""
    plain = _ESCAPE.sub("", stderr)
    return [frame.strip() for frame in plain.split("\r") if frame.strip()]
