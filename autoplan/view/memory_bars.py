"""Memory per GPU against capacity, as a stacked bar per pipeline rank and GPU type."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from autoplan.plan.schema import MemoryEstimate, Plan

__all__ = ["MEMORY_CATEGORIES", "memory_bar", "memory_table"]

MEMORY_CATEGORIES = {
    "weights": "blue",
    "grads": "green",
    "optimizer": "magenta",
    "activations": "yellow",
    "transient": "red",
}


def _parts(estimate: MemoryEstimate) -> dict[str, int]:
    return {
        "weights": estimate.weights_bytes,
        "grads": estimate.gradients_bytes,
        "optimizer": estimate.optimizer_bytes,
        "activations": estimate.activations_bytes,
        "transient": estimate.transient_bytes,
    }


def memory_bar(estimate: MemoryEstimate, width: int = 40) -> Text:
    """``width`` cells = the GPU's capacity; each category fills its share in its colour."""
    bar = Text()
    capacity = max(estimate.capacity_bytes, 1)
    used_cells = 0
    for name, size in _parts(estimate).items():
        cells = round(size / capacity * width)
        cells = min(cells, width - used_cells) if estimate.total_bytes <= capacity else cells
        bar.append("█" * cells, style=MEMORY_CATEGORIES[name])
        used_cells += cells
    if used_cells < width:
        bar.append("·" * (width - used_cells), style="dim")
    return bar


def _gib(size_bytes: int) -> str:
    return f"{size_bytes / 2**30:.2f}"


def memory_table(plan: Plan) -> Table:
    """One row per memory estimate: GiB by category, total against capacity, and the bar."""
    legend = "  ".join(f"[{colour}]█[/] {name}" for name, colour in MEMORY_CATEGORIES.items())
    table = Table(title="Memory per GPU (GiB)", caption=legend, title_justify="left")
    for column in ("rank", "GPU", "weights", "grads", "optimizer", "activations", "transient"):
        table.add_column(column, justify="right" if column not in ("GPU",) else "left")
    table.add_column("total / capacity", justify="right")
    table.add_column("bar (width = capacity)")
    for estimate in sorted(plan.prediction.memory, key=lambda m: (m.pipeline_rank, m.gpu_type)):
        share = estimate.total_bytes / estimate.capacity_bytes if estimate.capacity_bytes else 0
        over = estimate.total_bytes > estimate.capacity_bytes
        total = f"{_gib(estimate.total_bytes)} / {_gib(estimate.capacity_bytes)} ({share:.0%})"
        table.add_row(
            str(estimate.pipeline_rank),
            estimate.gpu_type,
            *(_gib(size) for size in _parts(estimate).values()),
            Text(total, style="bold red" if over else ""),
            memory_bar(estimate),
        )
    return table
