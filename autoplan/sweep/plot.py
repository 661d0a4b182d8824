"""A sweep as a PNG: predicted throughput (above) and the run's cost (below) against cluster size.

Drawn like the simulator's timeline (``autoplan.simulate.gantt``): matplotlib's object API on
the Agg canvas, no pyplot state, no display. One line per global batch, each point of the
lower panel labelled with its MFU (how well the larger clusters are used). Without prices the
lower panel shows the time to train instead of its cost. Infeasible configurations are crosses
on the x axis, named in the legend.
The x axis is the number of nodes (log-2 scaled when the sizes span a factor of 4 or more),
each tick also giving the GPUs.
"""

from __future__ import annotations

from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, FixedLocator, FuncFormatter, NullLocator

from autoplan.sweep.schema import SweepRow
from autoplan.view.units import count_text

__all__ = ["write_sweep_png"]

_COLOURS = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD"]


def _series(rows: list[SweepRow]) -> dict[str, list[SweepRow]]:
    """Rows by global batch (a batch that grows with the GPUs is one series), in order."""
    out: dict[str, list[SweepRow]] = {}
    for row in rows:
        key = "1 sample per GPU" if row.batch_per_gpu else f"batch {row.global_batch_size:,}"
        out.setdefault(key, []).append(row)
    return out


def _nodes_axis(axes: Axes, rows: list[SweepRow]) -> None:
    sizes = sorted({row.nodes for row in rows})
    if sizes[-1] >= 4 * sizes[0]:
        axes.set_xscale("log", base=2)
    gpus = {row.nodes: row.total_gpus for row in rows}
    axes.xaxis.set_major_locator(FixedLocator(sizes))
    axes.xaxis.set_minor_locator(NullLocator())
    axes.set_xticklabels([f"{n}\n({gpus[n]:,} GPUs)" for n in sizes], fontsize=8)
    margin = 0.1 * (sizes[-1] - sizes[0]) or 1
    if axes.get_xscale() == "log":
        axes.set_xlim(sizes[0] / 1.25, sizes[-1] * 1.25)
    else:
        axes.set_xlim(sizes[0] - margin, sizes[-1] + margin)


def _mark_infeasible(axes: Axes, rows: list[SweepRow], colour: str, label: str) -> None:
    bad = [row for row in rows if not row.feasible]
    if bad:
        axes.plot(
            [row.nodes for row in bad],
            [0] * len(bad),
            linestyle="none",
            marker="x",
            markersize=9,
            color=colour,
            clip_on=False,
            label=f"{label}: no plan ({bad[0].note})",
        )


def write_sweep_png(
    path: str | Path, rows: list[SweepRow], title: str = "", dpi: int = 110
) -> None:
    """Draw ``rows`` (from ``run_sweep``) to ``path`` as a PNG."""
    figure = Figure(figsize=(10, 7.5), dpi=dpi, layout="constrained")
    FigureCanvasAgg(figure)
    throughput, lower = figure.subplots(2, 1, sharex=True)
    priced = any(row.cost_usd is not None for row in rows)
    for index, (label, series) in enumerate(_series(rows).items()):
        colour = _COLOURS[index % len(_COLOURS)]
        good = [row for row in series if row.feasible]
        if good:
            x = [row.nodes for row in good]
            throughput.plot(
                x, [row.tokens_per_s or 0 for row in good], marker="o", color=colour, label=label
            )
            figures = [(row.cost_usd if priced else (row.train_time_s or 0) / 3600) for row in good]
            lower.plot(x, figures, marker="o", color=colour, label=label)
            for row, value in zip(good, figures, strict=True):
                lower.annotate(
                    f"MFU {row.mfu or 0:.0%}",
                    (row.nodes, value),
                    textcoords="offset points",
                    xytext=(0, 6),
                    ha="center",
                    fontsize=7,
                    color=colour,
                )
        _mark_infeasible(throughput, series, colour, label)
    # Ticks with SI prefixes (2.5 M, $1.25 M), not a shared '1e7' offset; all the digits a
    # tick needs (the table's three figures would show 1.25 M as 1.2 M).
    engineering = EngFormatter(sep=" ")
    throughput.yaxis.set_major_formatter(engineering)
    lower.yaxis.set_major_formatter(
        FuncFormatter(lambda value, _: f"${engineering.format_eng(value)}")
        if priced
        else engineering
    )
    throughput.set_ylabel("predicted tokens/s")
    throughput.set_ylim(bottom=0)
    throughput.grid(alpha=0.3)
    throughput.legend(fontsize=8, frameon=False)
    tokens = rows[0].train_tokens if rows else 0
    lower.set_ylabel(
        f"cost of {count_text(tokens)} tokens (USD)"
        if priced
        else f"hours to train {count_text(tokens)} tokens"
    )
    lower.set_ylim(bottom=0)
    lower.grid(alpha=0.3)
    lower.set_xlabel("nodes")
    if rows:
        _nodes_axis(lower, rows)
    if title:
        throughput.set_title(title, fontsize=10, loc="left")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png")
