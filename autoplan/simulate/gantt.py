"""A simulated iteration as a PNG: a Gantt chart of the replicas above their memory curves.

Drawn with matplotlib's object API and the Agg canvas (no pyplot state, no display needed).
One row per replica, labelled with its pipeline rank, GPU type, tp and share; replicas of one
rank whose timelines are identical (every replica of a uniform plan) share one row marked
"× n", and past ``MAX_ROWS`` rows the replicas of one kind (GPU type, tp, share) of a rank
share one row showing the one that finishes last. Forward, backward, sends and optimizer have
their own colours, so the pipeline bubble is the white space between bars; a zero-bubble
schedule's deferred weight gradients (W) have theirs, its input gradients (I) the backward's. Under
interleaving, a rank's odd chunks are drawn in a lighter shade so that its stages can be told
apart. Beneath, one memory curve per replica kind of each rank (its replica with the highest
peak).
"""

from __future__ import annotations

import itertools
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from autoplan.simulate.result import ReplicaTimeline, SimulationResult

__all__ = ["CATEGORY_COLOURS", "MAX_ROWS", "gantt_rows", "write_gantt_png"]

MAX_ROWS = 64

CATEGORY_COLOURS = {
    "forward": "#4C72B0",
    "backward": "#55A868",
    "input_gradient": "#55A868",  # I is the backward the previous stage waits for
    "weight_gradient": "#DD8452",  # W, deferred into the bubbles: drawn apart
    "communication": "#C44E52",
    "optimizer": "#8172B2",
}

_COMPUTE_HEIGHT = 0.62
_COMM_HEIGHT = 0.18


def _is_odd_chunk(stage: int | None, pipeline_degree: int) -> bool:
    return stage is not None and (stage // pipeline_degree) % 2 == 1


def _lighter(colour: str) -> tuple[float, float, float]:
    red, green, blue = to_rgb(colour)
    return (red + (1 - red) * 0.4, green + (1 - green) * 0.4, blue + (1 - blue) * 0.4)


def _memory_unit(peak_bytes: int) -> tuple[float, str]:
    if peak_bytes >= 2**30:
        return 2**30, "GiB"
    if peak_bytes >= 2**20:
        return 2**20, "MiB"
    return 1.0, "bytes"


def _row_label(replicas: list[ReplicaTimeline]) -> str:
    first = replicas[0]
    who = f"r{first.replica}" if len(replicas) == 1 else f"{len(replicas)} replicas"
    times = f" × {len(replicas)}" if len(replicas) > 1 else ""
    cp = f" cp{first.context_parallel_degree}" if first.context_parallel_degree > 1 else ""
    cp += f" ep{first.expert_parallel_degree}" if first.expert_parallel_degree > 1 else ""
    return (
        f"rank {first.pipeline_rank} · {who}\n{first.gpu_type} tp{first.tensor_parallel_degree}"
        f"{cp}{times}, {first.micro_batch_size} sample{'' if first.micro_batch_size == 1 else 's'}"
    )


def gantt_rows(result: SimulationResult, max_rows: int = MAX_ROWS) -> list[list[ReplicaTimeline]]:
    """The replicas each row stands for; the row draws the first one's events (see the
    module docstring for how rows are merged)."""
    rows: list[list[ReplicaTimeline]] = []
    for rank in result.ranks:
        by_timeline: dict[tuple, list[ReplicaTimeline]] = {}
        for replica in rank.replicas:
            # Not by event names: a send's name says which replicas it joins.
            key = (
                replica.kind,
                tuple((e.category, e.stage, e.start_ms, e.end_ms) for e in replica.events),
            )
            by_timeline.setdefault(key, []).append(replica)
        rows.extend(by_timeline.values())
    if len(rows) <= max_rows:
        return rows
    merged: dict[tuple, list[ReplicaTimeline]] = {}
    for row in rows:
        merged.setdefault((row[0].pipeline_rank, row[0].kind), []).extend(row)
    return [
        sorted(group, key=lambda r: -max((e.end_ms for e in r.events), default=0.0))
        for group in merged.values()
    ]


def _memory_lines(result: SimulationResult) -> list[ReplicaTimeline]:
    """Per rank and replica kind, the replica with the highest peak."""
    chosen: dict[tuple, ReplicaTimeline] = {}
    for replica in result.replicas:
        key = (replica.pipeline_rank, replica.kind)
        if key not in chosen or replica.peak_bytes > chosen[key].peak_bytes:
            chosen[key] = replica
    return list(chosen.values())


def _draw_row(gantt: Axes, row: int, replica: ReplicaTimeline, result: SimulationResult) -> None:
    end_ms = result.iteration_time_ms or 1.0
    min_label_ms = end_ms / 90  # label a bar with its micro-batch only where the text fits
    min_outline_ms = end_ms / 400
    for category in CATEGORY_COLOURS:
        on_compute = [e for e in replica.events if e.category == category and e.track == "compute"]
        # A white outline separates neighbouring bars but would hide a bar thinner than
        # itself, so thin bars are drawn without one.
        # With interleaving, a rank's odd chunks (stages p..2p-1, 3p..) are drawn lighter.
        for wide, odd_chunk in itertools.product((True, False), (False, True)):
            bars = [
                e
                for e in on_compute
                if (e.duration_ms >= min_outline_ms) == wide
                and _is_odd_chunk(e.stage, result.pipeline_degree) == odd_chunk
            ]
            if bars:
                colour = (
                    _lighter(CATEGORY_COLOURS[category])
                    if odd_chunk
                    else CATEGORY_COLOURS[category]
                )
                gantt.broken_barh(
                    [(e.start_ms, e.duration_ms) for e in bars],
                    (row - _COMPUTE_HEIGHT / 2, _COMPUTE_HEIGHT),
                    facecolors=colour,
                    edgecolor="white" if wide else colour,
                    linewidth=0.4,
                )
    sends = [e for e in replica.events if e.track == "communication"]
    if sends:
        gantt.broken_barh(
            [(e.start_ms, e.duration_ms) for e in sends],
            (row + _COMPUTE_HEIGHT / 2 + 0.02, _COMM_HEIGHT),
            facecolors=CATEGORY_COLOURS["communication"],
        )
    for event in replica.events:
        if event.track != "compute" or event.duration_ms < min_label_ms:
            continue
        label = "opt" if event.micro_batch is None else str(event.micro_batch)
        if result.virtual_stages_per_rank > 1 and event.stage is not None:
            label = f"{label}\ns{event.stage}" if event.duration_ms > 2 * min_label_ms else label
        gantt.text(
            event.start_ms + event.duration_ms / 2,
            row,
            label,
            ha="center",
            va="center",
            fontsize=7,
            color="white",
        )


def write_gantt_png(
    path: str | Path, result: SimulationResult, title: str = "", dpi: int = 110
) -> None:
    """Draw ``result`` to ``path`` as a PNG."""
    rows = gantt_rows(result)
    height = 2.2 + 0.55 * len(rows) + 2.2
    figure = Figure(figsize=(13, height), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    gantt, memory_axes = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [max(len(rows), 2), 2.2]}
    )
    end_ms = result.iteration_time_ms or 1.0
    for index, replicas in enumerate(rows):
        _draw_row(gantt, index, replicas[0], result)
    gantt.set_yticks(range(len(rows)), [_row_label(replicas) for replicas in rows], fontsize=8)
    gantt.set_ylim(len(rows) - 0.4, -0.6)
    gantt.set_xlim(0, end_ms * 1.01)
    gantt.grid(axis="x", alpha=0.3)
    predicted = result.predicted_iteration_time_ms
    summary = (
        f"{result.schedule}  pp={result.pipeline_degree}  v={result.virtual_stages_per_rank}  "
        f"m={result.num_micro_batches}  ·  simulated {result.iteration_time_ms:.2f} ms"
        + (f" (plan predicts {predicted:.2f} ms)" if predicted is not None else "")
        + f"  ·  replicas idle {result.bubble_fraction:.0%} of the pipeline"
    )
    gantt.set_title(f"{title}\n{summary}" if title else summary, fontsize=10, loc="left")
    gantt.tick_params(labelbottom=False)
    split = any(e.category == "weight_gradient" for r in result.replicas for e in r.events)
    labels = {
        "communication": "dp all-reduce / send",
        "input_gradient": "backward / I (input grad.)",
        "weight_gradient": "W (weight grad.)",
    }
    # I shares the backward's colour: one legend entry for both, and W's only where drawn.
    hidden = ("backward",) if split else ("input_gradient", "weight_gradient")
    handles = [
        Patch(color=colour, label=labels.get(name, name))
        for name, colour in CATEGORY_COLOURS.items()
        if name not in hidden
    ]
    if result.virtual_stages_per_rank > 1:
        handles.append(
            Patch(color=_lighter(CATEGORY_COLOURS["forward"]), label="lighter: odd chunks")
        )
    figure.legend(
        handles=handles,
        loc="outside lower center",
        fontsize=8,
        ncols=len(handles),
        frameon=False,
    )

    lines = _memory_lines(result)
    scale, unit = _memory_unit(max((replica.peak_bytes for replica in lines), default=0))
    for replica in lines:
        times = [point.time_ms for point in replica.memory] + [end_ms]
        levels = [point.allocated_bytes / scale for point in replica.memory]
        levels.append(levels[-1])
        capacity = f" of {replica.capacity_bytes / 2**30:.0f} GiB" if replica.capacity_bytes else ""
        memory_axes.step(
            times,
            levels,
            where="post",
            linewidth=1.2,
            label=f"rank {replica.pipeline_rank} {replica.label}: peak "
            f"{replica.peak_bytes / scale:.2f} {unit}{capacity}",
        )
    memory_axes.set_ylabel(f"memory per GPU ({unit})")
    memory_axes.set_xlabel("time (ms)")
    memory_axes.set_ylim(bottom=0)
    memory_axes.grid(alpha=0.3)
    memory_axes.legend(
        fontsize=8,
        loc="lower left",
        bbox_to_anchor=(0.0, 1.0),
        ncols=min(len(lines), 2),
        frameon=False,
    )

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
