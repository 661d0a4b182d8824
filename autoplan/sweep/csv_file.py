"""A sweep's rows as CSV: one line per configuration, figures in plain units (no k/M suffixes),
one ``gpus_<TYPE>`` and ``gpus_used_<TYPE>`` column per GPU type, empty cells for figures an
infeasible row does not have."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from autoplan.files import write_text_atomic
from autoplan.sweep.schema import SweepRow

__all__ = ["sweep_csv_text", "write_sweep_csv"]

_FIGURES = [
    "tokens_per_s",
    "samples_per_s",
    "mfu",
    "iteration_time_ms",
    "pipeline_degree",
    "train_tokens",
    "train_time_s",
    "usd_per_hour",
    "cost_usd",
    "solve_time_s",
]


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def sweep_csv_text(rows: list[SweepRow]) -> str:
    """The rows as CSV text with a header line."""
    types = list(dict.fromkeys(gpu for row in rows for gpu in row.gpus))
    header = ["nodes", "global_batch_size", "cluster", "gpus"]
    header += [f"gpus_{gpu}" for gpu in types] + [f"gpus_used_{gpu}" for gpu in types]
    header += ["feasible", "timed_out", "search_status", "gap", *_FIGURES, "note", "reason"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        used = [row.gpus_used.get(gpu, 0) if row.feasible else "" for gpu in types]
        writer.writerow(
            [
                row.nodes,
                row.global_batch_size,
                row.cluster_name,
                row.total_gpus,
                *(row.gpus.get(gpu, 0) for gpu in types),
                *used,
                _cell(row.feasible),
                _cell(row.timed_out),
                _cell(row.search_status),
                _cell(row.gap),
                *(_cell(getattr(row, name)) for name in _FIGURES),
                row.note,
                row.reason,
            ]
        )
    return out.getvalue()


def write_sweep_csv(path: str | Path, rows: list[SweepRow]) -> None:
    """Write the rows to ``path`` as CSV (atomically)."""
    write_text_atomic(path, sweep_csv_text(rows))
