"""Lay a Document out as text that fits its console, as Markdown, or as JSON; never truncate.

Text: each section is a rich table when the table's natural width fits the console; otherwise
it falls back to stacked rows (the row's first cell as a heading, then one ``column: value``
line per cell, values folding onto further lines), so that a narrow terminal or a log file
(rich takes 80 columns when output is piped) still shows every character. Every column folds
rather than cutting text off with '…'. Markdown: a heading per section and a pipe table.
JSON: ``{"title", "sections": [{"title", "rows": [{column: value}]}]}`` (key–value sections as
``"items": {what: value}``): a ``Figure`` cell as its number under ``column_unit`` (e.g.
``"fwd_ms": 117.2``), other cells as shown.

A table is used while it fits the console with every column at least ``_MIN_COLUMN`` wide (or
its natural width, if narrower): long cells then fold inside their column rather than the whole
section falling back to stacked rows.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from autoplan.view.document import Cell, Document, Figure, Section, cell_text

__all__ = [
    "FORMATS",
    "OutputFormat",
    "print_document",
    "print_text",
    "render_json",
    "render_markdown",
]

OutputFormat = Literal["text", "markdown", "json"]
FORMATS: tuple[OutputFormat, ...] = ("text", "markdown", "json")

# Narrowest a column may fold to before a table gives way to stacked rows.
_MIN_COLUMN = 14


def _note(section: Section, text_layout: bool) -> str:
    notes = [section.note, section.text_note if text_layout else ""]
    return "; ".join(note for note in notes if note)


def _table(section: Section) -> Table:
    table = Table(
        title=section.title,
        title_justify="left",
        show_header=not section.key_value,
        caption=_note(section, True) or None,
        caption_justify="left",
    )
    for index, column in enumerate(section.columns):
        table.add_column(
            column,
            justify="right" if index in section.right else "left",
            overflow="fold",
            style="bold" if section.key_value and index == 0 else None,
        )
    for row, style in zip(
        section.rows, section.row_styles or [""] * len(section.rows), strict=True
    ):
        table.add_row(*row, style=style or None)
    return table


def _stacked(section: Section) -> Group:
    """Rows as blocks: a heading line (the row's naming cells), then ``column: value`` lines
    in a two-column grid whose values fold; key–value sections as one such grid."""
    styles = section.row_styles or [""] * len(section.rows)
    named = 1 if section.key_value else section.heading_columns
    keys = [f"{c}:" for c in section.columns[named:]] if not section.key_value else []
    keys += [f"{cell_text(row[0])}:" for row in section.rows] if section.key_value else []
    width = max((len(key) for key in keys), default=0) + (0 if section.key_value else 2)

    def grid() -> Table:
        table = Table.grid(padding=(0, 1))
        table.add_column(no_wrap=True, style="bold", min_width=width)
        table.add_column(overflow="fold")
        return table

    if section.key_value:
        block = grid()
        for row, style in zip(section.rows, styles, strict=True):
            block.add_row(Text(f"{cell_text(row[0])}:"), row[1], style=style or None)
        return Group(block)
    parts: list[RenderableType] = []
    for row, style in zip(section.rows, styles, strict=True):
        heading = " · ".join(
            f"{column} {cell_text(cell)}".strip()
            for column, cell in zip(section.columns[:named], row[:named], strict=True)
        )
        parts.append(Text(heading, style=f"underline {style}".strip(), overflow="fold"))
        block = grid()
        for column, cell in zip(section.columns[named:], row[named:], strict=True):
            if cell_text(cell).strip():
                block.add_row(Text(f"  {column}:"), cell, style=style or None)
        parts.append(block)
    return Group(*parts)


def _folded_width(section: Section) -> int:
    """Width of the section's table with each column folded to at most ``_MIN_COLUMN``
    characters (its natural width where that is less): borders and padding included."""
    total = 1
    for index, column in enumerate(section.columns):
        if index in section.text_only:
            widest = max((len(cell_text(row[index])) for row in section.rows), default=0)
        else:
            cells = [cell_text(row[index]) for row in section.rows]
            widest = max((max(map(len, c.splitlines() or [""])) for c in cells), default=0)
        natural = max(widest, 0 if section.key_value else len(column))
        total += min(natural, _MIN_COLUMN) + 3
    return total


def _print_section(console: Console, section: Section) -> None:
    table = _table(section)
    # Measured without the console's own limit: rich clamps measurements to the width.
    unlimited = console.options.update_width(1_000_000)
    natural = console.measure(table, options=unlimited)
    if natural.maximum <= console.width or (
        natural.minimum <= console.width and _folded_width(section) <= console.width
    ):
        console.print(table)
        return
    console.print(Text(section.title, style="italic"), overflow="fold")
    console.print(_stacked(section))
    note = _note(section, True)
    if note:
        console.print(Text(note, style="dim"), overflow="fold")


def print_text(console: Console, document: Document) -> None:
    """Print ``document`` to ``console`` in the layout that fits its width."""
    if document.title:
        console.print(Text(document.title, style="bold"), overflow="fold")
    for section in document.sections:
        _print_section(console, section)
        console.print()


def _markdown_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", "<br>") or " "


def render_markdown(document: Document) -> str:
    """The document as Markdown: a heading per section and a pipe table."""
    lines = [f"## {document.title}", ""] if document.title else []
    for section in document.sections:
        columns = [c for i, c in enumerate(section.columns) if i not in section.text_only]
        keep = [i for i in range(len(section.columns)) if i not in section.text_only]
        header = ["what", "value"] if section.key_value else columns
        lines.append(f"### {section.title}")
        lines.append("")
        lines.append("| " + " | ".join(_markdown_cell(c) for c in header) + " |")
        aligns = ["---:" if i in section.right else "---" for i in keep]
        lines.append("| " + " | ".join(aligns) + " |")
        for row in section.rows:
            cells = [_markdown_cell(cell_text(row[i])) for i in keep]
            lines.append("| " + " | ".join(cells) + " |")
        if section.note:
            lines.extend(["", section.note])
        lines.append("")
    return "\n".join(lines)


def _json_cell(column: str, cell: Cell | Figure) -> tuple[str, object]:
    if isinstance(cell, Figure):
        return (f"{column}_{cell.unit}" if cell.unit else column), cell.value
    return column, cell_text(cell)


def _json_section(section: Section) -> dict[str, Any]:
    if section.key_value:
        items = dict(_json_cell(cell_text(row[0]).strip(), row[1]) for row in section.rows)
        return {"title": section.title, "items": items}
    rows = [
        dict(
            _json_cell(column, cell)
            for index, (column, cell) in enumerate(zip(section.columns, row, strict=True))
            if index not in section.text_only
        )
        for row in section.rows
    ]
    out: dict[str, Any] = {"title": section.title, "rows": rows}
    if section.note:
        out["note"] = section.note
    return out


def render_json(document: Document) -> str:
    """The document as JSON (figures as numbers, other cells as shown)."""
    data = {"title": document.title, "sections": [_json_section(s) for s in document.sections]}
    return json.dumps(data, indent=2, ensure_ascii=False)


def print_document(console: Console, document: Document, output: OutputFormat = "text") -> None:
    """Print ``document`` in ``output`` format: laid out for the console, or as Markdown or
    JSON written as they are (no wrapping)."""
    if output == "text":
        print_text(console, document)
        return
    text = render_markdown(document) if output == "markdown" else render_json(document)
    console.out(text, highlight=False)
