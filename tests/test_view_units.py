"""Human units, node ranges and the layout fallback of the views."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from autoplan.view.document import Document, Section
from autoplan.view.render import print_document, render_json, render_markdown
from autoplan.view.units import (
    bytes_text,
    count_text,
    duration_text,
    node_ranges,
    rate_text,
    runs_text,
)


@pytest.mark.parametrize(
    ("number", "text"),
    [(69.0e9, "69.0 B"), (175e9, "175 B"), (350e6, "350 M"), (12_345, "12.3 k"), (512, "512")],
)
def test_counts(number: float, text: str) -> None:
    assert count_text(number) == text


@pytest.mark.parametrize(
    ("size", "text"),
    [(1.1 * 2**40, "1.10 TiB"), (62.3 * 2**30, "62.3 GiB"), (512 * 2**20, "512 MiB"), (0, "0 B")],
)
def test_bytes(size: float, text: str) -> None:
    assert bytes_text(size) == text


@pytest.mark.parametrize(
    ("ms", "text"),
    [
        (68_900, "68.9 s"),
        (412.3, "412 ms"),
        (3, "3.00 ms"),
        (0.25, "250 µs"),
        (750_000, "12.5 min"),
        (8_280_000, "2.30 h"),
        (0, "0 ms"),
    ],
)
def test_durations(ms: float, text: str) -> None:
    assert duration_text(ms) == text


def test_rates() -> None:
    assert rate_text(1.2e6, "tokens") == "1.2 M tokens/s"
    assert rate_text(3.72, "samples") == "3.72 samples/s"


def test_node_ranges_fold_numbered_names() -> None:
    names = [f"a100-{i}" for i in range(16)] + ["v100-2", "v100-3", "v100-5", "head"]
    assert node_ranges(names) == "a100-[0-15], v100-[2-3,5], head"
    assert node_ranges(["a100-3"]) == "a100-3"
    assert node_ranges(["n-1", "n-0", "n-1"]) == "n-[0-1]"


def test_runs() -> None:
    assert runs_text([1] * 16) == "1 × 16"
    assert runs_text(["none", "none", "full"]) == "none × 2, full"


def _document() -> Document:
    section = Section(title="T", columns=["stage", "what", "long"], right=frozenset({0}))
    section.add("0", "a|b", "word " * 30)
    section.add("1", "c", "x" * 120)  # one word longer than the console
    return Document(title="doc", sections=[section])


def _printed(width: int) -> str:
    console = Console(width=width, record=True)
    with console.capture() as captured:
        print_document(console, _document())
    return captured.get()


def test_text_falls_back_to_stacked_rows_and_never_truncates() -> None:
    wide = _printed(400)
    assert "┃ stage ┃" in wide  # a table when it fits
    narrow = _printed(60)
    assert "┃" not in narrow and "stage 0" in narrow and "  long:" in narrow
    assert "…" not in narrow
    assert "".join(narrow.split()).count("x") == 120  # the long word folds, whole
    assert max(len(line) for line in narrow.splitlines()) <= 60


def test_markdown_escapes_pipes_and_json_keeps_cells() -> None:
    markdown = render_markdown(_document())
    assert "| 0 | a\\|b |" in markdown
    assert "| ---: | --- | --- |" in markdown
    data = json.loads(render_json(_document()))
    assert data["sections"][0]["rows"][1] == {"stage": "1", "what": "c", "long": "x" * 120}


def test_rounding_noise_is_no_time_and_counts_agree_with_their_noun() -> None:
    from autoplan.view.units import counted

    assert duration_text(1.8e-12) == "0 ms"  # an all-reduce hidden by backward, less rounding
    assert duration_text(2e-6) == "0.002 µs"  # 2 ns is still a time
    assert counted(1, "sample") == "1 sample" and counted(3, "sample") == "3 samples"
    assert counted(1, "micro-batch", "micro-batches") == "1 micro-batch"
    assert counted(2, "micro-batch", "micro-batches") == "2 micro-batches"


def test_wide_tables_fold_long_cells_instead_of_stacking() -> None:
    # A section with one long cell used to stack into 'column: value' lines at any width; a
    # table is kept while every column can keep 14 characters, the long cell folding.
    section = Section(title="Plans compared", columns=["", "a.json", "b.json"])
    section.add(
        "replicas per stage", "s0-3: " + "A100-80GB tp1 × 8 (micro-batch 2 each); " * 8, "x"
    )
    wide, narrow = Console(width=120, record=True), Console(width=30, record=True)
    print_document(wide, Document(title="", sections=[section]))
    print_document(narrow, Document(title="", sections=[section]))
    assert "│" in wide.export_text() and "a.json:" not in wide.export_text()  # a table
    assert "a.json:" in narrow.export_text()  # too narrow for three columns: stacked
