"""Memory per GPU of each replica kind against capacity, with its reserve, and a stacked bar."""

from __future__ import annotations

from rich.text import Text

from autoplan.plan.schema import MemoryEstimate, Plan
from autoplan.view.document import Figure, Section
from autoplan.view.units import bytes_text

__all__ = ["MEMORY_CATEGORIES", "memory_bar", "memory_section"]

MEMORY_CATEGORIES = {
    "weights": "blue",
    "grads": "green",
    "optimizer": "magenta",
    "activations": "yellow",
    "transient": "red",
    "reserve": "white",
}


def _parts(estimate: MemoryEstimate) -> dict[str, int]:
    return {
        "weights": estimate.weights_bytes,
        "grads": estimate.gradients_bytes,
        "optimizer": estimate.optimizer_bytes,
        "activations": estimate.activations_bytes,
        "transient": estimate.transient_bytes,
        "reserve": estimate.reserved_bytes,
    }


def _bytes(size: int) -> Figure:
    return Figure(bytes_text(size), size, "bytes")


def memory_bar(estimate: MemoryEstimate, width: int = 32) -> Text:
    """``width`` cells = the GPU's capacity; each category (and the reserve, dim) fills its
    share in its colour; an estimate over capacity fills every cell."""
    bar = Text()
    capacity = max(estimate.capacity_bytes, 1)
    used_cells = 0
    for name, size in _parts(estimate).items():
        cells = min(round(size / capacity * width), width - used_cells)
        symbol = "▒" if name == "reserve" else "█"
        bar.append(symbol * cells, style=MEMORY_CATEGORIES[name])
        used_cells += cells
    if used_cells < width:
        bar.append("·" * (width - used_cells), style="dim")
    return bar


def memory_section(plan: Plan, *, bars: bool = True) -> Section:
    """One row per memory estimate (pipeline rank × replica kind): memory by category, total
    and reserve against capacity, and (``bars``) the bar."""
    legend = "  ".join(f"{'▒' if name == 'reserve' else '█'} {name}" for name in MEMORY_CATEGORIES)
    columns = ["rank", "GPU", "tp", "micro-batch", "weights", "grads", "optimizer", "activations"]
    columns += ["transient", "total", "reserve", "capacity", "used"]
    if bars:
        columns.append("bar (width = capacity)")
    section = Section(
        title="Memory per GPU, by replica kind",
        columns=columns,
        right=frozenset({0, 2, 3, *range(4, 13)}),
        text_only=frozenset({13}) if bars else frozenset(),
        heading_columns=4,
        note="micro-batch: samples per micro-batch of one replica; "
        "used = (total + reserve) / capacity",
        text_note=f"bar: {legend}" if bars else "",
    )
    estimates = sorted(
        plan.prediction.memory,
        key=lambda m: (m.pipeline_rank, m.gpu_type, m.tensor_parallel_degree, m.micro_batch_size),
    )
    for estimate in estimates:
        needed = estimate.total_bytes + estimate.reserved_bytes
        share = needed / estimate.capacity_bytes if estimate.capacity_bytes else 0.0
        over = needed > estimate.capacity_bytes
        cells: list[str | Figure | Text] = [
            Figure(str(estimate.pipeline_rank), estimate.pipeline_rank, ""),
            estimate.gpu_type,
            Figure(str(estimate.tensor_parallel_degree), estimate.tensor_parallel_degree, ""),
            Figure(str(estimate.micro_batch_size), estimate.micro_batch_size, ""),
            *(_bytes(size) for name, size in _parts(estimate).items() if name != "reserve"),
            _bytes(estimate.total_bytes),
            _bytes(estimate.reserved_bytes),
            _bytes(estimate.capacity_bytes),
            Figure(f"{share:.0%}", share, "fraction"),
        ]
        if bars:
            cells.append(memory_bar(estimate))
        section.add(*cells, style="bold red" if over else "")
    return section
