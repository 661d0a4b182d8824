"""``autoplan sweep``'s table: one row per configuration (cluster size × global batch)."""

from __future__ import annotations

from autoplan.sweep.schema import SweepRow
from autoplan.view.document import Document, Section
from autoplan.view.units import count_text, long_duration_text, percent_text, usd_text

__all__ = ["sweep_document"]


def _gpus_text(row: SweepRow) -> str:
    return ", ".join(f"{count:,} {gpu}" for gpu, count in row.gpus.items())


def sweep_document(
    rows: list[SweepRow], title: str, prices: dict[str, float] | None = None
) -> Document:
    """The sweep as a Document: nodes, batch, GPUs per type, predicted tokens/s and MFU, the
    time to train and its cost, and a note (why there is no plan, the time limit, idle GPUs)."""
    tokens = rows[0].train_tokens if rows else 0.0
    section = Section(
        title=f"Configurations ({len(rows)})",
        columns=[
            "nodes",
            "batch",
            "GPUs",
            "tokens/s",
            "MFU",
            f"time for {count_text(tokens)} tokens",
            "cost",
            "note",
        ],
        right=frozenset({0, 1, 3, 4, 5, 6}),
        heading_columns=2,
    )
    for row in rows:
        figures = ["-"] * 4
        if row.feasible:
            figures = [
                count_text(row.tokens_per_s or 0),
                percent_text(row.mfu or 0),
                long_duration_text(row.train_time_s or 0),
                usd_text(row.cost_usd) if row.cost_usd is not None else "-",
            ]
        section.add(
            str(row.nodes),
            f"{row.global_batch_size:,}",
            _gpus_text(row),
            *figures,
            row.note,
            style="" if row.feasible else "dim",
        )
    notes = []
    if prices:
        listed = ", ".join(f"{gpu} {usd_text(price)}" for gpu, price in prices.items())
        notes.append(
            f"cost: every GPU of the configuration, idle ones too, × its price per GPU-hour "
            f"({listed}) × the time to train"
        )
    else:
        notes.append("cost: give --price TYPE=USD_PER_HOUR for every GPU type")
    if any(row.batch_per_gpu for row in rows):
        notes.append("batch: one sample per GPU (no --global-batch)")
    section.note = "; ".join(notes)
    return Document(title=title, sections=[section])
