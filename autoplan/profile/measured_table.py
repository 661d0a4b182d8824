"""Measured-time tables: per (GPU type, tp, micro-batch size, layer) forward and backward ms.

The common format of heterogeneous planners (e.g. ``../shared/calibration/layer_times.csv``):
one row per measured layer of one configuration, times per micro-batch on one GPU of a tp
group. ``autoplan profile import`` attaches a table to a profile (``attach``: each row becomes
a ``MeasuredTimes`` entry of its layer, keyed by (device, tp, micro-batch size)); ``autoplan
profile --measure --table`` writes this machine's measurements in the same format
(``write_table``), so each GPU type can be measured once, where it is, and planned anywhere.

Columns (CSV header or JSON keys; a JSON file is a list of rows or ``{"rows": [...]}``):

- ``gpu`` (or ``gpu_type``, ``device``, ``device_name``): a catalog GPU type or torch's device
  name; the cost model matches it to GPU types by their name tokens;
- ``tp`` (or ``tensor_parallel_degree``), ``micro_batch`` (or ``micro_batch_size``, ``mbs``);
- ``layer`` (or ``layer_index``): the layer's index in the profile, or its name;
- ``fwd_ms`` / ``bwd_ms`` (or ``forward_ms`` / ``backward_ms``);
- optional ``memory_bytes``; optional ``model``, to pick one model's rows from a table of
  several (``--model``); other columns are ignored.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoplan.errors import InputError
from autoplan.profile.schema import LayerProfile, MeasuredTimes, Profile

__all__ = ["TableRow", "attach", "read_table", "table_rows", "write_table"]

_ALIASES = {
    "gpu": ("gpu", "gpu_type", "device", "device_name"),
    "tp": ("tp", "tensor_parallel_degree"),
    "micro_batch": ("micro_batch", "micro_batch_size", "mbs"),
    "layer": ("layer", "layer_index"),
    "fwd_ms": ("fwd_ms", "forward_ms"),
    "bwd_ms": ("bwd_ms", "backward_ms"),
    "memory_bytes": ("memory_bytes",),
    "model": ("model",),
}
_REQUIRED = ("gpu", "tp", "micro_batch", "layer", "fwd_ms", "bwd_ms")
COLUMNS = ("gpu", "tp", "micro_batch", "layer", "fwd_ms", "bwd_ms", "memory_bytes")


@dataclass(frozen=True)
class TableRow:
    """One measured layer of one configuration."""

    gpu: str
    tp: int
    micro_batch: int
    layer: str  # an index or a layer name, as the table gives it
    forward_ms: float
    backward_ms: float
    memory_bytes: int | None = None


def _field(raw: dict[str, Any], name: str) -> Any:
    for alias in _ALIASES[name]:
        if alias in raw and raw[alias] not in (None, ""):
            return raw[alias]
    return None


def _parse(raw: dict[str, Any], where: str) -> TableRow:
    missing = [name for name in _REQUIRED if _field(raw, name) is None]
    if missing:
        raise InputError(f"{where}: no {', '.join(missing)} (columns: {', '.join(raw)})")
    try:
        memory = _field(raw, "memory_bytes")
        row = TableRow(
            gpu=str(_field(raw, "gpu")),
            tp=int(_field(raw, "tp")),
            micro_batch=int(_field(raw, "micro_batch")),
            layer=str(_field(raw, "layer")),
            forward_ms=float(_field(raw, "fwd_ms")),
            backward_ms=float(_field(raw, "bwd_ms")),
            memory_bytes=None if memory is None else int(float(memory)),
        )
    except (TypeError, ValueError, OverflowError) as error:  # int(float('inf')) overflows
        raise InputError(f"{where}: {error}") from None
    times = (row.forward_ms, row.backward_ms)
    if row.tp < 1 or row.micro_batch < 1 or not all(math.isfinite(t) and t >= 0 for t in times):
        raise InputError(
            f"{where}: tp and micro_batch must be >= 1 and times finite and >= 0; got {row}"
        )
    if row.memory_bytes is not None and row.memory_bytes < 0:
        raise InputError(f"{where}: memory_bytes must be >= 0; got {row.memory_bytes}")
    return row


def _raw_rows(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error}") from None
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise InputError(f"{path}: not JSON: {error}") from None
        rows = data.get("rows") if isinstance(data, dict) else data
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InputError(f"{path}: a JSON table is a list of rows or {{'rows': [...]}}")
        return rows
    return list(csv.DictReader(text.splitlines()))


def read_table(
    path: str | Path, *, model: str | None = None, gpu_names: dict[str, str] | None = None
) -> list[TableRow]:
    """The rows of a CSV or JSON table; ``model`` keeps one model's rows (by its ``model``
    column), ``gpu_names`` renames GPUs (e.g. {'A100-40': 'A100-40GB'})."""
    path = Path(path)
    raw = _raw_rows(path)
    if model is not None:
        raw = [r for r in raw if _field(r, "model") == model]
        if not raw:
            raise InputError(f"{path}: no rows of model '{model}'")
    rows = [_parse(r, f"{path}: row {i + 2}") for i, r in enumerate(raw)]
    if not rows:
        raise InputError(f"{path}: the table has no rows")
    names = gpu_names or {}
    return [dataclasses.replace(row, gpu=names.get(row.gpu, row.gpu)) for row in rows]


def _layer_index(profile: Profile, layer: str) -> int:
    if layer.isdigit():
        index = int(layer)
        if index >= len(profile.layers):
            raise InputError(
                f"the table has layer {index}; the profile of {profile.model.name} has "
                f"{len(profile.layers)} layers (0..{len(profile.layers) - 1})"
            )
        return index
    for candidate in profile.layers:
        if candidate.name == layer:
            return candidate.index
    raise InputError(f"the table names layer '{layer}', which the profile does not have")


def _key(entry: MeasuredTimes, profile: Profile) -> tuple[str, int, int]:
    return (
        entry.device_name,
        entry.tensor_parallel_degree,
        entry.micro_batch_size or profile.micro_batch_size,
    )


def attach(profile: Profile, rows: list[TableRow], source: str) -> Profile:
    """``profile`` with the table's times among its layers' measured entries; an entry of the
    same (device, tp, micro-batch size) is replaced. Repeated rows are an InputError."""
    added: dict[int, dict[tuple[str, int, int], MeasuredTimes]] = {}
    for row in rows:
        index = _layer_index(profile, row.layer)
        entry = MeasuredTimes(
            device_name=row.gpu,
            forward_ms=row.forward_ms,
            backward_ms=row.backward_ms,
            tensor_parallel_degree=row.tp,
            micro_batch_size=row.micro_batch,
            memory_bytes=row.memory_bytes,
            source=source,
        )
        key = _key(entry, profile)
        if key in added.setdefault(index, {}):
            raise InputError(
                f"the table has layer {index} twice for gpu {row.gpu}, tp {row.tp}, "
                f"micro-batch {row.micro_batch}"
            )
        added[index][key] = entry
    layers: list[LayerProfile] = []
    for layer in profile.layers:
        merged = {_key(e, profile): e for e in layer.measured}
        merged.update(added.get(layer.index, {}))
        ordered = [merged[k] for k in sorted(merged)]
        layers.append(layer.model_copy(update={"measured": ordered}))
    return profile.model_copy(update={"layers": layers})


def table_rows(profile: Profile) -> list[TableRow]:
    """Every measured entry of the profile as a table row (layers by index)."""
    return [
        TableRow(
            gpu=entry.device_name,
            tp=entry.tensor_parallel_degree,
            micro_batch=entry.micro_batch_size or profile.micro_batch_size,
            layer=str(layer.index),
            forward_ms=entry.forward_ms,
            backward_ms=entry.backward_ms,
            memory_bytes=entry.memory_bytes,
        )
        for layer in profile.layers
        for entry in layer.measured
    ]


def write_table(path: str | Path, rows: list[TableRow]) -> None:
    """Write rows as CSV (``COLUMNS``; times with repr precision, so they read back equal)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        for row in rows:
            writer.writerow(
                [
                    row.gpu,
                    row.tp,
                    row.micro_batch,
                    row.layer,
                    repr(row.forward_ms),
                    repr(row.backward_ms),
                    "" if row.memory_bytes is None else row.memory_bytes,
                ]
            )
