"""A simulated iteration as a Chrome trace (Trace Event Format), for Perfetto or chrome://tracing.

One process per pipeline rank: a "compute" thread (forwards, backwards, optimizer), a
"dp all-reduce" thread and one "send → rank k" thread per peer (sends on one link run one after
another, so no thread holds overlapping events), plus a memory counter. Times are in µs.
Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoplan.simulate.result import SimulationResult

__all__ = [
    "ALLREDUCE_THREAD",
    "COMPUTE_THREAD",
    "chrome_trace",
    "send_thread",
    "write_chrome_trace",
]

COMPUTE_THREAD = 0
ALLREDUCE_THREAD = 1


def send_thread(peer_rank: int) -> int:
    """Thread id of the sends to ``peer_rank``."""
    return 2 + peer_rank


_MS_TO_US = 1000.0


def _metadata(kind: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def chrome_trace(result: SimulationResult, title: str = "") -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    events: list[dict[str, Any]] = []
    for rank in result.ranks:
        pid = rank.pipeline_rank
        stages = ",".join(str(stage) for stage in rank.stages)
        name = (
            f"pipeline rank {pid} · {rank.gpu_type} · stage{'s' * (len(rank.stages) > 1)} {stages}"
        )
        events.append(_metadata("process_name", pid, 0, {"name": name}))
        events.append(_metadata("process_sort_index", pid, 0, {"sort_index": pid}))
        events.append(_metadata("thread_name", pid, COMPUTE_THREAD, {"name": "compute"}))
        threads = {COMPUTE_THREAD}
        for event in rank.events:
            if event.track == "compute":
                tid = COMPUTE_THREAD
            elif event.peer_rank is None:
                tid = ALLREDUCE_THREAD
            else:
                tid = send_thread(event.peer_rank)
            if tid not in threads:
                threads.add(tid)
                thread_name = (
                    "dp all-reduce" if tid == ALLREDUCE_THREAD else f"send → rank {event.peer_rank}"
                )
                events.append(_metadata("thread_name", pid, tid, {"name": thread_name}))
            args: dict[str, Any] = {}
            if event.stage is not None:
                args["stage"] = event.stage
            if event.micro_batch is not None:
                args["micro_batch"] = event.micro_batch
            events.append(
                {
                    "name": event.name,
                    "cat": event.category,
                    "ph": "X",
                    "ts": event.start_ms * _MS_TO_US,
                    "dur": event.duration_ms * _MS_TO_US,
                    "pid": pid,
                    "tid": tid,
                    "args": args,
                }
            )
        for point in rank.memory:
            events.append(
                {
                    "name": "memory",
                    "ph": "C",
                    "ts": point.time_ms * _MS_TO_US,
                    "pid": pid,
                    "args": {"MiB": round(point.allocated_bytes / 2**20, 3)},
                }
            )
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "title": title,
            "schedule": result.schedule,
            "pipeline_degree": result.pipeline_degree,
            "virtual_stages_per_rank": result.virtual_stages_per_rank,
            "num_micro_batches": result.num_micro_batches,
            "simulated_iteration_time_ms": result.iteration_time_ms,
            "predicted_iteration_time_ms": result.predicted_iteration_time_ms,
        },
    }


def write_chrome_trace(path: str | Path, result: SimulationResult, title: str = "") -> None:
    """Write the trace JSON to ``path`` (same result, same bytes)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(chrome_trace(result, title), indent=1) + "\n")
