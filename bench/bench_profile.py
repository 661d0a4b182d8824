"""Profiler speed and memory: each model profiled in a fresh process, its peak RSS read from
that process alone (``os.wait4``), so one model's memory does not hide another's.

Target (issue 2): llama2-70b at seq 4096 in under 30 s and under 2 GB RSS on a laptop-class
machine: fake tensors allocate nothing, and identical blocks are traced once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["main"]

CASES = [
    ("gpt2-small", 1024, 1),
    ("llama2-7b", 4096, 1),
    ("llama2-70b", 4096, 1),
    ("gpt3-175b", 2048, 1),
]

_CHILD = """
import json, sys, time
started = time.perf_counter()
from autoplan.files import write_json_model
from autoplan.profile.profiler import profile_model
imported = time.perf_counter()
profile = profile_model(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), "bf16")
profiled = time.perf_counter()
write_json_model(sys.argv[4], profile)
print(json.dumps({
    "import_s": imported - started,
    "profile_s": profiled - imported,
    "layers": len(profile.layers),
    "traced": len(profile.profiled_layer_indices),
    "params": profile.totals.param_count,
    "tflop": (profile.totals.forward_flops + profile.totals.backward_flops) / 1e12,
}))
"""


def _run_case(name: str, seq: int, batch: int, out: Path) -> dict:
    command = [sys.executable, "-c", _CHILD, name, str(seq), str(batch), str(out)]
    started = time.perf_counter()
    # One pipe (stderr merged) read to the end, then wait4 for this child's own rusage.
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall_s = time.perf_counter() - started
    if child.returncode != 0:
        raise RuntimeError(f"profiling {name} failed: {output[-2000:]}")
    result = json.loads(output.strip().splitlines()[-1])
    # Linux reports ru_maxrss in KiB.
    result.update(wall_s=wall_s, rss_mib=usage.ru_maxrss / 1024, json_kib=out.stat().st_size / 1024)
    return result


def main() -> None:
    """Profile each model in its own process and print a table."""
    header = (
        f"{'model':<12} {'seq':>5} {'layers':>6} {'traced':>6} {'parameters':>17} "
        f"{'TFLOP/step':>11} {'profile s':>9} {'process s':>9} {'peak RSS MiB':>12} "
        f"{'JSON KiB':>8}"
    )
    print("bench_profile: one fresh process per model, bf16, micro-batch 1")
    print(header)
    print("-" * len(header))
    with tempfile.TemporaryDirectory() as folder:
        for name, seq, batch in CASES:
            row = _run_case(name, seq, batch, Path(folder) / f"{name}.json")
            print(
                f"{name:<12} {seq:>5} {row['layers']:>6} {row['traced']:>6} "
                f"{row['params']:>17,} {row['tflop']:>11,.1f} {row['profile_s']:>9.2f} "
                f"{row['wall_s']:>9.2f} {row['rss_mib']:>12.0f} {row['json_kib']:>8.0f}"
            )
    print(
        "profile s: profile_model() alone; process s: the whole process (python, torch "
        "import, profile, JSON); target llama2-70b < 30 s and < 2048 MiB"
    )


if __name__ == "__main__":
    main()
