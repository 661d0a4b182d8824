"""A simulated iteration as a Chrome trace (Trace Event Format), for Perfetto or chrome://tracing.

One process per pipeline rank; inside it, per replica, a "compute" thread (forwards,
backwards, optimizer), a "dp all-reduce" thread and one "send → rank k replica j" thread per
peer (sends on one link run one after another, so no thread holds overlapping events). Threads
are numbered replica by replica (sort index = thread id), so a replica's tracks stay together.
One memory counter per replica kind (GPU type, tp, share) of the rank: its replica with the
highest peak. Times are in µs.
Format: https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autoplan.simulate.result import RankTimeline, ReplicaTimeline, SimulatedEvent, SimulationResult

__all__ = ["chrome_trace", "write_chrome_trace"]

_MS_TO_US = 1000.0


def _metadata(kind: str, pid: int, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "args": args}


def _track(event: SimulatedEvent) -> tuple[str, int, int]:
    """Which of a replica's threads holds the event: (kind, peer rank, peer replica)."""
    if event.track == "compute":
        return ("compute", -1, -1)
    if event.peer_rank is None:
        return ("dp all-reduce", -1, -1)
    kind = "recv" if event.name.startswith("recv") else "send"
    return (kind, event.peer_rank, event.peer_replica if event.peer_replica is not None else 0)


def _thread_name(replica: ReplicaTimeline, track: tuple[str, int, int]) -> str:
    kind, peer_rank, peer_replica = track
    if kind == "send":
        what = f"send → rank {peer_rank} r{peer_replica}"
    elif kind == "recv":
        what = f"recv ← rank {peer_rank} r{peer_replica}"
    else:
        what = kind
    return f"r{replica.replica} {replica.label} · {what}"


def _replica_events(pid: int, replica: ReplicaTimeline, first_tid: int) -> list[dict[str, Any]]:
    """Metadata and X events of one replica's threads, numbered from ``first_tid``."""
    tids: dict[tuple[str, int, int], int] = {("compute", -1, -1): first_tid}
    for event in replica.events:
        tids.setdefault(_track(event), first_tid + len(tids))
    events = []
    for track, tid in tids.items():
        events.append(_metadata("thread_name", pid, tid, {"name": _thread_name(replica, track)}))
        events.append(_metadata("thread_sort_index", pid, tid, {"sort_index": tid}))
    for event in replica.events:
        args: dict[str, Any] = {}
        if event.stage is not None:
            args["stage"] = event.stage
        if event.micro_batch is not None:
            args["micro_batch"] = event.micro_batch
        if event.samples is not None:
            args["samples"] = event.samples
        events.append(
            {
                "name": event.name,
                "cat": event.category,
                "ph": "X",
                "ts": event.start_ms * _MS_TO_US,
                "dur": event.duration_ms * _MS_TO_US,
                "pid": pid,
                "tid": tids[_track(event)],
                "args": args,
            }
        )
    return events


def _memory_counters(pid: int, rank: RankTimeline) -> list[dict[str, Any]]:
    chosen: dict[tuple[str, int, int], ReplicaTimeline] = {}
    for replica in rank.replicas:
        best = chosen.get(replica.kind)
        if best is None or replica.peak_bytes > best.peak_bytes:
            chosen[replica.kind] = replica
    return [
        {
            "name": f"memory per GPU: {replica.label}",
            "ph": "C",
            "ts": point.time_ms * _MS_TO_US,
            "pid": pid,
            "args": {"MiB": round(point.allocated_bytes / 2**20, 3)},
        }
        for replica in chosen.values()
        for point in replica.memory
    ]


def chrome_trace(result: SimulationResult, title: str = "") -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    events: list[dict[str, Any]] = []
    for rank in result.ranks:
        pid = rank.pipeline_rank
        stages = ",".join(str(stage) for stage in rank.stages)
        name = (
            f"pipeline rank {pid} · {rank.gpu_type} · {len(rank.replicas)} "
            f"replica{'s' * (len(rank.replicas) > 1)} · stage{'s' * (len(rank.stages) > 1)} "
            f"{stages}"
        )
        events.append(_metadata("process_name", pid, 0, {"name": name}))
        events.append(_metadata("process_sort_index", pid, 0, {"sort_index": pid}))
        next_tid = 0
        for replica in rank.replicas:
            replica_events = _replica_events(pid, replica, next_tid)
            next_tid += sum(1 for e in replica_events if e["name"] == "thread_name")
            events.extend(replica_events)
        events.extend(_memory_counters(pid, rank))
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
