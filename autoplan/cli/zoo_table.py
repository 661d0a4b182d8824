"""The rows of ``autoplan models``, kept in the user's cache so that listing the zoo needs no torch.

Counting a zoo model's parameters builds it (on the meta device: nothing is allocated), which
needs torch (seconds to import) and, for the whole zoo, seconds more. The rows depend only on
the zoo's source code, so they are computed once and kept in
``$XDG_CACHE_HOME/autoplan/zoo-<hash>.json`` (``~/.cache`` without it), the hash being that of
the zoo's source files and autoplan's version: an edited zoo makes a new file, never a stale
listing. A cache that cannot be read or written is ignored (the rows are computed each time).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
from pathlib import Path

from autoplan.files import write_text_atomic

__all__ = ["ZOO_COLUMNS", "cache_path", "zoo_rows"]

logger = logging.getLogger(__name__)

ZOO_COLUMNS = (
    "name",
    "family",
    "parameters",
    "layers",
    "hidden",
    "heads",
    "kv heads",
    "vocab",
    "max seq",
)


def _zoo_sources() -> list[Path]:
    """The zoo package's source files, found without importing it (which imports torch)."""
    spec = importlib.util.find_spec("autoplan.zoo")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations)))
    return sorted(folder.glob("*.py"))


def cache_path() -> Path:
    """Where the rows of this zoo's source and this autoplan's version are kept."""
    from autoplan.cli.app import package_version

    digest = hashlib.sha256(package_version().encode())
    for source in _zoo_sources():
        digest.update(source.name.encode() + b"\0" + source.read_bytes() + b"\0")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autoplan" / f"zoo-{digest.hexdigest()[:24]}.json"


def _computed_rows() -> list[list[str]]:
    from autoplan.zoo.registry import get_model_spec, model_names

    rows = []
    for name in model_names():
        spec = get_model_spec(name)
        rows.append(
            [
                name,
                spec.family,
                f"{spec.parameter_count():,}",
                str(spec.num_blocks),
                str(spec.hidden_size),
                str(spec.num_attention_heads),
                str(spec.num_kv_heads),
                str(spec.vocab_size),
                str(spec.max_seq_len),
            ]
        )
    return rows


def _cached_rows(path: Path) -> list[list[str]] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    good = (
        isinstance(data, dict)
        and data.get("columns") == list(ZOO_COLUMNS)
        and isinstance(data.get("rows"), list)
        and all(
            isinstance(row, list)
            and len(row) == len(ZOO_COLUMNS)
            and all(isinstance(cell, str) for cell in row)
            for row in data["rows"]
        )
    )
    return data["rows"] if good else None


def zoo_rows() -> list[list[str]]:
    """One row of :data:`ZOO_COLUMNS` per zoo model, in the zoo's order: from the cache when
    this zoo's rows are there, else computed (with torch) and kept for next time."""
    try:
        path = cache_path()
    except (OSError, RuntimeError) as error:  # an unreadable source, no home: keep nothing
        logger.info("zoo listing not cached: %s", error)
        return _computed_rows()
    rows = _cached_rows(path)
    if rows is not None:
        return rows
    rows = _computed_rows()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(path, json.dumps({"columns": list(ZOO_COLUMNS), "rows": rows}))
    except OSError as error:  # a read-only home: the listing is right, only slower next time
        logger.info("zoo listing not cached at %s: %s", path, error)
    return rows
